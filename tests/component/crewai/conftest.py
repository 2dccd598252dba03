"""Fixtures for the crewai execution tests: real crewai, the offline LLM, real files.

The root conftest switches telemetry/tracing off and points CREWAI_STORAGE_DIR at a
throw-away folder before crewai is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLES_REGISTRY = "crewfence_sidecar.samples:SAMPLE_CREWS"


@dataclass
class ChunkSink:
    """Collects the data of `chunk` events the way the runtime would append them."""

    items: list[dict[str, Any]] = field(default_factory=list)

    def emit(self, data: dict[str, Any]) -> None:
        self.items.append(data)


@pytest.fixture(scope="session")
def crews_file() -> Path:
    return FIXTURES / "crews.yaml"


@pytest.fixture(scope="session")
def sample_catalog() -> Any:
    from crewfence_sidecar.crews import CrewCatalog

    return CrewCatalog.load(SAMPLES_REGISTRY, None)


@pytest.fixture(scope="session")
def file_catalog(crews_file: Path) -> Any:
    from crewfence_sidecar.crews import CrewCatalog

    return CrewCatalog.load(None, crews_file)


@pytest.fixture
def training_dir(tmp_path: Path) -> Path:
    path = tmp_path / "training"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def chunks() -> ChunkSink:
    return ChunkSink()


@pytest.fixture
def make_ctx(training_dir: Path, chunks: ChunkSink) -> Callable[..., Any]:
    from crewfence_sidecar.operations import ExecutionContext

    def make(crew_id: str, operation: str, input: dict[str, Any],
             training: Path | None = training_dir) -> ExecutionContext:
        return ExecutionContext(crew_id=crew_id, action_id=f"test/{operation}",
                                operation=operation, input=input, training_dir=training,
                                emit_chunk=chunks.emit)

    return make


@pytest.fixture
def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], str]:
    """Write a throw-away module and make it importable; returns its module name."""
    folder = tmp_path / "modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))

    def write(name: str, source: str) -> str:
        (folder / f"{name}.py").write_text(source, encoding="utf-8")
        return name

    return write
