"""A namespaced install (`rbac.namespaced=true`) fences its own namespaces and leaves every
other namespace alone: pods there, with and without claims, are created whatever Crews exist
there, and never reach the operator.

The chart's policy bindings and webhook selector are scoped to `operator.watchNamespaces`
(always without kube-system and the release namespace for the webhook); the out-of-cluster
operator, started for the same namespaces, installs the same policy files scoped the same way.
"""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import helm, install_chart
from harness.handles import Cluster, Operator, wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "crew-research.yaml"
COUNTER = "crewfence_operator_admission_requests_total"
NAME_LABEL = "kubernetes.io/metadata.name"


def _pod(name: str, claim: str | None = None) -> str:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox",
                                            "command": ["sleep", "600"]}]}
    if claim:
        spec["volumes"] = [{"name": "s", "persistentVolumeClaim": {"claimName": claim}}]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                           "spec": spec})


def _crew(namespace: str) -> dict[str, Any]:
    crew = yaml.safe_load(EXAMPLE.read_text())
    crew["spec"]["replicas"] = 1
    crew["metadata"]["namespace"] = namespace
    return crew


def _pod_reviews(operator: Operator) -> float:
    with urllib.request.urlopen(operator.metrics_url, timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f'{COUNTER}{{resource="pods"'):
                return float(line.split()[-1])
    return 0.0


@pytest.fixture
def outside(cluster: Cluster) -> Iterator[str]:
    name = f"e2e-outside-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name, check=True)
    yield name
    cluster.kubectl("delete", "pods", "--all", "-n", name, "--wait=false")
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def test_namespaced_install_leaves_other_namespaces_alone(
    cluster: Cluster, operator_factory: Callable[..., Operator], namespace: str, outside: str
) -> None:
    suffix = uuid.uuid4().hex[:6]
    release, release_ns = f"ns{suffix}", f"crewfence-{suffix}"
    install_chart(cluster, release, release_ns, "--set", "rbac.namespaced=true",
                  "--set-json", f'operator.watchNamespaces=["{namespace}"]')
    operator: Operator | None = None
    try:
        # The release's objects are scoped to the watched namespace.
        binding = cluster.get_json("validatingadmissionpolicybinding",
                                   f"{release}-crewfence-state-claims")
        exprs = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert {"key": NAME_LABEL, "operator": "In", "values": [namespace]} in exprs
        vwc = cluster.get_json("validatingwebhookconfiguration", f"{release}-crewfence")
        for hook in vwc["webhooks"]:
            exprs = hook["namespaceSelector"]["matchExpressions"]
            assert {"key": NAME_LABEL, "operator": "In", "values": [namespace]} in exprs
            assert {"key": NAME_LABEL, "operator": "NotIn",
                    "values": sorted(["kube-system", release_ns])} in exprs

        operator = operator_factory(namespaces=(namespace,))
        wait_until(lambda: cluster.get_json("validatingwebhookconfiguration", "crewfence.dev"),
                   timeout=60, what="the operator's webhook configuration")
        for ns in (namespace, outside):
            cluster.apply(_crew(ns))
        wait_until(lambda: cluster.get_json("pod", "research-0", "-n", namespace), timeout=90,
                   what="the watched Crew's replica pod")

        # Watched namespace: fenced by the API server.
        denied = cluster.kubectl("apply", "-n", namespace, "-f", "-",
                                 input=_pod("debugger", "research-state-0"))
        assert denied.returncode != 0 and 'Crew "research"' in denied.stderr

        # Any other namespace: nothing is fenced there, nothing reaches the operator.
        cluster.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": "mine", "namespace": outside},
                       "spec": {"accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": "1Gi"}}}})
        before = _pod_reviews(operator)
        for name, claim in (("plain", None), ("own-claim", "mine"),
                            ("crew-named", "research-state-0")):
            made = cluster.kubectl("apply", "-n", outside, "-f", "-", input=_pod(name, claim))
            assert made.returncode == 0, made.stderr
        assert _pod_reviews(operator) == before
    finally:
        if operator is not None:
            operator.stop()  # the next test's operator re-installs the cluster-wide binding
        for ns in (namespace, outside):
            cluster.kubectl("delete", "crew", "research", "-n", ns, "--wait=false")
        helm(cluster, "uninstall", release, "-n", release_ns, "--wait=false", check=False,
             timeout=120)
        cluster.kubectl("delete", "namespace", release_ns, "--wait=false")
