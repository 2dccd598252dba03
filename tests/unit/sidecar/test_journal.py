"""Journal: durable rows, restore checks, restart fencing of running records, tombstones."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from crewfence_sidecar.contract import JobRecord, Status
from crewfence_sidecar.fencing import fence_journal
from crewfence_sidecar.journal import Journal, JournalError, JournalFull, JournalLimits, utc_now


def _record(action_id: str) -> JobRecord:
    now = utc_now()
    return JobRecord(action_id=action_id, crew_id="c", operation="run", request_hash="h" * 64,
                     status=Status.RUNNING, event_count=0, created_at=now, updated_at=now)


@pytest.fixture
def jpath(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d / "journal.db"


def _open(path: Path, **limits: int) -> Journal:
    return Journal.open(path, JournalLimits(**limits))


def test_new_journal_is_0600_with_a_stable_id_and_no_shm(jpath: Path) -> None:
    j = _open(jpath)
    jid = j.journal_id
    j.admit(_record("a"), {"x": 1})
    assert oct(jpath.stat().st_mode & 0o777) == "0o600"
    assert not jpath.with_name(jpath.name + "-shm").exists()
    j.close()
    j2 = _open(jpath)
    assert j2.journal_id == jid
    j2.close()


def test_restored_running_becomes_failed_and_uncertain(jpath: Path) -> None:
    j = _open(jpath)
    j.admit(_record("run1"), {})
    j.append_event("run1", "chunk", {"content": "x"})
    j.admit(_record("done"), {})
    j.finish("done", Status.COMPLETED, output={"raw": "r"}, error=None, uncertain=False,
             event_data={"output": {"raw": "r"}})
    j.close()  # like a crash: nothing marks run1 terminal

    j2 = _open(jpath)
    rec = j2.get("run1")
    assert rec is not None and rec.status is Status.FAILED and rec.uncertain_outcome
    events = j2.events("run1")
    assert [e.sequence for e in events] == [0, 1, 2]
    assert events[-1].event == "failed" and events[-1].data["uncertain_outcome"] is True
    done = j2.get("done")
    assert done is not None and done.status is Status.COMPLETED and not done.uncertain_outcome
    assert j2.restore_report.recovered_running == ["run1"]
    j2.close()


def test_archive_leaves_a_tombstone_that_survives_restart(jpath: Path) -> None:
    j = _open(jpath)
    j.admit(_record("a"), {})
    with pytest.raises(ValueError):
        j.archive("a")
    j.finish("a", Status.CANCELLED, output=None, error=None, uncertain=True, event_data={})
    stone = j.archive("a")
    assert stone.status is Status.CANCELLED and stone.uncertain_outcome
    assert j.get("a") is None and j.events("a") == []
    j.close()
    j2 = _open(jpath)
    again = j2.tombstone("a")
    assert again is not None and again.request_hash == "h" * 64
    j2.close()


def test_a_records_recorded_mark_is_on_the_record_and_survives_restart(jpath: Path) -> None:
    """The mark a client set (``POST /jobs/{id}/recorded``) is part of the record it reads
    again, before and after a restart: a CrewJob re-applied from Git learns from the record
    that its finish was counted already (the operator's per-Crew usage counters)."""
    j = _open(jpath)
    for aid in ("marked", "unmarked"):
        j.admit(_record(aid), {})
        j.finish(aid, Status.COMPLETED, output={"raw": "r"}, error=None, uncertain=False,
                 event_data={"raw": "r"})
    assert j.get("marked").recorded_at is None  # type: ignore[union-attr]
    at = j.mark_recorded("marked")
    assert j.get("marked").recorded_at == at  # type: ignore[union-attr]
    assert j.mark_recorded("marked") == at, "the first mark's time stays"
    j.close()
    j2 = _open(jpath)
    assert j2.get("marked").recorded_at == at  # type: ignore[union-attr]
    assert j2.get("unmarked").recorded_at is None  # type: ignore[union-attr]
    assert j2.get("marked").to_wire()["recorded_at"] == at  # type: ignore[union-attr]
    j2.close()


def test_record_bound_refuses_admission_and_keeps_nothing(jpath: Path) -> None:
    j = _open(jpath, max_retained_runs=2)
    j.admit(_record("a"), {})
    j.admit(_record("b"), {})
    with pytest.raises(JournalFull):
        j.admit(_record("c"), {})
    assert j.get("c") is None
    j.close()
    assert sqlite3.connect(jpath).execute("select count(*) from records").fetchone()[0] == 2


def test_byte_bound_refuses_admission(jpath: Path) -> None:
    j = _open(jpath, max_state_bytes=1024 * 1024)
    with pytest.raises(JournalFull):
        for i in range(10_000):
            j.admit(_record(f"a{i}"), {"pad": "x" * 2000})
    assert len(j.records) < 10_000
    j.close()


def test_events_per_run_bound_reserves_the_terminal_slot(jpath: Path) -> None:
    j = _open(jpath, max_events_per_run=4)
    j.admit(_record("a"), {})
    j.append_event("a", "chunk", {})
    j.append_event("a", "chunk", {})
    with pytest.raises(JournalFull):
        j.append_event("a", "chunk", {})
    ev = j.finish("a", Status.COMPLETED, output=1, error=None, uncertain=False, event_data={})
    assert ev.sequence == 3
    j.close()


def test_oversized_terminal_event_keeps_output_on_the_record(jpath: Path) -> None:
    j = _open(jpath, max_event_bytes=1024)
    j.admit(_record("a"), {})
    big = "y" * 5000
    ev = j.finish("a", Status.COMPLETED, output=big, error=None, uncertain=False,
                  event_data={"output": big})
    assert ev.data.get("output_omitted") is True
    assert j.get("a").output == big  # type: ignore[union-attr]
    j.close()


def _two_finished_runs(jpath: Path) -> None:
    j = _open(jpath)
    for name in ("a", "b"):
        j.admit(_record(name), {"pad": "z" * 2000})
        for _ in range(4):
            j.append_event(name, "chunk", {})
        j.finish(name, Status.FAILED, output=None, error=None, uncertain=True,
                 event_data={})
    j.archive("b")
    j.close()


@pytest.mark.parametrize("limit, bound", [
    ({"max_retained_runs": 1}, "max_retained_runs"),
    ({"max_events_per_run": 4}, "max_events_per_run"),
    ({"max_event_bytes": 1024}, "max_event_bytes"),
    ({"max_state_bytes": 1024}, "max_state_bytes"),
])
def test_lowered_bounds_never_brick_a_journal(jpath: Path, limit: dict[str, int],
                                              bound: str) -> None:
    """Invariant (Journal.over_bounds): a journal holding more than a lowered bound opens,
    serves what it holds (record, events, tombstone, a resolution) and names the bound."""
    _two_finished_runs(jpath)
    j = _open(jpath, **limit)
    assert bound in [b.bound for b in j.over_bounds()], j.over_bounds()
    rec = j.get("a")
    assert rec is not None and rec.status is Status.FAILED
    assert [e.event for e in j.events("a")][-1] == "failed"
    assert j.tombstone("b") is not None
    j.append_resolution("a", {"resolution": "NotHappened"})
    assert j.resolution("a") is not None
    j.close()


@pytest.mark.parametrize("limit", [{"max_retained_runs": 1}, {"max_state_bytes": 1024}])
def test_over_a_lowered_bound_only_new_admissions_are_refused(
        jpath: Path, limit: dict[str, int]) -> None:
    _two_finished_runs(jpath)
    j = _open(jpath, **limit)
    with pytest.raises(JournalFull):
        j.admit(_record("c"), {})
    assert j.get("c") is None
    j.archive("a")
    if "max_retained_runs" in limit:  # back under its bound: admissions again
        assert j.over_bounds() == []
        j.admit(_record("c"), {})
    j.close()


def test_a_journal_within_its_bounds_reports_none(jpath: Path) -> None:
    _two_finished_runs(jpath)
    j = _open(jpath)
    assert j.over_bounds() == []
    j.close()


def test_a_journal_over_its_byte_bound_opens_and_recovers(jpath: Path) -> None:
    j = _open(jpath)
    for i in range(300):
        j.admit(_record(f"a{i}"), {"pad": "z" * 4000})
    j.close()
    j = _open(jpath, max_state_bytes=1024 * 1024)  # 300 running records, over the bound
    assert [b.bound for b in j.over_bounds()] == ["max_state_bytes"]
    rec = j.get("a0")  # restored running records are still recovered (failed, uncertain)
    assert rec is not None and rec.status is Status.FAILED and rec.uncertain_outcome
    with pytest.raises(JournalFull):
        j.admit(_record("new"), {})
    j.close()


def test_restore_detects_tampered_event_sequences(jpath: Path) -> None:
    j = _open(jpath)
    j.admit(_record("a"), {})
    j.append_event("a", "chunk", {})
    j.close()
    conn = sqlite3.connect(jpath)
    conn.execute("DELETE FROM events WHERE sequence = 0")
    conn.commit()
    conn.close()
    with pytest.raises(JournalError, match="contiguous"):
        _open(jpath)


def test_an_append_inserts_event_rows_and_rewrites_no_record_row(jpath: Path) -> None:
    """One table per append: a durable effect commit syncs the events page alone (the
    record's row, a second page in the WAL, is rewritten only when the record ends)."""
    j = _open(jpath)
    j.admit(_record("a"), {})
    statements: list[str] = []
    j._conn.set_trace_callback(statements.append)
    j.append_events("a", [("model_call", {"n": 1}), ("tool_call_started", {"n": 2})],
                    durable=True)
    j._conn.set_trace_callback(None)
    writes = [s for s in statements if s.lstrip().upper().startswith(("INSERT", "UPDATE"))]
    assert writes and all(s.startswith("INSERT INTO events") for s in writes), writes
    rec = j.get("a")
    assert rec is not None and rec.event_count == 3
    j.finish("a", Status.COMPLETED, output=None, error=None, uncertain=False, event_data={})
    j.close()
    conn = sqlite3.connect(jpath)
    assert conn.execute("SELECT event_count FROM records").fetchone()[0] == 4
    conn.close()
    j2 = _open(jpath)  # a terminal record's count is exact again
    assert [e.sequence for e in j2.events("a")] == [0, 1, 2, 3]
    j2.close()


@pytest.mark.parametrize("status", ["running", "completed"])
def test_restore_detects_events_lost_behind_the_stored_count(jpath: Path,
                                                             status: str) -> None:
    j = _open(jpath)
    j.admit(_record("a"), {})
    j.append_event("a", "chunk", {})
    if status == "completed":
        j.finish("a", Status.COMPLETED, output=None, error=None, uncertain=False,
                 event_data={})
    j.close()
    conn = sqlite3.connect(jpath)
    conn.execute("UPDATE records SET event_count = 9")  # more events than there are
    conn.commit()
    conn.close()
    with pytest.raises(JournalError, match="disagree"):
        _open(jpath)


def test_restore_detects_duplicate_action_ids(jpath: Path) -> None:
    j = _open(jpath)
    j.admit(_record("a"), {})
    j.finish("a", Status.COMPLETED, output=None, error=None, uncertain=False, event_data={})
    j.close()
    conn = sqlite3.connect(jpath)
    conn.execute("INSERT INTO tombstones VALUES ('a','c','run','h','completed',0,'t')")
    conn.commit()
    conn.close()
    with pytest.raises(JournalError, match="duplicate"):
        _open(jpath)


def test_not_a_database_is_refused(jpath: Path) -> None:
    jpath.write_bytes(b"garbage" * 1000)
    jpath.chmod(0o600)
    with pytest.raises(JournalError):
        _open(jpath)


def test_admission_cost_does_not_rewrite_the_file(jpath: Path) -> None:
    """Row inserts only: adding one record to a big journal grows the file by a few pages."""
    j = _open(jpath)
    for i in range(600):
        j.admit(_record(f"a{i}"), {"pad": "p" * 200})
    before = j.state_bytes()
    j.admit(_record("last"), {"pad": "p" * 200})
    assert j.state_bytes() - before < 64 * 1024
    j.close()


def test_fenced_open_then_restore(jpath: Path) -> None:
    lock, existed = fence_journal(jpath)
    assert not existed
    j = _open(jpath)
    j.close()
    lock.release()


def _archived(jpath: Path, action_id: str, **limits: int) -> Journal:
    j = _open(jpath, **limits)
    j.admit(_record(action_id), {})
    j.finish(action_id, Status.COMPLETED, output=None, error=None, uncertain=False,
             event_data={})
    j.archive(action_id)
    return j


def _age_tombstones(jpath: Path, seconds: int) -> None:
    from datetime import UTC, datetime, timedelta

    from crewfence_sidecar.journal import utc_iso
    conn = sqlite3.connect(jpath)
    conn.execute("UPDATE tombstones SET archived_at = ?",
                 (utc_iso(datetime.now(UTC) - timedelta(seconds=seconds)),))
    conn.commit()
    conn.close()


def test_tombstones_never_expire_by_default(jpath: Path) -> None:
    _archived(jpath, "a").close()
    _age_tombstones(jpath, 100 * 365 * 24 * 3600)
    j = _open(jpath)
    assert j.tombstone("a") is not None and j.tombstone_count() == 1
    with pytest.raises(ValueError):
        j.admit(_record("a"), {})
    j.close()


def test_a_tombstone_answers_until_its_retention_then_never_again(jpath: Path) -> None:
    """Invariant (Journal.tombstone_cutoff): an explicit tombstone retention ends a
    tombstone; before it, the tombstone answers (and the action cannot be admitted)."""
    j = _archived(jpath, "a", tombstone_retention_seconds=3600)
    assert j.tombstone("a") is not None
    with pytest.raises(ValueError):
        j.admit(_record("a"), {})
    j.close()
    _age_tombstones(jpath, 3601)
    conn = sqlite3.connect(jpath)  # the row is still there until the journal opens
    assert conn.execute("SELECT count(*) FROM tombstones").fetchone()[0] == 1
    conn.close()
    j = _open(jpath, tombstone_retention_seconds=3600)
    assert j.tombstone("a") is None and j.tombstone_count() == 0
    assert j.tombstone_page("", 10) == []
    j.admit(_record("a"), {})  # the action id is new again
    j.close()
    j = _open(jpath, tombstone_retention_seconds=3600)  # restores (no record+tombstone pair)
    assert j.get("a") is not None
    j.close()


def test_a_tombstone_that_expires_while_open_frees_its_action_id(jpath: Path) -> None:
    """Invariant (Journal.admit, its one-lookup tombstone check): a tombstone past its
    retention no longer blocks the action id even before a reopen expires it (its row goes
    with the new admission's transaction); one within its retention does."""
    from datetime import UTC, datetime, timedelta

    from crewfence_sidecar.journal import utc_iso

    j = _archived(jpath, "a", tombstone_retention_seconds=3600)
    j._conn.execute("UPDATE tombstones SET archived_at = ?",
                    (utc_iso(datetime.now(UTC) - timedelta(seconds=3500)),))
    with pytest.raises(ValueError):
        j.admit(_record("a"), {})
    j._conn.execute("UPDATE tombstones SET archived_at = ?",
                    (utc_iso(datetime.now(UTC) - timedelta(seconds=3601)),))
    assert j.tombstone("a") is None
    j.admit(_record("a"), {})
    assert j._conn.execute("SELECT count(*) FROM tombstones").fetchone()[0] == 0
    j.close()
    j = _open(jpath, tombstone_retention_seconds=3600)  # restores: no record+tombstone pair
    assert j.get("a") is not None
    j.close()


def test_an_expired_tombstone_is_not_imported(jpath: Path) -> None:
    from crewfence_sidecar.contract import Tombstone

    j = _open(jpath, tombstone_retention_seconds=60)
    old = Tombstone(action_id="x", crew_id="c", operation="run", request_hash="h" * 64,
                    status=Status.COMPLETED, archived_at="2020-01-01T00:00:00.000Z",
                    uncertain_outcome=False)
    fresh = Tombstone(action_id="y", crew_id="c", operation="run", request_hash="h" * 64,
                      status=Status.COMPLETED, archived_at=utc_now(), uncertain_outcome=False)
    result = j.import_tombstones([old, fresh])
    assert (result.imported, result.known) == (1, 1)
    assert j.tombstone("x") is None and j.tombstone("y") is not None
    j.close()


def _wal_bytes(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def test_open_grows_the_wal_so_commits_overwrite_it(jpath: Path) -> None:
    """Invariant (commits overwrite the WAL, not append to it): once open, the WAL file has
    its steady size, admissions and completions do not grow it, and the room was made by a
    rolled-back transaction: no table, record or event of it exists, before or after a
    restart, and the journal passes SQLite's integrity check."""
    from crewfence_sidecar.journal import WAL_ROOM_FRAMES

    _open(jpath).close()  # a clean close checkpoints and removes the WAL
    assert _wal_bytes(jpath) == 0
    j = _open(jpath)
    grown = _wal_bytes(jpath)
    assert grown >= WAL_ROOM_FRAMES * 4096
    for i in range(50):
        j.admit(_record(f"g{i}"), {"pad": "p" * 200})
        j.finish(f"g{i}", Status.COMPLETED, output={"raw": "r"}, error=None,
                 uncertain=False, event_data={"output": {"raw": "r"}})
    assert _wal_bytes(jpath) == grown
    tables = {r[0] for r in j._conn.execute("SELECT name FROM sqlite_master")}
    assert "crewfence_wal_room" not in tables
    assert j._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    j.close()
    j2 = _open(jpath)
    assert len(j2.records) == 50 and all(r.status is Status.COMPLETED
                                         for r in j2.records.values())
    assert j2._conn.execute("SELECT count(*) FROM events").fetchone()[0] == 100
    j2.close()


def test_the_wal_is_not_grown_past_a_quarter_of_the_state_bound(jpath: Path) -> None:
    j = _open(jpath, max_state_bytes=8 * 1024 * 1024)
    assert _wal_bytes(jpath) < 1024 * 1024
    j.admit(_record("small"), {})
    j.close()


# --- findings outlive the record (Journal.archive, import_tombstones) ---------------------------
_FOUND = {"crew_id": "c", "outcome": "NotHappened", "note": "nothing went out", "evidence": [],
          "recorded_at": "2026-12-02T00:00:00.000Z"}


def _resolved_uncertain(j: Journal, action_id: str, *, successor: str | None = None,
                        resume: bool = False) -> None:
    j.admit(_record(action_id), {})
    j.finish(action_id, Status.FAILED, output=None, error=None, uncertain=True, event_data={})
    j.append_resolution(action_id, dict(_FOUND))
    if successor is not None:
        claim: dict[str, object] = {"crew_id": "c", "successor_action_id": successor}
        if resume:
            claim["resume"] = True
        j.append_successor(action_id, claim)


@pytest.mark.parametrize("bulk", [False, True], ids=["by-hand", "bulk"])
def test_archive_keeps_the_resolution_and_successor_claim(jpath: Path, bulk: bool) -> None:
    """Invariant (Journal.archive: findings outlive the record): the resolution and the
    successor claim (resume flag included) stay with the tombstone, across a restart, for
    archiving by hand and by age (retention, POST /admin/archive) alike."""
    j = _open(jpath)
    _resolved_uncertain(j, "p", successor="s", resume=False)
    before = (j.resolution("p"), j.successor("p"))
    if bulk:
        assert [t.action_id for t in j.archive_older_than(utc_now())] == ["p"]
    else:
        j.archive("p")
    j.close()
    j = _open(jpath)
    stone = j.tombstone("p")
    assert stone is not None and j.get("p") is None and j.events("p") == []
    assert (stone.resolution, stone.successor) == before
    assert (j.resolution("p"), j.successor("p")) == before
    assert [t.resolution for t in j.tombstone_page("", 10)] == [before[0]]
    j.close()


def test_a_resolution_after_archive_is_written_once(jpath: Path) -> None:
    """Invariant (Journal.append_tombstone_resolution): an archived action without a finding
    takes one, kept with its tombstone; it is durable and the journal answers it after."""
    j = _archived(jpath, "a")
    assert j.tombstone("a") is not None and j.resolution("a") is None
    event = j.append_tombstone_resolution("a", dict(_FOUND))
    assert event.event == "resolution" and event.sequence == 1
    j.close()
    j = _open(jpath)
    assert j.resolution("a") == event
    stone = j.tombstone("a")
    assert stone is not None and stone.resolution == event
    with pytest.raises(sqlite3.IntegrityError):  # the primary key: one resolution per action
        j._conn.execute("INSERT INTO tombstone_findings VALUES ('a', 'resolution', 2, '{}')")
    j.close()


def test_an_import_keeps_the_first_finding_and_reports_a_different_one(jpath: Path,
                                                                        tmp_path: Path) -> None:
    """Invariant (Journal.import_tombstones: never overwritten): a handed-over tombstone keeps
    its findings; a finding that differs from the one held here is a conflict and the held one
    stays; one this journal's tombstone lacks is added; an identical one is known."""
    src = _open(tmp_path / "src.db")
    _resolved_uncertain(src, "p", successor="s", resume=True)
    src.archive("p")
    offered = src.tombstone("p")
    assert offered is not None and offered.successor is not None
    assert offered.successor.data["resume"] is True

    dst = _open(jpath)
    first = dst.import_tombstones([offered])
    assert (first.imported, first.known, first.conflicts) == (1, 0, ())
    held = dst.tombstone("p")
    assert held is not None and (held.resolution, held.successor) == (offered.resolution,
                                                                       offered.successor)
    again = dst.import_tombstones([offered])
    assert (again.imported, again.known, again.conflicts) == (0, 1, ())

    from dataclasses import replace

    from crewfence_sidecar.contract import JobEvent
    assert offered.resolution is not None
    other = replace(offered, resolution=JobEvent(
        "resolution", offered.resolution.sequence, {**_FOUND, "outcome": "Happened"}))
    clash = dst.import_tombstones([other])
    assert clash.conflicts == ("p",)
    kept = dst.tombstone("p")
    assert kept is not None and kept.resolution == offered.resolution

    bare = dst.import_tombstones([replace(offered, action_id="q", resolution=None,
                                          successor=None)])
    assert bare.imported == 1
    filled = dst.import_tombstones([replace(offered, action_id="q")])
    assert (filled.known, filled.conflicts) == (1, ())
    q = dst.tombstone("q")
    assert q is not None and q.resolution == offered.resolution
    dst.close()
    src.close()


def test_expiry_and_readmission_drop_the_tombstones_findings(jpath: Path) -> None:
    """A tombstone past its retention takes its findings with it: the re-admitted action id
    starts with none."""
    j = _open(jpath, tombstone_retention_seconds=3600)
    _resolved_uncertain(j, "p")
    j.archive("p")
    j.close()
    _age_tombstones(jpath, 3601)
    j = _open(jpath, tombstone_retention_seconds=3600)
    assert j.tombstone("p") is None and j.resolution("p") is None
    assert j._conn.execute("SELECT count(*) FROM tombstone_findings").fetchone()[0] == 0
    j.close()


def test_an_old_journal_without_the_findings_table_opens(jpath: Path) -> None:
    """A journal written before tombstone_findings existed opens without a migration."""
    j = _archived(jpath, "a")
    j.close()
    conn = sqlite3.connect(jpath)
    conn.execute("DROP TABLE tombstone_findings")
    conn.commit()
    conn.close()
    j = _open(jpath)
    stone = j.tombstone("a")
    assert stone is not None and stone.resolution is None
    j.close()
