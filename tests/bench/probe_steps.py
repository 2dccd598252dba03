"""Where the serial part of a blocking ``run`` goes: wall time of each step, quiet and back to
back, from timestamps the real sidecar writes at each step (a measurement aid, no bar).

    .venv/bin/python tests/bench/probe_steps.py [--kind declarative|registry] [--runs N]
                                                [--interleave]

The sidecar is the real ``crewfence-sidecar`` (mutual TLS, the bench's crews) started through a
small wrapper that records ``time.monotonic_ns()`` (shared by every process on the machine) on
entry to and exit from admission, its durable commit, the job frame to the worker, every frame
from the worker (the worker's own ``started_ns`` and pid too) and the terminal commit; the
client records its send and receive. A synchronous step's exit mark also carries the loop
thread's CPU time and run-queue wait over the step (``/proc/thread-self/schedstat``), which
tells a commit waiting for the disk from one waiting for a CPU. Prints the p50 of each step per
mode. With ``--interleave`` each quiet run alternates with the same crew ``akickoff``-ed in the
in-process runner (as ``bench_sidecar.py``'s quiet mode does), and each back-to-back block is
followed by one of the in-process runner; both p50s are printed. ``PROBE_FINE=1`` splits the
step from the admission's commit to the job frame (job task, execution, executor).
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
from pathlib import Path
from typing import Any, TextIO

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sidecar as b

WRAPPER = '''#!{python}
import inspect, json, os, sys, time
from crewfence_sidecar import http_api, runtime as rt
from crewfence_sidecar.workers import supervisor as sv

OUT = open(os.environ["PROBE_STEPS_OUT"], "a", buffering=1)


def mark(step, aid="", **extra):
    OUT.write(json.dumps({{"t": time.monotonic_ns(), "step": step, "aid": aid, **extra}}) + "\\n")


R, H = rt.Runtime, sv.WorkerHandle
route, read_json = http_api.start_job, http_api._read_json


async def timed_route(request):
    mark("route_in", request.headers.get("Idempotency-Key", ""))
    return await route(request)


async def timed_read_json(request):
    body = await read_json(request)
    mark("body_read", request.headers.get("Idempotency-Key", ""))
    return body


http_api.start_job, http_api._read_json = timed_route, timed_read_json


def around(func, step_in, step_out, aid_of):
    """``func`` (a method, sync or async) marked on entry and exit, by the action id its
    arguments name."""
    if inspect.iscoroutinefunction(func):
        async def timed(self, *args):
            aid = aid_of(*args)
            mark(step_in, aid)
            try:
                return await func(self, *args)
            finally:
                mark(step_out, aid)
    else:
        def timed(self, *args):
            aid = aid_of(*args)
            mark(step_in, aid)
            cpu = time.thread_time_ns()
            wait = int(open("/proc/thread-self/schedstat").read().split()[1])
            try:
                return func(self, *args)
            finally:
                mark(step_out, aid, cpu_ns=time.thread_time_ns() - cpu,
                     rq_ns=int(open("/proc/thread-self/schedstat").read().split()[1]) - wait)
    return timed


next_message = H.next_message


async def timed_next(self):
    message = await next_message(self)
    if message is not None:
        mark("worker_" + str(message.get("type")), "",
             **({{"worker_t": message["started_ns"], "pid": message.get("pid")}}
                if "started_ns" in message else {{}}))
    return message


R.admit = around(R.admit, "admit_in", "admit_out", lambda req, key: req.action_id)
R._persist_admission = around(R._persist_admission, "commit_in", "commit_out",
                              lambda req, digest: req.action_id)
R._record_output = around(R._record_output, "terminal_in", "terminal_out",
                          lambda aid, output: aid)
H.open = around(H.open, "frame_in", "frame_out", lambda job: job.get("action_id"))
if os.environ.get("PROBE_FINE"):
    from crewfence_sidecar.workers import executor as ex
    R._job = around(R._job, "job_in", "job_out", lambda rec, req: rec.action_id)
    R._execute = around(R._execute, "execute_in", "execute_out", lambda req: req.action_id)
    ex.WorkerExecutor.__call__ = around(ex.WorkerExecutor.__call__, "exec_in", "exec_out",
                                        lambda ctx: ctx.action_id)
H.next_message = timed_next
from crewfence_sidecar.cli import main
sys.exit(main())
'''

STEPS: tuple[tuple[str, str, str], ...] = (
    ("client_send", "route_in", "client request, TLS, HTTP parse, middlewares"),
    ("route_in", "body_read", "body read and JSON parsed"),
    ("body_read", "admit_in", "start request validated"),
    ("admit_in", "commit_in", "key, RFC 8785 hash, lookups, admissibility"),
    ("commit_in", "commit_out", "the admission's durable commit (fsync)"),
    ("commit_out", "frame_in", "job task, concurrency slot, worker taken"),
    ("commit_out", "job_in", "  (fine) until the job task runs"),
    ("job_in", "execute_in", "  (fine) concurrency slot, timeout entered"),
    ("execute_in", "exec_in", "  (fine) job context to the executor"),
    ("exec_in", "frame_in", "  (fine) worker taken"),
    ("frame_in", "frame_out", "job frame written to the worker"),
    ("frame_out", "worker_started", "worker reads the frame, sends `started`"),
    ("worker_started", "worker_result", "the crew in the worker (build, kickoff)"),
    ("worker_result", "terminal_in", "result frame read"),
    ("terminal_in", "terminal_out", "the terminal commit (fsync)"),
    ("terminal_out", "client_recv", "blocking route wakes, answer written and read"),
    ("client_send", "client_recv", "whole run"),
)


def _mark(out: TextIO, step: str, aid: str) -> None:
    out.write(json.dumps({"t": time.monotonic_ns(), "step": step, "aid": aid}) + "\n")


def per_run(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Each run's step times; worker frames belong to the job whose frame went out last."""
    runs: dict[str, dict[str, int]] = {}
    current = ""
    for row in sorted(rows, key=lambda r: r["t"]):
        step, aid = row["step"], row["aid"]
        if step == "frame_out":
            current = aid
        if step.startswith("worker_") and current:
            steps = runs.setdefault(current, {})
            steps.setdefault(step, row["t"])
            if "worker_t" in row:
                steps.setdefault("worker_started", row["worker_t"])
            continue
        if aid:
            runs.setdefault(aid, {}).setdefault(step, row["t"])
    return runs


def report(runs: dict[str, dict[str, int]]) -> None:
    for mode, prefix in (("quiet", "q"), ("back to back", "b")):
        print(f"== {mode}")
        for start, end, what in STEPS:
            spans = [(v[end] - v[start]) / 1e6 for k, v in runs.items()
                     if k.startswith(prefix) and start in v and end in v]
            if spans:
                print(f"{statistics.median(spans):8.3f} ms  {start} -> {end}: {what} "
                      f"(n={len(spans)})")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=("declarative", "registry"), default="declarative")
    ap.add_argument("--runs", type=int, default=12, help="runs per mode and round (2 rounds)")
    ap.add_argument("--interleave", action="store_true",
                    help="quiet runs alternate with the same crew akickoff-ed in-process, as "
                         "bench_sidecar's quiet mode does (both sides' p50 printed)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="probe-steps-"))
    out_path = base / "steps.jsonl"
    wrapper = base / "timed-sidecar"
    wrapper.write_text(WRAPPER.format(python=sys.executable))
    wrapper.chmod(0o700)
    b.SIDECAR = str(wrapper)
    crews = base / "crews.yaml"
    crews.write_text(b.CREWS)
    tls_env, ctx = b.mtls_pki(base)
    env = {**tls_env, "PROBE_STEPS_OUT": str(out_path)}
    journal = b.private_dir(base, "s") / "journal.db"
    if args.kind == "declarative":
        p, crew_id = b.start_sidecar(base, "s", journal, crews, **env), "research"
    else:
        p = b.start_sidecar(base, "s", journal, None, CREWFENCE_REGISTRY=b.REGISTRY,
                            PYTHONPATH=os.pathsep.join([b.BENCH_DIR,
                                                        os.environ.get("PYTHONPATH", "")]),
                            **env)
        crew_id = "research-registry"
    b.wait_listening(p)
    roots = [p.proc.pid, os.getpid()]
    runner = None
    if args.interleave:
        from inprocess_runner import InProcessRunner
        runner = await InProcessRunner.start(crews, base / "inproc-crewai", registry=b.REGISTRY)
        await runner.ready()
        roots.append(runner.pid)
    inproc: list[float] = []
    inproc_b2b: list[float] = []
    try:
        with out_path.open("a", buffering=1) as out:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
                url = f"https://127.0.0.1:{p.port}"

                async def one(aid: str) -> None:
                    _mark(out, "client_send", aid)
                    await b.blocking_run(s, url, crew_id, aid, f"topic {aid}")
                    _mark(out, "client_recv", aid)

                await asyncio.gather(*(b.blocking_run(s, url, crew_id, f"warm{j}", "warm")
                                       for j in range(4)))
                if runner is not None:
                    await runner.run("warm", crew_id)
                for rnd in range(2):
                    for i in range(args.runs):
                        await b.await_quiet(roots)
                        await one(f"q{rnd}-{i}")
                        if runner is not None:
                            await b.await_quiet(roots)
                            inproc.append(await runner.run(f"topic q{rnd}-{i}", crew_id))
                    await b.await_quiet(roots)
                    for i in range(args.runs):
                        await one(f"b{rnd}-{i}")
                    if runner is not None:
                        await b.await_quiet(roots)
                        for i in range(args.runs):
                            inproc_b2b.append(await runner.run(f"topic b{rnd}-{i}", crew_id))
    finally:
        p.stop()
        if runner is not None:
            await runner.close()
    report(per_run([json.loads(line) for line in out_path.read_text().splitlines()]))
    if inproc:
        print(f"{statistics.median(inproc) * 1e3:8.3f} ms  in-process run, interleaved with the "
              f"quiet runs (n={len(inproc)})")
    if inproc_b2b:
        print(f"{statistics.median(inproc_b2b) * 1e3:8.3f} ms  in-process run, back to back "
              f"(n={len(inproc_b2b)})")
    print(f"load {os.getloadavg()[0]:.2f}; steps: {out_path}")


if __name__ == "__main__":
    asyncio.run(main())
