"""Mutual-TLS benchmark: what HTTPS with client certificates adds to a blocking `run`.

    .venv/bin/python tests/bench/bench_sidecar_tls.py [--json out.json] [--runs N]

One run on this machine, on loopback, over ``--pairs`` fresh sets of processes (a plain
sidecar, a mutual-TLS sidecar and an in-process interpreter, see ``inprocess_runner``), the
paths interleaved, each run started once the measured processes are quiet
(`bench_sidecar.await_quiet`):
- a blocking `run` through a plain-HTTP sidecar;
- the same through the mutual-TLS sidecar on a kept-alive connection (how the operator talks
  to a replica: one pooled session per operator, one SSL context per Crew, so connections
  are reused);
- the same through the mutual-TLS sidecar, a fresh connection (full handshake) per run;
- the same offline crew built and kicked off in-process with `akickoff`.

Bar (exit status 1 when it fails): the mutual-TLS sidecar run on a kept-alive connection (p50
of all sets pooled) <= 1.2x the in-process run (p50); the full handshake, paid once per
connection, is reported next to it. Figures are ratios of one run, never absolute targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sidecar import (
    CREWS,
    await_quiet,
    blocking_run,
    ms,
    mtls_pki,
    pct,
    private_dir,
    start_sidecar,
    wait_listening,
)


async def _run(session: aiohttp.ClientSession, url: str, action_id: str, topic: str) -> float:
    return await blocking_run(session, url, "research", action_id, topic)


async def run_benchmark(base: Path, runs: int, pairs: int) -> dict[str, Any]:
    from inprocess_runner import InProcessRunner

    crews = base / "crews.yaml"
    crews.write_text(CREWS)
    tls_env, ctx = mtls_pki(base)
    lat: dict[str, list[float]] = {"plain": [], "tls_fresh": [], "tls_pooled": [],
                                   "inproc": []}
    for k in range(pairs):
        plain = start_sidecar(base, f"plain{k}", private_dir(base, f"plain{k}") / "journal.db",
                              crews)
        tls = start_sidecar(base, f"tls{k}", private_dir(base, f"tls{k}") / "journal.db", crews,
                            **tls_env)
        runner = await InProcessRunner.start(crews, base / f"inproc{k}-crewai")
        try:
            await runner.ready()
            wait_listening(plain)
            wait_listening(tls)
            plain_url, tls_url = plain.url, f"https://127.0.0.1:{tls.port}"
            fresh = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ctx, force_close=True))
            pooled = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
            async with aiohttp.ClientSession() as s, fresh, pooled:
                await _run(s, plain_url, "warm", "warm")
                await _run(fresh, tls_url, "warm", "warm")
                await _run(pooled, tls_url, "warm-pooled", "warm")
                roots = [plain.proc.pid, tls.proc.pid, runner.pid, os.getpid()]
                for i in range(runs):
                    await await_quiet(roots)
                    lat["plain"].append(await _run(s, plain_url, f"p-{i}", f"topic {i}"))
                    await await_quiet(roots)
                    lat["tls_fresh"].append(await _run(fresh, tls_url, f"f-{i}", f"topic {i}"))
                    await await_quiet(roots)
                    lat["tls_pooled"].append(await _run(pooled, tls_url, f"k-{i}",
                                                        f"topic {i}"))
                    await await_quiet(roots)
                    lat["inproc"].append(await runner.run(f"topic {i}"))
        finally:
            plain.stop()
            tls.stop()
            await runner.close()
    out: dict[str, Any] = {"runs": runs, "pairs": pairs}
    for key, values in lat.items():
        out[f"{key}_p50"] = pct(values, 50)
        out[f"{key}_mean"] = statistics.fmean(values)
    return out


def report(r: dict[str, Any]) -> bool:
    pooled_vs_inproc = r["tls_pooled_p50"] / r["inproc_p50"]
    fresh_vs_inproc = r["tls_fresh_p50"] / r["inproc_p50"]
    plain_vs_inproc = r["plain_p50"] / r["inproc_p50"]
    rows = [
        ("blocking run, plain HTTP sidecar", r["plain_p50"], f"{plain_vs_inproc:.2f}x in-process"),
        ("blocking run, mTLS, kept-alive", r["tls_pooled_p50"],
         f"{pooled_vs_inproc:.2f}x in-process (bar <= 1.2x)"),
        ("blocking run, mTLS, fresh handshake", r["tls_fresh_p50"],
         f"{fresh_vs_inproc:.2f}x in-process (once per connection)"),
        ("same crew in-process akickoff", r["inproc_p50"],
         f"{r['pairs']} fresh process sets x {r['runs']} runs, pooled"),
    ]
    for name, p50, note in rows:
        print(f"{name:<40} p50 {ms(p50):>10}  {note}")
    print(f"{'added by mutual TLS, kept-alive':<40} p50 "
          f"{ms(r['tls_pooled_p50'] - r['plain_p50']):>10}  "
          f"{r['tls_pooled_p50'] / r['plain_p50']:.2f}x plain HTTP")
    print(f"{'added by a full handshake':<40} p50 "
          f"{ms(r['tls_fresh_p50'] - r['tls_pooled_p50']):>10}")
    ok = pooled_vs_inproc <= 1.2
    r.update({"tls_vs_inproc": pooled_vs_inproc, "tls_fresh_vs_inproc": fresh_vs_inproc,
              "plain_vs_inproc": plain_vs_inproc,
              "tls_vs_plain": r["tls_pooled_p50"] / r["plain_p50"], "bars_met": ok})
    print("bar:", "met" if ok else "NOT met")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="runs of each path per set")
    parser.add_argument("--pairs", type=int, default=6,
                        help="fresh sets of processes (plain, mTLS, in-process); default 6")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crewfence-bench-tls-") as tmp:
        results = asyncio.run(run_benchmark(Path(tmp), args.runs, args.pairs))
    ok = report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
