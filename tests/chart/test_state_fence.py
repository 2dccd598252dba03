"""The chart's state fence: the policies and bindings are exactly what the out-of-cluster
operator installs (operator/crewfence_operator/admission.py over the same files), the webhook is
scoped by matchConditions and a namespace selector that always keeps its exclusions, renders are
deterministic, and the operator has a readiness probe and a NetworkPolicy of its own."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helpers import NAMESPACE, RELEASE, Helm, find, one
from crewfence_operator import admission

FULLNAME = f"{RELEASE}-crewfence"
OPERATOR = f"{FULLNAME}-operator"
WEBHOOK = f"{FULLNAME}-webhook"


def _strip(obj: dict[str, Any]) -> dict[str, Any]:
    """An object without the chart's labels (the operator sets none)."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "labels"}
    return {**obj, "metadata": meta}


@pytest.mark.parametrize("watch", [[], ["team-a", "team-b"]])
def test_policies_and_bindings_equal_what_the_operator_installs(
    helm: Helm, watch: list[str]
) -> None:
    values: dict[str, Any] = {"operator.watchNamespaces": watch} if watch else {}
    docs = helm.render(values)
    rendered = [
        _strip(d) for d in docs
        if d["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    ]
    assert rendered == admission.policy_objects(FULLNAME, watch)


def test_policy_failure_policy_is_a_value(helm: Helm) -> None:
    docs = helm.render({"admissionPolicy.failurePolicy": "Ignore"})
    assert {p["spec"]["failurePolicy"] for p in find(docs, "ValidatingAdmissionPolicy")} == {
        "Ignore"}
    assert not find(helm.render({"admissionPolicy.enabled": False}), "ValidatingAdmissionPolicy")


@pytest.mark.parametrize("values", [
    pytest.param({}, id="cluster"),
    pytest.param({"operator.watchNamespaces": ["team-a"]}, id="watched"),
    pytest.param({"webhook.namespaceSelector": {
        "matchLabels": {"tier": "apps"},
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                              "values": ["kube-system", NAMESPACE, "team-a"]}]}},
        id="user-selector"),
])
def test_webhook_equals_the_operators_and_keeps_its_exclusions(
    helm: Helm, values: dict[str, Any]
) -> None:
    vwc = one(helm.render(values), "ValidatingWebhookConfiguration")
    watch = values.get("operator.watchNamespaces", [])
    expected = admission.webhook_configuration(admission.WebhookSettings(
        name=FULLNAME,
        client_config=lambda hook: {"service": {"name": WEBHOOK, "namespace": NAMESPACE,
                                                "path": f"/{hook}", "port": 443}},
        namespace_selector=admission.namespace_selector(
            watch, [NAMESPACE], values.get("webhook.namespaceSelector")),
    ))
    assert vwc["webhooks"] == expected["webhooks"]
    for hook in vwc["webhooks"]:
        assert hook["matchConditions"] and hook["failurePolicy"] == "Ignore"
        assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": sorted(["kube-system", NAMESPACE])} in hook["namespaceSelector"][
                    "matchExpressions"]


def test_two_renders_are_identical(helm: Helm) -> None:
    for values in ({}, {"webhook.certManager.enabled": True}, {"replicaCount": 2}):
        assert helm.template_text(values) == helm.template_text(values)


def test_operator_readiness_probe(helm: Helm) -> None:
    container = one(helm.render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz"
    port = next(p for p in container["ports"] if p["name"] == probe["port"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CREWFENCE_OPERATOR_READINESS_PORT"] == str(port["containerPort"])


def test_operator_network_policy_opens_only_admission_and_metrics(helm: Helm) -> None:
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    docs = helm.render({"networkPolicy.operator.apiServerCIDRs": ["10.0.0.0/24"],
                        "networkPolicy.operator.apiServerExcept": ["10.0.0.128/25"],
                        "networkPolicy.operator.metricsFrom": [scraper]})
    policy = one(docs, "NetworkPolicy", OPERATOR)
    pod = one(docs, "Deployment")["spec"]["template"]
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"][
        "labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admission_rule, metrics_rule = policy["spec"]["ingress"]
    assert admission_rule == {"from": [{"ipBlock": {"cidr": "10.0.0.0/24",
                                                    "except": ["10.0.0.128/25"]}}],
                              "ports": [{"protocol": "TCP", "port": 9443}]}
    assert metrics_rule == {"from": [scraper], "ports": [{"protocol": "TCP", "port": 9090}]}
    # Default: no scrapers configured, no metrics ingress; no webhook, no admission ingress.
    closed = one(helm.render({"webhook.enabled": False}), "NetworkPolicy", OPERATOR)
    assert not closed["spec"].get("ingress")


def test_certificate_keeper_rbac_is_exactly_its_secret_and_configuration(helm: Helm) -> None:
    docs = helm.render()
    role = one(docs, "Role", f"{OPERATOR}-webhook-tls")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [f"{WEBHOOK}-tls"],
         "verbs": ["get", "update"]},
    ]
    cluster_role = one(docs, "ClusterRole", f"{OPERATOR}-webhook-ca")
    assert cluster_role["rules"] == [
        {"apiGroups": ["admissionregistration.k8s.io"],
         "resources": ["validatingwebhookconfigurations"], "resourceNames": [FULLNAME],
         "verbs": ["get", "patch"]}]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = one(docs, kind, f"{OPERATOR}-webhook-{'tls' if kind == 'RoleBinding' else 'ca'}")
        assert binding["subjects"][0]["name"] == OPERATOR
