"""The AIP protocol conformance suite (docs/aip-compatibility.md) against a REAL sidecar.

Written from the client's side: plain aiohttp, no import of the sidecar's modules. The only
project code used here is the test helper that starts the real ``crewfence-sidecar``
executable (tests/component/sidecar/sidecar_helpers.py).

``CREWFENCE_CONFORMANCE_PYTHONPATH`` (optional) is put in front of the sidecar process's
``PYTHONPATH``: pointing it at another checkout's ``sidecar/`` folder runs this suite against
that checkout's answers (how the suite was shown to fail on the answers before issue 14).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "component" / "sidecar"))

from aip_client import STARTABLE, Target
from sidecar_helpers import TOKEN, SidecarProcess, sidecar_env, write_crews


def _start(root: Path, **more: str) -> tuple[SidecarProcess, Target]:
    state = root / "state"
    state.mkdir(mode=0o700)
    training = root / "training"
    training.mkdir()
    env = sidecar_env(state / "journal.db", write_crews(root),
                      CREWFENCE_ALLOWED_OPERATIONS=",".join(STARTABLE),
                      CREWFENCE_TRAINING_DIR=str(training),
                      CREWAI_STORAGE_DIR=str(root / "crewai"), HOME=str(root), **more)
    extra = os.environ.get("CREWFENCE_CONFORMANCE_PYTHONPATH")
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
    proc = SidecarProcess([], env, root / "sidecar.log").start().wait_listening()
    return proc, Target(proc.url, TOKEN, training)


@pytest.fixture(scope="session")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    proc, target = _start(tmp_path_factory.mktemp("conformance"))
    try:
        yield target
    finally:
        assert proc.terminate() == 0, proc.stderr_text()[-3000:]


@pytest.fixture(scope="session")
def one_slot_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A sidecar that runs one job at a time: a second blocking job waits (for the 504)."""
    proc, target = _start(tmp_path_factory.mktemp("conformance-one-slot"),
                          CREWFENCE_MAX_CONCURRENCY="1")
    try:
        yield target
    finally:
        assert proc.terminate() == 0, proc.stderr_text()[-3000:]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        yield s
