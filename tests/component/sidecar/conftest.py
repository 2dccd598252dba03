"""Component fixtures: real crewai with the offline LLM, real SQLite, real files.

In-process servers use aiohttp's TestServer on a real loopback socket; process-level tests
start the real ``crewfence-sidecar`` executable (helpers in ``sidecar_helpers.py`` here).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

# Before crewai is imported anywhere in this process.
os.environ.update({"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false",
                   "OTEL_SDK_DISABLED": "true", "CREWAI_DISABLE_TRACKING": "true"})
sys.path.insert(0, str(Path(__file__).parent))

from sidecar_helpers import ALL_OPS, TOKEN, close_in_process, serve_in_process, write_crews
from worker_support import make_worker_client, worker_template  # noqa: F401 - fixtures


@pytest.fixture(scope="session")
def crewai_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # tests/conftest.py normally chose a throw-away folder already; keep it
    if "CREWAI_STORAGE_DIR" not in os.environ:
        os.environ["CREWAI_STORAGE_DIR"] = str(tmp_path_factory.mktemp("crewai-storage"))
    return Path(os.environ["CREWAI_STORAGE_DIR"])


@pytest.fixture(scope="session")
def crews_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_crews(tmp_path_factory.mktemp("crews"))


@pytest.fixture(scope="session")
def catalog(crews_file: Path, crewai_storage: Path) -> Any:
    from crewfence_sidecar.crews import CrewCatalog

    return CrewCatalog.load(None, crews_file)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
async def make_client(catalog: Any, crews_file: Path, state_dir: Path,
                      tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """make_client(env overrides) -> aiohttp TestClient of a real in-process sidecar."""
    from aiohttp.test_utils import TestClient
    from crewfence_sidecar.config import load_config
    from crewfence_sidecar.server import build_sidecar, crewai_executor, open_journal

    made: list[tuple[Any, Any]] = []
    training = tmp_path / "training"
    training.mkdir()

    async def make(**env: str) -> TestClient:
        base = {"CREWFENCE_CREWS_FILE": str(crews_file),
                "CREWFENCE_STATE_FILE": str(state_dir / "journal.db"),
                "CREWFENCE_TOKEN": TOKEN, "CREWFENCE_HOST": "127.0.0.1",
                "CREWFENCE_ALLOWED_OPERATIONS": ALL_OPS,
                "CREWFENCE_TRAINING_DIR": str(training)}
        base.update(env)
        config = load_config([], {k: v for k, v in base.items() if v != ""})
        opened = open_journal(config)
        sidecar = build_sidecar(config, catalog, crewai_executor(catalog), opened)
        client = await serve_in_process(sidecar, made)
        client.training_dir = training
        return client

    yield make
    await close_in_process(made)
