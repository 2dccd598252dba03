"""An archived action keeps its findings (issue 19): the journaled resolution and the one
successor claim stay with its tombstone (``Journal.archive``: "findings outlive the record"),
answer a later resolution exactly as the record did, and go with the tombstone when it is
handed over to another replica (``Journal.import_tombstones``). Two real sidecars (in process,
real crewai with the offline LLM), each with its own SQLite journal; the operator's
``SidecarClient`` carries the hand-over as the Crew daemon does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from crewfence_operator.sidecar_client import Endpoint, SidecarClient
from crewfence_sidecar.contract import JobEvent, job_path
from sidecar_helpers import AUTH, uncertain_after_restart

RESOLVE = {"crew_id": "research", "note": "provider logs show no request",
           "evidence": ["https://tickets/1"], "resolved_by": "kubectl-crewfence"}
CONFIRM = "X-AIP-Archive-Confirmation"


def _client(session: aiohttp.ClientSession, c: Any) -> SidecarClient:
    return SidecarClient(session, Endpoint(f"127.0.0.1:{c.server.port}",
                                           AUTH["Authorization"].split()[1]))


async def _resolve(c: Any, action_id: str, outcome: str) -> Any:
    return await c.post(job_path(action_id, "/resolution"), headers=AUTH,
                        json={**RESOLVE, "action_id": action_id, "outcome": outcome})


async def _error(resp: Any) -> dict[str, Any]:
    return dict((await resp.json())["error"])


async def test_an_archived_action_answers_from_its_journaled_finding_here_and_after_hand_over(
        make_client: Any, tmp_path: Path) -> None:
    c = await uncertain_after_restart(make_client, ("ns/p", "ns/q"))
    first = await _resolve(c, "ns/p", "NotHappened")
    assert first.status == 201
    journaled = (await first.json())["event"]
    claim = await c.post(job_path("ns/p", "/successor"), headers=AUTH,
                         json={"crew_id": "research", "action_id": "ns/p",
                               "successor_action_id": "ns/next"})
    assert claim.status == 201, await claim.text()

    # by hand (ns/p) and by age (ns/q: no finding yet)
    assert (await c.delete(job_path("ns/p"), headers={**AUTH, CONFIRM: "ns/p"})).status == 200
    bulk = await c.post("/admin/archive", json={"older_than_seconds": 0},
                        headers={**AUTH, CONFIRM: "older-than:0"})
    assert (await bulk.json())["archived"] == ["ns/q"]

    same = await _resolve(c, "ns/p", "NotHappened")
    assert same.status == 200, await same.text()
    body = await same.json()
    assert (body["event"], body["created"]) == (journaled, False)
    assert body["successor"]["data"]["successor_action_id"] == "ns/next"
    other = await _resolve(c, "ns/p", "Happened")
    assert other.status == 409
    err = await _error(other)
    assert err["code"] == "resolution_conflict" and err["journaled"] == journaled

    again = await c.post(job_path("ns/p", "/successor"), headers=AUTH,
                         json={"crew_id": "research", "action_id": "ns/p",
                               "successor_action_id": "ns/second"})
    assert again.status == 410, "the successor route on an archived predecessor refuses"
    gone = await again.json()
    assert "NotHappened" in gone["error"]["message"] and "'ns/next'" in gone["error"]["message"]
    assert gone["tombstone"]["successor"]["data"]["successor_action_id"] == "ns/next"

    late = await _resolve(c, "ns/q", "Happened")
    assert late.status == 201, await late.text()
    late_event = (await late.json())["event"]
    assert (await _resolve(c, "ns/q", "Happened")).status == 200
    assert (await _error(await _resolve(c, "ns/q", "NotHappened")))["journaled"] == late_event

    d = tmp_path / "serving"
    d.mkdir(mode=0o700)
    serving = await make_client(CREWFENCE_STATE_FILE=str(d / "journal.db"))
    async with aiohttp.ClientSession() as session:
        stones, _ = await _client(session, c).tombstone_page()
        assert {s.action_id: s.resolution is not None for s in stones} == \
            {"ns/p": True, "ns/q": True}
        target = _client(session, serving)
        result = await target.import_tombstones(stones)
        assert (result.imported, result.conflicts) == (2, ())
        p = next(s for s in stones if s.action_id == "ns/p")
        assert p.resolution is not None
        flipped = replace(p, resolution=JobEvent("resolution", p.resolution.sequence,
                                                 {**p.resolution.data, "outcome": "Happened"}))
        clash = await target.import_tombstones([flipped])
        assert clash.conflicts == ("ns/p",), "a different finding is reported, not merged"

    moved = await _resolve(serving, "ns/p", "Happened")
    assert moved.status == 409
    assert (await _error(moved))["journaled"] == journaled, "the first finding stands"
    repeat = await _resolve(serving, "ns/q", "Happened")
    assert repeat.status == 200 and (await repeat.json())["event"] == late_event
