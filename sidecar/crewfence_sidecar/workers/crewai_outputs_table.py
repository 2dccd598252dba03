"""crewai's kickoff-outputs table, created once per file in the workers, not at every build.

Every ``Crew`` crewai builds gets a ``TaskOutputStorageHandler`` whose
``KickoffTaskOutputsSQLiteStorage`` opens the storage directory's
``latest_kickoff_task_outputs.db`` under crewai's file lock, sets WAL mode and runs
``CREATE TABLE IF NOT EXISTS`` with a column check: a no-op once the file has its table, yet
0.55 ms of a 1.2 ms build of the bench's one-agent crew (measured in one process, 60
alternations). A worker builds a crew for every job, ahead of it, while the sidecar answers
the last job and admits the next one; on 2 cores that build is CPU the sidecar waits behind.

Invariant (the table crewai writes to always exists): the initialisation is skipped only for
a file this process (or the template it was forked from) initialised itself at that very path
and that is still that file, same device and inode and not empty. A file deleted, emptied or
replaced since (a storage wiped under the pod) is initialised again by crewai's own code; so is
a file whose inode number once belonged to another path (the template's warm-up initialises a
file in a scratch directory it then deletes, and the real file may get its number). While the
sidecar runs it holds the real file open (``crewai_outputs_holder``), so that file's number is
never freed for another. Anything else crewai does with the file (the writes after each task,
``replay``'s reads, a reset) is unchanged.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

_initialised: set[tuple[str, int, int]] = set()


def _identity(path: str) -> tuple[str, int, int] | None:
    """The path with its file's device and inode; None when the file is missing or empty (no
    table in it)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_dev, st.st_ino) if st.st_size > 0 else None


def _once_per_file(initialise: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(initialise)
    def wrapper(storage: Any) -> None:
        path = str(storage.db_path)
        if _identity(path) in _initialised:
            return
        initialise(storage)
        identity = _identity(path)
        if identity is not None:
            _initialised.add(identity)

    wrapper.__crewfence_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def install() -> bool:
    """Make crewai initialise its kickoff-outputs file once per file in this process (and the
    processes it forks); False when this crewai has no such storage (nothing changed)."""
    try:
        from crewai.memory.storage.kickoff_task_outputs_storage import (
            KickoffTaskOutputsSQLiteStorage as Storage,
        )
    except ImportError:
        return False
    initialise = getattr(Storage, "_initialize_db", None)
    if initialise is None:
        return False
    if not getattr(initialise, "__crewfence_wrapped__", False):
        Storage._initialize_db = _once_per_file(initialise)  # type: ignore[method-assign,assignment]
    return True
