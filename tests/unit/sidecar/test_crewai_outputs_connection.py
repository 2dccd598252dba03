"""crewai's kickoff-outputs file written through one kept connection per worker thread
(``workers.crewai_outputs_connection``), with crewai's real storage class and real SQLite
files: every write still a committed, synced write; no connection kept outside a process that
asked, or across a fork; a deleted or replaced file written at its path again."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from crewai.memory.storage import kickoff_task_outputs_storage as outputs
from crewai.memory.storage.kickoff_task_outputs_storage import (
    KickoffTaskOutputsSQLiteStorage as Storage,
)
from crewfence_sidecar.workers import crewai_outputs_connection as kept

_connect = sqlite3.connect  # the tests' own reads: never counted


class _Task:
    """What crewai's ``add`` reads of a task."""

    def __init__(self, n: int) -> None:
        self.id = f"task-{n}"
        self.key = f"key-{n}"
        self.expected_output = "A summary"


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The shim installed on crewai's storage module for the test, nothing kept yet; the
    paths SQLite connections were opened on (crewai's and the shim's, not the tests')."""
    monkeypatch.setattr(outputs, "sqlite3", sqlite3)
    monkeypatch.setattr(kept, "_owner_pid", None)
    monkeypatch.setattr(kept, "_local", threading.local())
    paths: list[str] = []

    def counting_connect(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        paths.append(os.fspath(database))
        return _connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", counting_connect)
    assert kept.install()
    assert kept.install()  # twice: still one shim
    yield paths


def _session(db: Path) -> Any:
    """One of crewai's sessions on the file, as its storage opens one."""
    return closing(outputs.sqlite3.connect(str(db), timeout=30))


def _kept_file(tmp_path: Path) -> Path:
    """crewai's file with its table, in a process that keeps connections from now on."""
    db = tmp_path / "latest_kickoff_task_outputs.db"
    Storage(str(db))
    kept.keep_in_this_process()
    return db


def _rows(db: Path) -> list[str]:
    with closing(_connect(db)) as conn:
        return [row[0] for row in conn.execute(
            "SELECT task_id FROM latest_kickoff_task_outputs ORDER BY task_index")]


def _write_kickoff(storage: Storage, tasks: int) -> None:
    """What a kickoff does to the file: the reset, then one write per task and its update."""
    storage.delete_all()
    for n in range(tasks):
        storage.add(_Task(n), {"raw": f"output {n}"}, n)  # type: ignore[arg-type]
        storage.update(n, output={"raw": f"output {n} again"})


def test_a_worker_writes_every_kickoff_through_one_connection(
        tmp_path: Path, opened: list[str]) -> None:
    db = tmp_path / "latest_kickoff_task_outputs.db"
    kept.keep_in_this_process()
    storage = Storage(str(db))
    for _ in range(3):
        _write_kickoff(storage, tasks=2)
        # committed when crewai's call returned: another connection reads every row
        assert _rows(db) == ["task-0", "task-1"]
    assert [row["task_id"] for row in storage.load()] == ["task-0", "task-1"]
    assert opened == [str(db)]  # stock: one connection per call, 1 + 3 * 5 + 1 of them


def test_the_kept_connection_commits_as_synced_as_crewais_own(
        tmp_path: Path, opened: list[str]) -> None:
    db = tmp_path / "latest_kickoff_task_outputs.db"
    Storage(str(db))
    with closing(_connect(db, timeout=30)) as stock:
        stock_sync = stock.execute("PRAGMA synchronous").fetchone()[0]
    kept.keep_in_this_process()
    with _session(db) as session:
        assert session.execute("PRAGMA synchronous").fetchone()[0] == stock_sync == 2  # FULL
        assert session.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_process_that_did_not_ask_gets_crewais_stock_connections(
        tmp_path: Path, opened: list[str]) -> None:
    db = tmp_path / "latest_kickoff_task_outputs.db"
    storage = Storage(str(db))
    _write_kickoff(storage, tasks=1)
    assert len(opened) == 1 + 3  # the table, the reset, the write, its update: one each
    with _session(db) as conn:
        assert type(conn) is sqlite3.Connection


def test_a_forked_child_never_uses_its_parents_connection(
        tmp_path: Path, opened: list[str]) -> None:
    db = tmp_path / "latest_kickoff_task_outputs.db"
    kept.keep_in_this_process()
    storage = Storage(str(db))
    _write_kickoff(storage, tasks=1)
    parents = len(opened)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what crewai's connect gives it, then leave at once
        code = 1
        try:
            before = len(opened)
            storage.add(_Task(7), {"raw": "child"}, 7)  # type: ignore[arg-type]
            conn = outputs.sqlite3.connect(str(db), timeout=30)
            verdict = f"{type(conn).__name__} {len(opened) - before}"
            conn.close()
            os.write(write, verdict.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        verdict = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0
    assert verdict == "Connection 2"  # the child opened its own, for both uses
    assert "task-7" in _rows(db)
    _write_kickoff(storage, tasks=1)
    assert len(opened) == parents  # the parent still writes through its one connection


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_deleted_or_replaced_file_is_written_at_its_path(
        tmp_path: Path, opened: list[str], how: str) -> None:
    db = tmp_path / "latest_kickoff_task_outputs.db"
    kept.keep_in_this_process()
    _write_kickoff(Storage(str(db)), tasks=1)
    for name in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        name.unlink(missing_ok=True)  # the storage wiped under the pod
    if how == "replaced":
        other = tmp_path / "elsewhere.db"
        Storage(str(other))
        other.replace(db)
    storage = Storage(str(db))  # a new build, as crewai does for every crew
    storage.add(_Task(3), {"raw": "after"}, 3)  # type: ignore[arg-type]
    assert _rows(db) == ["task-3"]


def test_a_nested_connect_gets_a_connection_of_its_own(
        tmp_path: Path, opened: list[str]) -> None:
    db = _kept_file(tmp_path)
    with _session(db) as outer:
        with _session(db) as inner:
            assert type(inner) is sqlite3.Connection
            assert inner is not kept._local.kept.conn
        outer.execute("SELECT 1").fetchone()


def test_what_a_session_left_open_is_rolled_back_at_its_close(
        tmp_path: Path, opened: list[str]) -> None:
    db = _kept_file(tmp_path)
    session = outputs.sqlite3.connect(str(db), timeout=30)
    session.execute("BEGIN TRANSACTION")
    session.execute("INSERT INTO latest_kickoff_task_outputs (task_id, task_index) "
                    "VALUES ('left-open', 0)")
    session.close()
    assert _rows(db) == []
    with _session(db) as again:
        assert not again.in_transaction
        again.execute("BEGIN TRANSACTION")  # not "within a transaction"
        again.execute("ROLLBACK")


def test_each_thread_writes_through_its_own_connection(
        tmp_path: Path, opened: list[str]) -> None:
    db = tmp_path / "latest_kickoff_task_outputs.db"
    kept.keep_in_this_process()
    storage = Storage(str(db))
    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            storage.add(_Task(5), {"raw": "thread"}, 5)  # type: ignore[arg-type]
            storage.update(5, output={"raw": "thread again"})
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    storage.add(_Task(4), {"raw": "main"}, 4)  # type: ignore[arg-type]
    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    storage.add(_Task(6), {"raw": "main again"}, 6)  # type: ignore[arg-type]
    assert errors == []
    assert _rows(db) == ["task-4", "task-5", "task-6"]
    assert opened == [str(db), str(db)]  # one per thread


def test_what_a_session_set_on_the_connection_is_not_seen_by_the_next(
        tmp_path: Path, opened: list[str]) -> None:
    db = _kept_file(tmp_path)
    with _session(db) as first:
        first.row_factory = sqlite3.Row
        first.isolation_level = None
        assert isinstance(first.execute("SELECT 1 AS one").fetchone(), sqlite3.Row)
    with _session(db) as second:
        assert second.execute("SELECT 1 AS one").fetchone() == (1,)
        assert second.isolation_level == ""
    assert opened == [str(db), str(db)]  # crewai's table, then the one kept connection
