"""The in-process side of the run benchmarks, in a fresh interpreter per measured pair.

    python tests/bench/inprocess_runner.py CREWS_FILE   (driven over stdin/stdout)

Why a process of its own: one CPython process runs the same offline crew at a speed of its
own (on the 2-core build machine, fresh processes measured p50 24.9-34.5 ms for the same
`akickoff`, same code, idle machine: memory layout, hash seed, allocator state). A ratio taken
between ONE sidecar (one worker) and ONE in-process interpreter measures those two processes'
luck as much as the sidecar's overhead, so the benchmarks compare several fresh pairs and pool
their samples.

Protocol (one line each): the runner prints ``ready <pid>`` once it has built and run the crew
once (warm); then for every ``run <topic>`` line it builds the crew and awaits ``akickoff``
and prints the seconds that took (``perf_counter`` in this process: no IPC in the figure);
``quit`` or end of input ends it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

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
    async def start(cls, crews: Path, storage_dir: Path) -> InProcessRunner:
        env = {**os.environ, "CREWAI_STORAGE_DIR": str(storage_dir)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, str(crews), env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE)
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

    async def run(self, topic: str) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"run {topic}\n".encode())
        await self.proc.stdin.drain()
        return float(await self._line())

    async def close(self) -> None:
        if self.proc.returncode is None and self.proc.stdin is not None:
            self.proc.stdin.write(b"quit\n")
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def _serve(crews: Path) -> None:
    from crewfence_sidecar.crews import CrewCatalog

    catalog = CrewCatalog.load(None, crews)
    await catalog.build("research").akickoff(inputs={"topic": "warm"})
    print(f"ready {os.getpid()}", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if not line or line == "quit":
            return
        topic = line.removeprefix("run ")
        t = time.perf_counter()
        await catalog.build("research").akickoff(inputs={"topic": topic})
        print(f"{time.perf_counter() - t:.9f}", flush=True)


if __name__ == "__main__":
    asyncio.run(_serve(Path(sys.argv[1])))
