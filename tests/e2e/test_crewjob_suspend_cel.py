"""spec.suspend and spec.managedBy as the real API server enforces them (crds/crewjob.yaml CEL),
and a suspended CrewJob under the operator (held unadmitted, admitted when resumed).

The root rule sees status: once ``status.assignment`` exists (written before the admission
leaves, crewjob/machine.py I1) the job was admitted and ``suspend`` may not become true; the
message says to use spec.cancel. Before that, suspend may go both ways. The first two tests run
no operator: the status is written by hand, as the operator would.
"""

from __future__ import annotations

import json

from crewjob_support import (
    apply_obj,
    condition,
    crewjob_manifest,
    get_job,
    research_crew,
    sidecar_record,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness import controlplane
from harness.handles import Cluster, Operator


def _job(namespace: str, name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"crewRef": {"name": "research"}, "operation": "run", **spec}}


def _patch(cluster: Cluster, namespace: str, name: str, patch: dict[str, object],
           subresource: str | None = None) -> tuple[int, str]:
    args = ["-n", namespace, "patch", "crewjob", name, "--type=merge", "-p", json.dumps(patch)]
    if subresource:
        args.append(f"--subresource={subresource}")
    result = cluster.kubectl(*args, check=False)
    return result.returncode, result.stderr


def test_suspend_is_refused_once_admitted_and_free_before(cluster: Cluster, namespace: str) -> None:
    controlplane.install_crds(cluster.info, sorted((controlplane.REPO / "crds").glob("*.yaml")))
    cluster.apply(_job(namespace, "held", suspend=True))
    # Before admission: resume and suspend again, both allowed.
    assert _patch(cluster, namespace, "held", {"spec": {"suspend": False}})[0] == 0
    assert _patch(cluster, namespace, "held", {"spec": {"suspend": True}})[0] == 0
    assert _patch(cluster, namespace, "held", {"spec": {"suspend": False}})[0] == 0
    # The operator admits: the assignment is in status.
    rc, err = _patch(cluster, namespace, "held", {"status": {"phase": "Running", "assignment": {
        "ordinal": 0, "pod": "research-0", "claim": "state-research-0"}}}, "status")
    assert rc == 0, err
    rc, err = _patch(cluster, namespace, "held", {"spec": {"suspend": True}})
    assert rc != 0
    assert "spec.cancel" in err and "admitted" in err
    assert cluster.get_json("-n", namespace, "crewjob", "held")["spec"]["suspend"] is False
    # cancel is still the way to stop it.
    assert _patch(cluster, namespace, "held", {"spec": {"cancel": True}})[0] == 0


def test_managed_by_is_reserved(cluster: Cluster, namespace: str) -> None:
    controlplane.install_crds(cluster.info, sorted((controlplane.REPO / "crds").glob("*.yaml")))
    result = cluster.kubectl("-n", namespace, "create", "-f", "-", check=False, input=json.dumps(
        _job(namespace, "multi", managedBy="kueue.x-k8s.io/multikueue")))
    assert result.returncode != 0
    assert "reserved" in result.stderr and "MultiKueue" in result.stderr


def test_a_suspended_crewjob_waits_unadmitted_and_resuming_admits_it(
        cluster: Cluster, operator_process: Operator, namespace: str) -> None:
    assert apply_obj(cluster, research_crew(1), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "research", 1)
    assert apply_obj(cluster, crewjob_manifest("later", "run", {"topic": "held"},
                                               suspend=True), namespace).returncode == 0

    def held() -> dict[str, object] | None:
        obj = get_job(cluster, namespace, "later") or {}
        cond = condition(obj, "Suspended")
        return obj if cond is not None and cond["status"] == "True" else None

    obj = wait_for(held, timeout=60, what="the suspended CrewJob to say Suspended=True")
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("Pending", "Suspended")
    assert "assignment" not in status
    code, _ = sidecar_record(cluster, namespace, "research", 0, f"{namespace}/later")
    assert code == 404  # nothing was admitted
    assert _patch(cluster, namespace, "later", {"spec": {"suspend": False}})[0] == 0
    done = wait_phase(cluster, namespace, "later")
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"])
    suspended = condition(done, "Suspended")
    assert suspended is not None and suspended["status"] == "False"
    rc, err = _patch(cluster, namespace, "later", {"spec": {"suspend": True}})
    assert rc != 0 and "spec.cancel" in err
