"""The CrewJob state machine at the edges, on the real control plane (issue 8):

- a Crew deleted under a running job ends it Failed, uncertain, JournalLost, in bounded time;
- a running CrewJob deleted and its manifest re-applied shows the Action cancelled (the probe
  finds the cancelled record; nothing runs a second time);
- a cancel requested while the sidecar container is being restarted (kill -9 by the pod runner)
  ends with the restored record's verdict, never "nothing was cancelled", never a second run.
"""

from __future__ import annotations

import json
import signal

import pytest
from crewjob_support import (
    apply_obj,
    condition,
    crew_access,
    crew_replicas,
    crewjob_manifest,
    get_job,
    metric_total,
    research_crew,
    sidecar_get,
    sidecar_record,
    wait_crew_ready,
    wait_for,
    wait_phase,
    wait_warning,
)
from harness.handles import Cluster, Operator, PodRunner

pytestmark = pytest.mark.slow


@pytest.fixture
def ns(cluster: Cluster, operator_process: Operator, namespace: str) -> str:
    assert apply_obj(cluster, research_crew(1), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "research", 1)
    return namespace


def admissions(cluster: Cluster, ns: str) -> float:
    rep = crew_replicas(cluster, ns, "research")[0]
    _, text = sidecar_get(rep, "/metrics", crew_access(cluster, ns, "research"))
    return metric_total(text, "crewfence_sidecar_admissions_total")


def test_crew_deleted_under_a_running_job_is_journal_lost(cluster: Cluster, ns: str) -> None:
    job = crewjob_manifest("orphaned", "run", {"topic": "[[sleep:300]] orphaned"})
    assert apply_obj(cluster, job, ns).returncode == 0
    wait_phase(cluster, ns, "orphaned", ("Running",), timeout=180)
    cluster.kubectl("delete", "crew", "research", "-n", ns, "--wait=false", check=True)
    obj = wait_phase(cluster, ns, "orphaned", timeout=240)
    status = obj["status"]
    assert (status["phase"], status["reason"], status["uncertainOutcome"]) == (
        "Failed", "JournalLost", True), json.dumps(status)
    assert status["failure"]["code"] in ("crew_deleted", "claim_gone")
    assert "Reconcile external effects" in status["recovery"]
    uncertain = condition(obj, "OutcomeUncertain")
    assert uncertain is not None and uncertain["status"] == "True"
    wait_warning(cluster, ns, "orphaned", "OutcomeUncertainJournalLost")


def test_running_job_deleted_and_reapplied_shows_the_action_cancelled(
        cluster: Cluster, ns: str) -> None:
    job = crewjob_manifest("resync", "run", {"topic": "[[sleep:300]] resync"})
    assert apply_obj(cluster, job, ns).returncode == 0
    first = wait_phase(cluster, ns, "resync", ("Running",), timeout=180)
    started = first["status"].get("startedAt")
    cluster.kubectl("delete", "crewjob", "resync", "-n", ns, "--wait=true", "--timeout=120s",
                    check=True)
    code, record = sidecar_record(cluster, ns, "research", 0, f"{ns}/resync")
    assert code == 200 and record is not None and record["status"] == "cancelled"
    assert apply_obj(cluster, job, ns).returncode == 0  # the GitOps resync
    again = wait_phase(cluster, ns, "resync", timeout=180)
    status = again["status"]
    assert status["phase"] == "Cancelled", json.dumps(status)
    assert status["assignment"]["ordinal"] == 0
    if started:
        assert status["startedAt"] == started  # the original record, not a new run
    assert admissions(cluster, ns) == 1


def test_cancel_during_a_sidecar_restart(cluster: Cluster, ns: str,
                                         pod_runner: PodRunner) -> None:
    job = crewjob_manifest("cancel-restart", "run", {"topic": "[[sleep:300]] cancel-restart"})
    assert apply_obj(cluster, job, ns).returncode == 0
    running = wait_phase(cluster, ns, "cancel-restart", ("Running",), timeout=180)
    pod = running["status"]["assignment"]["pod"]
    pod_runner.kill(ns, pod, sig=signal.SIGKILL)
    cluster.kubectl("patch", "crewjob", "cancel-restart", "-n", ns, "--type", "merge",
                    "-p", '{"spec":{"cancel":true}}', check=True)
    obj = wait_phase(cluster, ns, "cancel-restart", timeout=240)
    status = obj["status"]
    # The restarted sidecar restored the running record as failed + uncertain: that record,
    # not a guess, is the verdict; the cancel was requested and is reported as such.
    assert (status["phase"], status["reason"], status["uncertainOutcome"]) == (
        "Failed", "SidecarRestarted", True), json.dumps(status)
    assert status["cancellation"]["requested"] is True
    assert "nothing was cancelled" not in json.dumps(status)
    wait_for(lambda: pod_runner.pid(ns, pod) is not None, timeout=120,
             what="the sidecar container restarted")
    code, record = sidecar_record(cluster, ns, "research", 0, f"{ns}/cancel-restart")
    assert code == 200 and record is not None
    assert (record["status"], record["uncertain_outcome"]) == ("failed", True)
    assert admissions(cluster, ns) == 0  # the restarted process admitted nothing again
    assert get_job(cluster, ns, "cancel-restart")["status"]["phase"] == "Failed"


def test_crew_deleted_with_orphan_and_recreated_continues_the_job(
        cluster: Cluster, ns: str) -> None:
    """Issue 19: a missing Crew object alone is no lost journal. ``--cascade=orphan`` leaves
    pod and claim; the job waits (CrewNotFound, never JournalLost), the re-created Crew adopts
    its pod (not fenced as foreign) and the job ends with the record's own outcome."""
    job = crewjob_manifest("orphan-crew", "run", {"topic": "[[sleep:20]] orphan crew"})
    assert apply_obj(cluster, job, ns).returncode == 0
    wait_phase(cluster, ns, "orphan-crew", ("Running",), timeout=180)
    before = admissions(cluster, ns)
    crew = cluster.get_json("crew", "research", "-n", ns)
    cluster.kubectl("delete", "crew", "research", "-n", ns, "--cascade=orphan", "--wait=true",
                    "--timeout=60s", check=True)
    waiting = wait_for(
        lambda: (o := get_job(cluster, ns, "orphan-crew")) and
        (o.get("status") or {}).get("reason") == "CrewNotFound" and o,
        timeout=60, what="the job to wait for its Crew")
    assert waiting["status"]["phase"] == "Running" and not waiting["status"].get(
        "uncertainOutcome"), json.dumps(waiting["status"])
    assert "still exists" in waiting["status"]["message"]
    pod = cluster.get_json("pod", "research-0", "-n", ns)
    assert pod is not None and not pod["metadata"].get("ownerReferences"), \
        "the garbage collector orphaned the pod"

    assert apply_obj(cluster, research_crew(1), ns).returncode == 0
    status = wait_phase(cluster, ns, "orphan-crew", timeout=240)["status"]
    assert (status["phase"], status.get("uncertainOutcome", False)) == ("Succeeded", False), \
        json.dumps(status)
    adopted = cluster.get_json("pod", "research-0", "-n", ns)
    new_crew = cluster.get_json("crew", "research", "-n", ns)
    assert new_crew["metadata"]["uid"] != crew["metadata"]["uid"]
    assert [r["uid"] for r in adopted["metadata"]["ownerReferences"]] == [
        new_crew["metadata"]["uid"]]
    replicas = crew_replicas(cluster, ns, "research")
    assert not any(r.get("fenced") for r in replicas), json.dumps(replicas)
    assert admissions(cluster, ns) == before, "nothing was admitted a second time"


def test_the_output_configmap_is_this_crewjobs_or_the_status_says_why_not(
        cluster: Cluster, ns: str) -> None:
    """Issue 19: never point status at a ConfigMap that is not this CrewJob's output. Only an
    output larger than status holds (32 KiB) gets a ConfigMap: the topic makes it larger (the
    CrewOutput repeats each task's description)."""
    big = "lorem ipsum " * 3000
    foreign = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "taken-output"}, "data": {"output": "somebody else's"}}
    assert apply_obj(cluster, foreign, ns).returncode == 0
    assert apply_obj(cluster, crewjob_manifest("taken", "run", {"topic": f"cm {big}"}),
                     ns).returncode == 0
    status = wait_phase(cluster, ns, "taken")["status"]
    assert status["phase"] == "Succeeded" and "configMap" not in status["output"]
    assert status["output"]["truncated"] is True, "the output must not fit in status here"
    assert "does not belong to this CrewJob" in status["output"]["configMapError"]
    kept = cluster.get_json("configmap", "taken-output", "-n", ns)
    assert kept["data"] == {"output": "somebody else's"} and not kept["metadata"].get(
        "ownerReferences"), "a foreign ConfigMap is never touched"

    # Deleted with --cascade=orphan and re-applied: the earlier object's ConfigMap is taken
    # over by the new CrewJob (owner uid) and still holds the output.
    job = crewjob_manifest("again", "run", {"topic": f"cm again {big}"})
    assert apply_obj(cluster, job, ns).returncode == 0
    first = wait_phase(cluster, ns, "again")
    cluster.kubectl("delete", "crewjob", "again", "-n", ns, "--cascade=orphan", "--wait=true",
                    "--timeout=60s", check=True)
    assert apply_obj(cluster, job, ns).returncode == 0
    second = wait_phase(cluster, ns, "again")
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert second["status"]["output"]["configMap"]["name"] == "again-output"
    cm = cluster.get_json("configmap", "again-output", "-n", ns)
    assert [r["uid"] for r in cm["metadata"]["ownerReferences"]] == [second["metadata"]["uid"]]
    assert second["status"]["output"]["sha256"] == first["status"]["output"]["sha256"]
