"""The order in which `scripts/test.sh` hands test files to its xdist workers
(tests/conftest.py, ``schedule_key``): heaviest recorded file first, an unrecorded e2e file
among the heavy ones, every file's tests kept together and in their order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def _root_conftest(config: pytest.Config) -> ModuleType:
    # The loaded module itself: importing it again would run its environment set-up twice.
    for plugin in config.pluginmanager.get_plugins():
        if isinstance(plugin, ModuleType) and \
                Path(getattr(plugin, "__file__", "") or "").resolve() == TESTS / "conftest.py":
            return plugin
    raise AssertionError("tests/conftest.py is not loaded")


@dataclass(frozen=True)
class _Item:
    path: Path
    name: str


def test_every_recorded_file_exists() -> None:
    recorded = json.loads((TESTS / "file_seconds.json").read_text())["seconds"]
    assert recorded, "no file recorded"
    missing = [p for p in recorded if not (REPO / p).is_file()]
    assert not missing, f"renamed or removed test files still recorded: {missing}"


def test_heavier_files_go_first_and_files_stay_whole(
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    conftest = _root_conftest(request.config)
    weights = {"tests/e2e/test_long.py": 300.0, "tests/component/test_mid.py": 60.0,
               "tests/e2e/test_short.py": 5.0}
    monkeypatch.setattr(conftest, "_file_weights", lambda: weights)
    unit, short, mid, long_, new_e2e = (
        TESTS / "unit" / "test_u.py", TESTS / "e2e" / "test_short.py",
        TESTS / "component" / "test_mid.py", TESTS / "e2e" / "test_long.py",
        TESTS / "e2e" / "test_new.py")
    items = [_Item(unit, "u1"), _Item(short, "s1"), _Item(mid, "m1"), _Item(long_, "l1"),
             _Item(long_, "l2"), _Item(new_e2e, "n1"), _Item(short, "s2"), _Item(unit, "u2")]

    serial = list(items)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    conftest.pytest_collection_modifyitems(request.config, serial)
    assert serial == items, "a serial run keeps pytest's order"

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    conftest.pytest_collection_modifyitems(request.config, items)
    assert [i.name for i in items] == ["l1", "l2", "n1", "m1", "s1", "s2", "u1", "u2"]
