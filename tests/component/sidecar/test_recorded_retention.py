"""Retention never races the operator (issue 19): ``recorded_only`` bulk archive takes only
records whose outcome a client marked recorded (``POST /jobs/{id}/recorded``), and records
nobody marked only a day past the window. Real in-process sidecar, real SQLite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from crewfence_sidecar.contract import RECORDED_SUFFIX, UNRECORDED_GRACE_SECONDS, job_path
from crewfence_sidecar.journal import utc_iso
from sidecar_helpers import AUTH, headers, start_body

CONFIRM = {**AUTH, "X-AIP-Archive-Confirmation": "older-than:0"}


async def _archive(c: Any, **extra: Any) -> list[str]:
    r = await c.post("/admin/archive", json={"older_than_seconds": 0, **extra}, headers=CONFIRM)
    assert r.status == 200, await r.text()
    return list((await r.json())["archived"])


async def _mark(c: Any, action_id: str, crew_id: str = "research") -> Any:
    return await c.post(job_path(action_id, RECORDED_SUFFIX),
                        json={"crew_id": crew_id, "action_id": action_id}, headers=AUTH)


async def test_recorded_only_retention_keeps_what_nobody_recorded(make_client: Any) -> None:
    c = await make_client()
    for aid in ("rec/marked", "rec/unmarked"):
        assert (await c.post("/jobs", json=start_body(aid), headers=headers(aid))).status == 200
    r = await _mark(c, "rec/marked")
    assert r.status == 200 and (await r.json())["recorded_at"]
    again = await _mark(c, "rec/marked")
    assert (await again.json())["recorded_at"] == (await r.json())["recorded_at"], "idempotent"

    assert await _archive(c, recorded_only=True) == ["rec/marked"]
    assert (await c.get(job_path("rec/unmarked"), headers=AUTH)).status == 200
    assert (await _mark(c, "rec/marked")).status == 410, "an archived record answers 410"

    # A day past the window, a record nobody marked goes too (no operator reads it).
    journal = c.sidecar.runtime.journal
    stamp = utc_iso(datetime.now(UTC) - timedelta(seconds=UNRECORDED_GRACE_SECONDS + 60))
    journal._conn.execute("UPDATE records SET updated_at = ? WHERE action_id = ?",
                          (stamp, "rec/unmarked"))
    journal.records["rec/unmarked"].updated_at = stamp
    assert await _archive(c, recorded_only=True) == ["rec/unmarked"]


async def test_plain_retention_is_unchanged_and_marks_are_checked(make_client: Any) -> None:
    c = await make_client()
    assert (await c.post("/jobs", json=start_body("rec/plain"),
                         headers=headers("k"))).status == 200
    assert (await _mark(c, "rec/plain", crew_id="other")).status == 404
    assert (await _mark(c, "rec/none")).status == 404
    bad = await c.post(job_path("rec/plain", RECORDED_SUFFIX),
                       json={"crew_id": "research", "action_id": "rec/other"}, headers=AUTH)
    assert bad.status == 400
    assert (await c.post(job_path("rec/plain", RECORDED_SUFFIX),
                         json={"crew_id": "research", "action_id": "rec/plain"})).status == 401
    r = await c.post("/admin/archive", json={"older_than_seconds": 0, "recorded_only": "yes"},
                     headers=CONFIRM)
    assert r.status == 400
    assert await _archive(c) == ["rec/plain"], "without recorded_only: as before"


async def test_the_mark_goes_with_the_record(make_client: Any) -> None:
    c = await make_client()
    assert (await c.post("/jobs", json=start_body("rec/gone"),
                         headers=headers("k"))).status == 200
    assert (await _mark(c, "rec/gone")).status == 200
    assert await _archive(c, recorded_only=True) == ["rec/gone"]
    rows = c.sidecar.runtime.journal._conn.execute("SELECT count(*) FROM recorded").fetchone()
    assert rows[0] == 0
