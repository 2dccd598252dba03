"""Crash recovery on the real control plane: a killed pod, a SIGKILLed operator, deletion."""

from __future__ import annotations

import json

import pytest
from crewjob_support import (
    TERMINAL,
    apply_obj,
    condition,
    crew_access,
    crew_replicas,
    crewjob_manifest,
    get_job,
    llm_calls,
    metric_total,
    operator_metric,
    research_crew,
    sidecar_get,
    sidecar_record,
    wait_crew_ready,
    wait_for,
    wait_phase,
    wait_warning,
)
from harness.handles import Cluster, Operator

pytestmark = pytest.mark.slow


@pytest.fixture
def ns(cluster: Cluster, operator_process: Operator, namespace: str) -> str:
    """A fresh namespace and Crew per test: a broken replica cannot leak into the next test."""
    assert apply_obj(cluster, research_crew(2), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "research", 2)
    return namespace


def test_killed_pod_gives_an_uncertain_outcome_and_no_rerun(
        cluster: Cluster, ns: str, operator_process: Operator) -> None:
    name = "killed"
    assert apply_obj(cluster, crewjob_manifest(name, "run", {"topic": "[[sleep:120]] crash"}),
                     ns).returncode == 0
    running = wait_phase(cluster, ns, name, ("Running",), timeout=180)
    pod = running["status"]["assignment"]["pod"]
    ordinal = running["status"]["assignment"]["ordinal"]
    journal = running["status"]["assignment"]["journalId"]
    before = operator_metric(operator_process.metrics_url,
                             "crewfence_operator_uncertain_outcomes_total", 'SidecarRestarted')
    cluster.kubectl("delete", "pod", pod, "-n", ns, "--force", "--grace-period=0", check=True)

    obj = wait_phase(cluster, ns, name, timeout=300)
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "SidecarRestarted"), \
        json.dumps(status)
    assert status["uncertainOutcome"] is True
    assert status["failure"]["retryable"] is False
    assert "Reconcile external effects" in status["recovery"]
    uncertain = condition(obj, "OutcomeUncertain")
    assert uncertain is not None and uncertain["status"] == "True"
    assert uncertain["reason"] == "SidecarRestarted"
    assert status["assignment"]["journalId"] == journal  # same journal, never moved
    wait_warning(cluster, ns, name, "OutcomeUncertain")
    after = operator_metric(operator_process.metrics_url,
                            "crewfence_operator_uncertain_outcomes_total", 'SidecarRestarted')
    assert after == before + 1
    # no re-run: the restarted sidecar keeps the failed+uncertain record and admitted nothing
    code, record = sidecar_record(cluster, ns, "research", ordinal, f"{ns}/{name}")
    assert code == 200 and record is not None
    assert (record["status"], record["uncertain_outcome"]) == ("failed", True)
    rep = next(r for r in crew_replicas(cluster, ns, "research") if r["ordinal"] == ordinal)
    _, metrics = sidecar_get(rep, "/metrics", crew_access(cluster, ns, "research"))
    assert metric_total(metrics, "crewfence_sidecar_admissions_total") == 0
    assert metric_total(metrics, "crewfence_offline_llm_calls_total") == 0
    assert get_job(cluster, ns, name)["status"]["phase"] == "Failed"


def test_operator_sigkill_with_50_in_flight(cluster: Cluster, ns: str,
                                            operator_process: Operator) -> None:
    # calls one job costs, measured with the same shape of input
    probe = crewjob_manifest("probe", "run", {"topic": "[[sleep:1]] probe"})
    base = sum(llm_calls(cluster, ns, "research").values())
    assert apply_obj(cluster, probe, ns).returncode == 0
    assert wait_phase(cluster, ns, "probe")["status"]["phase"] == "Succeeded"
    per_job = sum(llm_calls(cluster, ns, "research").values()) - base
    assert per_job > 0

    names = [f"flight-{i:02d}" for i in range(50)]
    docs = "\n---\n".join(json.dumps(crewjob_manifest(n, "run", {"topic": f"[[sleep:1]] {n}"}))
                          for n in names)
    start = sum(llm_calls(cluster, ns, "research").values())
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=docs, check=True)

    def some_running() -> bool:
        items = cluster.get_json("crewjobs", "-n", ns)["items"]
        phases = [((i.get("status") or {}).get("phase")) for i in items
                  if i["metadata"]["name"] in names]
        return sum(p == "Running" for p in phases) >= 5

    wait_for(some_running, timeout=180, what="CrewJobs in flight")
    operator_process.kill()
    assert not operator_process.alive()
    operator_process.start()

    def all_terminal() -> bool:
        items = cluster.get_json("crewjobs", "-n", ns)["items"]
        phases = {i["metadata"]["name"]: (i.get("status") or {}).get("phase") for i in items}
        return all(phases.get(n) in TERMINAL for n in names)

    wait_for(all_terminal, timeout=900, what="all 50 CrewJobs terminal", interval=2)
    items = {i["metadata"]["name"]: i for i in cluster.get_json("crewjobs", "-n", ns)["items"]}
    phases = [items[n]["status"]["phase"] for n in names]
    assert phases.count("Succeeded") == 50, phases
    assert sum(llm_calls(cluster, ns, "research").values()) - start == 50 * per_job


def test_deletion_cancels_or_orphans(cluster: Cluster, ns: str) -> None:
    for name, policy in (("del-cancel", "Cancel"), ("del-orphan", "Orphan")):
        job = crewjob_manifest(name, "run", {"topic": f"[[sleep:120]] {name}"},
                               deletionPolicy=policy)
        assert apply_obj(cluster, job, ns).returncode == 0
    assignments = {}
    for name in ("del-cancel", "del-orphan"):
        running = wait_phase(cluster, ns, name, ("Running",), timeout=180)
        assignments[name] = running["status"]["assignment"]["ordinal"]
    for name in ("del-cancel", "del-orphan"):
        cluster.kubectl("delete", "crewjob", name, "-n", ns, "--wait=true", "--timeout=90s",
                        check=True)
    _, cancelled = sidecar_record(cluster, ns, "research", assignments["del-cancel"],
                                  f"{ns}/del-cancel")
    _, orphaned = sidecar_record(cluster, ns, "research", assignments["del-orphan"],
                                 f"{ns}/del-orphan")
    assert cancelled is not None and cancelled["status"] == "cancelled"
    assert orphaned is not None and orphaned["status"] == "running"


def test_deletion_while_the_operator_is_down_still_cancels(
        cluster: Cluster, ns: str, operator_process: Operator) -> None:
    """kopf spawns no daemon for an object already being deleted: the deletion handler must
    still ask the sidecar to cancel before the finalizer goes (deletionPolicy Cancel)."""
    job = crewjob_manifest("del-while-down", "run", {"topic": "[[sleep:120]] del-while-down"})
    assert apply_obj(cluster, job, ns).returncode == 0
    running = wait_phase(cluster, ns, "del-while-down", ("Running",), timeout=180)
    ordinal = running["status"]["assignment"]["ordinal"]
    operator_process.kill()
    assert not operator_process.alive()
    cluster.kubectl("delete", "crewjob", "del-while-down", "-n", ns, "--wait=false", check=True)
    held = get_job(cluster, ns, "del-while-down")
    assert held is not None and held["metadata"].get("deletionTimestamp")  # the finalizer holds
    operator_process.start()

    def gone() -> bool:
        return get_job(cluster, ns, "del-while-down") is None

    wait_for(gone, timeout=180, what="the deleted CrewJob released by the restarted operator")
    _, record = sidecar_record(cluster, ns, "research", ordinal, f"{ns}/del-while-down")
    assert record is not None and record["status"] == "cancelled"
