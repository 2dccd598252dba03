"""The in-process side of the run benchmarks, in a fresh interpreter per measured pair.

    python tests/bench/inprocess_runner.py CREWS_FILE   (driven over stdin/stdout)

Why a process of its own: one CPython process runs the same offline crew at a speed of its
own (on the 2-core build machine, fresh processes measured p50 24.9-34.5 ms for the same
`akickoff`, same code, idle machine: memory layout, hash seed, allocator state). A ratio taken
between ONE sidecar (one worker) and ONE in-process interpreter measures those two processes'
luck as much as the sidecar's overhead, so the benchmarks compare several fresh pairs and pool
their samples.

Protocol (one line each): the runner prints ``ready <pid>`` once it has built and run each
crew once (warm); then for every ``run <crew_id> <topic>`` line it builds the crew and awaits
``akickoff`` and prints the seconds that took (``perf_counter`` in this process: no IPC in
the figure); for ``run4 <crew_id> <topic>`` it does that four times at once (one event loop,
``asyncio.gather``: what one in-process sidecar does with four concurrent jobs) and prints
the four durations on one line; ``quit`` or end of input ends it.

With ``--hold-outputs`` it keeps crewai's kickoff-outputs file open as the sidecar does
(``crewai_outputs_holder``), so that crewai's own writes cost the same on both sides.

The crews are ``bench_sidecar.CREWS`` (``research``) and, with ``--registry``, the registry
crews of that ``module:attribute`` (``bench_registry``), loaded by the sidecar's own
``CrewCatalog``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.update({"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false",
                   "OTEL_SDK_DISABLED": "true", "CREWAI_DISABLE_TRACKING": "true"})


class InProcessRunner:
    """Drives one runner process from the benchmark's event loop."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def start(cls, crews: Path, storage_dir: Path, registry: str | None = None, *,
                    hold_outputs: bool = False) -> InProcessRunner:
        """``hold_outputs``: the runner keeps crewai's kickoff-outputs file open as the sidecar
        does (``crewai_outputs_holder``), for a like-for-like figure."""
        env = {**os.environ, "CREWAI_STORAGE_DIR": str(storage_dir),
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent),
                                              os.environ.get("PYTHONPATH", "")])}
        extra = ["--registry", registry] if registry else []
        if hold_outputs:
            extra.append("--hold-outputs")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, str(crews), *extra, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        return cls(proc)

    async def _line(self) -> str:
        assert self.proc.stdout is not None
        line = (await self.proc.stdout.readline()).decode().strip()
        if not line:
            raise SystemExit(f"the in-process runner ended (exit {await self.proc.wait()})")
        return line

    async def ready(self) -> None:
        line = await self._line()
        if not line.startswith("ready "):
            raise SystemExit(f"the in-process runner said {line!r}")

    async def run(self, topic: str, crew_id: str = "research") -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"run {crew_id} {topic}\n".encode())
        await self.proc.stdin.drain()
        return float(await self._line())

    async def run4(self, topic: str, crew_id: str = "research") -> list[float]:
        """Four runs at once in the runner's one event loop; their durations."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"run4 {crew_id} {topic}\n".encode())
        await self.proc.stdin.drain()
        return [float(x) for x in (await self._line()).split()]

    async def close(self) -> None:
        if self.proc.returncode is None and self.proc.stdin is not None:
            self.proc.stdin.write(b"quit\n")
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def _timed(catalog: Any, crew_id: str, topic: str) -> float:
    t = time.perf_counter()
    await catalog.build(crew_id).akickoff(inputs={"topic": topic})
    return time.perf_counter() - t


async def _serve(crews: Path, registry: str | None, hold_outputs: bool) -> None:
    from crewfence_sidecar.crews import CrewCatalog

    catalog = CrewCatalog.load(registry, crews)
    held = None
    if hold_outputs:
        from crewfence_sidecar.crewai_outputs_holder import hold

        held = hold()
        if held is None:
            raise SystemExit("crewai's outputs file could not be held open")
    for crew_id in catalog.crew_ids():
        await _timed(catalog, crew_id, "warm")
    print(f"ready {os.getpid()}", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if not line or line == "quit":
            return
        command, crew_id, topic = line.split(" ", 2)
        if command == "run4":
            took = await asyncio.gather(*(_timed(catalog, crew_id, f"{topic} {k}")
                                          for k in range(4)))
            print(" ".join(f"{x:.9f}" for x in took), flush=True)
        else:
            print(f"{await _timed(catalog, crew_id, topic):.9f}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    registry_arg = args[args.index("--registry") + 1] if "--registry" in args else None
    asyncio.run(_serve(Path(args[0]), registry_arg, "--hold-outputs" in args))
