"""Cancellation of each cancellable operation while it runs, of a terminal job, and timeouts.

The offline LLM's documented ``[[sleep:N]]`` marker keeps a job running. Every operation is
thread-backed with crewai 1.15 (even the async ``akickoff`` path calls the LLM in a worker
thread), so a cancelled or timed-out job ends ``uncertain_outcome: true``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from crewfence_sidecar.contract import EFFECT_EVENTS, job_path
from sidecar_helpers import AUTH, headers, llm_calls, start_body, until_llm_called

SLOW = "[[sleep:2]] slowly"


async def _admit(c: Any, action_id: str, crew_id: str, operation: str,
                 input_: dict[str, Any], **extra: Any) -> None:
    r = await c.post("/jobs", json=start_body(action_id, crew_id=crew_id, operation=operation,
                                              input_=input_, **extra),
                     headers=headers(action_id, async_=True))
    assert r.status == 202, await r.text()


async def _cancel(c: Any, action_id: str, crew_id: str) -> dict[str, Any]:
    r = await c.post(job_path(action_id, "/cancel"),
                     json={"crew_id": crew_id, "action_id": action_id, "reason": "test"},
                     headers=AUTH)
    assert r.status == 200
    return await r.json()


async def _replay_task_id(c: Any) -> str:
    r = await c.post("/jobs", json=start_body("seed-run", crew_id="duo"), headers=headers("s"))
    return (await r.json())["tasks_output"][0]["id"]  # blocking 200: the output itself


@pytest.mark.parametrize("operation, thread_backed", [
    ("run", True), ("batch_run", True), ("replay", True), ("train", True), ("test", True),
])
async def test_cancel_each_cancellable_operation_while_running(
        make_client: Any, operation: str, thread_backed: bool) -> None:
    c = await make_client()
    crew = "research"
    table: dict[str, dict[str, Any]] = {
        "run": {"topic": SLOW},
        "batch_run": {"inputs": [{"topic": SLOW}, {"topic": SLOW}]},
        "train": {"n_iterations": 1, "artifact_name": "cancelled", "inputs": {"topic": SLOW}},
        "test": {"n_iterations": 1, "eval_llm": "crewfence/offline", "inputs": {"topic": SLOW}},
    }
    inputs = table.get(operation, {})
    if operation == "replay":
        crew = "duo"
        inputs = {"task_id": await _replay_task_id(c), "inputs": {"topic": SLOW}}
    before = llm_calls()
    await _admit(c, f"cancel-{operation}", crew, operation, inputs)
    await until_llm_called(before)
    rec = await _cancel(c, f"cancel-{operation}", crew)
    assert rec["status"] == "cancelled"
    assert rec["uncertain_outcome"] is thread_backed
    assert rec["error"]["reason"] == "test"
    page = await (await c.get(job_path(f"cancel-{operation}", "/events"), headers=AUTH)).json()
    last = page["events"][-1]
    assert last["event"] == "cancelled" and page["status"] == "cancelled"
    assert last["data"].get("uncertain_outcome", False) is thread_backed
    assert [e["sequence"] for e in page["events"]] == list(range(len(page["events"])))


async def test_cancel_of_a_terminal_job_changes_nothing(make_client: Any) -> None:
    c = await make_client()
    assert (await c.post("/jobs", json=start_body("term"), headers=headers("t"))).status == 200
    done = await (await c.get(job_path("term"), headers=AUTH)).json()
    assert done["status"] == "completed"
    again = await _cancel(c, "term", "research")
    assert again == done


async def test_cancel_of_a_stream_closes_it_with_the_cancelled_event(make_client: Any) -> None:
    c = await make_client()
    before = llm_calls()
    resp = await c.post("/jobs/stream", json=start_body("streamed", topic="[[sleep:3]] x"),
                        headers=headers("st"))
    assert resp.status == 200
    await until_llm_called(before)
    await _cancel(c, "streamed", "research")
    text = await asyncio.wait_for(resp.text(), 10)
    names = [ln[7:] for ln in text.splitlines() if ln.startswith("event: ")]
    # the effect ledger's events (task_started, model_call...) may come in between
    assert [n for n in names if n not in EFFECT_EVENTS] == ["started", "cancelled"]


async def _terminal(c: Any, action_id: str) -> dict[str, Any]:
    runtime = c.sidecar.runtime
    assert await runtime.wait_terminal(action_id, 60)
    return await (await c.get(job_path(action_id), headers=AUTH)).json()


async def test_timeout_of_a_run(make_client: Any) -> None:
    c = await make_client()
    await _admit(c, "to-run", "research", "run", {"topic": "[[sleep:3]] x"}, timeout_ms=400)
    rec = await _terminal(c, "to-run")
    assert rec["status"] == "failed"
    # crewai's async path runs the LLM call in a worker thread: the outcome is unknown
    assert rec["error"]["code"] == "timeout" and rec["uncertain_outcome"] is True


async def test_timeout_of_a_thread_backed_operation_is_uncertain(make_client: Any) -> None:
    c = await make_client()
    await _admit(c, "to-test", "research", "test",
                 {"n_iterations": 1, "eval_llm": "crewfence/offline",
                  "inputs": {"topic": SLOW}}, timeout_ms=400)
    rec = await _terminal(c, "to-test")
    assert rec["status"] == "failed" and rec["error"]["code"] == "timeout"
    assert rec["uncertain_outcome"] is True
    page = await (await c.get(job_path("to-test", "/events"), headers=AUTH)).json()
    assert page["events"][-1]["data"]["uncertain_outcome"] is True
