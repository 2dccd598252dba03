"""Every shared-state rejection through kubectl, with its message (real API server: the
ValidatingAdmissionPolicies the operator installs out of cluster, and its webhook for what CEL
cannot decide)."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from harness.handles import Cluster, Operator, wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "crew-research.yaml"


def _webhook_serving(cluster: Cluster, operator: Operator) -> None:
    port = f":{operator.launch.webhook_port}/"

    def registered() -> bool:
        cfg = cluster.get_json("validatingwebhookconfiguration", "crewfence.dev")
        urls = [w["clientConfig"].get("url", "") for w in (cfg or {}).get("webhooks") or []]
        return len(urls) == 2 and all(port in u for u in urls)

    wait_until(registered, timeout=60, what="the managed webhook configuration")


def _small_crew(name: str, ns: str, **storage: Any) -> dict[str, Any]:
    return {
        "apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"agents": {"a": {"role": "r", "goal": "g", "backstory": "b"}},
                 "tasks": [{"name": "t", "agent": "a", "description": "d",
                            "expected_output": "o"}],
                 "storage": storage},
    }


def _pod(name: str, ns: str, claim: str, labels: dict[str, str] | None = None) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "600"],
                                 "volumeMounts": [{"name": "s", "mountPath": "/data"}]}],
                 "volumes": [{"name": "s", "persistentVolumeClaim": {"claimName": claim}}]},
    })


def _ready_crew(cluster: Cluster, ns: str, name: str) -> None:
    wait_until(lambda: ((cluster.get_json("crew", name, "-n", ns) or {}).get("status") or {})
               .get("readyReplicas") == 1, timeout=180, what=f"Crew {name} ready")


def test_foreign_pod_on_state_claim_is_rejected(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    _webhook_serving(cluster, operator_process)
    crew = yaml.safe_load(EXAMPLE.read_text())
    crew["spec"]["replicas"] = 1
    crew["metadata"]["namespace"] = namespace
    cluster.apply(crew)
    wait_until(lambda: cluster.get_json("pvc", "research-state-0", "-n", namespace),
               timeout=60, what="the state claim")

    result = cluster.kubectl("apply", "-f", "-", input=_pod("debugger", namespace,
                                                             "research-state-0"))
    assert result.returncode != 0
    message = result.stderr
    # Decided by the API server itself (the policy), not by the operator's webhook.
    assert "ValidatingAdmissionPolicy 'crewfence-state-claims'" in message
    assert '"debugger"' in message and '"research-state-0"' in message
    assert 'Crew "research"' in message and "one writer per journal" in message

    # Copying the operator's labels does not help: the pod is not owned by the Crew.
    forged = _pod("research-0-copy", namespace, "research-state-0", labels={
        "app.kubernetes.io/managed-by": "crewfence", "crewfence.dev/crew": "research",
        "crewfence.dev/replica": "0"})
    result = cluster.kubectl("apply", "-f", "-", input=forged)
    assert result.returncode != 0 and '"research-0-copy"' in result.stderr
    assert "ValidatingAdmissionPolicy" in result.stderr
    assert cluster.get_json("pod", "debugger", "-n", namespace) is None

    # A pod on an ordinary claim is not our business.
    cluster.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                   "metadata": {"name": "scratch", "namespace": namespace},
                   "spec": {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}}}})
    ok = cluster.kubectl("apply", "-f", "-", input=_pod("worker", namespace, "scratch"))
    assert ok.returncode == 0, ok.stderr


def test_shared_access_modes_rejected_by_the_api_server(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    for mode in ("ReadWriteMany", "ReadOnlyMany"):
        result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(
            _small_crew("shared", namespace, accessMode=mode)))
        assert result.returncode != 0
        assert "spec.storage.accessMode" in result.stderr
        assert "ReadWriteOncePod or ReadWriteOnce" in result.stderr
    assert cluster.get_json("crew", "shared", "-n", namespace) is None


def test_existing_claim_of_another_crew_is_rejected(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    _webhook_serving(cluster, operator_process)
    cluster.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                   "metadata": {"name": "team-data", "namespace": namespace},
                   "spec": {"accessModes": ["ReadWriteOncePod"],
                            "resources": {"requests": {"storage": "1Gi"}}}})
    cluster.apply(_small_crew("first", namespace, existingClaim="team-data"))
    _ready_crew(cluster, namespace, "first")
    labels = cluster.get_json("pvc", "team-data", "-n", namespace)["metadata"]["labels"]
    assert labels["crewfence.dev/role"] == "state" and labels["crewfence.dev/crew"] == "first"

    result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        _small_crew("second", namespace, existingClaim="team-data")))
    assert result.returncode != 0
    assert '"team-data"' in result.stderr and 'Crew "first"' in result.stderr
    assert cluster.get_json("crew", "second", "-n", namespace) is None


def test_webhook_fences_a_state_claim_whose_crew_is_gone(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    """What CEL cannot decide (no Crew left to be a param): the webhook reads the claim's
    labels and still rejects, with the Crew and the claim named."""
    _webhook_serving(cluster, operator_process)
    cluster.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                   "metadata": {"name": "kept-journal", "namespace": namespace, "labels": {
                       "app.kubernetes.io/managed-by": "crewfence", "crewfence.dev/crew": "gone",
                       "crewfence.dev/replica": "0", "crewfence.dev/role": "state"}},
                   "spec": {"accessModes": ["ReadWriteOncePod"],
                            "resources": {"requests": {"storage": "1Gi"}}}})

    def rejected() -> str | None:
        result = cluster.kubectl("apply", "-f", "-",
                                 input=_pod("reader", namespace, "kept-journal"))
        if result.returncode == 0:  # the webhook was not serving yet (failurePolicy Ignore)
            cluster.kubectl("delete", "pod", "reader", "-n", namespace, "--wait=true")
            return None
        return result.stderr

    message = wait_until(rejected, timeout=60, what="the webhook to reject")
    assert "denied the request" in message and 'Crew "gone"' in message
    assert '"kept-journal"' in message


def test_webhook_itself_rejects_shared_modes(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    # The API server's CEL rule answers first, so kubectl never reaches the webhook with a
    # shared mode; ask the running webhook directly, as the API server would.
    _webhook_serving(cluster, operator_process)
    cfg = cluster.get_json("validatingwebhookconfiguration", "crewfence.dev")
    hook = next(w for w in cfg["webhooks"] if w["clientConfig"]["url"].endswith("/validate-crew"))
    ca = base64.b64decode(hook["clientConfig"]["caBundle"])
    context = ssl.create_default_context(cadata=ca.decode())
    crew = _small_crew("shared", namespace, accessMode="ReadWriteMany")
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "e2e-1", "operation": "CREATE", "namespace": namespace, "name": "shared",
        "kind": {"group": "crewfence.dev", "version": "v1alpha1", "kind": "Crew"},
        "resource": {"group": "crewfence.dev", "version": "v1alpha1", "resource": "crews"},
        "userInfo": {"username": "e2e"}, "object": crew}}
    request = urllib.request.Request(hook["clientConfig"]["url"], method="POST",
                                     data=json.dumps(review).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=30) as resp:
        answer = json.load(resp)["response"]
    assert answer["uid"] == "e2e-1" and answer["allowed"] is False
    assert answer["status"]["code"] == 403
    assert "ReadWriteMany" in answer["status"]["message"]
    assert "ReadWriteOncePod" in answer["status"]["message"]
