"""The replay decision of a resumed job (crewfence_sidecar.resume), pure: plans built from
journal events as the ledger writes them, and the decision for each call position."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import rfc8785
from crewfence_sidecar.contract import (
    ContractError,
    JobEvent,
    Operation,
    StartRequest,
    parse_start_request,
    request_hash,
    tool_idempotency_key,
)
from crewfence_sidecar.resume import (
    ALREADY_MADE_TEXT,
    ResumePlan,
    ToolAction,
    ToolReplay,
    build_plan,
    decide_tool,
    unresolved_in_doubt,
)

PRED = "pred-1"


def _events(*specs: tuple[str, dict[str, Any]]) -> list[JobEvent]:
    return [JobEvent(event=name, sequence=i, data=data) for i, (name, data) in enumerate(specs)]


def _started(task: int, call: int, tool: str = "tickets/create_ticket",
             args: str = "a" * 64) -> tuple[str, dict[str, Any]]:
    return ("tool_call_started", {"tool": tool, "task_index": task, "call_index": call,
                                  "arguments_sha256": args,
                                  "idempotency_key": tool_idempotency_key(PRED, task, call)})


def _finished(task: int, call: int, result: str | None) -> tuple[str, dict[str, Any]]:
    data: dict[str, Any] = {"task_index": task, "call_index": call,
                            "idempotency_key": tool_idempotency_key(PRED, task, call)}
    if result is not None:
        data["result"] = result
    return ("tool_call_finished", data)


def _completed(index: int, output: str | None, total: int = 4) -> tuple[str, dict[str, Any]]:
    data: dict[str, Any] = {"task": f"step{index}", "index": index, "total": total}
    if output is not None:
        data["output"] = output
    return ("task_completed", data)


def _crashed_in_third_task() -> list[JobEvent]:
    """Four tasks, one call each; killed during the third task's call."""
    return _events(("started", {}),
                   ("task_started", {"index": 0, "total": 4}), _started(0, 0),
                   _finished(0, 0, "r0"), _completed(0, "out0"),
                   ("task_started", {"index": 1, "total": 4}), _started(1, 0),
                   _finished(1, 0, "r1"), _completed(1, "out1"),
                   ("task_started", {"index": 2, "total": 4}), _started(2, 0),
                   ("failed", {"uncertain_outcome": True}))


def test_a_plan_reuses_the_completed_prefix_of_tasks_and_knows_the_call_in_doubt() -> None:
    plan = build_plan(PRED, _crashed_in_third_task(), "NotHappened")
    assert plan.task_outputs == ("out0", "out1") and plan.tasks_total == 4
    assert plan.calls[(2, 0)].finished is False
    assert plan.calls[(0, 0)].result == "r0"
    assert ResumePlan.from_wire(plan.to_wire()) == plan


def test_only_a_prefix_of_tasks_with_material_is_reused() -> None:
    events = _events(_completed(0, None), _completed(1, "out1"))  # task 0 had no material
    assert build_plan(PRED, events, None).task_outputs == ()
    events = _events(_completed(0, "out0"), _completed(2, "out2"))  # a gap at 1
    assert build_plan(PRED, events, None).task_outputs == ("out0",)


def test_a_matching_finished_call_is_answered_from_the_journal_with_its_key() -> None:
    plan = build_plan(PRED, _crashed_in_third_task(), "NotHappened")
    decision = decide_tool(plan, 0, 0, "tickets/create_ticket", "a" * 64)
    assert decision.action is ToolAction.REPLAY and decision.result == "r0"
    assert decision.key == tool_idempotency_key(PRED, 0, 0)


@pytest.mark.parametrize(("resolution", "action", "result"), [
    ("NotHappened", ToolAction.RERUN_SAME_KEY, None),
    ("Compensated", ToolAction.RERUN_SAME_KEY, None),
    ("Happened", ToolAction.ALREADY_MADE, ALREADY_MADE_TEXT),
])
def test_the_call_in_doubt_follows_the_resolution(resolution: str, action: ToolAction,
                                                   result: str | None) -> None:
    plan = build_plan(PRED, _crashed_in_third_task(), resolution)
    decision = decide_tool(plan, 2, 0, "tickets/create_ticket", "a" * 64)
    assert decision.action is action and decision.result == result
    assert decision.key == tool_idempotency_key(PRED, 2, 0)  # never a new key


def test_an_unresolved_call_in_doubt_is_never_run_and_blocks_admission() -> None:
    plan = build_plan(PRED, _crashed_in_third_task(), None)
    assert unresolved_in_doubt(plan) == [tool_idempotency_key(PRED, 2, 0)]
    decision = decide_tool(plan, 2, 0, "tickets/create_ticket", "a" * 64)
    assert decision.action is ToolAction.ALREADY_MADE  # not run
    assert unresolved_in_doubt(build_plan(PRED, _crashed_in_third_task(), "Happened")) == []


@pytest.mark.parametrize(("tool", "args"), [("tickets/other", "a" * 64),
                                            ("tickets/create_ticket", "b" * 64)])
def test_a_diverging_call_runs_live_and_so_does_the_rest_of_its_task(tool: str,
                                                                     args: str) -> None:
    events = _events(_started(0, 0), _finished(0, 0, "r0"), _started(0, 1),
                     _finished(0, 1, "r1"))
    replay = ToolReplay(build_plan(PRED, events, None))
    assert replay.decide(0, 0, tool, args).action is ToolAction.LIVE
    # call 1 matches the journal, but the task diverged before it
    later = replay.decide(0, 1, "tickets/create_ticket", "a" * 64)
    assert later.action is ToolAction.LIVE and later.key is None


def test_a_call_past_the_predecessors_trajectory_runs_live() -> None:
    plan = build_plan(PRED, _crashed_in_third_task(), "NotHappened")
    assert decide_tool(plan, 3, 0, "tickets/create_ticket", "a" * 64).action is ToolAction.LIVE


def test_a_finished_call_without_material_reruns_with_the_predecessors_key() -> None:
    plan = build_plan(PRED, _events(_started(0, 0), _finished(0, 0, None)), None)
    decision = decide_tool(plan, 0, 0, "tickets/create_ticket", "a" * 64)
    assert decision.action is ToolAction.RERUN_SAME_KEY
    assert decision.key == tool_idempotency_key(PRED, 0, 0)


def test_a_successor_of_a_successor_reuses_the_reused_material_and_first_keys() -> None:
    first_key = tool_idempotency_key(PRED, 0, 0)
    events = _events(
        ("task_reused", {"index": 0, "total": 2, "output": "out0"}),
        ("tool_call_reused", {"tool": "t", "task_index": 1, "call_index": 0,
                              "arguments_sha256": "a" * 64, "idempotency_key": first_key,
                              "action": "replay", "result": "r"}),
        ("tool_call_reused", {"tool": "t", "task_index": 1, "call_index": 1,
                              "arguments_sha256": "a" * 64, "idempotency_key": "cfk1-x",
                              "action": "already_made"}))
    plan = build_plan("succ-1", events, "Happened")
    assert plan.task_outputs == ("out0",)
    replay = decide_tool(plan, 1, 0, "t", "a" * 64)
    assert (replay.action, replay.key, replay.result) == (ToolAction.REPLAY, first_key, "r")
    # a call "already made" stays made: never run by a later successor either
    assert decide_tool(plan, 1, 1, "t", "a" * 64).action is ToolAction.ALREADY_MADE


def test_batch_outputs_are_kept_by_input_index() -> None:
    events = _events(("batch_item_completed", {"index": 1, "output": {"raw": "b1"}}),
                     ("batch_item_completed", {"index": 0, "material": "too_large"}))
    assert build_plan(PRED, events, None).batch_outputs == {1: {"raw": "b1"}}


# --- the wire contract --------------------------------------------------------------------------
def test_the_request_hash_of_a_start_without_resume_from_is_what_it_always_was() -> None:
    plain = StartRequest(crew_id="c", action_id="a", operation=Operation.RUN, input={"x": 1})
    before = hashlib.sha256(rfc8785.dumps({
        "crew_id": "c", "action_id": "a", "operation": "run", "input": {"x": 1},
        "timeout_ms": None, "idempotency_key": "k"})).hexdigest()
    assert request_hash(plain, "k") == before
    resumed = StartRequest(crew_id="c", action_id="a", operation=Operation.RUN,
                           input={"x": 1}, resume_from="p")
    assert request_hash(resumed, "k") != before  # a resume is another request


def test_resume_from_is_parsed_and_bounded() -> None:
    body = {"crew_id": "c", "action_id": "a", "operation": "run", "input": {},
            "resume_from": "p"}
    assert parse_start_request(body).resume_from == "p"
    assert parse_start_request(body).to_wire()["resume_from"] == "p"
    for bad in ({**body, "resume_from": "a"}, {**body, "resume_from": ""},
                {**body, "operation": "train"}):
        with pytest.raises(ContractError) as err:
            parse_start_request(bad)
        assert err.value.status == 400


def test_a_plan_over_its_material_budget_drops_material_not_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from crewfence_sidecar import resume

    monkeypatch.setattr(resume, "MAX_PLAN_MATERIAL_CHARS", 10)
    events = _events(_completed(0, "12345"), _started(0, 0), _finished(0, 0, "123456"),
                     _started(0, 1), _finished(0, 1, "1234"))
    plan = build_plan(PRED, events, None)
    assert plan.task_outputs == ("12345",)
    # the first result does not fit what is left (5): it reruns with its key; the next fits
    assert decide_tool(plan, 0, 0, "tickets/create_ticket", "a" * 64).action is \
        ToolAction.RERUN_SAME_KEY
    assert decide_tool(plan, 0, 1, "tickets/create_ticket", "a" * 64).result == "1234"
