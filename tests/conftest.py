"""Project-wide pytest configuration.

Every test runs with crewai's telemetry and tracing switched off and with
crewai's own storage in a throw-away folder: nothing may reach the network and
nothing may write into the user's home directory.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

_OFFLINE_ENV = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_DISABLE_TRACKING": "true",
}

for _name, _value in _OFFLINE_ENV.items():
    os.environ[_name] = _value

# One folder per pytest process, so xdist workers never share crewai's
# `latest_kickoff_task_outputs.db` (what `replay` reads) or its memory stores; a
# CREWAI_STORAGE_DIR given from outside only chooses where these folders go.
_outer_storage = os.environ.get("CREWAI_STORAGE_DIR") or None
if _outer_storage is not None:
    _outer_storage = os.path.abspath(_outer_storage)
    os.makedirs(_outer_storage, exist_ok=True)
os.environ["CREWAI_STORAGE_DIR"] = tempfile.mkdtemp(
    prefix=f"crewfence-crewai-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-",
    dir=_outer_storage,
)


def _remove_storage(path: str, owner: int = os.getpid()) -> None:
    if os.getpid() == owner:  # never from a forked child (sidecar workers fork in-process)
        shutil.rmtree(path, ignore_errors=True)


atexit.register(_remove_storage, os.environ["CREWAI_STORAGE_DIR"])



# --- scheduling under pytest-xdist ----------------------------------------------------------
# `scripts/test.sh` runs `-n 2 --dist loadfile --no-loadscope-reorder`: a file goes whole to
# one worker, in the order collected here. xdist's default order (most tests first) left the
# one-test e2e files for the end, so one worker ran a two-minute file alone while the other
# idled. Heaviest file first (longest-processing-time-first) lets the many short files fill
# both workers' tails evenly. Only the order changes, never which tests run; a serial run (no
# xdist) keeps pytest's own order.
_TESTS = Path(__file__).resolve().parent
_WEIGHTS_FILE = _TESTS / "file_seconds.json"
UNKNOWN_E2E_SECONDS = 120.0
"""Where an e2e file without a recorded duration (a new one) goes: among the long ones."""


def _file_weights() -> dict[str, float]:
    """Seconds per test file (repo-relative path -> s) from one measured run; a hint only."""
    try:
        raw = json.loads(_WEIGHTS_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in raw.get("seconds", {}).items()}


def schedule_key(path: Path, weights: dict[str, float]) -> float:
    """Sort key of a test file: heavier first; an unrecorded e2e file counts as heavy, any
    other unrecorded file as light (it keeps its place among the light ones)."""
    try:
        rel = path.resolve().relative_to(_TESTS.parent).as_posix()
    except ValueError:
        return 0.0
    default = UNKNOWN_E2E_SECONDS if rel.startswith("tests/e2e/") else 0.0
    return -weights.get(rel, default)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    weights = _file_weights()
    keys = {path: schedule_key(path, weights) for path in {item.path for item in items}}
    # A stable sort on the file alone keeps every file's tests together and in their order.
    items.sort(key=lambda item: keys[item.path])
