"""The machine's Hold input (spec.suspend, Kueue: I8), the TTL decision (crewjob/ttl.py T1-T3)
and the Kueue Workload functions (crewjob/kueue.py K1-K4): pure, no I/O."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from crewfence_operator.crewjob import kueue, ttl
from crewfence_operator.crewjob import machine as m
from crewfence_operator.crewjob.machine import (
    Admit,
    Cancel,
    CrewView,
    Follow,
    Hold,
    Memory,
    Observation,
    Probe,
    Wait,
)
from crewfence_operator.crewjob.outcome import Phase
from crewfence_operator.crewjob.replicas import Replica, ReplicaState
from crewfence_operator.crewjob.spec import JobSpec, SpecError
from crewfence_operator.crewjob.status import health
from crewfence_operator.sidecar_client import Lookup
from crewfence_sidecar.contract import JobRecord, Status

NOW = 1_800_000_000.0
SPEC = JobSpec.from_resource("team-a", "job-1", {"crewRef": {"name": "research"},
                                                 "operation": "run", "input": {"topic": "x"}})


def replica(k: int, *, state: ReplicaState = ReplicaState.ACTIVE, up: bool = True,
            ready: bool = True, journal: str | None = None) -> Replica:
    return Replica(ordinal=k, pod=f"research-{k}", claim=f"state-{k}",
                   address=f"10.0.0.{k}:8090" if up else None,
                   journal_id=journal or f"j{k}", ready=ready and up, fenced=False, state=state)


def record(status: Status = Status.RUNNING, *, uncertain: bool = False,
           error: dict[str, Any] | None = None, spec: JobSpec = SPEC) -> JobRecord:
    return JobRecord(action_id=spec.action_id, crew_id="research", operation="run",
                     request_hash=spec.request_hash(), status=status, event_count=1,
                     created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:01Z",
                     output="out" if status is Status.COMPLETED else None, error=error,
                     uncertain_outcome=uncertain)


def assigned(k: int = 0, journal: str | None = None, at: float = NOW) -> dict[str, Any]:
    return {"phase": "Running", "reason": "Dispatched",
            "assignment": {"ordinal": k, "pod": f"research-{k}", "claim": f"state-{k}",
                           "journalId": journal or f"j{k}", "assignedAt": m.iso(at)}}


def obs(*replicas: Replica, status: dict[str, Any] | None = None, memory: Memory | None = None,
        spec: JobSpec | SpecError = SPEC, crew: bool = True, now: float = NOW,
        deleting: bool = False, gate: m.Gate = m.OPEN_GATE,
        claim_exists: bool | None = False) -> Observation:
    return Observation(namespace="team-a", name="job-1", generation=1, spec=spec,
                       status=status or {},
                       crew=CrewView(tuple(replicas), True) if crew else None,
                       memory=memory or Memory(), now=now, deleting=deleting, gate=gate,
                       assigned_claim_exists=claim_exists)


HELD = Hold(held=True, reason=m.HoldReason.SUSPENDED, message="spec.suspend is true")


def _with_hold(o: m.Observation, hold: Hold) -> m.Observation:
    return replace(o, hold=hold)


def _conditions(patch: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (patch or {}).get("conditions") or []}


# --- I8: held means never admitted --------------------------------------------------------
def test_held_probes_first_then_waits_pending_suspended_and_never_admits() -> None:
    assert isinstance(m.decide(_with_hold(obs(replica(0)), HELD)).step, Probe)
    d = m.decide(_with_hold(obs(replica(0), memory=Memory(probes={0: Lookup()})), HELD))
    assert isinstance(d.step, Wait)
    assert d.patch is not None and (d.patch["phase"], d.patch["reason"]) == ("Pending",
                                                                             "Suspended")
    assert "assignment" not in d.patch
    assert _conditions(d.patch)["Suspended"]["status"] == "True"
    assert _conditions(d.patch)["Reconciling"]["status"] == "True"


def test_resumed_admits_and_says_suspended_false() -> None:
    held = m.decide(_with_hold(obs(replica(0), memory=Memory(probes={0: Lookup()})), HELD))
    assert held.patch is not None
    d = m.decide(obs(replica(0), status=held.patch, memory=Memory(probes={0: Lookup()})))
    assert isinstance(d.step, Admit)
    assert _conditions(d.patch)["Suspended"]["status"] == "False"


def test_held_job_whose_action_is_already_running_is_attached_not_held() -> None:
    d = m.decide(_with_hold(obs(replica(0), memory=Memory(probes={0: Lookup(
        record=record())})), HELD))
    assert isinstance(d.step, Follow)


def test_eviction_of_an_assigned_running_job_is_a_cancel_naming_the_queue() -> None:
    evicted = Hold(held=True, reason=m.HoldReason.WAITING_FOR_WORKLOAD, queued=True,
                   evicted="Deactivated: the workload is deactivated")
    d = m.decide(_with_hold(obs(replica(0), status=assigned(),
                                memory=Memory(lookup=Lookup(record=record()))), evicted))
    assert isinstance(d.step, Cancel)
    assert "evicted by its queue" in d.step.reason
    assert d.patch is not None
    assert d.patch["cancellation"]["requested"] is True
    assert "evicted by its queue" in d.patch["cancellation"]["message"]


def test_a_running_job_without_eviction_is_not_cancelled_by_a_hold() -> None:
    d = m.decide(_with_hold(obs(replica(0), status=assigned(),
                                memory=Memory(lookup=Lookup(record=record()))), HELD))
    assert isinstance(d.step, Follow)


# --- kstatus health ---------------------------------------------------------------------
def test_terminal_health_is_never_neither_ready_nor_stalled() -> None:
    for phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED):
        for uncertain in (False, True):
            for cancel in (False, True):
                h = health(phase, uncertain=uncertain, cancel_requested=cancel)
                assert h.ready != h.stalled
    assert health(Phase.CANCELLED, uncertain=False, cancel_requested=True).ready
    assert health(Phase.CANCELLED, uncertain=False, cancel_requested=False).stalled
    assert health(Phase.FAILED, uncertain=True, cancel_requested=False, resolved=True).ready


# --- TTL --------------------------------------------------------------------------------
def _finished(**status: Any) -> dict[str, Any]:
    base = {"phase": "Succeeded", "finishedAt": "2026-12-01T10:00:00.250Z",
            "observedGeneration": 1}
    return {"metadata": {"generation": 1}, "spec": {"ttlSecondsAfterFinished": 60},
            "status": {**base, **status}}


FINISHED_AT = datetime(2026, 12, 1, 10, 0, 0, 250000, tzinfo=UTC).timestamp()


def test_ttl_counts_from_finished_at_and_own_ttl_wins() -> None:
    assert ttl.deletion_due(_finished(), {"crewJobDefaults": {"ttlSecondsAfterFinished": 5}},
                            FINISHED_AT + 10) == 50
    job = _finished()
    job["spec"] = {}
    assert ttl.deletion_due(job, {"crewJobDefaults": {"ttlSecondsAfterFinished": 5}},
                            FINISHED_AT + 10) == -5
    assert ttl.deletion_due(job, {}, FINISHED_AT + 10**6) is None  # no TTL: kept


def test_ttl_never_deletes_unresolved_uncertain_working_or_behind_jobs() -> None:
    late = FINISHED_AT + 10**6
    assert ttl.deletion_due(_finished(uncertainOutcome=True), None, late) is None
    assert ttl.deletion_due(_finished(uncertainOutcome=True,
                                      resolution={"outcome": "NotHappened"}), None, late) < 0
    assert ttl.deletion_due(_finished(phase="Running"), None, late) is None
    behind = _finished()
    behind["metadata"]["generation"] = 2
    assert ttl.deletion_due(behind, None, late) is None


# --- Kueue ------------------------------------------------------------------------------
JOB = {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewJob",
       "metadata": {"name": "j", "namespace": "team-a", "uid": "u-1",
                    "labels": {kueue.QUEUE_LABEL: "team", kueue.PRIORITY_CLASS_LABEL: "high"}},
       "spec": {"crewRef": {"name": "research"}, "operation": "run"}}


def _workload(**conditions: str) -> dict[str, Any]:
    return {"metadata": {"name": "w", "generation": 1},
            "status": {"conditions": [{"type": t, "status": s, "reason": "R", "message": "m"}
                                      for t, s in conditions.items()]}}


def test_workload_requests_one_crewjob_and_the_workers_memory_owned_by_the_job() -> None:
    body = kueue.workload_body(JOB, {"workerLimits": {"memoryMiB": 1024}}, priority=1000)
    requests = body["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]
    assert requests["requests"] == {kueue.RESOURCE: "1", "memory": "1024Mi"}
    assert body["spec"]["queueName"] == "team" and body["spec"]["priority"] == 1000
    [owner] = body["metadata"]["ownerReferences"]
    assert owner["uid"] == "u-1" and owner["controller"] is True
    assert body["metadata"]["labels"][kueue.JOB_UID_LABEL] == "u-1"
    assert kueue.workload_name("j", "u-1") != kueue.workload_name("j", "u-2")


def test_labelled_jobs_are_held_until_admitted_and_unlabelled_are_not() -> None:
    meta, spec = JOB["metadata"], JOB["spec"]
    assert kueue.hold_of(spec, meta, None, assigned=False).held
    pending = kueue.view_of(_workload(QuotaReserved="False"))
    assert kueue.hold_of(spec, meta, pending, assigned=False).held
    admitted = kueue.view_of(_workload(QuotaReserved="True", Admitted="True"))
    assert not kueue.hold_of(spec, meta, admitted, assigned=False).held
    assert kueue.hold_of({**spec, "suspend": True}, meta, admitted, assigned=False).held
    assert kueue.hold_of(spec, {"name": "j"}, None, assigned=False) == m.NO_HOLD


def test_eviction_is_a_cancel_only_once_assigned_and_requeue_gives_quota_back() -> None:
    meta, spec = JOB["metadata"], JOB["spec"]
    evicted = kueue.view_of(_workload(QuotaReserved="True", Admitted="True", Evicted="True"))
    before = kueue.hold_of(spec, meta, evicted, assigned=False)
    assert before.held and before.evicted is None
    after = kueue.hold_of(spec, meta, evicted, assigned=True)
    assert after.evicted is not None
    status = kueue.requeue_status({**_workload(QuotaReserved="True"), "status": {
        "admission": {"clusterQueue": "q"}, "conditions": []}}, "not dispatched", "T")
    assert status["admission"] is None
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "QuotaReserved": "False", "Admitted": "False"}


def test_finished_status_keeps_kueues_conditions_and_adds_finished() -> None:
    wl = _workload(QuotaReserved="True", Admitted="True")
    status = kueue.finished_status(wl, "Succeeded", "Completed", "T")
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "QuotaReserved": "True", "Admitted": "True", "Finished": "True"}


