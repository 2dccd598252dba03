"""``spec.resume``: the successor's start request, its gate and its placement (pure parts:
crewjob/spec.py, crewjob/supersede.py, crewjob/machine.py)."""

from __future__ import annotations

from typing import Any

import pytest
from crewfence_operator.crewjob import machine as m
from crewfence_operator.crewjob import supersede
from crewfence_operator.crewjob.machine import Admit, CrewView, Finish, Gate, Memory, Wait
from crewfence_operator.crewjob.outcome import Reason
from crewfence_operator.crewjob.replicas import Replica, ReplicaState
from crewfence_operator.crewjob.spec import JobSpec, SpecError
from crewfence_operator.sidecar_client import Lookup

NOW = 1_800_000_000.0
RESUMING = {"crewRef": {"name": "research"}, "operation": "run", "input": {"topic": "x"},
            "supersedes": "job-1", "resume": True}


def test_a_resuming_spec_starts_with_resume_from_the_predecessors_default_action_id() -> None:
    spec = JobSpec.from_resource("team-a", "job-1-rerun", RESUMING)
    assert spec.resume_from == "team-a/job-1"
    assert spec.start_request().to_wire()["resume_from"] == "team-a/job-1"
    plain = JobSpec.from_resource("team-a", "job-1-rerun", {**RESUMING, "resume": False})
    assert plain.resume_from is None and "resume_from" not in plain.start_request().to_wire()
    assert spec.request_hash() != plain.request_hash()
    with pytest.raises(SpecError):
        JobSpec.from_resource("team-a", "x", {k: v for k, v in RESUMING.items()
                                              if k != "supersedes"})


def _predecessor(outcome: str, *, journaled: bool = True, action_id: str | None = None,
                 ordinal: int = 2) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": "Failed", "uncertainOutcome": True,
        "resolution": {"outcome": outcome,
                       "journal": {"state": "Journaled" if journaled else "Pending"}},
        "assignment": {"ordinal": ordinal, "pod": f"research-{ordinal}", "claim": "c",
                       "journalId": "j2"}}
    if action_id:
        status["actionId"] = action_id
    return {"metadata": {"namespace": "team-a", "name": "job-1"},
            "spec": {"resolution": {"outcome": outcome, "note": "n"}}, "status": status}


def _decide(pred: dict[str, Any], resume_from: str | None = "team-a/job-1"
            ) -> supersede.GateDecision:
    return supersede.decide(successor_name="job-1-rerun", successor_action_id="team-a/job-1-rerun",
                            predecessor=pred, predecessor_name="job-1", resume_from=resume_from)


def test_a_resume_may_follow_happened_and_is_pinned_to_the_predecessors_replica() -> None:
    d = _decide(_predecessor("Happened"))
    assert d.proceed and d.pin == (2, "j2")
    # without resume, Happened still refuses a successor for good
    assert _decide(_predecessor("Happened"), resume_from=None).gate is supersede.Gate.REFUSE
    d = _decide(_predecessor("NotHappened"))
    assert d.proceed and d.pin == (2, "j2")
    assert _decide(_predecessor("NotHappened"), resume_from=None).pin is None


def test_a_resume_waits_until_the_sidecar_journaled_the_resolution() -> None:
    d = _decide(_predecessor("NotHappened", journaled=False))
    assert d.gate is supersede.Gate.WAIT and d.code == "predecessor_resolution_not_journaled"


def test_a_resume_of_a_predecessor_with_another_action_id_is_refused() -> None:
    d = _decide(_predecessor("NotHappened", action_id="custom-id"))
    assert d.gate is supersede.Gate.REFUSE and d.code == "resume_mismatch"


def _replica(k: int, *, ready: bool = True, journal: str | None = None) -> Replica:
    return Replica(ordinal=k, pod=f"research-{k}", claim=f"state-{k}", address=f"10.0.0.{k}:1",
                   journal_id=journal or f"j{k}", ready=ready, fenced=False,
                   state=ReplicaState.ACTIVE)


def _obs(*replicas: Replica, gate: Gate) -> m.Observation:
    spec = JobSpec.from_resource("team-a", "job-1-rerun", RESUMING)
    return m.Observation(namespace="team-a", name="job-1-rerun", generation=1, spec=spec,
                         status={}, crew=CrewView(tuple(replicas), True),
                         memory=Memory(probes={r.ordinal: Lookup() for r in replicas}),
                         now=NOW, deleting=False, gate=gate, assigned_claim_exists=False)


PIN = Gate(pin_ordinal=2, pin_journal="j2")


def test_a_resume_is_admitted_on_the_predecessors_replica_only() -> None:
    for _ in range(3):
        d = m.decide(_obs(_replica(0), _replica(1), _replica(2), gate=PIN))
        assert isinstance(d.step, Admit) and d.step.replica.ordinal == 2


def test_a_resume_waits_with_a_reason_while_that_replica_cannot_serve() -> None:
    d = m.decide(_obs(_replica(0), _replica(1), _replica(2, ready=False), gate=PIN))
    assert isinstance(d.step, Wait)
    assert d.patch is not None
    assert d.patch["reason"] == Reason.PREDECESSOR_REPLICA_UNAVAILABLE.value
    assert "replica 2" in d.patch["message"]


def test_a_resume_whose_predecessors_journal_was_replaced_fails() -> None:
    d = m.decide(_obs(_replica(0), _replica(2, journal="j-new"), gate=PIN))
    assert isinstance(d.step, Finish)
    assert d.step.verdict.failure is not None
    assert d.step.verdict.failure.code == "resume_journal_gone"


# --- kubectl crewfence rerun --resume / explain ---------------------------------------------
def test_rerun_resume_writes_spec_resume() -> None:
    from crewfence_operator.kubectl import rerun

    pred = {"metadata": {"name": "job-1", "namespace": "team-a"},
            "spec": {"crewRef": {"name": "research"}, "operation": "run", "input": {}}}
    assert rerun.successor_body(pred, "job-1-rerun", resume=True)["spec"]["resume"] is True
    assert "resume" not in rerun.successor_body(pred, "job-1-rerun")["spec"]


def _ev(name: str, **data: Any) -> dict[str, Any]:
    return {"event": name, "data": data}


def test_explain_puts_both_trajectories_side_by_side() -> None:
    from crewfence_operator.kubectl.trajectory import side_by_side

    pred = [_ev("task_started", task="a", index=0), _ev("task_completed", task="a", index=0),
            _ev("task_started", task="b", index=1),
            _ev("tool_call_started", tool="t/x", task_index=1, call_index=0,
                idempotency_key="cfk1-aaaaaaaaaaaaaaaa"),
            _ev("tool_call_finished", task_index=1, call_index=0,
                idempotency_key="cfk1-aaaaaaaaaaaaaaaa"),
            _ev("tool_call_started", tool="t/x", task_index=1, call_index=1,
                idempotency_key="cfk1-bbbbbbbbbbbbbbbb")]
    succ = [_ev("task_reused", task="a", index=0), _ev("task_started", task="b", index=1),
            _ev("tool_call_reused", tool="t/x", task_index=1, call_index=0, action="replay",
                idempotency_key="cfk1-aaaaaaaaaaaaaaaa"),
            _ev("tool_call_started", tool="t/x", task_index=1, call_index=1,
                resume="rerun_same_key", idempotency_key="cfk1-bbbbbbbbbbbbbbbb"),
            _ev("tool_call_finished", task_index=1, call_index=1,
                idempotency_key="cfk1-bbbbbbbbbbbbbbbb"),
            _ev("task_completed", task="b", index=1)]
    rows = side_by_side(pred, succ)
    assert rows[0] == "    task 0 a: predecessor completed; successor reused from the journal"
    assert rows[1] == "    task 1 b: predecessor started; successor completed"
    assert "predecessor ran (cfk1-aaaaaaaaaaaa), finished; successor answered from the " \
           "journal" in rows[2]
    assert "predecessor ran (cfk1-bbbbbbbbbbbb), in doubt; successor ran again, same key " \
           "(cfk1-bbbbbbbbbbbb), finished" in rows[3]


def test_explain_counts_each_tasks_model_calls_made_and_answered_from_the_journal() -> None:
    from crewfence_operator.kubectl.trajectory import side_by_side

    pred = [_ev("task_started", task="c", index=2),
            _ev("model_call", task="c", task_index=2, model_index=0)]
    succ = [_ev("task_started", task="c", index=2),
            _ev("model_call_reused", task="c", task_index=2, model_index=0),
            _ev("model_call", task="c", task_index=2, model_index=1),
            _ev("task_completed", task="c", index=2)]
    assert side_by_side(pred, succ)[1] == (
        "      model calls: predecessor 1 made; successor 1 made, 1 from the journal")


def test_the_followed_stream_counts_what_a_resumed_job_reused() -> None:
    from crewfence_operator.crewjob.effects import EffectLog
    from crewfence_sidecar.contract import JobEvent

    log = EffectLog()
    raw = [("started", {"resume_from": "team-a/job-1"}),
           ("task_reused", {"task": "a", "index": 0, "total": 2, "from_action": "team-a/job-1"}),
           ("tool_call_reused", {"tool": "t", "task_index": 1, "call_index": 0,
                                 "idempotency_key": "k", "action": "replay",
                                 "from_action": "team-a/job-1"}),
           ("model_call_reused", {"model": "m", "task_index": 1, "model_index": 0,
                                  "request_sha256": "a" * 64, "from_action": "team-a/job-1"}),
           ("model_call", {"model": "m", "task_index": 1, "model_index": 1}),
           ("task_completed", {"task": "b", "index": 1, "total": 2})]
    for seq, (name, data) in enumerate(raw):
        log.observe(JobEvent(event=name, sequence=seq, data=data))
    effects = log.summary().to_status()
    assert effects["reused"] == {"fromActionId": "team-a/job-1", "tasks": 1, "toolCalls": 1,
                                 "modelCalls": 1, "batchItems": 0}
    assert (effects["tasksCompleted"], effects["tasksTotal"], effects["toolCalls"],
            effects["modelCalls"]) == (1, 2, 0, 1)


def test_logs_say_what_a_resumed_job_took_from_the_journal() -> None:
    from crewfence_operator.kubectl.timeline import event_line

    def line(name: str, **data: Any) -> str:
        return event_line({"event": name, "sequence": 1, "data": data})

    assert "reused from p's journal (not run again)" in line(
        "task_reused", task="a", index=0, total=2, from_action="p")
    assert "answered from the journal (not executed again)" in line(
        "tool_call_reused", tool="t", action="replay")
    assert "not made again (resolved Happened)" in line(
        "tool_call_reused", tool="t", action="already_made")
    assert "answered from p's journal (request matched; no call made)" in line(
        "model_call_reused", task="a", model_index=0, from_action="p")
