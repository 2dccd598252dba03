"""The operator engineer's report, over real HTTP: a slow run of a crew WITH knowledge.

crewai 1.15.30 rewrites the knowledge search query with the sync ``LLM.call`` on the event
loop's thread; a ``[[sleep:N]]`` run used to freeze ``/health`` and the cancel route for N
seconds. Both are called here from another thread with their own socket timeouts, so a
blocked sidecar loop fails them (a client on the same loop would wait for the loop too).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from crewfence_sidecar.contract import EFFECT_EVENTS, job_path
from sidecar_helpers import AUTH, headers, llm_calls, start_body

SLEEP_S = 20
HEALTH_DEADLINE_S = 5.0  # far below SLEEP_S
CANCEL_DEADLINE_S = 10.0  # cancelling must not wait for the sleep to end


@dataclass(frozen=True)
class Observed:
    health_status: int
    cancel_record: dict[str, Any]


def _request(url: str, timeout: float, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={
        **AUTH, "Content-Type": "application/json"}, method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, json.loads(response.read() or b"null")


def _health_then_cancel_during_first_llm_call(base: str, action_id: str,
                                              before: int) -> Observed:
    deadline = time.monotonic() + 60.0
    while llm_calls() <= before:
        assert time.monotonic() < deadline, "the job never reached the LLM"
        time.sleep(0.01)  # polls a process-wide counter; no event to wait on
    status, _ = _request(f"{base}/health", HEALTH_DEADLINE_S)
    _, record = _request(f"{base}{job_path(action_id, '/cancel')}", CANCEL_DEADLINE_S,
                         {"crew_id": "library", "action_id": action_id, "reason": "test"})
    return Observed(status, record)


async def test_slow_knowledge_run_keeps_health_and_cancel_responsive(make_client: Any) -> None:
    c = await make_client()
    base = str(c.make_url("")).rstrip("/")
    action_id = "knowledge-slow"
    before = llm_calls()
    observer = asyncio.ensure_future(asyncio.to_thread(
        _health_then_cancel_during_first_llm_call, base, action_id, before))
    r = await c.post("/jobs", json=start_body(
        action_id, crew_id="library", input_={"question": f"bees [[sleep:{SLEEP_S}]]"}),
        headers=headers(action_id, async_=True))
    assert r.status == 202, await r.text()

    observed = await observer
    assert observed.health_status == 200
    assert observed.cancel_record["status"] == "cancelled"
    assert observed.cancel_record["error"]["reason"] == "test"
    page = await (await c.get(job_path(action_id, "/events"), headers=AUTH)).json()
    assert [e["event"] for e in page["events"]
            if e["event"] not in EFFECT_EVENTS] == ["started", "cancelled"]
