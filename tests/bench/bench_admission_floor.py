"""What bounds durable admission on this machine (issue 24), without any sidecar code:

    .venv/bin/python tests/bench/bench_admission_floor.py [--n 300] [--dir STATE_PARENT]

A bare aiohttp server (no middleware, the default asyncio loop) in its own process, called
by the same client code as ``bench_sidecar.py``'s admission section, the calls interleaved
sample by sample with the client's own raw 256 B append + fsync:

- ``empty``: a handler that reads the body and answers 202;
- ``fsync``: the same plus one 256 B append + fsync;
- ``admit``: the same plus ``Journal.admit`` on a 10,000-record journal;
- ``Journal.admit`` timed inside the server between requests, against 40 in a row.

Prints p50s and each as a multiple of the raw append + fsync p50 of the same run. No bar:
the figures say how much of the ``bench_sidecar.py`` admission bar (<= 4x the raw fsync)
the HTTP round trip alone already takes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PAYLOAD = b"x" * 256
BODY = {"crew_id": "research", "action_id": "a", "operation": "run", "input": {"topic": "t"}}
HEADERS = {"Authorization": "Bearer x", "Idempotency-Key": "k", "Prefer": "respond-async"}


def serve(base: Path, port_file: Path) -> None:
    from aiohttp import web
    from bench_sidecar import build_journal, timed_admit
    from crewfence_sidecar.journal import Journal, JournalLimits

    build_journal(base / "journal.db", 9999, 2)
    journal = Journal.open(base / "journal.db", JournalLimits(max_retained_runs=1_000_000))
    fd = os.open(base / "server-probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    count = [0]
    inside: list[float] = []

    def one_admit() -> float:
        count[0] += 1
        return timed_admit(journal, f"floor-{count[0]}")

    async def empty(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True}, status=202)

    async def fsync(request: web.Request) -> web.Response:
        await request.read()
        os.write(fd, PAYLOAD)
        os.fsync(fd)
        return web.json_response({"ok": True}, status=202)

    async def admit(request: web.Request) -> web.Response:
        await request.read()
        inside.append(one_admit())
        return web.json_response({"ok": True}, status=202)

    async def in_a_row(request: web.Request) -> web.Response:
        return web.json_response({"p50": statistics.median(one_admit() for _ in range(40))})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"inside": statistics.median(inside)})

    app = web.Application()
    # /jobs: the sidecar's admission route, so a client sends both servers the same request
    for path, handler in (("/empty", empty), ("/fsync", fsync), ("/admit", admit),
                          ("/jobs", admit), ("/in-a-row", in_a_row)):
        app.router.add_post(path, handler)
    app.router.add_get("/stats", stats)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port_file.write_text(str(runner.addresses[0][1]))
        await asyncio.Event().wait()

    asyncio.run(main())


async def measure(url: str, base: Path, n: int) -> dict[str, Any]:
    import aiohttp

    fd = os.open(base / "client-probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    lat: dict[str, list[float]] = {k: [] for k in ("raw", "empty", "fsync", "admit")}
    rows: list[float] = []
    async with aiohttp.ClientSession() as s:
        for i in range(n):
            t = time.perf_counter()
            os.write(fd, PAYLOAD)
            os.fsync(fd)
            lat["raw"].append(time.perf_counter() - t)
            for route in ("empty", "fsync", "admit"):
                t = time.perf_counter()
                async with s.post(f"{url}/{route}", json=BODY, headers=HEADERS) as r:
                    await r.read()
                lat[route].append(time.perf_counter() - t)
            if i % 50 == 0:
                async with s.post(f"{url}/in-a-row", json=BODY) as r:
                    rows.append((await r.json())["p50"])
        async with s.get(f"{url}/stats") as r:
            inside = (await r.json())["inside"]
    out = {k: statistics.median(v) for k, v in lat.items()}
    out.update({"admit_inside": inside, "admit_in_a_row": statistics.median(rows)})
    return out


@contextlib.contextmanager
def floor_server(base: Path) -> Iterator[str]:
    """The bare floor server in its own process (state under ``base``): its base URL."""
    port_file = base / "floor-port"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(base), str(port_file)],
                            env=env)
    try:
        while not (port_file.exists() and port_file.read_text()):
            if proc.poll() is not None:
                raise SystemExit("the floor server exited")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}"
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=300, help="samples of each (default 300)")
    parser.add_argument("--dir", help="state directory to measure (default: a temp dir)")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), Path(args.serve[1]))
        return 0
    with tempfile.TemporaryDirectory(prefix="crewfence-floor-", dir=args.dir) as tmp:
        base = Path(tmp)
        with floor_server(base) as url:
            start = Path("/proc/loadavg").read_text().split()[:3]
            r = asyncio.run(measure(url, base, args.n))
            end = Path("/proc/loadavg").read_text().split()[:3]
    raw = r["raw"]
    print(f"load average at the start / end: {' '.join(start)} / {' '.join(end)}")
    for key, label in (("raw", "raw 256 B append + fsync (client)"),
                       ("empty", "empty handler round trip"),
                       ("fsync", "handler with one append + fsync"),
                       ("admit", "handler with Journal.admit (10,000 records)"),
                       ("admit_inside", "Journal.admit inside, between requests"),
                       ("admit_in_a_row", "Journal.admit inside, 40 in a row")):
        print(f"{label:<45} p50 {r[key] * 1000:7.3f} ms = {r[key] / raw:5.2f}x raw fsync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
