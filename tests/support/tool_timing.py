"""Times every tool call as crewai runs it, from its ``pre_tool_call`` hooks to its
``post_tool_call`` hooks, for the tool-ledger benchmark. Importing this module registers two
crewai hooks; they are registered before the ledger's (the ledger installs its hooks at a
job's start), so a timed call includes the ledger's work on it. Durations (seconds) are
appended to ``$CREWFENCE_BENCH_TOOL_TIMES`` when set, and to :data:`DURATIONS`.

``REGISTRY`` is an empty crew registry, so a sidecar can import this module in its template
(``CREWFENCE_REGISTRY=tool_timing:REGISTRY``) and its workers inherit the hooks.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from crewai.hooks.dispatch import InterceptionPoint, register

DURATIONS: list[float] = []
REGISTRY: dict[str, Any] = {}
_starts = threading.local()


def _pre(_ctx: Any) -> None:
    _starts.at = time.perf_counter()


def _post(_ctx: Any) -> None:
    started = getattr(_starts, "at", None)
    if started is None:
        return
    took = time.perf_counter() - started
    _starts.at = None
    DURATIONS.append(took)
    target = os.environ.get("CREWFENCE_BENCH_TOOL_TIMES")
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(f"{took:.9f}\n")


register(InterceptionPoint.PRE_TOOL_CALL, _pre)
register(InterceptionPoint.POST_TOOL_CALL, _post)
