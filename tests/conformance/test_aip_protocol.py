"""Route by route, docs/aip-compatibility.md: health, auth, admission, the blocking route's
terminal states, the stream's framing, events, lookups and cancel (real sidecar process)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aip_client import (
    CONTROL_OPERATIONS,
    RECORD_FIELDS,
    STARTABLE,
    TERMINAL_EVENTS,
    Answer,
    Target,
    assert_run_output,
    auth,
    call,
    job_path,
    new_action_id,
    parse_sse,
    start_body,
    start_headers,
    wait_record,
)

SLOW = "[[sleep:30]] slowly"


# --- GET /health ---------------------------------------------------------------------------
async def test_health_lists_startable_and_control_operations_sorted(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    got = await call(session, "GET", sidecar.url + "/health")  # no token needed
    assert got.status == 200
    health = got.body
    assert health["status"] == "ready"
    assert health["operations"] == sorted(STARTABLE + CONTROL_OPERATIONS)
    assert set(CONTROL_OPERATIONS) <= set(health["operations"])
    assert set(health["crews"]) == {"research", "duo", "library"}
    assert health["durable_journal"] is True and isinstance(health["journal_id"], str)
    for name in ("active_runs", "retained_runs", "max_retained_runs"):
        assert isinstance(health[name], int) and health[name] >= 0


# --- authentication ------------------------------------------------------------------------
async def test_every_job_route_needs_the_bearer_token(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("auth")
    attempts: list[tuple[str, str, Any]] = [
        ("POST", "/jobs", start_body(action, "run", {"topic": "x"})),
        ("POST", "/jobs/stream", start_body(action, "run", {"topic": "x"})),
        ("GET", job_path(action), None),
        ("GET", job_path(action, "/events"), None),
        ("POST", job_path(action, "/cancel"), {"crew_id": "research", "action_id": action}),
    ]
    for method, path, body in attempts:
        for headers in ({"Idempotency-Key": "k"},
                        {"Idempotency-Key": "k", "Authorization": "Bearer wrong-token"}):
            got = await call(session, method, sidecar.url + path, json_body=body,
                             headers=headers)
            assert got.status in (401, 403), (method, path, got.status)
            if got.status == 401:
                assert got.headers["WWW-Authenticate"].lower().startswith("bearer")
    # nothing was admitted by those attempts
    got = await call(session, "GET", sidecar.url + job_path(action), headers=auth(sidecar.token))
    assert got.status == 404


# --- admission -----------------------------------------------------------------------------
async def test_idempotency_key_is_required_and_bounded(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("key")
    body = start_body(action, "run", {"topic": "x"})
    for path in ("/jobs", "/jobs/stream"):
        got = await call(session, "POST", sidecar.url + path, json_body=body,
                         headers=auth(sidecar.token))
        assert got.status == 428
        got = await call(session, "POST", sidecar.url + path, json_body=body,
                         headers={**auth(sidecar.token), "Idempotency-Key": " "})
        assert got.status == 428
        got = await call(session, "POST", sidecar.url + path, json_body=body,
                         headers=start_headers(sidecar.token, "k" * 513, action))
        assert got.status == 400


async def test_request_validation_codes(sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("codes")
    hdrs = start_headers(sidecar.token, "k", action)
    cases: list[tuple[dict[str, Any], int]] = [
        ({**start_body(action, "run", {"topic": "x"}), "extra": 1}, 400),
        (start_body(action, "run", {"topic": "x"}, crew_id="no-such-crew"), 404),
        (start_body(action, "replay", {}), 422),
        (start_body(action, "memory_reset", {"command_type": "nonsense"}), 422),
    ]
    for body, expected in cases:
        got = await call(session, "POST", sidecar.url + "/jobs", json_body=body, headers=hdrs)
        assert got.status == expected, (body, got.body)


async def test_exact_repeat_answers_from_the_record_and_a_changed_request_is_409(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("repeat")
    body = start_body(action, "run", {"topic": "herons"}, timeout_ms=120_000)
    hdrs = start_headers(sidecar.token, "key-1", action)
    first = await call(session, "POST", sidecar.url + "/jobs", json_body=body, headers=hdrs)
    assert first.status == 200
    record = await wait_record(session, sidecar.url, sidecar.token, action, until={"completed"})
    again = await call(session, "POST", sidecar.url + "/jobs", json_body=body, headers=hdrs)
    assert again.status == 200 and again.body == first.body
    after = await wait_record(session, sidecar.url, sidecar.token, action, until={"completed"})
    assert after == record  # nothing scheduled: same record, same events
    for changed, key in ((start_body(action, "run", {"topic": "other"}, timeout_ms=120_000),
                          "key-1"),
                         (body, "key-2"),
                         (start_body(action, "run", {"topic": "herons"}), "key-1")):
        got = await call(session, "POST", sidecar.url + "/jobs", json_body=changed,
                         headers=start_headers(sidecar.token, key, action))
        assert got.status == 409, got.body


# --- the blocking route's terminal states --------------------------------------------------
async def test_blocking_completed_is_200_with_the_output_itself(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("blocking-ok")
    got = await call(session, "POST", sidecar.url + "/jobs",
                     json_body=start_body(action, "run", {"topic": "owls"}),
                     headers=start_headers(sidecar.token, "k", action))
    assert got.status == 200
    assert_run_output(got.body)
    assert "owls" in got.body["raw"]
    record = await wait_record(session, sidecar.url, sidecar.token, action, until={"completed"})
    assert record["output"] == got.body


async def test_blocking_failed_is_502(sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("blocking-failed")
    got = await call(session, "POST", sidecar.url + "/jobs",
                     json_body=start_body(action, "run", {"topic": "x [[fail]]"}),
                     headers=start_headers(sidecar.token, "k", action))
    assert got.status == 502, got.body
    assert got.body["detail"] == "CrewAI run failed"
    record = await wait_record(session, sidecar.url, sidecar.token, action,
                               until=TERMINAL_EVENTS)
    assert record["status"] == "failed"


async def _blocking_in_background(session: aiohttp.ClientSession, target: Target,
                                  body: dict[str, Any]) -> asyncio.Task[Answer]:
    return asyncio.create_task(call(
        session, "POST", target.url + "/jobs", json_body=body,
        headers=start_headers(target.token, "k", body["action_id"])))


async def _cancel(session: aiohttp.ClientSession, target: Target, action: str,
                  crew_id: str = "research") -> Answer:
    return await call(session, "POST", target.url + job_path(action, "/cancel"),
                      json_body={"crew_id": crew_id, "action_id": action, "reason": "test"},
                      headers=auth(target.token))


async def test_blocking_cancelled_is_409(sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("blocking-cancelled")
    pending = await _blocking_in_background(session, sidecar,
                                            start_body(action, "run", {"topic": SLOW}))
    await wait_record(session, sidecar.url, sidecar.token, action, until={"running"})
    cancelled = await _cancel(session, sidecar, action)
    assert cancelled.status == 200 and cancelled.body["status"] == "cancelled"
    got = await asyncio.wait_for(pending, 60)
    assert got.status == 409, got.body
    assert got.body["detail"] == "CrewAI run was cancelled"
    # an exact repeat of the cancelled job answers the same way; nothing runs again
    again = await call(session, "POST", sidecar.url + "/jobs",
                       json_body=start_body(action, "run", {"topic": SLOW}),
                       headers=start_headers(sidecar.token, "k", action))
    assert again.status == 409 and again.body["detail"] == "CrewAI run was cancelled"


async def test_blocking_wait_expiry_is_504_and_the_job_keeps_its_record(
        one_slot_sidecar: Target, session: aiohttp.ClientSession) -> None:
    target = one_slot_sidecar
    busy = new_action_id("slot-holder")
    got = await call(session, "POST", target.url + "/jobs",
                     json_body=start_body(busy, "run", {"topic": SLOW}),
                     headers=start_headers(target.token, "k", busy, Prefer="respond-async"))
    assert got.status in (200, 202)
    waiting = new_action_id("waits")
    try:
        got = await call(session, "POST", target.url + "/jobs",
                         json_body=start_body(waiting, "run", {"topic": "x"}, timeout_ms=500),
                         headers=start_headers(target.token, "k", waiting))
        assert got.status == 504, got.body
        record = await wait_record(session, target.url, target.token, waiting,
                                   until={"running"})
        assert record["status"] == "running"
    finally:
        for action in (busy, waiting):
            await _cancel(session, target, action)


# --- lookups -------------------------------------------------------------------------------
async def test_record_lookup(sidecar: Target, session: aiohttp.ClientSession) -> None:
    got = await call(session, "GET", sidecar.url + job_path(new_action_id("unknown")),
                     headers=auth(sidecar.token))
    assert got.status == 404
    action = new_action_id("lookup")
    await call(session, "POST", sidecar.url + "/jobs",
               json_body=start_body(action, "run", {"topic": "moles"}),
               headers=start_headers(sidecar.token, "k", action))
    record = await wait_record(session, sidecar.url, sidecar.token, action, until={"completed"})
    assert RECORD_FIELDS <= set(record)
    assert record["action_id"] == action and record["crew_id"] == "research"
    assert record["operation"] == "run" and record["uncertain_outcome"] is False
    assert_run_output(record["output"])


# --- the stream and the events -------------------------------------------------------------
def _assert_framing(text: str) -> list[Any]:
    frames = parse_sse(text)
    assert frames, text
    events = []
    for frame in frames:
        event = frame.data
        assert set(event) >= {"event", "sequence", "data"}, event
        assert frame.name == event["event"]
        assert isinstance(event["data"], dict)
        events.append(event)
    assert [e["sequence"] for e in events] == list(range(len(events)))
    assert events[0]["event"] == "started"
    assert events[-1]["event"] in TERMINAL_EVENTS
    assert all(e["event"] not in TERMINAL_EVENTS for e in events[:-1])
    return events


async def test_stream_frames_and_completed_event_carries_the_output(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("stream")
    async with session.post(sidecar.url + "/jobs/stream",
                            json=start_body(action, "run", {"topic": "lynx"}, crew_id="duo"),
                            headers=start_headers(sidecar.token, "k", action)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        text = await resp.text()  # the stream ends after the terminal event
    events = _assert_framing(text)
    assert events[-1]["event"] == "completed"
    assert any(e["event"] == "chunk" and e["data"].get("content") for e in events)
    record = await wait_record(session, sidecar.url, sidecar.token, action, until={"completed"})
    assert events[-1]["data"] == record["output"]  # the output itself
    assert_run_output(events[-1]["data"])


async def test_events_page_and_sse_follow(sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("events")
    await call(session, "POST", sidecar.url + "/jobs",
               json_body=start_body(action, "run", {"topic": "voles"}),
               headers=start_headers(sidecar.token, "k", action))
    record = await wait_record(session, sidecar.url, sidecar.token, action, until={"completed"})
    page = await call(session, "GET", sidecar.url + job_path(action, "/events") + "?cursor=0",
                      headers=auth(sidecar.token))
    assert page.status == 200
    assert set(page.body) >= {"action_id", "cursor", "next_cursor", "status", "events"}
    assert page.body["action_id"] == action and page.body["status"] == "completed"
    assert page.body["cursor"] == 0 and page.body["next_cursor"] == len(page.body["events"])
    events = page.body["events"]
    assert [e["sequence"] for e in events] == list(range(len(events)))
    assert events[-1]["event"] == "completed" and events[-1]["data"] == record["output"]
    later = await call(session, "GET", sidecar.url + job_path(action, "/events") + "?cursor=1",
                       headers=auth(sidecar.token))
    assert later.body["events"] == events[1:] and later.body["cursor"] == 1
    async with session.get(sidecar.url + job_path(action, "/events"),
                           headers={**auth(sidecar.token), "Accept": "text/event-stream"}) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        followed = _assert_framing(await r.text())
    assert followed == events


# --- cancel --------------------------------------------------------------------------------
async def test_cancel_route(sidecar: Target, session: aiohttp.ClientSession) -> None:
    got = await _cancel(session, sidecar, new_action_id("unknown"))
    assert got.status == 404
    action = new_action_id("cancel")
    got = await call(session, "POST", sidecar.url + "/jobs",
                     json_body=start_body(action, "run", {"topic": SLOW}),
                     headers=start_headers(sidecar.token, "k", action, Prefer="respond-async"))
    assert got.status in (200, 202)
    cancelled = await _cancel(session, sidecar, action)
    assert cancelled.status == 200
    assert RECORD_FIELDS <= set(cancelled.body) and cancelled.body["status"] == "cancelled"
    again = await _cancel(session, sidecar, action)  # a terminal record is unchanged
    assert again.status == 200 and again.body == cancelled.body
    page = await call(session, "GET", sidecar.url + job_path(action, "/events"),
                      headers=auth(sidecar.token))
    assert page.body["events"][-1]["event"] == "cancelled"


async def test_cancelling_a_streamed_job_closes_the_stream_with_cancelled(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("stream-cancel")
    async with session.post(sidecar.url + "/jobs/stream",
                            json=start_body(action, "run", {"topic": SLOW}),
                            headers=start_headers(sidecar.token, "k", action)) as resp:
        assert resp.status == 200
        first = await resp.content.readuntil(b"\n\n")
        assert parse_sse(first.decode())[0].name == "started"
        assert (await _cancel(session, sidecar, action)).status == 200
        rest = await asyncio.wait_for(resp.text(), 60)
    events = _assert_framing(first.decode() + rest)
    assert events[-1]["event"] == "cancelled"
