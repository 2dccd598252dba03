"""State folders of pytest sessions under `.e2e/`: one per pytest process, pruned safely.

`scripts/test.sh` runs pytest with xdist workers, and other people's sessions may run on the
same checkout: each process gets `pytest-<pid>[-<xdist worker>]` and its own control plane.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import controlplane


def state_dir_name() -> str:
    """One folder per pytest process: each xdist worker runs its own control plane."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"pytest-{os.getpid()}" + (f"-{worker}" if worker else "")


def session_alive(state_dir: Path) -> bool:
    """Whether the pytest process named in `pytest-<pid>[-<worker>]` still runs."""
    parts = state_dir.name.split("-")
    if len(parts) < 2 or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def prune(root: Path, keep: int) -> list[Path]:
    """Drop all but the newest `keep` stopped session folders (their logs explain failures).

    Invariant: a folder whose session still lives is never removed, even before any process
    runs in it (a worker that has just created it and is generating certificates)."""
    runs = sorted(root.glob("pytest-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in runs[keep:]:
        if not session_alive(old) and not controlplane.running_records(old):
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    return removed
