"""The sidecar keeps crewai's kickoff-outputs file open, so that no close of crewai's is its last.

crewai writes a kickoff's task outputs (what ``replay`` reads) to
``latest_kickoff_task_outputs.db`` in its storage directory through a fresh SQLite connection
per write, in WAL mode: the reset when a kickoff starts, then one write per task. When such a
connection is the file's last, its close checkpoints the WAL into the file, syncs both and
deletes the WAL and its index; the next connection creates them again and syncs the directory.
Measured on the bench's one-task crew, in one process: 10 syncs and 6 file creations and
deletions per kickoff, 5 syncs and none while another connection stays open, and the kickoff
1.1 to 2.5 ms faster (of 17 to 21 ms).

Invariant (nothing about crewai's file changes but when its WAL is folded in): the sidecar's
connection reads no row and never holds a transaction, so it takes no lock a writer or a
checkpoint waits for; every write of crewai's stays a synced commit, and the WAL is folded into
the file by SQLite's automatic checkpoint (1,000 pages) instead of at every close. It is
opened after the worker template was forked, so no worker inherits it (an SQLite connection
must not cross a ``fork``).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path

log = logging.getLogger(__name__)

OUTPUTS_FILE = "latest_kickoff_task_outputs.db"
"""crewai's file name (``KickoffTaskOutputsSQLiteStorage``)."""
BUSY_SECONDS = 1.0
"""How long the start waits for a file another process is writing; then it is not held (the
sidecar's start is never held up by an optimisation)."""


def outputs_path() -> Path:
    """Where crewai puts the file in this process's environment (``CREWAI_STORAGE_DIR``);
    crewai_core's own function, which also creates the directory."""
    from crewai_core.paths import db_storage_path

    return Path(db_storage_path()) / OUTPUTS_FILE


def hold(path: Path | None = None) -> sqlite3.Connection | None:
    """Open crewai's outputs file (created in WAL mode when missing, as crewai would) and keep
    the connection; None when that cannot be done (crewai then works as it does alone)."""
    conn: sqlite3.Connection | None = None
    try:
        target = path if path is not None else outputs_path()
        conn = sqlite3.connect(target, timeout=BUSY_SECONDS, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the WAL index
    except (OSError, sqlite3.Error) as exc:
        log.info("crewai's kickoff-outputs file is not held open: %s", type(exc).__name__)
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        return None
    return conn
