"""Where the time of a blocking ``run`` goes, per mode: per-job start/finish and per-process
CPU (``/proc/<pid>/schedstat``: ns on a CPU and ns waiting for one) of the sidecar, the
template and every worker, against the in-process runner doing the same.

    .venv/bin/python tests/bench/probe_run.py [--kind declarative|registry] [--rounds N]

A measurement aid (no bar): prints one line per round of each mode, then medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sidecar as b


def schedstat(pid: int) -> tuple[int, int]:
    try:
        run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(run), int(wait)
    except (OSError, ValueError):
        return 0, 0


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in
                         Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return out


def snapshot(root: int) -> dict[int, tuple[int, int]]:
    return {p: schedstat(p) for p in tree(root)}


def delta(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
          root: int) -> dict[str, Any]:
    """CPU ms and runqueue-wait ms per process role over an interval (new pids: from 0)."""
    kids = tree(root)
    template = kids[1] if len(kids) > 1 else None
    out: dict[str, Any] = {"new": sorted(set(after) - set(before))}
    for pid, (run, wait) in after.items():
        r0, w0 = before.get(pid, (0, 0))
        role = "sidecar" if pid == root else "template" if pid == template else f"w{pid}"
        out[role] = ((run - r0) / 1e6, (wait - w0) / 1e6)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="declarative")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--modes", default="quiet,b2b,conc4")
    ap.add_argument("--profile", help="cProfile the sidecar process into this file")
    args = ap.parse_args()
    if args.profile:
        b.SIDECAR = "/tmp/i24d_prof_sidecar.py"
        os.environ["PROBE_PROF"] = args.profile
    from inprocess_runner import InProcessRunner

    base = Path(tempfile.mkdtemp(prefix="probe-run-"))
    crews = base / "crews.yaml"
    crews.write_text(b.CREWS)
    tls_env, ctx = b.mtls_pki(base)
    extra = dict(e.split("=", 1) for e in args.env)
    if args.kind == "declarative":
        p = b.start_sidecar(base, "s", b.private_dir(base, "s") / "journal.db", crews,
                            **tls_env, **extra)
        crew_id = "research"
    else:
        p = b.start_sidecar(base, "s", b.private_dir(base, "s") / "journal.db", None,
                            CREWFENCE_REGISTRY=b.REGISTRY,
                            PYTHONPATH=os.pathsep.join([b.BENCH_DIR,
                                                        os.environ.get("PYTHONPATH", "")]),
                            **tls_env, **extra)
        crew_id = "research-registry"
    runner = await InProcessRunner.start(crews, base / "inproc-crewai", registry=b.REGISTRY)
    await runner.ready()
    b.wait_listening(p)
    root = p.proc.pid
    roots = [root, runner.pid, os.getpid()]
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            url = f"https://127.0.0.1:{p.port}"
            n = 0

            async def one(tag: str) -> tuple[float, float]:
                nonlocal n
                n += 1
                t0 = time.perf_counter()
                await b.blocking_run(s, url, crew_id, f"{tag}-{n}", f"topic {n}")
                return t0, time.perf_counter()

            await asyncio.gather(*(one("warm") for _ in range(4)))
            await runner.run("warm", crew_id)
            for mode in args.modes.split(","):
                side_walls: list[float] = []
                in_walls: list[float] = []
                side_cpu: list[float] = []
                in_cpu: list[float] = []
                await b.await_quiet(roots)
                for i in range(args.rounds if mode == "conc4" else args.runs):
                    if mode == "quiet":
                        await b.await_quiet(roots)
                    s0 = snapshot(root)
                    t = time.perf_counter()
                    if mode == "conc4":
                        spans = await asyncio.gather(*(one(mode) for _ in range(4)))
                    else:
                        spans = [await one(mode)]
                    d = delta(s0, snapshot(root), root)
                    walls = [e - t for _, e in spans]
                    side_walls += walls
                    cpu = sum(v[0] for k, v in d.items() if k != "new")
                    side_cpu.append(cpu)
                    roles = " ".join(f"{k}={v[0]:.1f}/{v[1]:.1f}" for k, v in d.items()
                                     if k != "new" and v[0] > 0.5)
                    print(f"{mode} side {i}: ends {[round(w * 1000, 1) for w in walls]} "
                          f"cpu {cpu:.1f} ms new={d['new']} [{roles}]", flush=True)
                    if mode == "quiet":
                        await b.await_quiet(roots)
                    r0 = schedstat(runner.pid)
                    if mode == "conc4":
                        got = await runner.run4(f"topic {i}", crew_id)
                    else:
                        got = [await runner.run(f"topic {i}", crew_id)]
                    r1 = schedstat(runner.pid)
                    in_walls += got
                    in_cpu.append((r1[0] - r0[0]) / 1e6)
                    print(f"{mode} inproc {i}: {[round(w * 1000, 1) for w in got]} "
                          f"cpu {(r1[0] - r0[0]) / 1e6:.1f} wait {(r1[1] - r0[1]) / 1e6:.1f}",
                          flush=True)
                sp, ip = statistics.median(side_walls), statistics.median(in_walls)
                print(f"== {mode}: sidecar p50 {sp * 1000:.1f} ms, in-process "
                      f"{ip * 1000:.1f} ms, ratio {sp / ip:.2f}; cpu/round sidecar "
                      f"{statistics.median(side_cpu):.1f} ms in-process "
                      f"{statistics.median(in_cpu):.1f} ms; load {os.getloadavg()[0]:.1f}",
                      flush=True)
    finally:
        if args.profile:
            os.kill(p.proc.pid, signal.SIGUSR1)
            await asyncio.sleep(2)
        p.stop()
        await runner.close()
        print("log:", p.log)


if __name__ == "__main__":
    asyncio.run(main())
