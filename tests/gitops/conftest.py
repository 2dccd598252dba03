"""Run the chart's Argo CD Lua health checks in a real Lua interpreter.

Argo CD evaluates health scripts with gopher-lua, a Lua 5.1 implementation, so the scripts are
run under Lua 5.1 (and 5.4, to catch anything version-specific). The script sees the live object
as the global `obj` and returns the table `hs`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Test modules import shared helpers (status_objects) from this folder.
sys.path.insert(0, str(Path(__file__).resolve().parent))

ARGOCD_DIR = Path(__file__).resolve().parents[2] / "charts" / "crewfence" / "files" / "argocd"
LUA_MODULES = ("lupa.lua51", "lupa.lua54")
ARGO_HEALTH_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


@dataclass(frozen=True)
class Health:
    status: str
    message: str


HealthCheck = Callable[[str, dict[str, Any]], Health]


@pytest.fixture(params=LUA_MODULES)
def run_health(request: pytest.FixtureRequest) -> HealthCheck:
    lupa = importlib.import_module(request.param)

    def run(script_name: str, obj: dict[str, Any]) -> Health:
        lua = lupa.LuaRuntime(unpack_returned_tuples=True)
        lua.globals().obj = lua.table_from(obj, recursive=True)
        hs = lua.execute((ARGOCD_DIR / script_name).read_text())
        assert hs is not None, "the script must return hs"
        status = hs["status"]
        assert status in ARGO_HEALTH_STATUSES
        return Health(status=str(status), message=str(hs["message"] or ""))

    return run
