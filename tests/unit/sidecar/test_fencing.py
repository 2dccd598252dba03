"""File rules and the flock fence (real files, real flock)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from crewfence_sidecar.fencing import FencingError, acquire_lock, fence_journal, lock_path_for


@pytest.fixture
def state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


def test_second_lock_on_the_same_journal_is_refused(state: Path) -> None:
    journal = state / "j.db"
    first = acquire_lock(journal)
    with pytest.raises(FencingError, match="owned by another running process"):
        acquire_lock(journal)
    first.release()
    acquire_lock(journal).release()  # released -> free again


def test_lock_file_is_forced_to_0600(state: Path) -> None:
    journal = state / "j.db"
    lp = lock_path_for(journal)
    lp.write_text("")
    lp.chmod(0o644)
    lock = acquire_lock(journal)
    assert lp.stat().st_mode & 0o777 == 0o600
    lock.release()


def test_symlinked_lock_is_refused(state: Path, tmp_path: Path) -> None:
    journal = state / "j.db"
    (tmp_path / "elsewhere").write_text("")
    lock_path_for(journal).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FencingError, match="symlink"):
        acquire_lock(journal)


def test_symlinked_journal_is_refused(state: Path, tmp_path: Path) -> None:
    target = tmp_path / "real.db"
    target.write_text("")
    target.chmod(0o600)
    (state / "j.db").symlink_to(target)
    with pytest.raises(FencingError, match="symlink"):
        fence_journal(state / "j.db")


def test_non_regular_journal_is_refused(state: Path) -> None:
    (state / "j.db").mkdir()
    with pytest.raises(FencingError, match="not a regular file"):
        fence_journal(state / "j.db")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o400, 0o700])
def test_journal_mode_other_than_0600_is_refused(state: Path, mode: int) -> None:
    j = state / "j.db"
    j.write_text("")
    j.chmod(mode)
    with pytest.raises(FencingError, match="0600"):
        fence_journal(j)


@pytest.mark.parametrize("mode", [0o770, 0o702, 0o777])
def test_writable_parent_is_refused(tmp_path: Path, mode: int) -> None:
    d = tmp_path / "state"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(FencingError, match="group- or world-writable"):
        fence_journal(d / "j.db")


def test_symlinked_parent_is_refused(tmp_path: Path, state: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(state)
    with pytest.raises(FencingError, match="symlink"):
        fence_journal(link / "j.db")


def test_missing_parent_is_created_private(tmp_path: Path) -> None:
    lock, existed = fence_journal(tmp_path / "fresh" / "j.db")
    assert not existed
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700
    lock.release()
