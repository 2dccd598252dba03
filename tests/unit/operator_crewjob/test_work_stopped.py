"""A record that says its worker was stopped (``work_stopped``) changes the status and the
advice: ``status.cancellation.workStopped``/``stoppedAt`` and "work stopped at T: reconcile
effects up to T" instead of "assume work may continue"; the outcome stays uncertain."""

from __future__ import annotations

from typing import Any

import pytest
from crewfence_operator.crewjob import machine as m
from crewfence_operator.crewjob.effects import EffectLog
from crewfence_operator.crewjob.machine import CrewView, Finish, Memory, Observation
from crewfence_operator.crewjob.outcome import Phase, verdict_from_record, with_stop
from crewfence_operator.crewjob.replicas import Replica, ReplicaState
from crewfence_operator.crewjob.spec import JobSpec
from crewfence_operator.crewjob.status import Cancellation
from crewfence_operator.sidecar_client import Lookup
from crewfence_sidecar.contract import JobRecord, Status

SPEC = JobSpec.from_resource("team-a", "job-1", {"crewRef": {"name": "research"},
                                                 "operation": "run", "input": {"topic": "x"}})


def record(status: Status, *, uncertain: bool, error: dict[str, Any]) -> JobRecord:
    return JobRecord(action_id=SPEC.action_id, crew_id="research", operation="run",
                     request_hash=SPEC.request_hash(), status=status, event_count=2,
                     created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:03Z",
                     error=error, uncertain_outcome=uncertain)


def replica(k: int) -> Replica:
    return Replica(ordinal=k, pod=f"research-{k}", claim=f"state-{k}",
                   address=f"10.0.0.{k}:8090", journal_id=f"j{k}", ready=True, fenced=False,
                   state=ReplicaState.ACTIVE)


def obs(*replicas: Replica, memory: Memory) -> Observation:
    return Observation(namespace="team-a", name="job-1", generation=1, spec=SPEC, status={},
                       crew=CrewView(tuple(replicas), True), memory=memory, now=1_800_000_000.0,
                       deleting=False, gate=m.OPEN_GATE)

T = "2026-01-01T00:00:02.000Z"
STOPPED = {"work_stopped": True, "stopped_at": T, "stopped_by": "SIGTERM"}


@pytest.mark.parametrize("status, error", [
    (Status.CANCELLED, {"code": "cancelled", **STOPPED}),
    (Status.FAILED, {"code": "timeout", **STOPPED}),
    (Status.FAILED, {"code": "worker_died", "signal": "SIGKILL", **STOPPED}),
])
def test_a_stopped_worker_changes_the_advice_not_the_uncertainty(
        status: Status, error: dict[str, Any]) -> None:
    rec = record(status, uncertain=True, error=error)
    before = verdict_from_record(rec, thread_backed=True, cancel_requested=True)
    after = with_stop(before, rec)
    assert after.uncertain and after.phase is before.phase and after.reason is before.reason
    assert f"Work stopped at {T}: reconcile external effects up to {T}" in after.recovery
    assert "may continue" not in after.recovery


def test_without_the_stop_in_the_record_the_advice_stays() -> None:
    rec = record(Status.CANCELLED, uncertain=True, error={"code": "cancelled"})
    before = verdict_from_record(rec, thread_backed=True, cancel_requested=True)
    assert with_stop(before, rec) == before
    assert "may continue" in before.recovery


def test_the_status_shows_the_stop_even_for_a_timeout() -> None:
    rec: JobRecord = record(Status.FAILED, uncertain=True, error={"code": "timeout", **STOPPED})
    d = m.decide(obs(replica(0), memory=Memory(effects=EffectLog(next_sequence=2),
                                                probes={0: Lookup(record=rec)})))
    assert isinstance(d.step, Finish) and d.step.verdict.phase is Phase.FAILED
    assert d.patch is not None
    assert d.patch["cancellation"]["workStopped"] is True
    assert d.patch["cancellation"]["stoppedAt"] == T
    assert f"Work stopped at {T}" in d.patch["recovery"]


def test_cancellation_status_round_trips_the_stop() -> None:
    c = Cancellation(requested=True, dispatched=True, remote_stop_confirmed=True,
                     work_stopped=True, stopped_at=T)
    assert Cancellation.from_status(c.to_status()) == c
    assert "workStopped" not in Cancellation(requested=True).to_status()
