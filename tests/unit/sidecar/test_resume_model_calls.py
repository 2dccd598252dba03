"""Model calls of a resumed job (crewfence_sidecar.resume's model replay, pure; and the
response encoding of crewfence_sidecar.resume_llm): a matched request is answered from the
journal, the first diverging call runs live and so does every later model call of its task."""

from __future__ import annotations

from typing import Any

import pytest
from crewfence_sidecar.contract import JobEvent, summarize_effects
from crewfence_sidecar.resume import (
    ModelAction,
    ModelReplay,
    ResumePlan,
    build_plan,
    decide_model,
)
from crewfence_sidecar.resume_llm import decode_response, encode_response, request_sha256
from pydantic import BaseModel

PRED = "pred-1"
A, B, C = "a" * 64, "b" * 64, "c" * 64


def _events(*specs: tuple[str, dict[str, Any]]) -> list[JobEvent]:
    return [JobEvent(event=name, sequence=i, data=data) for i, (name, data) in enumerate(specs)]


def _model(task: int, index: int, request: str, response: str | None,
           name: str = "model_call") -> tuple[str, dict[str, Any]]:
    data: dict[str, Any] = {"model": "m", "task_index": task, "model_index": index,
                            "request_sha256": request}
    if response is not None:
        data["response"] = response
    return (name, data)


def _plan() -> ResumePlan:
    """Task 0: two model calls journaled, the third (in flight when killed) is not."""
    return build_plan(PRED, _events(_model(0, 0, A, "r0"), _model(0, 1, B, "r1")), "Happened")


def test_a_matching_request_is_answered_from_the_journal() -> None:
    decision = decide_model(_plan(), 0, 0, A)
    assert (decision.action, decision.response) == (ModelAction.REPLAY, "r0")


def test_a_diverging_request_runs_live() -> None:
    assert decide_model(_plan(), 0, 0, C).action is ModelAction.LIVE
    assert decide_model(_plan(), 0, 1, A).action is ModelAction.LIVE  # another position


def test_the_call_in_doubt_and_calls_past_the_trajectory_run_live() -> None:
    assert decide_model(_plan(), 0, 2, C).action is ModelAction.LIVE
    assert decide_model(_plan(), 1, 0, A).action is ModelAction.LIVE


def test_a_call_whose_response_was_not_journaled_runs_live() -> None:
    plan = build_plan(PRED, _events(_model(0, 0, A, None)), None)
    assert decide_model(plan, 0, 0, A).action is ModelAction.LIVE


def test_after_a_divergence_every_later_model_call_of_the_task_runs_live() -> None:
    replay = ModelReplay(_plan())
    assert replay.decide(0, 0, C).action is ModelAction.LIVE
    # call 1's request hashes like the journaled one, but the task diverged before it
    assert replay.decide(0, 1, B).action is ModelAction.LIVE


def test_replay_goes_on_while_requests_match_and_other_tasks_are_not_affected() -> None:
    plan = build_plan(PRED, _events(_model(0, 0, A, "r0"), _model(0, 1, B, "r1"),
                                    _model(1, 0, A, "s0")), None)
    replay = ModelReplay(plan)
    assert [replay.decide(0, i, h).action for i, h in ((0, A), (1, B))] == [
        ModelAction.REPLAY, ModelAction.REPLAY]
    assert replay.decide(0, 2, C).action is ModelAction.LIVE
    assert replay.decide(1, 0, A).response == "s0"  # task 1 did not diverge


def test_reused_model_calls_are_material_for_a_successor_of_a_successor() -> None:
    plan = build_plan("succ-1", _events(_model(0, 0, A, "r0", name="model_call_reused")), None)
    assert decide_model(plan, 0, 0, A).response == "r0"
    assert ResumePlan.from_wire(plan.to_wire()) == plan


def test_the_plan_budget_drops_model_responses_it_cannot_carry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from crewfence_sidecar import resume

    monkeypatch.setattr(resume, "MAX_PLAN_MATERIAL_CHARS", 3)
    plan = build_plan(PRED, _events(_model(0, 0, A, "1234"), _model(0, 1, B, "12")), None)
    assert decide_model(plan, 0, 0, A).action is ModelAction.LIVE
    assert decide_model(plan, 0, 1, B).response == "12"


def test_the_status_counts_model_calls_reused_apart_from_live_ones() -> None:
    summary = summarize_effects(_events(
        ("started", {"resume_from": PRED}), _model(0, 0, A, "r0", name="model_call_reused"),
        _model(0, 1, B, "r1"), ("completed", {})))
    assert summary.model_calls == 1
    assert summary.to_status()["reused"]["modelCalls"] == 1


# --- what a response and a request are, on the journal --------------------------------------
class Verdict(BaseModel):
    score: int


def test_responses_come_back_as_they_went() -> None:
    calls = [{"id": "call_1", "type": "function",
              "function": {"name": "t", "arguments": "{}"}}]
    for response, model in (("text", None), (calls, None), (Verdict(score=3), Verdict)):
        encoded = encode_response(response)
        assert encoded is not None
        assert decode_response(encoded, model) == response


def test_a_response_that_would_not_come_back_is_not_material() -> None:
    assert encode_response(None) is None and encode_response([]) is None
    assert encode_response([object()]) is None
    with pytest.raises(ValueError):  # a structured answer for a call that wants text
        decode_response(str(encode_response(Verdict(score=1))), None)


def test_the_request_hash_covers_messages_model_tools_and_schema() -> None:
    messages = [{"role": "user", "content": "hi"}]
    base = request_sha256("m", messages, None, None)
    assert base == request_sha256("m", [{"content": "hi", "role": "user"}], None, None)
    assert len({base, request_sha256("n", messages, None, None),
                request_sha256("m", [{"role": "user", "content": "ho"}], None, None),
                request_sha256("m", messages, [{"name": "t"}], None),
                request_sha256("m", messages, None, Verdict)}) == 5


def test_a_response_that_cannot_be_serialized_is_not_material_and_does_not_raise() -> None:
    class Broken(BaseModel):
        score: int

        def model_dump_json(self, **_: Any) -> str:  # type: ignore[override]
            raise TypeError("no")

    assert encode_response(Broken(score=1)) is None


# --- the wrapper around the LLM's call ------------------------------------------------------
class _Ledger:
    """Answers the first request from the journal when ``journaled`` is set."""

    def __init__(self, journaled: str | None) -> None:
        self.journaled = journaled
        self.requests: list[str] = []
        self.responses: list[str | None] = []

    def tracks_models(self) -> bool:
        return True

    def model_request(self, task: Any, sha: str) -> str | None:
        self.requests.append(sha)
        return self.journaled

    def model_not_replayed(self, task: Any) -> None:
        self.journaled = None

    def model_response(self, task: Any, encoded: str | None) -> None:
        self.responses.append(encoded)


def _llm_classes() -> tuple[type, type]:
    class Base:
        model = "m"
        made = 0

        def call(self, messages: Any, tools: Any = None, **_: Any) -> str:
            Base.made += 1
            return "live"

    class Child(Base):
        def call(self, messages: Any, tools: Any = None, **kw: Any) -> str:
            return super().call(messages, tools, **kw)  # a subclass calling its parent's

    return Base, Child


def test_a_matched_call_is_not_made_and_a_nested_call_is_one_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from crewfence_sidecar import resume_llm

    base, child = _llm_classes()
    for cls in (base, child):
        resume_llm.wrap_llm_class(cls)
    journal = _Ledger(encode_response("from the journal"))
    monkeypatch.setattr(resume_llm, "_ledger", lambda: journal)
    assert child().call([{"role": "user", "content": "hi"}]) == "from the journal"
    assert base.made == 0 and journal.responses == []  # not made, not billed

    live = _Ledger(None)
    monkeypatch.setattr(resume_llm, "_ledger", lambda: live)
    assert child().call([{"role": "user", "content": "hi"}]) == "live"
    assert base.made == 1
    assert len(live.requests) == 1 and live.responses == [encode_response("live")]


def test_a_journaled_response_that_does_not_fit_the_call_runs_it_live(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from crewfence_sidecar import resume_llm

    base, _ = _llm_classes()
    resume_llm.wrap_llm_class(base)
    journal = _Ledger(encode_response(Verdict(score=1)))  # structured, but text is asked
    monkeypatch.setattr(resume_llm, "_ledger", lambda: journal)
    assert base().call([{"role": "user", "content": "hi"}]) == "live"
    assert base.made == 1 and journal.journaled is None
