"""summarize_effects and the tool-call idempotency key (the contract's pure helpers)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import rfc8785
from crewfence_sidecar.contract import (
    JobEvent,
    _jcs_plain_object,
    arguments_sha256,
    summarize_effects,
    tool_idempotency_key,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def _started(key: str, tool: str = "tickets/create_ticket", server: str | None = "tickets",
             task: str = "file", at: str = "2026-12-01T20:10:11.123Z") -> dict[str, Any]:
    return {"event": "tool_call_started", "sequence": 0,
            "data": {"tool": tool, "server": server, "task": task, "task_index": 0,
                     "call_index": 0, "arguments_sha256": "0" * 64, "idempotency_key": key,
                     "at": at}}


def _finished(key: str) -> dict[str, Any]:
    return {"event": "tool_call_finished", "sequence": 0,
            "data": {"idempotency_key": key, "error": None}}


def _run(*effects: dict[str, Any], terminal: dict[str, Any] | None) -> list[dict[str, Any]]:
    events = [{"event": "started", "sequence": 0, "data": {}},
              {"event": "task_started", "sequence": 1, "data": {"task": "file", "index": 0,
                                                               "total": 2}},
              {"event": "model_call", "sequence": 2,
               "data": {"prompt_tokens": 10, "completion_tokens": 3}},
              {"event": "model_call", "sequence": 3,
               "data": {"prompt_tokens": None, "completion_tokens": None}},
              *effects,
              {"event": "task_completed", "sequence": 9, "data": {"total": 2}}]
    return events + ([terminal] if terminal is not None else [])


def test_the_key_is_cfk1_and_40_hex_of_the_canonical_identity() -> None:
    expected = hashlib.sha256(rfc8785.dumps(
        {"action_id": "ns/job", "task_index": 1, "call_index": 2})).hexdigest()[:40]
    assert tool_idempotency_key("ns/job", 1, 2) == "cfk1-" + expected
    assert tool_idempotency_key("ns/job", 1, 2) == tool_idempotency_key("ns/job", 1, 2)
    assert len({tool_idempotency_key("a", 0, 0), tool_idempotency_key("a", 0, 1),
                tool_idempotency_key("a", 1, 0), tool_idempotency_key("b", 0, 0)}) == 4


def test_arguments_hash_ignores_key_order() -> None:
    assert arguments_sha256({"a": 1, "b": [1, 2]}) == arguments_sha256({"b": [1, 2], "a": 1})
    assert arguments_sha256({"a": 1}) != arguments_sha256({"a": 2})


def _reference_arguments_sha256(arguments: Any) -> str | None:
    """The hash before the fast path (None: it raised)."""
    try:
        try:
            material = rfc8785.dumps(arguments)
        except (rfc8785.CanonicalizationError, ValueError, TypeError):
            material = rfc8785.dumps(json.loads(json.dumps(arguments, default=str)))
    except (rfc8785.CanonicalizationError, ValueError, TypeError):
        return None
    return hashlib.sha256(material).hexdigest()


_SCALARS = (st.none() | st.booleans() | st.text()
            | st.integers(min_value=-(2 ** 60), max_value=2 ** 60)
            | st.floats(allow_nan=False, allow_infinity=False))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=6) | st.sampled_from(["a", "B", "_", "\u00e9", "\U0001f600",
                                                              "\uff61", "\x7f", "\n"]),
                       _VALUES, max_size=5))
def test_the_fast_canonical_json_is_byte_for_byte_rfc8785(arguments: dict[str, Any]) -> None:
    """The json.dumps path (flat objects of plain scalars) gives RFC 8785's bytes, and every
    other shape still hashes as RFC 8785 does."""
    fast = _jcs_plain_object(arguments)
    if fast is not None:
        assert fast == rfc8785.dumps(arguments)
    reference = _reference_arguments_sha256(arguments)
    assert arguments_sha256(arguments) == reference or reference is None


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(min_value=0, max_value=2 ** 53 - 1),
       st.integers(min_value=0, max_value=2 ** 53 - 1))
def test_the_key_is_rfc8785_for_any_action_id(action_id: str, task: int, call: int) -> None:
    fields = {"action_id": action_id, "task_index": task, "call_index": call}
    try:
        material = rfc8785.dumps(fields)
    except rfc8785.CanonicalizationError:  # a lone surrogate: refused as before
        return
    assert tool_idempotency_key(action_id, task, call) == (
        "cfk1-" + hashlib.sha256(material).hexdigest()[:40])


def test_the_fast_path_takes_the_common_shapes_and_leaves_the_rest() -> None:
    assert _jcs_plain_object({"n": 3, "q": "caf\u00e9\n", "ok": True, "none": None}) is not None
    for other in ({"f": 1.5}, {"nested": {"a": 1}}, {"l": [1]}, {"\u00e9": 1}, {1: 2},
                  {"big": 2 ** 53}, {"s": "\ud800"}, [1], "x"):
        assert _jcs_plain_object(other) is None, other


@pytest.mark.parametrize("arguments", [{"n": 2 ** 60}, {"x": float("nan")}, {"s": "\ud800"},
                                       {"n": [2 ** 60]}, {1: 2 ** 70}])
def test_arguments_rfc8785_cannot_serialise_still_hash(arguments: Any) -> None:
    """The hash never raises: a hook that raised would let crewai run the tool unjournaled."""
    assert len(arguments_sha256(arguments)) == 64
    assert arguments_sha256(arguments) == arguments_sha256(arguments)


def test_counts_and_tokens() -> None:
    summary = summarize_effects(_run(_started("k1"), _finished("k1"),
                                     terminal={"event": "completed", "sequence": 10,
                                               "data": {}}))
    assert (summary.tasks_completed, summary.tasks_total) == (1, 2)
    assert (summary.model_calls, summary.tool_calls) == (2, 1)
    assert (summary.prompt_tokens, summary.completion_tokens) == (10, 3)
    assert summary.in_doubt == []
    assert summary.in_doubt_message() == "no tool call was in flight"
    assert summary.to_status() == {"tasksCompleted": 1, "tasksTotal": 2, "modelCalls": 2,
                                   "toolCalls": 1, "inDoubt": [], "inDoubtCount": 0}
    assert summary.to_usage() == {"promptTokens": 10, "completionTokens": 3,
                                  "modelCalls": 2, "toolCalls": 1}


def test_an_unfinished_call_of_a_failed_record_is_in_doubt() -> None:
    events = _run(_started("k1"), _finished("k1"), _started("k2", at="2026-12-01T20:10:12.000Z"),
                  terminal={"event": "failed", "sequence": 10,
                            "data": {"status": "failed", "uncertain_outcome": True}})
    summary = summarize_effects([JobEvent.from_wire(e) for e in events])  # JobEvents too
    assert [c.idempotency_key for c in summary.in_doubt] == ["k2"]
    assert summary.in_doubt[0].started_at == "2026-12-01T20:10:12.000Z"
    assert summary.in_doubt_message() == (
        "1 tool call in doubt: `create_ticket` (server tickets), task `file`, key k2")
    assert summary.to_status()["inDoubt"] == [
        {"tool": "tickets/create_ticket", "server": "tickets", "task": "file",
         "startedAt": "2026-12-01T20:10:12.000Z", "idempotencyKey": "k2"}]


def test_a_record_without_a_terminal_event_keeps_its_open_calls_in_doubt() -> None:
    summary = summarize_effects(_run(_started("k1"), terminal=None))
    assert [c.idempotency_key for c in summary.in_doubt] == ["k1"]


def test_a_cleanly_completed_record_has_nothing_in_doubt() -> None:
    # a call without its finished event in a record that completed (e.g. a dropped event)
    summary = summarize_effects(_run(_started("k1"), terminal={"event": "completed",
                                                              "sequence": 10, "data": {}}))
    assert summary.in_doubt == []


def test_many_calls_in_doubt_are_bounded_in_the_status_and_counted() -> None:
    opened = [_started(f"k{n}", tool="lookup", server=None) for n in range(12)]
    summary = summarize_effects(_run(*opened, terminal={"event": "cancelled", "sequence": 99,
                                                        "data": {}}))
    status = summary.to_status()
    assert len(status["inDoubt"]) == 10 and status["inDoubtCount"] == 12
    message = summary.in_doubt_message()
    assert message.startswith("12 tool calls in doubt: `lookup` (python), task `file`, key k0;")
    assert message.endswith("; and 2 more")
    assert "(server" not in message
