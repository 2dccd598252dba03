"""The state fence lives in the API server (ValidatingAdmissionPolicy, Crews as params): it keeps
fencing while the operator is SIGKILLed, never touches namespaces without Crews, and pods that
mount no claim never reach the operator's webhook.

The operator runs out of cluster (``managed`` mode), where it installs the very policy files the
chart ships (operator/crewfence_operator/admission_manifests, byte-identical to the chart's).
"""

from __future__ import annotations

import statistics
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.handles import Cluster, Operator, wait_until
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "crew-research.yaml"
POLICY = "crewfence-state-claims"
SAMPLES = 6
COUNTER = "crewfence_operator_admission_requests_total"


def _pod(name: str, claim: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox",
                                            "command": ["sleep", "600"]}]}
    if claim:
        spec["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/data"}]
        spec["volumes"] = [{"name": "s", "persistentVolumeClaim": {"claimName": claim}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}}


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    """A second namespace that holds no Crew."""
    name = f"e2e-unrelated-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name, check=True)
    yield name
    cluster.kubectl("delete", "pods", "--all", "-n", name, "--wait=false")
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def _core(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))


def _create_seconds(core: client.CoreV1Api, namespace: str, claim: str | None,
                    tag: str) -> list[float]:
    """Wall time of each pod CREATE (one API call each, no kubectl start-up in the figure)."""
    times = []
    for i in range(SAMPLES):
        body = _pod(f"{tag}-{i}", claim)
        start = time.perf_counter()
        core.create_namespaced_pod(namespace, body)
        times.append(time.perf_counter() - start)
    return times


def _fence_installed(cluster: Cluster) -> None:
    def ready() -> bool:
        binding = cluster.get_json("validatingadmissionpolicybinding", POLICY)
        hooks = cluster.get_json("validatingwebhookconfiguration", "crewfence.dev")
        return binding is not None and hooks is not None
    wait_until(ready, timeout=60, what="the operator to install the policy and webhook")


def _admission_requests(operator: Operator, resource: str) -> float:
    with urllib.request.urlopen(operator.metrics_url, timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f'{COUNTER}{{resource="{resource}"'):
                return float(line.split()[-1])
    return 0.0


def _crew_with_claim(cluster: Cluster, namespace: str) -> None:
    crew = yaml.safe_load(EXAMPLE.read_text())
    crew["spec"]["replicas"] = 1
    crew["metadata"]["namespace"] = namespace
    cluster.apply(crew)
    # The operator's own replica pod passes the policy (it is created, not denied).
    wait_until(lambda: cluster.get_json("pod", "research-0", "-n", namespace), timeout=90,
               what="the Crew's replica pod")


def test_fence_holds_while_the_operator_is_killed(
    cluster: Cluster, operator_process: Operator, namespace: str, other_namespace: str
) -> None:
    _fence_installed(cluster)
    _crew_with_claim(cluster, namespace)
    core = _core(cluster)
    core.create_namespaced_persistent_volume_claim(other_namespace, _claim("mine"))
    core.create_namespaced_pod(other_namespace, _pod("warm-up"))  # connection set-up
    up_plain = _create_seconds(core, other_namespace, None, "up-plain")
    up_claim = _create_seconds(core, other_namespace, "mine", "up-claim")

    operator_process.kill()
    assert not operator_process.alive()
    try:
        down_plain = _create_seconds(core, other_namespace, None, "down-plain")
        down_claim = _create_seconds(core, other_namespace, "mine", "down-claim")

        denied = cluster.kubectl("apply", "-n", namespace, "-f", "-",
                                 input=yaml.safe_dump(_pod("debugger", "research-state-0")))
        assert denied.returncode != 0
        message = denied.stderr
        assert "ValidatingAdmissionPolicy" in message and POLICY in message
        assert '"debugger"' in message and '"research-state-0"' in message
        assert 'Crew "research"' in message
        assert cluster.get_json("pod", "debugger", "-n", namespace) is None
    finally:
        operator_process.start()

    figures = {name: statistics.median(t) for name, t in (
        ("up, no volume", up_plain), ("up, own claim", up_claim),
        ("down, no volume", down_plain), ("down, own claim", down_claim))}
    shown = ", ".join(f"{k}: {v:.4f}" for k, v in figures.items())
    print(f"\npod CREATE in a namespace without Crews (median of {SAMPLES}, seconds): {shown}")
    # A dead operator must not make anybody wait for the webhook timeout (10 s).
    assert max(down_plain + down_claim) < 5.0


def test_pods_without_claims_never_reach_the_operator(
    cluster: Cluster, operator_process: Operator, other_namespace: str
) -> None:
    _fence_installed(cluster)
    core = _core(cluster)

    def webhook_serving() -> bool:
        # A pod with a claim is reviewed by the webhook once it serves (admitted: not a Crew's).
        before = _admission_requests(operator_process, "pods")
        name = f"probe-{uuid.uuid4().hex[:6]}"
        core.create_namespaced_pod(other_namespace, _pod(name, "whatever"))
        return _admission_requests(operator_process, "pods") > before

    wait_until(webhook_serving, timeout=60, what="the webhook to review claim-mounting pods")
    before = _admission_requests(operator_process, "pods")
    _create_seconds(core, other_namespace, None, "plain")
    assert _admission_requests(operator_process, "pods") == before
    core.create_namespaced_pod(other_namespace, _pod("with-claim", "whatever"))
    assert _admission_requests(operator_process, "pods") == before + 1


def test_operator_readiness_follows_its_admission_server(
    cluster: Cluster, operator_process: Operator
) -> None:
    def readyz() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(operator_process.launch.readiness_url, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    _, body = wait_until(lambda: (r := readyz())[0] == 200 and r, timeout=60,
                              what="the operator to be ready")
    assert '"connected": true' in body and '"admission": true' in body
