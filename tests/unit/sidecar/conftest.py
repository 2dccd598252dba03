"""Fixtures shared by the sidecar's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from crewfence_sidecar.journal import Journal, JournalLimits


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    """A real journal (SQLite file) in a private state directory, five retained runs."""
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    j = Journal.open(d / "j.db", JournalLimits(max_retained_runs=5))
    yield j
    j.close()
