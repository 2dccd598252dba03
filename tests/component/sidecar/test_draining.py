"""Draining mode and bulk archive (issue 9, sidecar half).

In-process sidecar on a real loopback socket (real crewai with the offline LLM, real SQLite),
plus the real ``crewfence-sidecar`` executable for the restart case and the operator's
``SidecarClient`` against the in-process sidecar.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from crewfence_sidecar.contract import (
    ARCHIVE_CONFIRMATION_HEADER,
    BULK_ARCHIVE_PATH,
    DRAIN_PATH,
    DRAINING_CODE,
    job_path,
)
from crewfence_sidecar.journal import utc_iso
from sidecar_helpers import (
    AUTH,
    SidecarProcess,
    headers,
    llm_calls,
    sidecar_env,
    start_body,
    until_llm_called,
    write_crews,
)

SLOW = "[[sleep:30]] slowly"


async def _terminal(c: Any, action_id: str, timeout: float = 60) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        record = await (await c.get(job_path(action_id), headers=AUTH)).json()
        if record["status"] != "running":
            return record
        assert loop.time() < deadline, "job did not finish"
        await c.sidecar.runtime.wait_change(action_id, 1.0)


async def _health(c: Any) -> dict[str, Any]:
    r = await c.get("/health")
    assert r.status == 200
    return dict(await r.json())


async def _drain(c: Any, draining: bool) -> dict[str, Any]:
    r = await c.post(DRAIN_PATH, json={"draining": draining}, headers=AUTH)
    assert r.status == 200, await r.text()
    return dict(await r.json())


def _assert_draining_refusal(status: int, body: dict[str, Any], hdrs: Any) -> None:
    assert status == 503, body
    assert body["code"] == DRAINING_CODE and body["detail"]
    assert int(hdrs["Retry-After"]) > 0


async def test_drain_route_needs_auth_and_a_strict_body(make_client: Any) -> None:
    c = await make_client()
    assert (await c.post(DRAIN_PATH, json={"draining": True})).status == 401
    for bad in ({}, {"draining": "yes"}, {"draining": True, "more": 1}, [True]):
        r = await c.post(DRAIN_PATH, json=bad, headers=AUTH)
        assert r.status == 400, bad
    assert (await _health(c))["draining"] is False


async def test_draining_refuses_new_admissions_and_keeps_answering_known_ones(
        make_client: Any) -> None:
    c = await make_client()
    done_body = start_body("drain/done")
    r = await c.post("/jobs", json=done_body, headers=headers("k-done", async_=True))
    assert r.status == 202
    done = await _terminal(c, "drain/done")
    slow_body = start_body("drain/slow", topic=SLOW)
    before = llm_calls()
    r = await c.post("/jobs", json=slow_body, headers=headers("k-slow", async_=True))
    assert r.status == 202
    await until_llm_called(before)  # the slow job sits in its LLM call from here on

    state = await _drain(c, True)
    assert state == {"draining": True, "unarchived_records": 2}
    health = await _health(c)
    assert health["draining"] is True and health["unarchived_records"] == 2

    calls, retained = llm_calls(), len(c.sidecar.runtime.journal.records)
    for path in ("/jobs", "/jobs/stream"):
        for prefer_async in (True, False):
            r = await c.post(path, json=start_body(f"drain/new{path}"),
                             headers=headers("k-new", async_=prefer_async))
            _assert_draining_refusal(r.status, await r.json(), r.headers)
    assert llm_calls() == calls and len(c.sidecar.runtime.journal.records) == retained
    assert (await c.get(job_path("drain/new/jobs"), headers=AUTH)).status == 404

    # Exact repeats of known actions still answer with their records, nothing scheduled.
    r = await c.post("/jobs", json=done_body, headers=headers("k-done", async_=True))
    assert r.status == 200 and (await r.json()) == done
    r = await c.post("/jobs", json=slow_body, headers=headers("k-slow", async_=True))
    assert r.status == 202 and (await r.json())["status"] == "running"
    # A changed request under a known id stays the protective 409, not a 503.
    r = await c.post("/jobs", json=done_body, headers=headers("k-other", async_=True))
    assert r.status == 409

    # Lookups, events (JSON and SSE), cancel and archive keep working.
    assert (await c.get(job_path("drain/done"), headers=AUTH)).status == 200
    page = await (await c.get(job_path("drain/done", "/events"), headers=AUTH)).json()
    assert page["status"] == "completed" and page["events"][-1]["event"] == "completed"
    sse = await c.get(job_path("drain/done", "/events"),
                      headers={**AUTH, "Accept": "text/event-stream"})
    assert "event: completed" in await sse.text()
    r = await c.post(job_path("drain/slow", "/cancel"),
                     json={"crew_id": "research", "action_id": "drain/slow"}, headers=AUTH)
    assert r.status == 200 and (await r.json())["status"] == "cancelled"
    r = await c.delete(job_path("drain/done"),
                       headers={**AUTH, ARCHIVE_CONFIRMATION_HEADER: "drain/done"})
    assert r.status == 200
    r = await c.post("/jobs", json=done_body, headers=headers("k-done", async_=True))
    assert r.status == 410  # archived: the tombstone answers, draining or not
    assert (await _health(c))["unarchived_records"] == 1

    # Switched off at run time: admissions are accepted again.
    assert await _drain(c, False) == {"draining": False, "unarchived_records": 1}
    r = await c.post("/jobs", json=start_body("drain/after"), headers=headers("k-after"))
    assert r.status == 200 and (await r.json())["raw"]


def _bulk(c: Any, seconds: Any, confirmation: str | None) -> Any:
    extra = {ARCHIVE_CONFIRMATION_HEADER: confirmation} if confirmation is not None else {}
    return c.post(BULK_ARCHIVE_PATH, json={"older_than_seconds": seconds},
                  headers={**AUTH, **extra})


def _age(c: Any, action_id: str, seconds: int) -> None:
    """Make a terminal record look ``seconds`` old (the journal's own row and memory copy)."""
    journal = c.sidecar.runtime.journal
    stamp = utc_iso(datetime.now(UTC) - timedelta(seconds=seconds))
    journal._conn.execute("UPDATE records SET updated_at = ? WHERE action_id = ?",
                          (stamp, action_id))
    journal.records[action_id].updated_at = stamp


async def test_bulk_archive_needs_its_confirmation_header(make_client: Any) -> None:
    c = await make_client()
    await c.post("/jobs", json=start_body("bulk/one"), headers=headers("k"))
    assert (await _bulk(c, 0, None)).status == 428
    assert (await _bulk(c, 0, "older-than:60")).status == 400
    assert (await _bulk(c, 0, "bulk/one")).status == 400
    for bad in (-1, 1.5, "0", True, None):
        assert (await _bulk(c, bad, f"older-than:{bad}")).status == 400, bad
    r = await c.post(BULK_ARCHIVE_PATH, json={"older_than_seconds": 0},
                     headers={ARCHIVE_CONFIRMATION_HEADER: "older-than:0"})
    assert r.status == 401
    assert (await c.get(job_path("bulk/one"), headers=AUTH)).status == 200  # nothing archived


async def test_bulk_archive_tombstones_old_terminal_records_only(make_client: Any) -> None:
    c = await make_client()
    bodies = {aid: start_body(aid) for aid in ("bulk/old-1", "bulk/old-2", "bulk/recent")}
    for aid, body in bodies.items():
        r = await c.post("/jobs", json=body, headers=headers(f"k-{aid}"))
        assert r.status == 200
    slow = start_body("bulk/running", topic=SLOW)
    before = llm_calls()
    assert (await c.post("/jobs", json=slow, headers=headers("k-run", async_=True))).status == 202
    await until_llm_called(before)
    _age(c, "bulk/old-1", 7200)
    _age(c, "bulk/old-2", 3700)

    r = await _bulk(c, 3600, "older-than:3600")
    assert r.status == 200
    assert await r.json() == {"archived": ["bulk/old-1", "bulk/old-2"], "count": 2}
    assert (await _health(c))["unarchived_records"] == 2

    calls = llm_calls()
    for aid in ("bulk/old-1", "bulk/old-2"):
        r = await c.post("/jobs", json=bodies[aid], headers=headers(f"k-{aid}"))
        assert r.status == 410, aid  # an identical request never runs again
        gone = await r.json()
        assert gone["tombstone"]["action_id"] == aid and gone["tombstone"]["archived"] is True
        assert (await c.get(job_path(aid), headers=AUTH)).status == 410
    assert llm_calls() == calls

    # The running record is never archived, whatever the age asked for.
    r = await _bulk(c, 0, "older-than:0")
    assert r.status == 200 and (await r.json())["archived"] == ["bulk/recent"]
    running = await (await c.get(job_path("bulk/running"), headers=AUTH)).json()
    assert running["status"] == "running"
    r = await _bulk(c, 0, "older-than:0")
    assert await r.json() == {"archived": [], "count": 0}


async def test_bulk_archive_uses_the_age_index(make_client: Any) -> None:
    """One indexed query: the plan searches the partial index, it never scans the records."""
    c = await make_client()
    journal = c.sidecar.runtime.journal
    plan = journal._conn.execute(
        "EXPLAIN QUERY PLAN SELECT action_id FROM records INDEXED BY records_terminal_by_age "
        "WHERE status != 'running' AND updated_at <= ? ORDER BY updated_at", ("x",)).fetchall()
    details = " ".join(str(row[-1]) for row in plan)
    assert "records_terminal_by_age" in details and "SCAN records" not in details.replace(
        "SCAN records USING INDEX", "")


async def test_operator_client_drives_draining_and_bulk_archive(make_client: Any) -> None:
    from crewfence_operator.sidecar_client import Endpoint, SidecarClient, SidecarFailure

    c = await make_client()
    await c.post("/jobs", json=start_body("client/one"), headers=headers("k"))
    async with aiohttp.ClientSession() as session:
        client = SidecarClient(session, Endpoint(f"127.0.0.1:{c.server.port}",
                                                 AUTH["Authorization"].split()[1]))
        health = await client.health_status()
        assert (health.draining, health.unarchived_records) == (False, 1)
        assert health.journal_id == c.sidecar.runtime.journal.journal_id
        state = await client.set_draining(True)
        assert state.draining is True and state.unarchived_records == 1
        assert (await client.health_status()).draining is True
        from crewfence_sidecar.contract import Operation, StartRequest
        try:
            await client.start(StartRequest(crew_id="research", action_id="client/two",
                                            operation=Operation.RUN, input={"topic": "x"}),
                               "k2")
        except SidecarFailure as exc:
            assert exc.http_status == 503 and exc.code == DRAINING_CODE
        else:
            raise AssertionError("a draining sidecar admitted a new job")
        result = await client.archive_older_than(0)
        assert result.archived == ("client/one",) and result.count == 1
        assert (await client.health_status()).unarchived_records == 0
        assert (await client.set_draining(False)).draining is False


def _call(url: str, method: str = "GET", body: Any = None,
          extra: dict[str, str] | None = None) -> tuple[int, dict[str, Any], Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={**AUTH, "Content-Type": "application/json",
                                          **(extra or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


def test_draining_survives_a_restart_of_the_real_process(tmp_path: Path) -> None:
    crews = write_crews(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = sidecar_env(state / "journal.db", crews)
    first = SidecarProcess([], env, tmp_path / "first.log").start()
    try:
        first.wait_listening()
        status, _, _ = _call(first.url + "/jobs", "POST", start_body("restart/known"),
                             {"Idempotency-Key": "k"})
        assert status == 200
        status, body, _ = _call(first.url + DRAIN_PATH, "POST", {"draining": True})
        assert status == 200 and body == {"draining": True, "unarchived_records": 1}
    finally:
        assert first.terminate() == 0
    second = SidecarProcess([], env, tmp_path / "second.log").start()
    try:
        second.wait_listening()
        status, health, _ = _call(second.url + "/health")
        assert health["draining"] is True and health["unarchived_records"] == 1
        status, body, hdrs = _call(second.url + "/jobs", "POST", start_body("restart/new"),
                                   {"Idempotency-Key": "k-new"})
        _assert_draining_refusal(status, body, hdrs)
        status, body, _ = _call(second.url + "/jobs", "POST", start_body("restart/known"),
                                {"Idempotency-Key": "k"})
        assert status == 200 and body["raw"]  # an exact repeat still answers
        status, body, _ = _call(second.url + DRAIN_PATH, "POST", {"draining": False})
        assert body["draining"] is False
        status, _, _ = _call(second.url + "/jobs", "POST", start_body("restart/new"),
                             {"Idempotency-Key": "k-new", "Prefer": "respond-async"})
        assert status == 202
    finally:
        assert second.terminate() == 0
    with sqlite3.connect(state / "journal.db") as conn:
        value = conn.execute("SELECT value FROM meta WHERE key = 'draining'").fetchone()
    assert value == ("0",)
