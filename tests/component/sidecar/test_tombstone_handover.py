"""Tombstones outlive their replica (issue 19): a drained replica's tombstones are paged out of
its journal and kept by another replica's journal, where they answer exactly as there.

Two real in-process sidecars, each with its own SQLite journal (real crewai with the offline
LLM); the operator's ``SidecarClient`` carries the hand-over as the Crew daemon does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from crewfence_operator.sidecar_client import Endpoint, SidecarClient
from crewfence_sidecar.contract import TOMBSTONES_PATH, job_path
from sidecar_helpers import AUTH, headers, llm_calls, start_body

ARCHIVE = {"X-AIP-Archive-Confirmation": "older-than:0"}


def _client(session: aiohttp.ClientSession, c: Any) -> SidecarClient:
    return SidecarClient(session, Endpoint(f"127.0.0.1:{c.server.port}",
                                           AUTH["Authorization"].split()[1]))


async def _two(make_client: Any, tmp_path: Path) -> tuple[Any, Any]:
    dirs = []
    for name in ("retiring", "serving"):
        d = tmp_path / name
        d.mkdir(mode=0o700)
        dirs.append(d)
    retiring = await make_client(CREWFENCE_STATE_FILE=str(dirs[0] / "journal.db"))
    serving = await make_client(CREWFENCE_STATE_FILE=str(dirs[1] / "journal.db"))
    return retiring, serving


async def _archived_on(c: Any, *action_ids: str) -> dict[str, dict[str, Any]]:
    bodies = {aid: start_body(aid) for aid in action_ids}
    for aid, body in bodies.items():
        assert (await c.post("/jobs", json=body, headers=headers(f"k-{aid}"))).status == 200
    r = await c.post("/admin/archive", json={"older_than_seconds": 0},
                     headers={**AUTH, **ARCHIVE})
    assert r.status == 200 and (await r.json())["count"] == len(action_ids)
    return bodies


async def test_handed_over_tombstones_answer_410_and_never_run_again(
    make_client: Any, tmp_path: Path
) -> None:
    retiring, serving = await _two(make_client, tmp_path)
    bodies = await _archived_on(retiring, "ns/a", "ns/b", "ns/c")
    assert (await (await retiring.get("/health")).json())["tombstones"] == 3

    async with aiohttp.ClientSession() as session:
        source, target = _client(session, retiring), _client(session, serving)
        first, after = await source.tombstone_page(limit=2)
        assert [t.action_id for t in first] == ["ns/a", "ns/b"] and after == "ns/b"
        rest, end = await source.tombstone_page(after, limit=2)
        assert [t.action_id for t in rest] == ["ns/c"] and end is None
        result = await target.import_tombstones(first + rest)
        assert (result.imported, result.known, result.conflicts) == (3, 0, ())
        again = await target.import_tombstones(first + rest)
        assert (again.imported, again.known) == (0, 3), "a repeated hand-over changes nothing"

    assert (await (await serving.get("/health")).json())["tombstones"] == 3
    calls = llm_calls()
    for aid, body in bodies.items():
        gone = await serving.post("/jobs", json=body, headers=headers(f"k-{aid}"))
        assert gone.status == 410, aid
        assert (await gone.json())["tombstone"]["action_id"] == aid
        assert (await serving.get(job_path(aid), headers=AUTH)).status == 410
        other = await serving.post("/jobs", json=start_body(aid, topic="other"),
                                   headers=headers(f"k-{aid}"))
        assert other.status == 409, "another request under an archived id is a conflict"
    assert llm_calls() == calls, "nothing ran on the replica that took the tombstones over"


async def test_an_import_never_overwrites_what_the_journal_holds(
    make_client: Any, tmp_path: Path
) -> None:
    retiring, serving = await _two(make_client, tmp_path)
    await _archived_on(retiring, "ns/twice")
    # The same action id admitted on the serving replica too (what the fences prevent): the
    # record there is kept and the import names the conflict.
    assert (await serving.post("/jobs", json=start_body("ns/twice"),
                               headers=headers("k-ns/twice"))).status == 200
    async with aiohttp.ClientSession() as session:
        stones, _ = await _client(session, retiring).tombstone_page()
        result = await _client(session, serving).import_tombstones(stones)
    assert result.conflicts == ("ns/twice",) and result.imported == 0
    record = await (await serving.get(job_path("ns/twice"), headers=AUTH)).json()
    assert record["status"] == "completed"


async def test_tombstone_routes_need_auth_and_a_strict_body(
    make_client: Any, tmp_path: Path
) -> None:
    _, serving = await _two(make_client, tmp_path)
    assert (await serving.get(TOMBSTONES_PATH)).status == 401
    assert (await serving.post(TOMBSTONES_PATH, json={"tombstones": []})).status == 401
    for bad in ({}, {"tombstones": "x"}, {"tombstones": [{"action_id": "a"}]},
                {"tombstones": [7]}, {"tombstones": [["a"]]}, {"tombstones": [None]},
                {"tombstones": [], "more": 1},
                {"tombstones": [{"action_id": "a", "crew_id": "research", "operation": "run",
                                 "request_hash": "not-a-digest", "status": "completed",
                                 "archived_at": "2026-01-01T00:00:00Z"}]}):
        assert (await serving.post(TOMBSTONES_PATH, json=bad, headers=AUTH)).status == 400, bad
    for query in ("limit=0", "limit=501", "limit=x"):
        assert (await serving.get(f"{TOMBSTONES_PATH}?{query}", headers=AUTH)).status == 400
