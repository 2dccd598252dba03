"""The state fence's admission objects, built from the manifests the chart ships.

The two ValidatingAdmissionPolicies (``policy-pods.yaml``, ``policy-crews.yaml``) and the webhook
entries (``webhooks.yaml``) live once in ``charts/crewfence/files/admission/``; this package holds
a byte-identical copy (``admission_manifests/``, checked by a unit test) so that the
out-of-cluster operator installs exactly what the chart installs. Pure functions: building the
objects here, applying them in ``admission_install``.

Invariants kept here:

- *The fence never depends on the operator*: the policies are evaluated by kube-apiserver with
  the Crews themselves as params; the bindings never reference the operator.
- *Namespaces the operator must never gate*: every webhook namespace selector excludes
  ``kube-system`` and the operator's own namespace, whatever the user adds
  (``namespace_selector``); a user selector is combined with those exclusions, never replaces
  them.
- *Pods that mount no claim never reach the operator*: every webhook entry carries the
  ``matchConditions`` of ``webhooks.yaml``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
ALWAYS_EXCLUDED = ("kube-system",)
POLICY_FILES = ("policy-pods.yaml", "policy-crews.yaml")
WEBHOOKS_FILE = "webhooks.yaml"
MANIFEST_FILES = (*POLICY_FILES, WEBHOOKS_FILE)
FILE_NAME_PREFIX = "crewfence-"
WEBHOOK_NAME_SUFFIX = "crewfence.dev"
API_VERSION = "admissionregistration.k8s.io/v1"
_LITERAL_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Obj = dict[str, Any]


def manifest_text(file_name: str) -> str:
    """The packaged copy of one file of ``charts/crewfence/files/admission/``."""
    return (resources.files("crewfence_operator") / "admission_manifests" / file_name).read_text()


@cache
def _load(file_name: str) -> Any:
    return yaml.safe_load(manifest_text(file_name))


def policies(name_prefix: str) -> list[Obj]:
    """The ValidatingAdmissionPolicies, renamed ``<prefix>-<suffix>`` (the chart uses its
    fullname as prefix so two releases never claim one object)."""
    found: list[Obj] = []
    for file_name in POLICY_FILES:
        policy = copy.deepcopy(_load(file_name))
        suffix = str(policy["metadata"]["name"]).removeprefix(FILE_NAME_PREFIX)
        policy["metadata"] = {"name": f"{name_prefix}-{suffix}"}
        found.append(policy)
    return found


def literal_namespaces(namespaces: Iterable[str]) -> list[str] | None:
    """Sorted namespace names, or None when any is a pattern (a selector cannot express it)."""
    names = sorted(set(namespaces))
    if not all(_LITERAL_NAMESPACE.match(n) for n in names):
        return None
    return names


def namespace_selector(
    watch: Sequence[str],
    excluded: Iterable[str] = (),
    base: Mapping[str, Any] | None = None,
) -> Obj:
    """Namespaces one admission object may see: ``base`` (a user's selector) AND the watched
    namespaces (when given as names) AND never ``kube-system`` nor ``excluded``."""
    base = base or {}
    expressions: list[Obj] = [dict(e) for e in base.get("matchExpressions") or []]
    names = literal_namespaces(watch)
    if names:
        expressions.append({"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": names})
    never = sorted({*ALWAYS_EXCLUDED, *(n for n in excluded if n)})
    expressions.append({"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": never})
    selector: Obj = {}
    if base.get("matchLabels"):
        selector["matchLabels"] = dict(base["matchLabels"])
    selector["matchExpressions"] = expressions
    return selector


def binding(policy_name: str, selector: Mapping[str, Any]) -> Obj:
    """Bind one policy with every Crew of the request's namespace as params; no Crew: allow."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name},
        "spec": {
            "policyName": policy_name,
            "validationActions": ["Deny"],
            "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"},
            "matchResources": {"namespaceSelector": dict(selector)},
        },
    }


def policy_objects(name_prefix: str, watch: Sequence[str]) -> list[Obj]:
    """Policies then bindings (creation order)."""
    selector = namespace_selector(watch)
    found = policies(name_prefix)
    return [*found, *(binding(p["metadata"]["name"], selector) for p in found)]


@dataclass(frozen=True)
class WebhookSettings:
    """What varies between the chart's webhook configuration and the out-of-cluster one."""

    name: str
    client_config: Callable[[str], Obj]
    """Client config for one handler id (Service + path in cluster, URL out of cluster)."""
    namespace_selector: Obj
    failure_policy: str = "Ignore"
    timeout_seconds: int = 10


def webhook_ids() -> list[str]:
    return [str(hook["id"]) for hook in _load(WEBHOOKS_FILE)]


def webhook_configuration(settings: WebhookSettings) -> Obj:
    webhooks = []
    for hook in _load(WEBHOOKS_FILE):
        webhooks.append({
            "name": f"{hook['id']}.{WEBHOOK_NAME_SUFFIX}",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": settings.failure_policy,
            "matchPolicy": "Equivalent",
            "timeoutSeconds": settings.timeout_seconds,
            "clientConfig": settings.client_config(str(hook["id"])),
            "rules": copy.deepcopy(hook["rules"]),
            "matchConditions": copy.deepcopy(hook["matchConditions"]),
            "namespaceSelector": copy.deepcopy(settings.namespace_selector),
        })
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": settings.name},
        "webhooks": webhooks,
    }
