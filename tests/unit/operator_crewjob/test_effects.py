"""status.effects / status.usage: the record's events summarized, in the terminal patch only.

Pure: ``crewfence_sidecar.contract.summarize_effects``, ``crewjob/effects.py`` and the machine's
``ReadEffects`` step (``crewjob/machine.py``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from crewfence_operator.crewjob import machine as m
from crewfence_operator.crewjob.effects import MAX_READS, UNREAD, EffectLog
from crewfence_operator.crewjob.machine import (
    CrewView,
    Finish,
    Lookup_,
    Memory,
    Observation,
    ReadEffects,
    Wait,
)
from crewfence_operator.crewjob.outcome import Phase, Reason
from crewfence_operator.crewjob.replicas import Replica, ReplicaState
from crewfence_operator.crewjob.spec import JobSpec
from crewfence_operator.sidecar_client import Lookup, SidecarFailure
from crewfence_sidecar.contract import (
    EventName,
    FailureCategory,
    JobEvent,
    JobRecord,
    Status,
    summarize_effects,
)

REPO = Path(__file__).resolve().parents[3]
NOW = 1_800_000_000.0
SPEC = JobSpec.from_resource("team-a", "job-1", {"crewRef": {"name": "desk"},
                                                 "operation": "run", "input": {}})
KEY1 = "cfk1-" + "a" * 40
KEY2 = "cfk1-" + "b" * 40
AT = "2026-12-01T20:10:11.123Z"


def ev(seq: int, name: str, **data: Any) -> JobEvent:
    return JobEvent(event=name, sequence=seq, data={"at": AT, **data})


def tool_started(seq: int, key: str, tool: str = "tickets/create_ticket",
                 server: str | None = "tickets", task: str = "file") -> JobEvent:
    return ev(seq, EventName.TOOL_CALL_STARTED, tool=tool, server=server, task=task,
              task_index=0, call_index=0, arguments_sha256="0" * 64, idempotency_key=key)


def tool_finished(seq: int, key: str, error: str | None = None) -> JobEvent:
    return ev(seq, EventName.TOOL_CALL_FINISHED, tool="tickets/create_ticket",
              server="tickets", task="file", task_index=0, call_index=0,
              idempotency_key=key, result_sha256=None if error else "1" * 64, error=error,
              duration_ms=3.0)


def run_events(*, second_finished: bool, terminal: str | None = None) -> list[JobEvent]:
    """started, one task with a model call and two tool calls (the second maybe unfinished)."""
    events = [
        ev(0, EventName.STARTED),
        ev(1, EventName.TASK_STARTED, task="file", index=0, total=2, agent="Clerk"),
        ev(2, EventName.MODEL_CALL, model="crewfence/offline", call_index=0, task="file",
           prompt_tokens=120, completion_tokens=30, duration_ms=1.5),
        tool_started(3, KEY1), tool_finished(4, KEY1),
        ev(5, EventName.MODEL_CALL, model="crewfence/offline", call_index=1, task="file",
           prompt_tokens=None, completion_tokens=None, duration_ms=1.0),
        tool_started(6, KEY2),
    ]
    if second_finished:
        events.append(tool_finished(7, KEY2))
    if terminal:
        events.append(ev(len(events), terminal))
    return events


# --- summarize_effects (the contract's pure helper) ---------------------------------------------
def test_a_started_call_without_its_finish_is_in_doubt() -> None:
    s = summarize_effects(run_events(second_finished=False))
    assert (s.tool_calls, s.model_calls, s.tasks_total, s.tasks_completed) == (2, 2, 2, 0)
    assert (s.prompt_tokens, s.completion_tokens) == (120, 30)  # null counts add nothing
    assert [c.idempotency_key for c in s.in_doubt] == [KEY2]
    assert s.in_doubt_message() == (
        f"1 tool call in doubt: `create_ticket` (server tickets), task `file`, key {KEY2}")


def test_a_finished_call_with_an_error_is_not_in_doubt() -> None:
    events = [tool_started(0, KEY1), tool_finished(1, KEY1, error="McpError: boom")]
    s = summarize_effects(events)
    assert s.in_doubt == [] and s.in_doubt_message() == "no tool call was in flight"


def test_wire_dicts_and_unknown_events_are_accepted() -> None:
    wire = [e.to_wire() for e in run_events(second_finished=True)]
    wire.append({"event": "something_new", "sequence": 99, "data": {"x": 1}})
    assert summarize_effects(wire).to_status() == {
        "tasksCompleted": 0, "tasksTotal": 2, "modelCalls": 2, "toolCalls": 2,
        "inDoubt": [], "inDoubtCount": 0}


def test_status_lists_at_most_ten_calls_but_counts_all() -> None:
    events = [tool_started(i, f"cfk1-{i:040d}", tool="lookup", server=None) for i in range(12)]
    s = summarize_effects(events)
    status = s.to_status()
    assert status["inDoubtCount"] == 12 and len(status["inDoubt"]) == 10
    assert status["inDoubt"][0] == {"tool": "lookup", "server": None, "task": "file",
                                    "startedAt": AT, "idempotencyKey": f"cfk1-{0:040d}"}
    assert s.in_doubt_message().startswith("12 tool calls in doubt: `lookup` (python)")
    assert s.in_doubt_message().endswith("; and 2 more")


# --- EffectLog: only a log from sequence 0 without a gap is used ---------------------------------
def test_a_log_resumed_mid_record_never_covers_it() -> None:
    log = EffectLog()
    for event in run_events(second_finished=False)[3:]:
        log.observe(event)
    assert log.broken and log.events == []
    assert not log.covers(rec(Status.FAILED, events=7))


def test_a_log_from_zero_covers_the_record_once_it_reached_event_count() -> None:
    log = EffectLog()
    events = run_events(second_finished=False, terminal=EventName.FAILED)
    for event in events[:-1]:
        log.observe(event)
    assert not log.covers(rec(Status.FAILED, events=len(events)))
    log.observe(events[-1])
    assert log.covers(rec(Status.FAILED, events=len(events)))
    assert [e.event for e in log.events if e.event == EventName.STARTED] == []  # effects only


# --- the machine ---------------------------------------------------------------------------------
def replica() -> Replica:
    return Replica(ordinal=0, pod="desk-0", claim="desk-state-0", address="10.0.0.1:8090",
                   journal_id="j0", ready=True, fenced=False, state=ReplicaState.ACTIVE)


def rec(status: Status, *, events: int, uncertain: bool = False,
        code: str | None = None) -> JobRecord:
    return JobRecord(action_id=SPEC.action_id, crew_id="desk", operation="run",
                     request_hash=SPEC.request_hash(), status=status, event_count=events,
                     created_at="2026-12-01T20:10:00Z", updated_at="2026-12-01T20:10:20Z",
                     output="done" if status is Status.COMPLETED else None,
                     error={"code": code, "message": "x"} if code else None,
                     uncertain_outcome=uncertain)


ASSIGNED = {"phase": "Running", "reason": "Admitted", "startedAt": "2026-12-01T20:10:00Z",
            "assignment": {"ordinal": 0, "pod": "desk-0", "claim": "desk-state-0",
                           "journalId": "j0", "assignedAt": m.iso(NOW)}}


def decide(memory: Memory) -> m.Decision:
    return m.decide(Observation(namespace="team-a", name="job-1", generation=1, spec=SPEC,
                                status=ASSIGNED, crew=CrewView((replica(),), True),
                                memory=memory, now=NOW))


def followed(events: list[JobEvent]) -> EffectLog:
    log = EffectLog()
    for event in events:
        log.observe(event)
    return log


RESTARTED = rec(Status.FAILED, events=8, uncertain=True, code="sidecar_restarted")
"""The sidecar was killed while the second call ran: its restart failed the record (event 7)."""


def test_killed_mid_call_names_exactly_the_call_in_flight() -> None:
    events = run_events(second_finished=False)
    events.append(ev(7, EventName.FAILED))
    d = decide(Memory(lookup=Lookup(record=RESTARTED, journal_id="j0"),
                      effects=followed(events)))
    assert isinstance(d.step, Finish) and d.step.verdict.uncertain
    assert d.patch is not None
    assert d.patch["effects"]["inDoubt"] == [{
        "tool": "tickets/create_ticket", "server": "tickets", "task": "file",
        "startedAt": AT, "idempotencyKey": KEY2}]
    assert d.patch["effects"]["inDoubtCount"] == 1
    assert d.patch["usage"] == {"promptTokens": 120, "completionTokens": 30,
                                "modelCalls": 2, "toolCalls": 2}
    assert (f"1 tool call in doubt: `create_ticket` (server tickets), task `file`, key {KEY2}"
            in d.patch["message"])
    assert d.step.effects is not None and d.step.effects.tool_calls == 2


def test_killed_between_calls_says_no_call_was_in_flight() -> None:
    events = run_events(second_finished=True)
    events.append(ev(8, EventName.FAILED))
    record = rec(Status.FAILED, events=9, uncertain=True, code="sidecar_restarted")
    d = decide(Memory(lookup=Lookup(record=record, journal_id="j0"), effects=followed(events)))
    assert isinstance(d.step, Finish) and d.patch is not None
    assert d.patch["effects"]["inDoubt"] == [] and d.patch["effects"]["inDoubtCount"] == 0
    assert "no tool call was in flight" in d.patch["message"]


def test_a_completed_job_gets_effects_and_an_unchanged_message() -> None:
    events = run_events(second_finished=True, terminal=EventName.COMPLETED)
    record = rec(Status.COMPLETED, events=len(events))
    d = decide(Memory(lookup=Lookup(record=record, journal_id="j0"), effects=followed(events)))
    assert isinstance(d.step, Finish) and d.step.verdict.phase is Phase.SUCCEEDED
    assert d.patch is not None and d.patch["effects"]["toolCalls"] == 2
    assert "tool call" not in d.patch["message"]


def test_events_the_stream_did_not_cover_are_read_again_from_zero_before_finishing() -> None:
    resumed = followed(run_events(second_finished=False)[5:])  # an operator restart resumed at 5
    lookup = Lookup(record=RESTARTED, journal_id="j0")
    d = decide(Memory(lookup=lookup, effects=resumed))
    assert isinstance(d.step, ReadEffects) and d.patch is None  # no API write for this
    # the handler read the events from 0: now the one terminal patch carries the effects
    full = followed([*run_events(second_finished=False), ev(7, EventName.FAILED)])
    d2 = decide(replace_memory(d.memory, effects_read=full))
    assert isinstance(d2.step, Finish) and d2.patch is not None
    assert d2.patch["effects"]["inDoubt"][0]["idempotencyKey"] == KEY2


def replace_memory(memory: Memory, **changes: Any) -> Memory:
    return replace(memory, **changes)


def test_unreadable_events_are_retried_then_the_verdict_says_tool_calls_are_unknown() -> None:
    lost = SidecarFailure(FailureCategory.TRANSPORT, "transport_error", "reset", None)
    memory = Memory(lookup=Lookup(record=RESTARTED, journal_id="j0"),
                    effects=EffectLog(broken=True))
    steps: list[type] = []
    for _ in range(10):
        d = decide(memory)
        steps.append(type(d.step))
        if isinstance(d.step, Finish):
            break
        memory = d.memory
        if isinstance(d.step, ReadEffects):
            memory = replace_memory(memory, effects_read=lost)
        elif isinstance(d.step, Wait):
            memory = memory.fresh_round()
        elif isinstance(d.step, Lookup_):
            memory = replace_memory(memory, lookup=Lookup(record=RESTARTED, journal_id="j0"))
    assert steps.count(ReadEffects) == MAX_READS and steps[-1] is Finish
    assert d.patch is not None and "effects" not in d.patch
    assert UNREAD in d.patch["message"] and d.step.verdict.reason is Reason.SIDECAR_RESTARTED


def test_a_lost_journal_reports_what_the_stream_showed() -> None:
    events = run_events(second_finished=False)
    d = m.decide(Observation(namespace="team-a", name="job-1", generation=1, spec=SPEC,
                             status=ASSIGNED, crew=None,
                             memory=Memory(effects=followed(events), gone_since=NOW - 60),
                             now=NOW, assigned_claim_exists=False))
    assert isinstance(d.step, Finish) and d.step.verdict.reason is Reason.JOURNAL_LOST
    assert d.patch is not None and d.patch["effects"]["inDoubt"][0]["idempotencyKey"] == KEY2
    assert "as far as the operator read the event stream" in d.patch["message"]


# --- the CRD declares what the patch writes ------------------------------------------------------
def _jsonschema(node: Any) -> Any:
    if isinstance(node, list):
        return [_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _jsonschema(v) for k, v in node.items()
           if not k.startswith("x-kubernetes") and k != "nullable"}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if node.get("type") == "object" and "properties" in node:
        out["additionalProperties"] = False  # anything undeclared would be pruned
    return out


def test_effects_and_usage_are_declared_in_the_crewjob_crd() -> None:
    crd = yaml.safe_load((REPO / "crds" / "crewjob.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    props = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    events = [*run_events(second_finished=False), ev(7, EventName.FAILED)]
    d = decide(Memory(lookup=Lookup(record=RESTARTED, journal_id="j0"),
                      effects=followed(events)))
    assert d.patch is not None
    jsonschema.validate(d.patch["effects"], _jsonschema(props["effects"]))
    jsonschema.validate(d.patch["usage"], _jsonschema(props["usage"]))
