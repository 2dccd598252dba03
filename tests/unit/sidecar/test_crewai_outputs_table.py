"""crewai's kickoff-outputs table in the workers (``workers.crewai_outputs_table``): created
once per file, not at every crew build, and created again for a file that was deleted,
emptied or replaced since."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from crewai.memory.storage import kickoff_task_outputs_storage as outputs
from crewai.memory.storage.kickoff_task_outputs_storage import (
    KickoffTaskOutputsSQLiteStorage as Storage,
)
from crewfence_sidecar.workers import crewai_outputs_table

TABLE = "latest_kickoff_task_outputs"
_connect = sqlite3.connect  # the tests' own reads: not counted as crewai's


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The wrapper installed on crewai's class for the test; the paths crewai's own
    initialisation opened."""
    monkeypatch.setattr(Storage, "_initialize_db", Storage._initialize_db)
    monkeypatch.setattr(crewai_outputs_table, "_initialised", set())
    opened: list[str] = []

    def counting_connect(path: str, *args: object, **kwargs: object) -> sqlite3.Connection:
        opened.append(str(path))
        return _connect(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(outputs.sqlite3, "connect", counting_connect)
    assert crewai_outputs_table.install()
    yield opened


def _has_table(path: Path) -> bool:
    with closing(_connect(path)) as conn:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?",
                            (TABLE,)).fetchone() is not None


def test_a_second_build_does_not_initialise_the_same_file_again(
        tmp_path: Path, installed: list[str]) -> None:
    db = tmp_path / "latest_kickoff_task_outputs.db"
    Storage(str(db))
    Storage(str(db))
    Storage(str(db))
    assert installed == [str(db)]  # crewai's initialisation ran once (stock: three times)
    assert _has_table(db)


def test_a_deleted_file_is_initialised_again(tmp_path: Path, installed: list[str]) -> None:
    db = tmp_path / "latest_kickoff_task_outputs.db"
    Storage(str(db))
    db.unlink()
    Storage(str(db))
    assert installed == [str(db), str(db)]
    assert _has_table(db)


def test_a_replaced_or_emptied_file_is_initialised_again(
        tmp_path: Path, installed: list[str]) -> None:
    db = tmp_path / "latest_kickoff_task_outputs.db"
    Storage(str(db))
    replacement = tmp_path / "other.db"
    replacement.write_bytes(b"")
    replacement.replace(db)  # an empty file, another inode: no table in it
    Storage(str(db))
    assert _has_table(db)
    db.write_bytes(b"")  # emptied in place: same inode, no table
    Storage(str(db))
    assert _has_table(db)
    assert installed == [str(db)] * 3


def test_an_inode_initialised_at_another_path_is_initialised_again(
        tmp_path: Path, installed: list[str]) -> None:
    """The template's warm-up initialises a file in a scratch directory and deletes it; the
    real file may then get that inode number without having the table."""
    scratch, real = tmp_path / "scratch.db", tmp_path / "latest_kickoff_task_outputs.db"
    Storage(str(scratch))
    with closing(_connect(scratch)) as conn:
        conn.execute(f"DROP TABLE {TABLE}")
    scratch.rename(real)  # the same inode at the real path, and no table in it
    Storage(str(real))
    assert installed == [str(scratch), str(real)]
    assert _has_table(real)


def test_each_file_is_initialised_on_its_own(tmp_path: Path, installed: list[str]) -> None:
    first, second = tmp_path / "a.db", tmp_path / "b.db"
    Storage(str(first))
    Storage(str(second))
    assert installed == [str(first), str(second)]
    assert _has_table(first) and _has_table(second)


def test_install_twice_wraps_once(installed: list[str]) -> None:
    wrapped = Storage._initialize_db
    assert crewai_outputs_table.install()
    assert Storage._initialize_db is wrapped
