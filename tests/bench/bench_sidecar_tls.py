"""Mutual-TLS benchmark: what HTTPS with client certificates adds to a blocking `run`.

    .venv/bin/python tests/bench/bench_sidecar_tls.py [--json out.json] [--runs N]

One run on this machine, on loopback, interleaved, each run started once the measured
processes are quiet (`bench_sidecar.await_quiet`):
- a blocking `run` through a plain-HTTP sidecar (today's transport);
- the same through a mutual-TLS sidecar, a fresh connection (full handshake) per run;
- the same through the mutual-TLS sidecar on a kept-alive connection (the operator's pool);
- the same offline crew built and kicked off in-process with `akickoff`.

Bar (exit status 1 when it fails): the mutual-TLS sidecar run (fresh handshake, p50)
<= 1.2x the in-process run (p50). Figures are ratios of one run, never absolute targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sidecar import (
    AUTH,
    CREWS,
    await_quiet,
    ms,
    pct,
    private_dir,
    start_sidecar,
    wait_listening,
)
from crewfence_operator import certs


def _pki(base: Path) -> tuple[dict[str, str], ssl.SSLContext]:
    """Server files (env for the sidecar) and the client's context."""
    ca = certs.new_ca("bench crew CA")
    server = certs.issue(ca, "127.0.0.1", hosts=["127.0.0.1"], server=True)
    client = certs.issue(ca, "bench-operator", server=False, client=True)
    d = private_dir(base, "pki")
    (d / "ca.crt").write_bytes(ca.cert_pem)
    (d / "tls.crt").write_bytes(server.cert_pem)
    certs.write_private(d / "tls.key", server.key_pem)
    (d / "client.crt").write_bytes(client.cert_pem)
    certs.write_private(d / "client.key", client.key_pem)
    ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
    ctx.load_cert_chain(d / "client.crt", d / "client.key")
    env = {"CREWFENCE_TLS_CERT_FILE": str(d / "tls.crt"),
           "CREWFENCE_TLS_KEY_FILE": str(d / "tls.key"),
           "CREWFENCE_TLS_CLIENT_CA_FILE": str(d / "ca.crt")}
    return env, ctx


async def _run(session: aiohttp.ClientSession, url: str, action_id: str, topic: str) -> float:
    body = {"crew_id": "research", "action_id": action_id, "operation": "run",
            "input": {"topic": topic}}
    t = time.perf_counter()
    async with session.post(f"{url}/jobs", json=body,
                            headers={**AUTH, "Idempotency-Key": action_id}) as r:
        await r.read()
        assert r.status == 200, r.status
    return time.perf_counter() - t


async def run_benchmark(base: Path, runs: int) -> dict[str, Any]:
    crews = base / "crews.yaml"
    crews.write_text(CREWS)
    tls_env, ctx = _pki(base)
    plain = start_sidecar(base, "plain", private_dir(base, "plain") / "journal.db", crews)
    tls = start_sidecar(base, "tls", private_dir(base, "tls") / "journal.db", crews, **tls_env)
    os.environ["CREWAI_STORAGE_DIR"] = str(base / "inproc-crewai")
    from crewfence_sidecar.crews import CrewCatalog

    catalog = CrewCatalog.load(None, crews)
    lat: dict[str, list[float]] = {"plain": [], "tls_fresh": [], "tls_pooled": [],
                                   "inproc": []}
    try:
        wait_listening(plain)
        wait_listening(tls)
        plain_url, tls_url = plain.url, f"https://127.0.0.1:{tls.port}"
        fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, force_close=True))
        pooled = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
        async with aiohttp.ClientSession() as s, fresh, pooled:
            await _run(s, plain_url, "warm", "warm")
            await _run(fresh, tls_url, "warm", "warm")
            await _run(pooled, tls_url, "warm-pooled", "warm")
            await catalog.build("research").akickoff(inputs={"topic": "warm"})
            roots = [plain.proc.pid, tls.proc.pid, os.getpid()]
            for i in range(runs):
                await await_quiet(roots)
                lat["plain"].append(await _run(s, plain_url, f"p-{i}", f"topic {i}"))
                await await_quiet(roots)
                lat["tls_fresh"].append(await _run(fresh, tls_url, f"f-{i}", f"topic {i}"))
                await await_quiet(roots)
                lat["tls_pooled"].append(await _run(pooled, tls_url, f"k-{i}", f"topic {i}"))
                await await_quiet(roots)
                t = time.perf_counter()
                await catalog.build("research").akickoff(inputs={"topic": f"topic {i}"})
                lat["inproc"].append(time.perf_counter() - t)
    finally:
        plain.stop()
        tls.stop()
    out: dict[str, Any] = {"runs": runs}
    for key, values in lat.items():
        out[f"{key}_p50"] = pct(values, 50)
        out[f"{key}_mean"] = statistics.fmean(values)
    return out


def report(r: dict[str, Any]) -> bool:
    tls_vs_inproc = r["tls_fresh_p50"] / r["inproc_p50"]
    plain_vs_inproc = r["plain_p50"] / r["inproc_p50"]
    rows = [
        ("blocking run, plain HTTP sidecar", r["plain_p50"], f"{plain_vs_inproc:.2f}x in-process"),
        ("blocking run, mTLS, fresh handshake", r["tls_fresh_p50"],
         f"{tls_vs_inproc:.2f}x in-process (bar <= 1.2x)"),
        ("blocking run, mTLS, kept-alive", r["tls_pooled_p50"],
         f"{r['tls_pooled_p50'] / r['inproc_p50']:.2f}x in-process"),
        ("same crew in-process akickoff", r["inproc_p50"], ""),
    ]
    for name, p50, note in rows:
        print(f"{name:<40} p50 {ms(p50):>10}  {note}")
    added = r["tls_fresh_p50"] - r["plain_p50"]
    print(f"{'added by mutual TLS (fresh handshake)':<40} p50 {ms(added):>10}  "
          f"{r['tls_fresh_p50'] / r['plain_p50']:.2f}x plain HTTP")
    ok = tls_vs_inproc <= 1.2
    r.update({"tls_vs_inproc": tls_vs_inproc, "plain_vs_inproc": plain_vs_inproc,
              "tls_vs_plain": r["tls_fresh_p50"] / r["plain_p50"], "bars_met": ok})
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crewfence-bench-tls-") as tmp:
        results = asyncio.run(run_benchmark(Path(tmp), args.runs))
    ok = report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
