"""``kubectl crewfence logs`` and ``explain``'s timeline read the journal itself: a real
in-process sidecar (real crewai, offline LLM, real SQLite) and the plugin's own printing."""

from __future__ import annotations

import asyncio
from typing import Any

from crewfence_operator.kubectl.logs import print_events
from crewfence_operator.kubectl.sidecar import SidecarAccess
from crewfence_operator.kubectl.timeline import event_line, in_doubt_lines
from sidecar_helpers import TOKEN, headers, start_body


def _access(c: Any) -> SidecarAccess:
    return SidecarAccess(address=f"127.0.0.1:{c.server.port}", token=TOKEN)


async def test_logs_prints_every_event_of_a_finished_job_in_order(make_client: Any) -> None:
    c = await make_client()
    assert (await c.post("/jobs", json=start_body("logs/done"),
                         headers=headers("k"))).status == 200
    lines: list[str] = []
    await print_events(_access(c), "logs/done", follow=False, out=lines.append)
    record = c.sidecar.runtime.journal.get("logs/done")
    assert len(lines) == record.event_count
    assert lines[0].startswith("#0 ") and "started" in lines[0]
    assert any("task 1/1 `" in line and "started" in line for line in lines), lines
    assert any("model call 0 to crewfence/offline" in line for line in lines), lines
    assert lines[-1].startswith(f"#{record.event_count - 1} ") and "completed" in lines[-1]


async def test_logs_follow_prints_until_the_record_ends(make_client: Any) -> None:
    c = await make_client()
    r = await c.post("/jobs", json=start_body("logs/slow", topic="[[sleep:2]] slowly"),
                     headers=headers("k", async_=True))
    assert r.status == 202
    lines: list[str] = []
    await asyncio.wait_for(print_events(_access(c), "logs/slow", follow=True,
                                        out=lines.append), 60)
    assert c.sidecar.runtime.journal.get("logs/slow").terminal, "followed to the end"
    assert "completed" in lines[-1] and len(lines) == c.sidecar.runtime.journal.get(
        "logs/slow").event_count


def test_tool_call_lines_show_the_key_and_never_the_arguments() -> None:
    started = {"event": "tool_call_started", "sequence": 4, "data": {
        "tool": "tickets/create_ticket", "server": "tickets", "task": "file", "task_index": 0,
        "call_index": 1, "arguments_sha256": "ab" * 32, "idempotency_key": "cfk1-" + "0" * 40,
        "at": "2026-12-01T20:00:00.000Z"}}
    line = event_line(started)
    assert line.startswith("#4 2026-12-01T20:00:00.000Z tool call `tickets/create_ticket`")
    assert "key cfk1-" in line and "STARTED" in line
    failed = {"event": "tool_call_finished", "sequence": 5, "data": {
        **started["data"], "result_sha256": None, "error": "LookupError", "duration_ms": 3.25}}
    assert "failed: LookupError in 3.2 ms" in event_line(failed)
    assert event_line({"event": "something_new", "sequence": 9, "data": {}}) == "#9 something_new"


def test_status_effects_in_words_name_each_call_in_doubt() -> None:
    status = {"effects": {"tasksCompleted": 0, "tasksTotal": 1, "modelCalls": 2, "toolCalls": 2,
                          "inDoubt": [{"tool": "tickets/create_ticket", "task": "file",
                                       "startedAt": "t", "idempotencyKey": "cfk1-x"}],
                          "inDoubtCount": 1}}
    lines = in_doubt_lines(status)
    assert "0/1 tasks completed, 2 model calls, 2 tool calls" in lines[0]
    assert "IN DOUBT: `tickets/create_ticket`" in lines[1] and "cfk1-x" in lines[1]
    status["effects"]["inDoubt"] = []
    status["effects"]["inDoubtCount"] = 0
    assert "No tool call was in flight" in in_doubt_lines(status)[1]
