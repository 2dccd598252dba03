"""A Crew on the real control plane: children, status from real sidecars, pod recreation on
the same claim, and scale-down that keeps a journal with records."""

from __future__ import annotations

import base64
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml
from crewjob_support import SidecarAccess, crew_access, sidecar_get
from harness.handles import Cluster, Operator, PodRunner, wait_until
from harness.operator_launch import operator_env

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "crew-research.yaml"
MANAGED = "app.kubernetes.io/managed-by"


def _crew(replicas: int, name: str = "research") -> dict[str, Any]:
    crew = yaml.safe_load(EXAMPLE.read_text())
    crew["metadata"]["name"] = name
    crew["spec"]["replicas"] = replicas
    return crew


def _status(cluster: Cluster, ns: str, name: str = "research") -> dict[str, Any]:
    crew = cluster.get_json("crew", name, "-n", ns) or {}
    return crew.get("status") or {}


def _ready(cluster: Cluster, ns: str, replicas: int, name: str = "research") -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        status = _status(cluster, ns, name)
        entries = status.get("replicas") or []
        ok = (status.get("readyReplicas") == replicas and len(entries) == replicas
              and all(r.get("ready") and r.get("journalId") for r in entries))
        return status if ok else None

    return wait_until(check, timeout=180, interval=0.5, what=f"{replicas} ready replicas")


def _token(cluster: Cluster, ns: str, crew: str = "research") -> str:
    secret = cluster.get_json("secret", f"{crew}-crewfence-token", "-n", ns)
    return base64.b64decode(secret["data"]["token"]).decode()


def test_crew_gets_children_and_status(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    # A bare operator (no CREWFENCE_OPERATOR_SIDECAR_TLS in its environment) talks mutual TLS.
    assert "CREWFENCE_OPERATOR_SIDECAR_TLS" not in operator_env(operator_process.launch)
    cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE), check=True)
    status = _ready(cluster, namespace, 2)
    crew = cluster.get_json("crew", "research", "-n", namespace)
    uid = crew["metadata"]["uid"]
    assert cluster.get_json("secret", "research-crewfence-ca", "-n", namespace) is not None
    assert status["observedGeneration"] == crew["metadata"]["generation"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"

    def owned(obj: dict[str, Any]) -> None:
        labels = obj["metadata"]["labels"]
        assert labels[MANAGED] == "crewfence" and labels["crewfence.dev/crew"] == "research"
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "Crew", "research", uid, True)

    journal_ids = set()
    for entry in status["replicas"]:
        ordinal = entry["ordinal"]
        pod = cluster.get_json("pod", f"research-{ordinal}", "-n", namespace)
        claim = cluster.get_json("pvc", f"research-state-{ordinal}", "-n", namespace)
        owned(pod)
        owned(claim)
        assert pod["metadata"]["labels"]["crewfence.dev/replica"] == str(ordinal)
        assert claim["metadata"]["labels"]["crewfence.dev/role"] == "state"
        assert claim["spec"]["accessModes"] == ["ReadWriteOncePod"]
        volumes = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
                   if "persistentVolumeClaim" in v]
        assert volumes == [f"research-state-{ordinal}"]
        assert entry["pod"] == f"research-{ordinal}"
        assert pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        assert entry["claim"] == f"research-state-{ordinal}"
        assert entry["address"] == f"{pod['status']['podIP']}:8090"
        assert entry["fenced"] is False
        journal_ids.add(entry["journalId"])
        # The journal id in status is the one the replica itself reports (over mutual TLS,
        # the replica's name verified).
        code, text = sidecar_get(entry, "/health", crew_access(cluster, namespace, "research"))
        assert code == 200 and json.loads(text)["journal_id"] == entry["journalId"]
        # ... and names its pod, so an answer from another pod at this address is dropped
        assert json.loads(text)["pod_uid"] == pod["metadata"]["uid"]
    assert len(journal_ids) == 2, "each replica has its own journal"
    # The helpers verify the replica's name, not just the CA: replica 1 cannot answer as 0.
    one = next(e for e in status["replicas"] if e["ordinal"] == 1)
    with pytest.raises(ssl.SSLCertVerificationError):
        crew_access(cluster, namespace, "research").request({**one, "ordinal": 0}, "/health")

    svc = cluster.get_json("service", "research", "-n", namespace)
    owned(svc)
    assert svc["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in svc["spec"]["ports"]] == [8090]
    secret = cluster.get_json("secret", "research-crewfence-token", "-n", namespace)
    owned(secret)
    token = _token(cluster, namespace)
    assert len(token) >= 32
    assert token not in operator_process.logs()
    assert token not in json.dumps(crew)

    printed = cluster.kubectl("get", "crw", "-n", namespace, check=True).stdout
    assert "research" in printed and "ReplicasReady" in printed


def test_deleted_pod_comes_back_on_the_same_claim(
    cluster: Cluster, operator_process: Operator, pod_runner: PodRunner, namespace: str
) -> None:
    cluster.apply({**_crew(1), "metadata": {"name": "research", "namespace": namespace}})
    before = _ready(cluster, namespace, 1)["replicas"][0]
    old_uid = cluster.get_json("pod", "research-0", "-n", namespace)["metadata"]["uid"]
    cluster.kubectl("delete", "pod", "research-0", "-n", namespace, "--wait=false", check=True)

    seen_uids: set[str] = set()

    def replaced() -> dict[str, Any] | None:
        pods = cluster.get_json("pods", "-n", namespace)["items"]
        on_claim = [p for p in pods if any(
            v.get("persistentVolumeClaim", {}).get("claimName") == "research-state-0"
            for v in p["spec"].get("volumes", []))]
        # Never two pod objects on one claim, not even while the old one terminates.
        assert len(on_claim) <= 1, [p["metadata"]["name"] for p in on_claim]
        seen_uids.update(p["metadata"]["uid"] for p in on_claim)
        status = _status(cluster, namespace)
        entry = (status.get("replicas") or [{}])[0]
        fresh = [p for p in on_claim if p["metadata"]["uid"] != old_uid]
        return entry if fresh and entry.get("ready") else None

    after = wait_until(replaced, timeout=180, interval=0.3, what="a new research-0, ready")
    assert after["claim"] == "research-state-0"
    assert after["journalId"] == before["journalId"], "same claim, same journal"
    assert len(seen_uids - {old_uid}) == 1


def _post_job(replica: dict[str, Any], access: SidecarAccess,
              action_id: str) -> dict[str, Any]:
    body = json.dumps({"crew_id": "research", "action_id": action_id, "operation": "run",
                       "input": {"topic": "bees"}}).encode()
    code, text = access.request(replica, "/jobs", method="POST", body=body, timeout=120,
                                headers={"Idempotency-Key": action_id,
                                         "Content-Type": "application/json"})
    assert code == 200, text
    answer: dict[str, Any] = json.loads(text)
    return answer


@pytest.mark.slow
def test_scale_down_keeps_a_journal_with_records(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    cluster.apply({**_crew(3), "metadata": {"name": "research", "namespace": namespace}})
    status = _ready(cluster, namespace, 3)
    replica2 = next(r for r in status["replicas"] if r["ordinal"] == 2)
    output = _post_job(replica2, crew_access(cluster, namespace, "research"), "scale-down-1")
    assert output["raw"]  # the blocking 200 is the completed run's output itself (AIP)

    # 3 -> 1: replica 1's journal is empty (drained, its pod goes; the claim stays by default),
    # replica 2's holds a record (its pod stays, draining, answering lookups).
    cluster.kubectl("patch", "crew", "research", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"replicas":1}}', check=True)

    def settled() -> dict[str, Any] | None:
        s = _status(cluster, namespace)
        pods = {p["metadata"]["name"] for p in
                cluster.get_json("pods", "-n", namespace)["items"]
                if not p["metadata"].get("deletionTimestamp")}
        claims = {c["metadata"]["name"] for c in
                  cluster.get_json("pvc", "-n", namespace)["items"]
                  if not c["metadata"].get("deletionTimestamp")}
        listed = {r["ordinal"]: r for r in s.get("replicas") or []}
        done = (pods == {"research-0", "research-2"} and sorted(listed) == [0, 2]
                and listed[2].get("state") == "Draining" and s.get("retainedClaims"))
        return {"status": s, "claims": claims, "replicas": listed} if done else None

    result = wait_until(settled, timeout=120, interval=0.5, what="scale-down to settle")
    assert {"research-state-1", "research-state-2"} <= result["claims"]
    draining = result["replicas"][2]
    assert draining["ready"] is False and draining["address"] == replica2["address"]
    assert draining["unarchivedRecords"] == 1
    (kept,) = result["status"]["retainedClaims"]
    assert kept["claim"] == "research-state-2" and kept["retainedRuns"] == 1
    cond = next(c for c in result["status"]["conditions"] if c["type"] == "StateClaimsRetained")
    assert cond["status"] == "True" and "research-state-2" in cond["message"]
    released = cluster.get_json("pvc", "research-state-1", "-n", namespace)
    assert "crewfence.dev/journal-empty" in released["metadata"]["annotations"]


def test_spec_change_rolls_the_pods(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    crew = _crew(1)
    crew["metadata"]["namespace"] = namespace
    crew["spec"]["operations"] = ["run"]
    cluster.apply(crew)
    before = _ready(cluster, namespace, 1)["replicas"][0]
    cluster.kubectl("patch", "crew", "research", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"operations":["run","knowledge_query"]}}', check=True)

    def rolled() -> dict[str, Any] | None:
        pod = cluster.get_json("pod", "research-0", "-n", namespace)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        status = _status(cluster, namespace)
        entry = (status.get("replicas") or [{}])[0]
        fresh = env.get("CREWFENCE_ALLOWED_OPERATIONS") == "run,knowledge_query"
        return entry if fresh and entry.get("ready") and status.get(
            "observedGeneration") == 2 else None

    after = wait_until(rolled, timeout=180, interval=0.5, what="the pod rolled to the new spec")
    code, text = sidecar_get(after, "/health", crew_access(cluster, namespace, "research"))
    # enabled startable operations plus the control ones, sorted (AIP)
    assert code == 200 and json.loads(text)["operations"] == ["cancel", "events",
                                                              "knowledge_query", "run", "status"]
    assert after["journalId"] == before["journalId"], "rolled on the same claim and journal"


def test_deleting_the_crew_removes_what_it_owns(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    crew = _crew(1)
    crew["metadata"]["namespace"] = namespace
    cluster.apply(crew)
    _ready(cluster, namespace, 1)
    result = cluster.kubectl("delete", "crew", "research", "-n", namespace, "--timeout=60s")
    assert result.returncode == 0, result.stderr  # the finalizer is released

    def gone() -> bool:
        left = [cluster.get_json(kind, name, "-n", namespace) for kind, name in (
            ("pod", "research-0"), ("service", "research"),
            ("secret", "research-crewfence-token"), ("configmap", "research-crewfence-crews"))]
        return all(obj is None for obj in left)

    wait_until(gone, timeout=120, what="owned objects garbage-collected")
