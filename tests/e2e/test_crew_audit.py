"""The shared-state audit: a foreign pod that got onto a state claim (here: it predates the
Crew, so no admission layer could refuse it) fences the replica, sets StateVolumeShared, posts
a Warning Event and counts in a metric."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from harness.handles import Cluster, Operator, wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "crew-research.yaml"


def _status(cluster: Cluster, ns: str) -> dict[str, Any]:
    return (cluster.get_json("crew", "research", "-n", ns) or {}).get("status") or {}


def _fenced_metric(operator: Operator) -> float:
    with urllib.request.urlopen(operator.metrics_url, timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("crewfence_operator_fenced_replicas "):
                return float(line.split()[1])
    raise AssertionError("crewfence_operator_fenced_replicas not exported")


def test_foreign_mount_fences_the_replica(
    cluster: Cluster, operator_factory: Callable[..., Operator], namespace: str
) -> None:
    operator = operator_factory(webhook_mode="off")
    assert _fenced_metric(operator) == 0
    # The API server's policy refuses a foreign pod on a Crew's state claim once the Crew
    # exists, so the foreign pod here predates the Crew (as one made before crewfence was
    # installed would): the audit is the layer that catches it.
    cluster.apply(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "backup-job",
                                                        "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "600"],
                                 "volumeMounts": [{"name": "s", "mountPath": "/data"}]}],
                 "volumes": [{"name": "s",
                              "persistentVolumeClaim": {"claimName": "research-state-1"}}]},
    }))
    crew = yaml.safe_load(EXAMPLE.read_text())
    crew["spec"]["replicas"] = 2
    crew["metadata"]["namespace"] = namespace
    cluster.apply(crew)

    def fenced() -> dict[str, Any] | None:
        status = _status(cluster, namespace)
        entries = {r["ordinal"]: r for r in status.get("replicas") or []}
        fenced_now = entries.get(1, {}).get("fenced") and status.get("readyReplicas") == 1
        return status if fenced_now else None

    status = wait_until(fenced, timeout=180, what="replica 1 fenced, replica 0 ready")
    entries = {r["ordinal"]: r for r in status["replicas"]}
    assert entries[0]["fenced"] is False
    reason = entries[1]["fenceReason"]
    assert '"research-state-1"' in reason and '"backup-job"' in reason
    assert status["readyReplicas"] == 1
    shared = next(c for c in status["conditions"] if c["type"] == "StateVolumeShared")
    assert shared["status"] == "True" and '"backup-job"' in shared["message"]

    def warning() -> list[dict[str, Any]]:
        events = cluster.get_json("events", "-n", namespace,
                                  "--field-selector", "reason=StateVolumeShared")["items"]
        return [e for e in events if e["type"] == "Warning"
                and e["involvedObject"]["name"] == "research"]

    (event,) = wait_until(warning, timeout=30, what="a StateVolumeShared Warning Event")
    assert '"research-state-1"' in event["message"] and '"backup-job"' in event["message"]
    assert _fenced_metric(operator) == 1

    cluster.kubectl("delete", "pod", "backup-job", "-n", namespace, "--wait=true", check=True)
    wait_until(lambda: not fenced() and _status(cluster, namespace).get("readyReplicas") == 2,
               timeout=60, what="the fence to lift")
    assert _fenced_metric(operator) == 0
