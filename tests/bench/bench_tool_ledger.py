"""Effect-ledger benchmark: what journaling a tool call write-ahead costs, one run, figures
as differences and ratios of that run.

    .venv/bin/python tests/bench/bench_tool_ledger.py [--runs N] [--calls K]

1. Per no-op Python tool call, in one process: the same declarative crew kicked off with a
   task of K ``[[tool:noop]]`` calls and with none, journaled (the runtime's in-process
   path: a file journal, each ``tool_call_started`` committed with a synced WAL before the
   tool runs) and not journaled (``operations.execute`` without a ledger). The per-call cost
   is ``(p50(K calls) - p50(0 calls)) / K`` on each side (the fixed costs of a job cancel
   out); the bar is the journaled minus the not-journaled per-call cost <= 1.5 ms.
2. A run with four tool calls through the real ``crewfence-sidecar`` (worker process,
   blocking ``POST /jobs``) against the same crew kicked off in-process, p50 of each and the
   difference per tool call (printed, no bar: it includes the sidecar's own per-job cost).

Runs are interleaved (journaled, not journaled, ...) so both sides see the same machine load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

os.environ.update({"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false",
                   "OTEL_SDK_DISABLED": "true", "CREWAI_DISABLE_TRACKING": "true"})
HERE = Path(__file__).resolve().parent
SUPPORT = HERE.parent / "support"
sys.path.insert(0, str(SUPPORT))
sys.path.insert(0, str(HERE.parent / "component" / "sidecar"))
BAR_MS = 1.5


def crews_document() -> dict[str, Any]:
    return {"crews": {"bench": {
        "tools": {"python": [{"name": "noop", "ref": "ledger_tools:noop"}]},
        "agents": {"worker": {"role": "Worker", "goal": "Work", "backstory": "Works.",
                              "tools": ["noop"], "max_retry_limit": 0}},
        "tasks": [{"name": "work", "agent": "worker", "description": "Work: {request}",
                   "expected_output": "done"}]}}}


def request(calls: int, tag: str) -> str:
    return tag + " " + " ".join(f'[[tool:noop {{"n": {n}}}]]' for n in range(calls))


async def in_process(catalog: Any, journal_dir: Path, runs: int,
                     calls: int) -> dict[str, list[float]]:
    from crewfence_sidecar import operations
    from crewfence_sidecar.contract import Operation, StartRequest
    from crewfence_sidecar.journal import Journal, JournalLimits
    from crewfence_sidecar.metrics import SidecarMetrics
    from crewfence_sidecar.runtime import JobContext, Runtime, RuntimeSettings
    from crewfence_sidecar.server import crewai_executor

    journal = Journal.open(journal_dir / "journal.db", JournalLimits())
    runtime = Runtime(journal, catalog, RuntimeSettings(allowed_operations=frozenset(Operation)),
                      crewai_executor(catalog), SidecarMetrics())

    async def journaled(n: int, action_id: str) -> float:
        started = time.perf_counter()
        await runtime.admit(StartRequest(crew_id="bench", action_id=action_id,
                                         operation=Operation.RUN,
                                         input={"request": request(n, action_id)}), action_id)
        await runtime.wait_terminal(action_id, 120)
        record = journal.get(action_id)
        assert record is not None and record.status.value == "completed", record
        return time.perf_counter() - started

    async def plain(n: int, action_id: str) -> float:
        async def no_chunks(_data: dict[str, Any]) -> None:
            return None

        ctx = JobContext(crew_id="bench", action_id=action_id, operation="run",
                         input={"request": request(n, action_id)}, training_dir=None,
                         emit_chunk=no_chunks)
        started = time.perf_counter()
        await operations.execute(catalog, ctx)
        return time.perf_counter() - started

    out: dict[str, list[float]] = {k: [] for k in ("j0", "jK", "p0", "pK", "p4")}
    await plain(calls, "warm-p")
    await journaled(calls, "warm-j")
    for run in range(runs):
        out["p0"].append(await plain(0, f"p0-{run}"))
        out["j0"].append(await journaled(0, f"j0-{run}"))
        out["pK"].append(await plain(calls, f"pK-{run}"))
        out["jK"].append(await journaled(calls, f"jK-{run}"))
        out["p4"].append(await plain(4, f"p4-{run}"))
    await runtime.close()
    journal.close()
    return out


def through_sidecar(crews_file: Path, state: Path, runs: int) -> list[float]:
    from sidecar_helpers import AUTH, SidecarProcess, sidecar_env

    env = sidecar_env(state / "journal.db", crews_file,
                      PYTHONPATH=os.pathsep.join(p for p in (str(SUPPORT),
                                                             os.environ.get("PYTHONPATH")) if p))
    sidecar = SidecarProcess([], env, state.parent / "sidecar.log").start().wait_listening()
    times: list[float] = []
    try:
        for run in range(runs + 1):
            action_id = f"s4-{run}"
            body = {"crew_id": "bench", "action_id": action_id, "operation": "run",
                    "input": {"request": request(4, action_id)}}
            req = urllib.request.Request(f"{sidecar.url}/jobs", method="POST",
                                         data=json.dumps(body).encode(),
                                         headers={**AUTH, "Content-Type": "application/json",
                                                  "Idempotency-Key": action_id})
            started = time.perf_counter()
            with urllib.request.urlopen(req, timeout=120) as resp:
                assert resp.status == 200
                resp.read()
            if run:  # the first one warms the worker pool up
                times.append(time.perf_counter() - started)
    finally:
        sidecar.terminate()
    return times


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ.setdefault("CREWAI_STORAGE_DIR", str(root / "crewai"))
        crews_file = root / "crews.yaml"
        crews_file.write_text(json.dumps(crews_document()))
        from crewfence_sidecar.crews import CrewCatalog

        catalog = CrewCatalog.load(None, crews_file)
        journal_dir = root / "inproc"
        journal_dir.mkdir(mode=0o700)
        t = asyncio.run(in_process(catalog, journal_dir, args.runs, args.calls))
        k = args.calls
        journaled = (p50_ms(t["jK"]) - p50_ms(t["j0"])) / k
        plain = (p50_ms(t["pK"]) - p50_ms(t["p0"])) / k
        state = root / "sidecar" / "state"
        state.mkdir(parents=True, mode=0o700)
        sidecar = through_sidecar(crews_file, state, args.runs)
    print(f"tool call (no-op Python tool), p50 per call over {args.runs} runs of {k} calls:")
    print(f"  journaled (in-process runtime, durable start)   {journaled:7.3f} ms")
    print(f"  not journaled (no ledger)                       {plain:7.3f} ms")
    ratio = journaled / plain if plain > 0 else float("inf")
    print(f"  difference {journaled - plain:.3f} ms per call, ratio {ratio:.2f}x "
          f"(bar: difference <= {BAR_MS} ms)")
    print(f"job p50: {k} calls journaled {p50_ms(t['jK']):.1f} ms, not journaled "
          f"{p50_ms(t['pK']):.1f} ms; 0 calls journaled {p50_ms(t['j0']):.1f} ms, not "
          f"{p50_ms(t['p0']):.1f} ms")
    inproc_four = p50_ms(t["p4"])
    print(f"four-tool-call run: sidecar (worker, blocking POST) p50 {p50_ms(sidecar):.1f} ms; "
          f"in-process (no ledger, akickoff) p50 {inproc_four:.1f} ms")
    print(f"  difference {p50_ms(sidecar) - inproc_four:.1f} ms for the run, "
          f"{(p50_ms(sidecar) - inproc_four) / 4:.1f} ms per tool call (includes the "
          "sidecar's per-job cost)")
    return 0 if journaled - plain <= BAR_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
