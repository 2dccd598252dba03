"""The chart agrees with the operator's code: its RBAC rules and its validating handlers."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

import kopf
import pytest
from chart_helpers import Helm, find, one

Triple = tuple[str, str, str]


def triples(rules: Iterable[dict[str, Any]]) -> set[Triple]:
    """PolicyRules as (apiGroup, resource, verb) triples, so rule grouping does not matter."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def operator_rbac_triples() -> set[Triple]:
    try:
        rbac = importlib.import_module("crewfence_operator.rbac")
    except ModuleNotFoundError:
        pytest.skip("operator/crewfence_operator/rbac.py does not exist yet")
    # The chart ships a Service-based webhook configuration, so kopf's managed-webhook rules
    # (rules(managed_webhook=True)) must not be granted in-cluster.
    return triples(rbac.rules(managed_webhook=False))


def chart_triples(docs: list[dict[str, Any]]) -> set[Triple]:
    roles = [
        r
        for r in find(docs, "ClusterRole") + find(docs, "Role")
        if r["metadata"]["name"].endswith(("-operator-cluster", "-operator"))
    ]
    return set().union(*(triples(r["rules"]) for r in roles))


def split_peering(t: set[Triple]) -> tuple[set[Triple], set[Triple]]:
    peering = {x for x in t if x[0] == "kopf.dev"}
    return t - peering, peering


@pytest.mark.parametrize(
    ("values", "peering_resource"),
    [
        ({}, None),
        ({"replicaCount": 2}, "clusterkopfpeerings"),
        ({"rbac.namespaced": True, "operator.watchNamespaces": ["team-a"]}, None),
        (
            {"rbac.namespaced": True, "operator.watchNamespaces": ["team-a"], "replicaCount": 2},
            "kopfpeerings",
        ),
    ],
    ids=["cluster", "cluster-peering", "namespaced", "namespaced-peering"],
)
def test_rbac_is_exactly_the_operators(
    helm: Helm, values: dict[str, Any], peering_resource: str | None
) -> None:
    wanted, wanted_peering = split_peering(operator_rbac_triples())
    granted, granted_peering = split_peering(chart_triples(helm.render(values)))
    assert granted == wanted
    # Peering rules only when there are peers, and only the one kind kopf uses in that mode.
    if peering_resource is None:
        assert granted_peering == set()
    else:
        assert {t[1] for t in granted_peering} == {peering_resource}
        assert granted_peering <= wanted_peering


def test_peering_adds_only_kopf_peering_rules(helm: Helm) -> None:
    single = chart_triples(helm.render())
    peered = chart_triples(helm.render({"replicaCount": 2}))
    assert {t[0] for t in peered - single} == {"kopf.dev"}
    assert single <= peered


def registered_validators() -> dict[str, tuple[str, str, str, set[str]]]:
    from crewfence_operator.handlers import webhook

    registry = kopf.OperatorRegistry()
    webhook.register(registry=registry)
    out = {}
    for handler in registry._webhooks.get_all_handlers():  # kopf has no public listing
        selector = handler.selector
        assert selector is not None
        plural = selector.plural or selector.any_name
        out[str(handler.id)] = (
            selector.group or "",
            selector.version or "",
            str(plural),
            set(handler.operations or []),
        )
    return out


def test_webhook_configuration_routes_to_the_operators_handlers(helm: Helm) -> None:
    handlers = registered_validators()
    assert handlers, "the operator registers validating handlers"
    vwc = one(helm.render(), "ValidatingWebhookConfiguration")
    served = {}
    for hook in vwc["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        [rule] = hook["rules"]
        served[path.lstrip("/")] = (
            rule["apiGroups"][0],
            rule["apiVersions"][0],
            rule["resources"][0],
            set(rule["operations"]),
        )
    assert served == handlers


def test_sidecar_port_and_labels_match_the_operator(helm: Helm) -> None:
    from crewfence_operator import constants as c

    docs = helm.render({"metrics.podMonitor.enabled": True})
    policy = find(docs, "NetworkPolicy")[0]["spec"]
    assert policy["ingress"][0]["ports"] == [{"protocol": "TCP", "port": c.SIDECAR_PORT}]
    assert policy["podSelector"]["matchLabels"] == {c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE}
    assert policy["podSelector"]["matchExpressions"][0]["key"] == c.LABEL_CREW
    endpoint = one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == c.SIDECAR_PORT_NAME
