"""summarize_effects and the tool-call idempotency key (the contract's pure helpers)."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785
from crewfence_sidecar.contract import (
    JobEvent,
    arguments_sha256,
    summarize_effects,
    tool_idempotency_key,
)


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
