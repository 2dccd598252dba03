"""The durable journal: records, events and tombstones in one SQLite file.

Every change is one small transaction (row inserts/updates) committed with
``synchronous=FULL`` in WAL mode under ``locking_mode=EXCLUSIVE`` (the WAL index then
lives in heap memory: no ``-shm`` file). The cost of an admission or an event therefore
does not depend on how many records the journal retains.

In memory we keep the records (small; events stay on disk and are paged on demand).
A change reaches memory only after its transaction committed, so a failed persist leaves
nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from crewfence_sidecar.contract import (
    RESOLUTION_EVENT,
    SUCCESSOR_EVENT,
    TERMINAL_EVENT_FOR_STATUS,
    EventName,
    JobEvent,
    JobRecord,
    Status,
    Tombstone,
    TombstoneImportResult,
    finding_of,
)
from crewfence_sidecar.fencing import create_journal_file

SCHEMA_VERSION: Final = 1
ESTIMATED_ROW_OVERHEAD: Final = 512
WAL_ROOM_FRAMES: Final = 1024
"""Frames the WAL file is grown to at open: SQLite's automatic checkpoint (1,000 pages) and
one transaction's margin, the size the file keeps once it has been checkpointed once."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    action_id TEXT PRIMARY KEY,
    crew_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    event_count INTEGER NOT NULL,
    output TEXT NOT NULL,
    error TEXT NOT NULL,
    uncertain_outcome INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    action_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    event TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (action_id, sequence)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tombstones (
    action_id TEXT PRIMARY KEY,
    crew_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    uncertain_outcome INTEGER NOT NULL,
    archived_at TEXT NOT NULL
);
-- The findings that fence an archived action (its resolution and successor claim events),
-- kept with its tombstone: a person's finding and the one-successor claim are written once
-- and outlive the record. A table of its own, so an older journal opens unchanged.
CREATE TABLE IF NOT EXISTS tombstone_findings (
    action_id TEXT NOT NULL,
    event TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (action_id, event)
) WITHOUT ROWID;
-- Terminal records whose outcome a client (the operator) has recorded elsewhere (its
-- CrewJob's status): recorded_only retention archives only these (and very old others).
CREATE TABLE IF NOT EXISTS recorded (
    action_id TEXT PRIMARY KEY,
    recorded_at TEXT NOT NULL
) WITHOUT ROWID;
-- Bulk archive (POST /admin/archive) finds terminal records by age with this index alone.
CREATE INDEX IF NOT EXISTS records_terminal_by_age ON records (updated_at)
    WHERE status != 'running';
"""
DRAINING_META_KEY: Final = "draining"
_ARCHIVE_BY_AGE: Final = (
    "SELECT action_id, crew_id, operation, request_hash, status, uncertain_outcome "
    "FROM records INDEXED BY records_terminal_by_age "
    "WHERE status != 'running' AND updated_at <= ? ORDER BY updated_at")
_FINDING_EVENTS: Final = (RESOLUTION_EVENT, SUCCESSOR_EVENT)
_KEEP_FINDINGS: Final = (
    "INSERT INTO tombstone_findings SELECT action_id, event, sequence, data FROM events "
    "WHERE action_id = ? AND event IN (?, ?)")
_ARCHIVE_RECORDED_BY_AGE: Final = (
    "SELECT action_id, crew_id, operation, request_hash, status, uncertain_outcome "
    "FROM records INDEXED BY records_terminal_by_age "
    "WHERE status != 'running' AND updated_at <= ? AND (updated_at <= ? OR EXISTS "
    "(SELECT 1 FROM recorded m WHERE m.action_id = records.action_id)) ORDER BY updated_at")


@dataclass(frozen=True)
class ResumeFacts:
    """What the journal says about a terminal, uncertain record as a resume's predecessor."""

    material: bool
    """Its ``started`` event says it journaled resume material (``resume_material``)."""
    claim: dict[str, Any] | None
    """Its ``successor`` claim's data, if one was journaled."""
    successor_ended: bool
    """The claimed successor's record is terminal here, or was archived."""


def kept_for_resume(facts: ResumeFacts) -> bool:
    """Whether bulk archiving (``journal.retention``, ``POST /admin/archive``) must keep an
    uncertain record for a resume; pure.

    Invariant (resume material outlives retention until its successor ends): an uncertain
    record that journaled resume material is kept while it may still be resumed (no successor
    claimed yet: the person deciding it may still ask for ``rerun --resume``), and while a
    resuming successor it claimed has not ended (claimed and not admitted yet, or running);
    a plain (non-resume) successor's claim ends the keep at once, since that successor needs
    no material and the one-successor fence forbids a resume after it. Only age-based
    archiving obeys this; a person archiving the one record (``DELETE /jobs/{id}``) is
    refused only while its resuming successor has not ended (:func:`resume_pending`).
    """
    if facts.claim is None:
        return facts.material
    return resume_pending(facts)


def resume_pending(facts: ResumeFacts) -> bool:
    """A resuming successor was claimed for this record and has not ended; pure."""
    return (facts.claim is not None and facts.claim.get("resume") is True
            and not facts.successor_ended)


def _same_finding(name: str, a: JobEvent, b: JobEvent) -> bool:
    """Two journals' copies of one finding agree (who re-sent it and when do not count)."""
    if name == RESOLUTION_EVENT:
        return finding_of(a.data) == finding_of(b.data)
    return (a.data.get("successor_action_id") == b.data.get("successor_action_id")
            and a.data.get("resume") is b.data.get("resume"))


def _missing_findings(have: Tombstone, offered: Tombstone) -> list[JobEvent] | None:
    """The offered tombstone's findings ``have`` lacks; None when one disagrees (a conflict:
    a finding is written once, never merged over); pure."""
    missing: list[JobEvent] = []
    for name, mine, theirs in ((RESOLUTION_EVENT, have.resolution, offered.resolution),
                               (SUCCESSOR_EVENT, have.successor, offered.successor)):
        if theirs is None:
            continue
        if mine is None:
            missing.append(theirs)
        elif not _same_finding(name, mine, theirs):
            return None
    return missing


class JournalError(Exception):
    """The journal cannot be opened or restored; the message is one printable line."""


class PersistError(Exception):
    """A change could not be made durable (disk full, I/O error); nothing was changed."""


class JournalFull(PersistError):
    """A bound (records or bytes) would be exceeded; nothing was changed."""


@dataclass(frozen=True)
class JournalLimits:
    max_retained_runs: int = 10_000
    max_events_per_run: int = 10_000
    max_event_bytes: int = 256 * 1024
    max_state_bytes: int = 1024**3
    tombstone_retention_seconds: int = 0
    """How long a tombstone answers for its action after it was archived (counted from the
    first archive, hand-overs included); 0 (the default): it never expires."""


@dataclass(frozen=True)
class BoundExceeded:
    """A journal bound the journal is at or over: ``held`` (records, bytes, events of its
    largest run, bytes of its largest event) against ``limit`` (the configured bound)."""

    bound: str
    """The JournalLimits field: max_retained_runs, max_state_bytes, max_events_per_run,
    max_event_bytes."""
    held: int
    limit: int

    def to_wire(self) -> dict[str, Any]:
        return {"bound": self.bound, "held": self.held, "limit": self.limit}


def utc_now() -> str:
    return utc_iso(datetime.now(UTC))


def utc_iso(moment: datetime) -> str:
    """The journal's timestamp format; its strings sort as the moments they name."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_STATUS = {s.value: s for s in Status}


def _record_from_row(row: tuple[Any, ...]) -> JobRecord:
    """A record without its output (decoded lazily by Journal.get: restore stays fast)."""
    (action_id, crew_id, operation, request_hash, status, event_count, error,
     uncertain, created_at, updated_at, recorded_at) = row
    return JobRecord(
        action_id=action_id, crew_id=crew_id, operation=operation,
        request_hash=request_hash, status=_STATUS[status], event_count=int(event_count),
        output=None, error=None if error == "null" else json.loads(error),
        uncertain_outcome=bool(uncertain), created_at=created_at, updated_at=updated_at,
        recorded_at=recorded_at,
    )


_SELECT_RECORDS = ("SELECT action_id, crew_id, operation, request_hash, status, event_count, "
                   "error, uncertain_outcome, created_at, updated_at, m.recorded_at "
                   "FROM records LEFT JOIN recorded m USING (action_id)")


@dataclass(frozen=True)
class RestoreReport:
    records: int
    recovered_running: list[str]
    seconds: float


class Journal:
    """One journal; every method is synchronous and must be called from one thread."""

    def __init__(self, conn: sqlite3.Connection, path: Path | None, limits: JournalLimits,
                 journal_id: str) -> None:
        self._conn = conn
        self.path = path
        self._files = (str(path), f"{path}-wal") if path is not None else ()
        """The journal's files, whose sizes ``_check_room`` adds up on every admission."""
        self.limits = limits
        self.journal_id = journal_id
        self.records: dict[str, JobRecord] = {}
        self._unloaded: set[str] = set()
        self.restore_report = RestoreReport(0, [], 0.0)
        self._restored_most_events = 0
        self._restored_biggest_event = 0
        self.draining = self._read_draining()

    # --- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Path | None, limits: JournalLimits, *, create: bool = True,
             readonly: bool = False) -> Journal:
        """Open (creating if allowed) and restore. ``path=None`` is an in-memory journal.

        The caller has already applied the file rules and holds the lock (fencing.py).
        ``readonly`` (inspection) changes nothing: running records stay as they are.
        """
        started = time.monotonic()
        if readonly:
            if path is None or not path.exists():
                raise JournalError(f"journal {path} does not exist")
            return cls._open_readonly(path, limits, started)
        if path is not None:
            if not path.exists():
                if not create:
                    raise JournalError(f"journal {path} does not exist")
                create_journal_file(path)
        try:
            conn = sqlite3.connect(str(path) if path else ":memory:", isolation_level=None,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if path is not None and str(mode).lower() != "wal":
                raise JournalError(f"journal {path}: cannot enable WAL mode (got {mode})")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=OFF")
            conn.executescript(_SCHEMA)
            journal_id = cls._ensure_meta(conn)
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"journal {path} is not a usable SQLite journal: {exc}") from None
        journal = cls(conn, path, limits, journal_id)
        journal._restore(started)
        try:
            journal.expire_tombstones()
        except PersistError as exc:
            raise JournalError(f"journal {path}: cannot expire tombstones: {exc}") from None
        if path is not None:
            journal._grow_wal()
        return journal

    def _grow_wal(self) -> None:
        """Grow the WAL file to its steady size now, so commits overwrite it, not append.

        SQLite leaves the WAL file at its size after a checkpoint and writes the next frames
        from its start again; a fresh one (after a clean close) grows with every commit, and
        an fdatasync of a growing file also commits the file system's metadata (measured on
        the build machine: 12 KiB appended and synced 0.31 ms, overwritten 0.24 ms). The
        room is made by one transaction that spills pages into the WAL and is rolled back:
        its frames were never committed, so recovery ignores them and the database does not
        change; every durability promise stays SQLite's own (``synchronous=FULL``). Skipped
        when the room would take more than a quarter of CREWFENCE_MAX_STATE_BYTES or more
        than an eighth of the file system's free space (a nearly full volume keeps failing
        admissions with 507 as soon as it is full, not after the room is used up).
        """
        conn = self._conn
        try:
            page = int(conn.execute("PRAGMA page_size").fetchone()[0])
            room = 32 + WAL_ROOM_FRAMES * (page + 24)
            assert self.path is not None
            if self._file_bytes() + room > self.limits.max_state_bytes // 4:
                return
            fs = os.statvfs(self.path.parent)
            if fs.f_bavail * fs.f_frsize < 8 * room:
                return
            wal = self.path.with_name(self.path.name + "-wal")
            if wal.exists() and wal.stat().st_size >= room:
                return
            cache = int(conn.execute("PRAGMA cache_size").fetchone()[0])
            conn.execute("PRAGMA cache_size=16")  # spill to the WAL early
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.execute("CREATE TABLE crewfence_wal_room (pad BLOB)")
                    conn.execute(
                        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                        "WHERE i < ?) INSERT INTO crewfence_wal_room SELECT zeroblob(?) FROM n",
                        (WAL_ROOM_FRAMES + 64, page - 64))
                finally:
                    conn.execute("ROLLBACK")
            finally:
                conn.execute(f"PRAGMA cache_size={cache}")
        except (sqlite3.Error, OSError):
            return  # only the speed-up is lost

    @classmethod
    def _open_readonly(cls, path: Path, limits: JournalLimits, started: float) -> Journal:
        try:
            # mode=ro cannot open a WAL journal without its -shm file (we never have one);
            # a read-write connection that refuses writes reads it, committed WAL included.
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            conn.execute("PRAGMA query_only=1")
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"journal {path} is not a usable SQLite journal: {exc}") from None
        if "journal_id" not in meta:
            raise JournalError(f"journal {path} has no journal id")
        journal = cls(conn, path, limits, str(meta["journal_id"]))
        journal._restore(started, recover=False)
        return journal

    @staticmethod
    def _ensure_meta(conn: sqlite3.Connection) -> str:
        rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if "journal_id" in rows:
            if rows.get("schema_version") != str(SCHEMA_VERSION):
                raise JournalError(f"journal schema version {rows.get('schema_version')} is "
                                   f"not {SCHEMA_VERSION}")
            return str(rows["journal_id"])
        journal_id = str(uuid.uuid4())
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO meta VALUES ('journal_id', ?), ('schema_version', ?), "
                     "('created_at', ?)", (journal_id, str(SCHEMA_VERSION), utc_now()))
        conn.execute("COMMIT")
        return journal_id

    def _restore(self, started: float, *, recover: bool = True) -> None:
        name = self.path or "(memory)"
        rows = self._conn.execute(_SELECT_RECORDS).fetchall()
        records: dict[str, JobRecord] = {}
        for row in rows:
            try:
                record = _record_from_row(tuple(row))
            except (ValueError, KeyError, TypeError):
                raise JournalError(f"journal {name}: record {row[0]!r} is malformed") from None
            if record.action_id in records:
                raise JournalError(f"journal {name}: duplicate action id "
                                   f"{record.action_id!r}")
            records[record.action_id] = record
        dup = self._conn.execute(
            "SELECT t.action_id FROM tombstones t JOIN records r USING (action_id) LIMIT 1"
        ).fetchone()
        if dup is not None:
            raise JournalError(f"journal {name}: duplicate action id {dup[0]!r} "
                               "(both a record and a tombstone)")
        stats = self._conn.execute(
            "SELECT action_id, count(*), min(sequence), max(sequence), "
            "max(length(CAST(data AS BLOB)) + length(event)) FROM events GROUP BY action_id"
        ).fetchall()
        seen: set[str] = set()
        most_events = biggest_event = 0
        for action_id, count, lo, hi, biggest in stats:
            found = records.get(action_id)
            if found is None:
                raise JournalError(f"journal {name}: events for unknown action {action_id!r}")
            most_events = max(most_events, count)
            biggest_event = max(biggest_event, biggest or 0)
            # a running record's stored count lags the events appended since its admission
            # (append_events does not touch its row); a terminal record's is exact
            stale = found.status is Status.RUNNING and count >= found.event_count
            if lo != 0 or hi != count - 1 or (count != found.event_count and not stale):
                raise JournalError(f"journal {name}: events of action {action_id!r} are not "
                                   "contiguous from 0 or disagree with its event_count")
            found.event_count = count
            seen.add(action_id)
        for action_id, record in records.items():
            if action_id not in seen and record.event_count != 0:
                raise JournalError(f"journal {name}: action {action_id!r} lost its events")
        self.records = records
        self._restored_most_events, self._restored_biggest_event = most_events, biggest_event
        self._unloaded = {r.action_id for r in records.values() if r.terminal}
        recovered = [r.action_id for r in records.values() if r.status is Status.RUNNING]
        if recover and recovered:
            try:
                self._recover_running(recovered)
            except PersistError as exc:
                raise JournalError(f"journal {name}: cannot record the recovery of running "
                                   f"records: {exc}") from None
        self.restore_report = RestoreReport(len(records), recovered if recover else [],
                                            time.monotonic() - started)

    def _recover_running(self, action_ids: list[str]) -> None:
        """Restored running records cannot resume: failed, uncertain (one transaction)."""
        error = {"code": "sidecar_restarted",
                 "message": "the sidecar restarted while this job was running; whether its "
                            "work finished or had external effects is unknown"}
        with self._tx():
            for action_id in action_ids:
                self.finish(action_id, Status.FAILED, output=None, error=error,
                            uncertain=True, event_data={"reason": "sidecar_restarted"},
                            _in_tx=True)

    # --- draining (journaled: survives a restart) ------------------------------------------
    def _read_draining(self) -> bool:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?",
                                 (DRAINING_META_KEY,)).fetchone()
        return row is not None and row[0] == "1"

    def set_draining(self, draining: bool) -> None:
        """Persist the draining switch durably before it takes effect (PersistError: unchanged)."""
        with self._tx() as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                         (DRAINING_META_KEY, "1" if draining else "0"))
        self.draining = draining

    # --- sizes -----------------------------------------------------------------------------
    def _file_bytes(self) -> int:
        if self.path is None:
            page = self._conn.execute("PRAGMA page_count").fetchone()[0]
            size = self._conn.execute("PRAGMA page_size").fetchone()[0]
            return int(page * size)
        total = 0
        for name in self._files:  # plain os.stat: checked on every commit of an event
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(name).st_size
        return total

    def state_bytes(self) -> int:
        try:
            return self._file_bytes()
        except sqlite3.Error:  # an in-memory journal that was closed: nothing is kept
            return 0

    def over_bounds(self) -> list[BoundExceeded]:
        """The bounds this journal holds more than (a bound lowered below what it holds).

        Invariant (lowered journal bounds never brick a journal): such a journal opens and
        serves everything it holds (lookups, exact repeats, archived answers, tombstones,
        resolutions); only what would grow it past a bound is refused (507 ``journal_full``
        for a new admission) until retention or archiving brings it back under. Records and
        bytes are live; events per run and event bytes are as restored (only records of an
        earlier, larger bound can exceed them, and those are terminal).
        """
        limits = self.limits
        found: list[BoundExceeded] = []
        held = len(self.records)
        if held >= limits.max_retained_runs:
            found.append(BoundExceeded("max_retained_runs", held, limits.max_retained_runs))
        size = self.state_bytes()
        if size + ESTIMATED_ROW_OVERHEAD > limits.max_state_bytes:
            found.append(BoundExceeded("max_state_bytes", size, limits.max_state_bytes))
        if self._restored_most_events > limits.max_events_per_run:
            found.append(BoundExceeded("max_events_per_run", self._restored_most_events,
                                       limits.max_events_per_run))
        if self._restored_biggest_event > limits.max_event_bytes:
            found.append(BoundExceeded("max_event_bytes", self._restored_biggest_event,
                                       limits.max_event_bytes))
        return found

    def _check_room(self, extra: int) -> None:
        # stat() of two files: constant cost, and exact enough for a bound
        if self._file_bytes() + extra + ESTIMATED_ROW_OVERHEAD > self.limits.max_state_bytes:
            raise JournalFull("the journal would exceed CREWFENCE_MAX_STATE_BYTES")

    # --- transactions ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _tx(self, *, fsync: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction. ``fsync=False`` (chunk events only) commits without syncing the
        WAL: safe against a process crash, and the next durable commit (the terminal event)
        syncs the whole WAL, those frames included; only a power loss could drop them."""
        conn = self._conn
        try:
            if not fsync:
                conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise PersistError(f"journal cannot begin a transaction: {exc}") from exc
        try:
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise PersistError(f"journal write failed: {exc}") from exc
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        finally:
            if not fsync:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA synchronous=FULL")

    # --- reads -----------------------------------------------------------------------------
    def get(self, action_id: str) -> JobRecord | None:
        record = self.records.get(action_id)
        if record is not None and action_id in self._unloaded:
            row = self._conn.execute("SELECT output FROM records WHERE action_id = ?",
                                     (action_id,)).fetchone()
            record.output = json.loads(row[0]) if row is not None else None
            self._unloaded.discard(action_id)
        return record

    def tombstone_cutoff(self) -> str:
        """Tombstones archived at or before this moment have expired ("" : none expire).

        Invariant (an explicit tombstone retention, default never): a tombstone answers for
        its action id (410 for the same request, 409 for another) until
        ``tombstone_retention_seconds`` after it was first archived, and then never again;
        with 0 it answers for the journal's whole life."""
        seconds = self.limits.tombstone_retention_seconds
        if seconds <= 0:
            return ""
        return utc_iso(datetime.now(UTC) - timedelta(seconds=seconds))

    def expire_tombstones(self) -> int:
        """Delete the tombstones past the retention, and their findings (durably); how many
        went."""
        cutoff = self.tombstone_cutoff()
        if not cutoff:
            return 0
        with self._tx() as conn:
            conn.execute("DELETE FROM tombstone_findings WHERE action_id IN "
                         "(SELECT action_id FROM tombstones WHERE archived_at <= ?)", (cutoff,))
            gone = conn.execute("DELETE FROM tombstones WHERE archived_at <= ?", (cutoff,))
        return int(gone.rowcount or 0)

    def _tombstone_findings(self, action_ids: list[str]) -> dict[tuple[str, str], JobEvent]:
        """The findings kept with these tombstones, by (action id, event name)."""
        if not action_ids:
            return {}
        rows = self._conn.execute(
            "SELECT action_id, event, sequence, data FROM tombstone_findings "
            "WHERE action_id IN (SELECT value FROM json_each(?))",
            (dumps(action_ids),)).fetchall()
        return {(r["action_id"], r["event"]): JobEvent(event=r["event"], sequence=r["sequence"],
                                                       data=json.loads(r["data"]))
                for r in rows}

    def _stones_from_rows(self, rows: list[sqlite3.Row]) -> list[Tombstone]:
        found = self._tombstone_findings([r["action_id"] for r in rows])
        return [Tombstone(action_id=r["action_id"], crew_id=r["crew_id"],
                          operation=r["operation"], request_hash=r["request_hash"],
                          status=_STATUS[r["status"]], archived_at=r["archived_at"],
                          uncertain_outcome=bool(r["uncertain_outcome"]),
                          resolution=found.get((r["action_id"], RESOLUTION_EVENT)),
                          successor=found.get((r["action_id"], SUCCESSOR_EVENT)))
                for r in rows]

    def tombstone(self, action_id: str) -> Tombstone | None:
        """The action's unexpired tombstone, with the findings kept with it."""
        rows = self._conn.execute("SELECT * FROM tombstones WHERE action_id = ? "
                                  "AND archived_at > ?",
                                  (action_id, self.tombstone_cutoff())).fetchall()
        stones = self._stones_from_rows(rows)
        return stones[0] if stones else None

    def _tombstone_answers(self, action_id: str) -> bool:
        """Whether an unexpired tombstone answers for the action id (``tombstone`` without
        building it: one indexed lookup)."""
        row = self._conn.execute("SELECT archived_at FROM tombstones WHERE action_id = ?",
                                 (action_id,)).fetchone()
        return row is not None and row[0] > self.tombstone_cutoff()

    def tombstones(self) -> list[Tombstone]:
        rows = self._conn.execute("SELECT action_id FROM tombstones ORDER BY archived_at")
        return [t for (aid,) in rows.fetchall() if (t := self.tombstone(aid)) is not None]

    def tombstone_count(self) -> int:
        return int(self._conn.execute("SELECT count(*) FROM tombstones WHERE archived_at > ?",
                                      (self.tombstone_cutoff(),)).fetchone()[0])

    def tombstone_page(self, after: str, limit: int) -> list[Tombstone]:
        """Tombstones in action-id order, starting after ``after`` (the hand-over export)."""
        rows = self._conn.execute(
            "SELECT * FROM tombstones WHERE action_id > ? AND archived_at > ? "
            "ORDER BY action_id LIMIT ?", (after, self.tombstone_cutoff(), limit)).fetchall()
        return self._stones_from_rows(rows)

    def events(self, action_id: str, cursor: int = 0, limit: int = 1000) -> list[JobEvent]:
        rows = self._conn.execute(
            "SELECT sequence, event, data FROM events WHERE action_id = ? AND sequence >= ? "
            "ORDER BY sequence LIMIT ?", (action_id, cursor, limit)).fetchall()
        return [JobEvent(event=r["event"], sequence=r["sequence"], data=json.loads(r["data"]))
                for r in rows]

    # --- writes ----------------------------------------------------------------------------
    def admit(self, record: JobRecord, started_data: dict[str, Any]) -> JobEvent:
        """Insert a running record and its `started` event durably, or raise (nothing kept)."""
        if record.action_id in self.records or self._tombstone_answers(record.action_id):
            raise ValueError(f"action {record.action_id!r} already exists")
        if len(self.records) >= self.limits.max_retained_runs:
            raise JournalFull("the journal holds CREWFENCE_MAX_RETAINED_RUNS records; archive "
                              "terminal records")
        data = dumps(started_data)
        self._check_room(len(data) + len(record.action_id) * 2)
        event = JobEvent(event=EventName.STARTED.value, sequence=0, data=started_data)
        with self._tx() as conn:
            # an expired tombstone of this action id (tombstone() above said none answers)
            conn.execute("DELETE FROM tombstones WHERE action_id = ?", (record.action_id,))
            conn.execute("DELETE FROM tombstone_findings WHERE action_id = ?",
                         (record.action_id,))
            conn.execute(
                "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (record.action_id, record.crew_id, record.operation, record.request_hash,
                 record.status.value, 1, dumps(record.output), dumps(record.error),
                 int(record.uncertain_outcome), record.created_at, record.updated_at))
            conn.execute("INSERT INTO events VALUES (?, 0, ?, ?)",
                         (record.action_id, event.event, data))
        record.event_count = 1
        self.records[record.action_id] = record
        return event

    def room_for_events(self, action_id: str) -> int:
        """Non-terminal events that still fit (one slot stays reserved for the terminal one)."""
        record = self.records[action_id]
        return self.limits.max_events_per_run - 1 - record.event_count

    def room_for_chunks(self, action_id: str) -> int:
        """``chunk`` events that still fit: chunks take at most the first half of a run's
        events. Invariant (chunks never starve the ledger): however long a model streams,
        the other half stays for the effect ledger, so a tool call's start is refused for
        lack of room only after the run's own effects filled it, never a model's text."""
        record = self.records[action_id]
        return self.limits.max_events_per_run // 2 - record.event_count

    def _encode_event(self, name: str, data: dict[str, Any], *, too_large: str) -> str:
        """The event body as stored; JournalFull (``too_large``) when name and body are over
        CREWFENCE_MAX_EVENT_BYTES, or when the disk has no room for it."""
        encoded = dumps(data)
        if len(encoded.encode("utf-8")) + len(name) > self.limits.max_event_bytes:
            raise JournalFull(too_large)
        self._check_room(len(encoded))
        return encoded

    def append_event(self, action_id: str, name: str, data: dict[str, Any], *,
                     durable: bool = False) -> JobEvent:
        """Append one non-terminal event; raise JournalFull when the record has no room.

        ``durable=True`` (a ``tool_call_started``: the tool runs only after it) commits with a
        synced WAL before returning; otherwise the next durable commit syncs it."""
        return self.append_events(action_id, [(name, data)], durable=durable)[0]

    def event_fits(self, name: str, data: dict[str, Any]) -> bool:
        """Whether one event of this name and body is within CREWFENCE_MAX_EVENT_BYTES."""
        return len(dumps(data).encode("utf-8")) + len(name) <= self.limits.max_event_bytes

    def append_events(self, action_id: str, events: list[tuple[str, dict[str, Any]]], *,
                      durable: bool = False) -> list[JobEvent]:
        """Append non-terminal events in order, in ONE transaction (all or none); JournalFull
        when they do not all fit (the per-run count, an event's bytes, the state bytes).

        Invariant (write-ahead, cheaply): with ``durable=True`` every event of the batch is
        on disk (synced WAL) when this returns; without, they are committed unsynced (safe
        against a process crash) and the next durable commit (a tool call's start, the
        terminal event) syncs them, so only a power loss could drop them, and a dropped
        ``tool_call_finished`` leaves its call in doubt, never falsely finished. One batch is
        one commit: the model call that ended at a tool call's start costs no commit of its
        own on the path the tool waits for.

        Invariant (one table written per append): only ``events`` rows are inserted; the
        record's row (its ``event_count``, ``updated_at``) is not rewritten, so a durable
        commit syncs the WAL frame of the events page alone, not a records page as well.
        Restore counts a running record's events (contiguous from 0) for its count; the
        row is brought up to date when the record ends (:meth:`finish`)."""
        record = self.records[action_id]
        if self.room_for_events(action_id) < len(events):
            raise JournalFull("CREWFENCE_MAX_EVENTS_PER_RUN reached")
        encoded: list[str] = []
        for name, data in events:
            text = dumps(data)
            if len(text.encode("utf-8")) + len(name) > self.limits.max_event_bytes:
                raise JournalFull("event is over CREWFENCE_MAX_EVENT_BYTES")
            encoded.append(text)
        self._check_room(sum(len(text) for text in encoded))
        first = record.event_count
        now = utc_now()
        with self._tx(fsync=durable) as conn:
            conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?)",
                             [(action_id, first + i, name, text)
                              for i, ((name, _), text) in enumerate(zip(events, encoded,
                                                                        strict=True))])
        record.event_count = first + len(events)
        record.updated_at = now
        return [JobEvent(event=name, sequence=first + i, data=data)
                for i, (name, data) in enumerate(events)]

    def finish(self, action_id: str, status: Status, *, output: Any, error: Any,
               uncertain: bool, event_data: dict[str, Any], _in_tx: bool = False) -> JobEvent:
        """Make a running record terminal together with its terminal event (one transaction).

        The terminal event always fits: one slot is reserved and an oversized event body is
        cut to a summary (the full output stays on the record).
        """
        record = self.records[action_id]
        name = TERMINAL_EVENT_FOR_STATUS[status].value
        data = dict(event_data)
        if status is not Status.COMPLETED:  # a `completed` event's data is the output itself
            data["status"] = status.value
        if uncertain:
            data["uncertain_outcome"] = True
        encoded = dumps(data)
        if len(encoded.encode("utf-8")) + len(name) > self.limits.max_event_bytes:
            if status is Status.COMPLETED:
                data = {"status": status.value}
            else:
                data = {k: v for k, v in data.items() if k != "output"}
            data["output_omitted"] = True
            encoded = dumps(data)
            if len(encoded.encode("utf-8")) + len(name) > self.limits.max_event_bytes:
                data = {"status": status.value, "uncertain_outcome": uncertain,
                        "truncated": True}
                encoded = dumps(data)
        seq = record.event_count
        now = utc_now()
        output_text = dumps(output)
        error_text = dumps(error)
        with contextlib.nullcontext(self._conn) if _in_tx else self._tx() as conn:
            conn.execute("INSERT INTO events VALUES (?, ?, ?, ?)",
                         (action_id, seq, name, encoded))
            conn.execute(
                "UPDATE records SET status = ?, event_count = ?, output = ?, error = ?, "
                "uncertain_outcome = ?, updated_at = ? WHERE action_id = ?",
                (status.value, seq + 1, output_text, error_text,
                 int(uncertain or record.uncertain_outcome), now, action_id))
        record.status = status
        record.event_count = seq + 1
        record.output = output
        record.error = error
        record.uncertain_outcome = uncertain or record.uncertain_outcome
        record.updated_at = now
        return JobEvent(event=name, sequence=seq, data=data)

    def resume_facts(self, action_id: str) -> ResumeFacts:
        """The facts :func:`kept_for_resume` decides on, read from this journal."""
        row = self._conn.execute("SELECT data FROM events WHERE action_id = ? AND sequence = 0",
                                 (action_id,)).fetchone()
        started = json.loads(row[0]) if row is not None else {}
        claim = self.successor(action_id)
        ended = False
        if claim is not None:
            successor = str(claim.data.get("successor_action_id") or "")
            record = self.records.get(successor)
            ended = (record.terminal if record is not None
                     else self.tombstone(successor) is not None)
        return ResumeFacts(material=started.get("resume_material") is True,
                           claim=claim.data if claim is not None else None,
                           successor_ended=ended)

    def archive(self, action_id: str) -> Tombstone:
        """Remove a terminal record and its events, leaving a tombstone.

        Invariant (findings outlive the record): the record's ``resolution`` and ``successor``
        events stay with its tombstone (``tombstone_findings``, the same transaction), so a
        later resolution is answered from the journaled finding, never written a second time.
        """
        record = self.records[action_id]
        if not record.terminal:
            raise ValueError("only terminal records can be archived")
        stone = Tombstone(action_id=record.action_id, crew_id=record.crew_id,
                          operation=record.operation, request_hash=record.request_hash,
                          status=record.status, archived_at=utc_now(),
                          uncertain_outcome=record.uncertain_outcome)
        with self._tx() as conn:
            conn.execute(_KEEP_FINDINGS, (action_id, *_FINDING_EVENTS))
            conn.execute("DELETE FROM events WHERE action_id = ?", (action_id,))
            conn.execute("DELETE FROM recorded WHERE action_id = ?", (action_id,))
            conn.execute("DELETE FROM records WHERE action_id = ?", (action_id,))
            conn.execute("INSERT INTO tombstones VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (stone.action_id, stone.crew_id, stone.operation, stone.request_hash,
                          stone.status.value, int(stone.uncertain_outcome), stone.archived_at))
        del self.records[action_id]
        self._unloaded.discard(action_id)
        return self.tombstone(action_id) or stone

    def archive_older_than(self, cutoff: str,
                           unrecorded_cutoff: str | None = None) -> list[Tombstone]:
        """Archive every terminal record with ``updated_at <= cutoff`` (one transaction).

        With ``unrecorded_cutoff`` (``recorded_only`` retention), a record is archived only
        when it was marked recorded (:meth:`mark_recorded`) or is older than that cutoff too.
        Invariant (retention never races the operator): a record whose outcome the operator
        has not written into its CrewJob yet keeps its output.

        Each archived record leaves the same tombstone as :meth:`archive`, its findings kept
        with it. The records are
        found through the partial index ``records_terminal_by_age``: the cost follows the
        number archived, not the number retained.
        """
        self.expire_tombstones()
        archived_at = utc_now()
        args: tuple[str, ...] = (cutoff,)
        query = _ARCHIVE_BY_AGE
        if unrecorded_cutoff is not None:
            query, args = _ARCHIVE_RECORDED_BY_AGE, (cutoff, unrecorded_cutoff)
        with self._tx() as conn:
            rows = conn.execute(query, args).fetchall()
            # a successor claim exists only on an uncertain record: the others never look
            stones = [Tombstone(action_id=r[0], crew_id=r[1], operation=r[2],
                                request_hash=r[3], status=_STATUS[r[4]],
                                archived_at=archived_at, uncertain_outcome=bool(r[5]))
                      for r in rows
                      if not (r[5] and kept_for_resume(self.resume_facts(r[0])))]
            for stone in stones:
                conn.execute(_KEEP_FINDINGS, (stone.action_id, *_FINDING_EVENTS))
                conn.execute("DELETE FROM events WHERE action_id = ?", (stone.action_id,))
                conn.execute("DELETE FROM recorded WHERE action_id = ?", (stone.action_id,))
                conn.execute("DELETE FROM records WHERE action_id = ?", (stone.action_id,))
                conn.execute("INSERT INTO tombstones VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (stone.action_id, stone.crew_id, stone.operation,
                              stone.request_hash, stone.status.value,
                              int(stone.uncertain_outcome), stone.archived_at))
        for stone in stones:
            self.records.pop(stone.action_id, None)
            self._unloaded.discard(stone.action_id)
        return stones

    def import_tombstones(self, stones: Iterable[Tombstone]) -> TombstoneImportResult:
        """Take over another journal's tombstones, with their findings (one durable
        transaction).

        Invariant (a tombstone outlives its replica): an imported tombstone answers exactly
        like one archived here (410 for an identical request, 409 for another; its journaled
        resolution and successor claim as they were written). Nothing here is ever
        overwritten: an action id this journal holds as a record, as a tombstone of another
        request, or as a tombstone with a different finding (resolution or successor claim),
        is a conflict, reported and left as it is. An identical tombstone is ``known`` (a
        repeated hand-over changes nothing); a finding this journal's tombstone lacks is added
        (write once: it had none).
        """
        imported: list[Tombstone] = []
        added: list[tuple[str, JobEvent]] = []
        known = 0
        conflicts: list[str] = []
        cutoff = self.tombstone_cutoff()
        for stone in stones:
            if stone.action_id in self.records:
                conflicts.append(stone.action_id)
                continue
            if cutoff and stone.archived_at <= cutoff:
                known += 1  # expired where it came from too: nothing to keep
                continue
            have = self.tombstone(stone.action_id)
            if have is None:
                imported.append(stone)
                continue
            missing = _missing_findings(have, stone)
            if have.request_hash != stone.request_hash or missing is None:
                conflicts.append(stone.action_id)
                continue
            known += 1
            added.extend((stone.action_id, event) for event in missing)
        if imported or added:
            with self._tx() as conn:
                for stone in imported:
                    # an expired row of this id may still be there (tombstone() ignores it)
                    conn.execute("DELETE FROM tombstones WHERE action_id = ?",
                                 (stone.action_id,))
                    conn.execute("DELETE FROM tombstone_findings WHERE action_id = ?",
                                 (stone.action_id,))
                    conn.execute("INSERT INTO tombstones VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (stone.action_id, stone.crew_id, stone.operation,
                                  stone.request_hash, stone.status.value,
                                  int(stone.uncertain_outcome), stone.archived_at))
                    added.extend((stone.action_id, event)
                                 for event in (stone.resolution, stone.successor)
                                 if event is not None)
                for action_id, event in added:
                    conn.execute("INSERT INTO tombstone_findings VALUES (?, ?, ?, ?)",
                                 (action_id, event.event, event.sequence, dumps(event.data)))
        return TombstoneImportResult(imported=len(imported), known=known,
                                     conflicts=tuple(conflicts))

    def mark_recorded(self, action_id: str) -> str:
        """Note (durably, once) that a client recorded this terminal record's outcome; the
        time it was first noted, which the record then carries (``recorded_at``). Its outcome
        does not change."""
        record = self.records[action_id]
        if not record.terminal:
            raise ValueError("only terminal records can be marked recorded")
        row = self._conn.execute("SELECT recorded_at FROM recorded WHERE action_id = ?",
                                 (action_id,)).fetchone()
        if row is not None:
            return str(row[0])
        now = utc_now()
        with self._tx() as conn:
            conn.execute("INSERT INTO recorded VALUES (?, ?)", (action_id, now))
        record.recorded_at = now
        return now

    def _finding(self, action_id: str, name: str) -> JobEvent | None:
        if action_id in self.records:
            query = ("SELECT sequence, event, data FROM events WHERE action_id = ? "
                     "AND event = ? ORDER BY sequence LIMIT 1")
        elif self.tombstone(action_id) is not None:
            query = ("SELECT sequence, event, data FROM tombstone_findings "
                     "WHERE action_id = ? AND event = ?")
        else:
            return None
        row = self._conn.execute(query, (action_id, name)).fetchone()
        if row is None:
            return None
        return JobEvent(event=row["event"], sequence=row["sequence"],
                        data=json.loads(row["data"]))

    def resolution(self, action_id: str) -> JobEvent | None:
        """The action's journaled resolution event, if any (at most one exists): its record's,
        or, once archived, the one kept with its tombstone."""
        return self._finding(action_id, RESOLUTION_EVENT)

    def successor(self, action_id: str) -> JobEvent | None:
        """The action's journaled successor claim, if any (at most one exists): its record's,
        or, once archived, the one kept with its tombstone."""
        return self._finding(action_id, SUCCESSOR_EVENT)

    def append_tombstone_resolution(self, action_id: str, data: dict[str, Any]) -> JobEvent:
        """Journal the one ``resolution`` of an archived action, with its tombstone (durable).

        Invariant (a resolution is written once, archived or not): the caller checked that
        the tombstone carries none (one thread: no race); a later one is answered from this
        one. The record's events are gone, so its sequence only orders the tombstone's
        findings: one after the highest it carries (1 when none).
        """
        if self.tombstone(action_id) is None:
            raise ValueError("only an archived action takes a tombstone resolution")
        encoded = dumps(data)
        if len(encoded.encode("utf-8")) + len(RESOLUTION_EVENT) > self.limits.max_event_bytes:
            raise JournalFull(f"the {RESOLUTION_EVENT} is over CREWFENCE_MAX_EVENT_BYTES")
        row = self._conn.execute("SELECT max(sequence) FROM tombstone_findings "
                                 "WHERE action_id = ?", (action_id,)).fetchone()
        seq = 1 if row is None or row[0] is None else int(row[0]) + 1
        with self._tx() as conn:
            conn.execute("INSERT INTO tombstone_findings VALUES (?, ?, ?, ?)",
                         (action_id, RESOLUTION_EVENT, seq, encoded))
        return JobEvent(event=RESOLUTION_EVENT, sequence=seq, data=data)

    def append_resolution(self, action_id: str, data: dict[str, Any]) -> JobEvent:
        """Append the one ``resolution`` event after a terminal record's terminal event.

        Invariant (a resolution is a finding, not a rewrite of history): the record's status,
        output, error, uncertainty and ``updated_at`` stay exactly as they were; only the
        event log grows by one durable (fsync'd) event.
        """
        return self._append_finding(action_id, RESOLUTION_EVENT, data)

    def append_successor(self, action_id: str, data: dict[str, Any]) -> JobEvent:
        """Append the one ``successor`` event (the claim of the one successor slot), after
        the ``resolution`` event; the record itself stays as it was (as for a resolution)."""
        return self._append_finding(action_id, SUCCESSOR_EVENT, data)

    def _append_finding(self, action_id: str, name: str, data: dict[str, Any]) -> JobEvent:
        """One durable event after a terminal record's terminal event; the caller checked
        that none of this name exists (one thread: no race)."""
        record = self.records[action_id]
        if not record.terminal:
            raise ValueError(f"only terminal records take a {name} event")
        # Neither CREWFENCE_MAX_EVENTS_PER_RUN nor CREWFENCE_MAX_STATE_BYTES refuses a
        # finding: at most two small ones per record exist, and a journal at (or, after a
        # lowered bound, over) its bound must still take a person's resolution.
        encoded = dumps(data)
        if len(encoded.encode("utf-8")) + len(name) > self.limits.max_event_bytes:
            raise JournalFull(f"the {name} is over CREWFENCE_MAX_EVENT_BYTES")
        seq = record.event_count
        with self._tx() as conn:
            conn.execute("INSERT INTO events VALUES (?, ?, ?, ?)",
                         (action_id, seq, name, encoded))
            conn.execute("UPDATE records SET event_count = ? WHERE action_id = ?",
                         (seq + 1, action_id))
        record.event_count = seq + 1
        return JobEvent(event=name, sequence=seq, data=data)

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
