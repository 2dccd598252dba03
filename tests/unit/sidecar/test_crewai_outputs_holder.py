"""crewai's kickoff-outputs file held open by the sidecar (``crewai_outputs_holder``): crewai's
own connections then never close it last (no checkpoint and WAL deletion at every write), and
the held connection takes no lock a writer or a checkpoint waits for."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from crewai.memory.storage.kickoff_task_outputs_storage import (
    KickoffTaskOutputsSQLiteStorage as Storage,
)
from crewfence_sidecar import crewai_outputs_holder
from crewfence_sidecar.crewai_outputs_holder import OUTPUTS_FILE, hold


def _wal(db: Path) -> Path:
    return db.with_name(db.name + "-wal")


def test_while_held_a_write_of_crewais_leaves_the_wal_in_place(tmp_path: Path) -> None:
    db = tmp_path / OUTPUTS_FILE
    Storage(str(db)).delete_all()  # alone: the last close folds the WAL in and deletes it
    assert not _wal(db).exists()
    held = hold(db)
    assert held is not None
    try:
        storage = Storage(str(db))
        storage.delete_all()
        assert _wal(db).exists()  # crewai's close was not the last: nothing folded, deleted
        assert storage.load() == []  # and crewai reads its file as before
    finally:
        held.close()


def test_the_held_connection_takes_no_lock_a_writer_or_a_checkpoint_waits_for(
        tmp_path: Path) -> None:
    db = tmp_path / OUTPUTS_FILE
    held = hold(db)
    assert held is not None
    try:
        with closing(sqlite3.connect(db, timeout=0)) as writer:
            writer.execute("CREATE TABLE t (x)")
            writer.execute("BEGIN IMMEDIATE")
            writer.execute("INSERT INTO t VALUES (1)")
            writer.execute("COMMIT")
            busy, frames, folded = writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0 and frames == folded
    finally:
        held.close()


def test_a_missing_file_is_created_in_wal_mode_as_crewai_would(tmp_path: Path) -> None:
    db = tmp_path / OUTPUTS_FILE
    held = hold(db)
    assert held is not None
    try:
        assert held.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        Storage(str(db))  # crewai sets its table up in it as usual
        with closing(sqlite3.connect(db)) as conn:
            assert conn.execute("SELECT count(*) FROM latest_kickoff_task_outputs").fetchone()
    finally:
        held.close()


def test_a_file_that_cannot_be_opened_is_not_held(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=crewai_outputs_holder.__name__)
    assert hold(tmp_path / "no-such-dir" / OUTPUTS_FILE) is None
    assert "not held open" in caplog.text


def test_a_file_busy_at_start_is_not_held(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A file another process is writing (an exclusive lock here) is not held, and the start
    goes on: it waits ``BUSY_SECONDS`` for it, no more."""
    monkeypatch.setattr(crewai_outputs_holder, "BUSY_SECONDS", 0.05)
    db = tmp_path / OUTPUTS_FILE
    with closing(sqlite3.connect(db, isolation_level=None)) as writer:
        writer.execute("PRAGMA locking_mode=EXCLUSIVE")
        writer.execute("CREATE TABLE t (x)")
        writer.execute("BEGIN EXCLUSIVE")
        assert hold(db) is None
        writer.execute("COMMIT")


def test_by_default_it_holds_the_file_crewai_uses(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREWAI_STORAGE_DIR", str(tmp_path / "crewai"))
    assert crewai_outputs_holder.outputs_path() == Path(Storage().db_path)
