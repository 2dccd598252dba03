"""``POST /jobs/{action_id}/resolution``: authenticated, idempotent, journaled as an event that
the journal export (the audit trail of record) carries; the record itself never changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crewfence_sidecar import user_cli
from crewfence_sidecar.contract import job_path
from sidecar_helpers import AUTH, headers, start_body

RESOLUTION = {"crew_id": "research", "action_id": "r-1", "outcome": "NotHappened",
              "note": "provider logs show no request", "evidence": ["https://tickets/1"],
              "resolved_by": "kubectl-crewfence"}


async def _finished(c: Any, action_id: str, topic: str = "bees") -> dict[str, Any]:
    r = await c.post("/jobs", json=start_body(action_id, topic=topic),
                     headers=headers(action_id, async_=True))
    assert r.status == 202, await r.text()
    assert await c.sidecar.runtime.wait_terminal(action_id, 60)
    record: dict[str, Any] = await (await c.get(job_path(action_id), headers=AUTH)).json()
    assert record["status"] in ("completed", "failed"), record
    return record


async def _resolve(c: Any, body: dict[str, Any], **kw: Any) -> Any:
    return await c.post(job_path(body["action_id"], "/resolution"), json=body,
                        headers=kw.get("headers", AUTH))


async def test_resolution_is_journaled_once_and_leaves_the_record_alone(
        make_client: Any, state_dir: Path, tmp_path: Path) -> None:
    c = await make_client()
    before = await _finished(c, "r-1", topic="[[fail]] boom")

    unauthenticated = await _resolve(c, RESOLUTION, headers={})
    assert unauthenticated.status == 401

    first = await _resolve(c, RESOLUTION)
    assert first.status == 201, await first.text()
    event = (await first.json())["event"]
    assert event["event"] == "resolution"
    assert event["sequence"] == before["event_count"]  # right after the terminal event
    assert event["data"]["outcome"] == "NotHappened"
    assert event["data"]["note"] == "provider logs show no request"

    repeat = await _resolve(c, RESOLUTION)
    assert repeat.status == 200
    assert (await repeat.json())["event"] == event
    assert (await repeat.json())["created"] is False

    other = await _resolve(c, {**RESOLUTION, "outcome": "Happened"})
    assert other.status == 409
    assert (await other.json())["error"]["code"] == "resolution_conflict"

    after = await (await c.get(job_path("r-1"), headers=AUTH)).json()
    assert {k: v for k, v in after.items() if k != "event_count"} == \
        {k: v for k, v in before.items() if k != "event_count"}
    assert after["event_count"] == before["event_count"] + 1

    page = await (await c.get(job_path("r-1", "/events"), headers=AUTH)).json()
    assert [e["event"] for e in page["events"]][-2:] == ["failed", "resolution"]

    # The journal export, taken while no sidecar owns the journal, carries the resolution.
    await c.sidecar.runtime.close()
    c.sidecar.opened.close()
    out = tmp_path / "export.json"
    assert user_cli.main(["journal", "export", str(state_dir / "journal.db"),
                          "--action-id", "r-1", "--output", str(out)]) == 0
    exported = json.loads(out.read_text())
    events = exported.get("events") or exported["records"][0]["events"]
    resolution = [e for e in events if e["event"] == "resolution"]
    assert len(resolution) == 1
    assert resolution[0]["data"]["evidence"] == ["https://tickets/1"]


async def test_resolution_refused_for_unknown_or_running_jobs_and_bad_bodies(
        make_client: Any) -> None:
    c = await make_client()
    unknown = await _resolve(c, {**RESOLUTION, "action_id": "nope"})
    assert unknown.status == 404

    r = await c.post("/jobs", json=start_body("slow", topic="[[sleep:30]] slowly"),
                     headers=headers("slow", async_=True))
    assert r.status == 202
    running = await _resolve(c, {**RESOLUTION, "action_id": "slow"})
    assert running.status == 409
    assert (await running.json())["error"]["code"] == "job_running"

    await _finished(c, "r-2")
    for bad in ({"outcome": "Maybe"}, {"note": "  "}, {"evidence": "not-a-list"},
                {"extra": 1}):
        resp = await _resolve(c, {**RESOLUTION, "action_id": "r-2", **bad})
        assert resp.status == 400, bad
    mismatch = await c.post(job_path("r-2", "/resolution"), json=RESOLUTION, headers=AUTH)
    assert mismatch.status == 400  # body names r-1, path r-2
