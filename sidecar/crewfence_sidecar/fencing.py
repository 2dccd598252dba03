"""The journal-owner fence: file rules for the journal and its directory, and the flock.

A state path serves exactly one sidecar process. The `<journal>.lock` companion is held with
``flock(LOCK_EX | LOCK_NB)`` for the life of the process; the kernel drops it when the
process dies (also on SIGKILL), so no stale-lock cleanup is ever needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path

# SQLite companions that must never be symlinks or special files either.
SQLITE_COMPANIONS = ("-wal", "-journal", "-shm")


class FencingError(Exception):
    """A fence or file rule refuses start-up; the message is the one line to print."""


def lock_path_for(journal: Path) -> Path:
    return journal.with_name(journal.name + ".lock")


def check_parent(journal: Path) -> None:
    """The journal's directory: a real directory, not a symlink, not group/world-writable.

    A missing directory is created (mode 0700) when its own parent exists, so an operator
    can point the state file into a fresh subdirectory of a volume whose root is
    group-writable (fsGroup).
    """
    parent = journal.parent
    try:
        st = parent.lstat()
    except FileNotFoundError:
        try:
            parent.mkdir(mode=0o700)
        except OSError as exc:
            raise FencingError(f"journal directory {parent} cannot be created: "
                               f"{exc.strerror}") from None
        st = parent.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise FencingError(f"journal directory {parent} is a symlink")
    if not stat.S_ISDIR(st.st_mode):
        raise FencingError(f"journal directory {parent} is not a directory")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise FencingError(f"journal directory {parent} is group- or world-writable "
                           f"(mode {stat.S_IMODE(st.st_mode):04o})")


def _check_regular_0600(path: Path, what: str) -> bool:
    """True when the file exists and obeys the rules; False when absent; raise otherwise."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise FencingError(f"{what} {path} is a symlink")
    if not stat.S_ISREG(st.st_mode):
        raise FencingError(f"{what} {path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode != 0o600:
        raise FencingError(f"{what} {path} must have mode 0600, has {mode:04o}")
    return True


def check_journal_file(journal: Path) -> bool:
    """Apply the journal file rules; return whether the journal already exists."""
    exists = _check_regular_0600(journal, "journal")
    for suffix in SQLITE_COMPANIONS:
        companion = journal.with_name(journal.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            st = companion.lstat()
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
                raise FencingError(f"journal companion {companion} is not a regular file")
    return exists


def create_journal_file(journal: Path) -> None:
    """Create an empty journal file with mode 0600 and make its directory entry durable."""
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask must not widen or narrow it
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(journal.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class JournalLock:
    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def acquire_lock(journal: Path) -> JournalLock:
    """Open `<journal>.lock` (regular, forced to 0600) and take LOCK_EX | LOCK_NB."""
    path = lock_path_for(journal)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise FencingError(f"journal lock {path} cannot be opened: {exc.strerror} "
                           "(a symlink is refused)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FencingError(f"journal lock {path} is not a regular file")
        os.fchmod(fd, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FencingError(
                f"journal {journal} is owned by another running process (lock {path} is "
                "held); one state path serves exactly one sidecar, never bypass the lock"
            ) from None
    except BaseException:
        os.close(fd)
        raise
    return JournalLock(path=path, fd=fd)


def fence_journal(journal: Path) -> tuple[JournalLock, bool]:
    """All start-up checks in order; returns the held lock and whether the journal existed."""
    check_parent(journal)
    lock = acquire_lock(journal)
    try:
        exists = check_journal_file(journal)
    except BaseException:
        lock.release()
        raise
    return lock, exists
