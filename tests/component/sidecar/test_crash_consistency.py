"""Crash consistency: SIGKILL the sidecar at random moments during a stream of admissions.

At least 50 trials on ONE journal. After every restart:
- every admission that got a 2xx answer is present (with its request hash);
- no record is running; every record that was running when the process died is failed with
  ``uncertain_outcome: true`` and a terminal event saying so;
- no request that got 507 left a record (the retained-record bound makes the journal fill
  up part-way through the trials);
- the journal id never changes.

The sidecars are real processes forked from a pre-warmed parent (zygote.py) so that 50
restarts do not pay crewai's import 50 times; each is SIGKILLed by pid.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from crewfence_sidecar.contract import job_path
from sidecar_helpers import AUTH, TOKEN, headers, start_body, wait_until, write_crews

TRIALS = int(os.environ.get("CREWFENCE_CRASH_TRIALS", "50"))
PER_TRIAL = 12
MAX_RECORDS = max(8, TRIALS * 2)  # later trials meet a full journal (507)


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self._read())["ready"]

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "zygote died"
        return line

    def _send(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        reply: dict[str, Any] = json.loads(self._read())
        return reply

    def spawn(self, env: dict[str, str], log: Path) -> int:
        return int(self._send({"cmd": "spawn", "argv": [], "env": env, "log": str(log)})["pid"])

    def reap(self, pid: int) -> int:
        return int(self._send({"cmd": "wait", "pid": pid})["status"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(30)


def _listening_port(log: Path) -> int | None:
    if not log.exists():
        return None
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"listening"' in line:
            return int(json.loads(line)["port"])
    if "crewfence-sidecar: error" in log.read_text(errors="replace"):
        raise AssertionError(log.read_text())
    return None


async def _admit(session: aiohttp.ClientSession, url: str, action_id: str,
                 topic: str) -> tuple[str, int | None, str | None]:
    try:
        async with session.post(f"{url}/jobs", json=start_body(action_id, topic=topic),
                                headers=headers(f"key-{action_id}", async_=True)) as r:
            body = await r.json()
            return action_id, r.status, body.get("request_hash")
    except aiohttp.ClientConnectorError:
        return action_id, -1, None  # never reached a server: must leave no record
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError):
        return action_id, None, None  # no answer: the outcome is unknown, either is fine


async def _verify(session: aiohttp.ClientSession, url: str, acked: dict[str, str],
                  refused: set[str], unknown: set[str]) -> dict[str, int]:
    counts = {"completed": 0, "uncertain": 0, "present": 0}

    async def one(action_id: str) -> None:
        async with session.get(f"{url}{job_path(action_id)}", headers=AUTH) as r:
            if action_id in refused:
                assert r.status == 404, f"refused or unsent {action_id} left a record"
                return
            if action_id in unknown and r.status == 404:
                return
            assert r.status == 200, f"acknowledged admission {action_id} is missing"
            rec = await r.json()
        if action_id in acked:
            assert rec["request_hash"] == acked[action_id]
        assert rec["status"] != "running", rec
        counts["present"] += 1
        if rec["status"] == "completed":
            counts["completed"] += 1
            return
        assert rec["status"] == "failed", rec
        assert rec["error"]["code"] == "sidecar_restarted", rec
        assert rec["uncertain_outcome"] is True
        counts["uncertain"] += 1
        async with session.get(f"{url}{job_path(action_id, '/events')}",
                               headers=AUTH) as r:
            page = await r.json()
        seqs = [e["sequence"] for e in page["events"]]
        assert seqs == list(range(len(seqs)))
        assert page["events"][-1]["event"] == "failed"
        assert page["events"][-1]["data"]["uncertain_outcome"] is True

    await asyncio.gather(*(one(a) for a in sorted(set(acked) | refused | unknown)))
    return counts


async def _stream(session: aiohttp.ClientSession, url: str, jobs: list[tuple[str, str]],
                  rng: random.Random) -> list[tuple[str, int | None, str | None]]:
    out = []
    for aid, topic in jobs:
        out.append(await _admit(session, url, aid, topic))
        if out[-1][1] == -1:
            break  # the server is gone; the rest was never sent
        await asyncio.sleep(rng.uniform(0, 0.1))  # pacing of the stream, not synchronisation
    return out


async def _completed(session: aiohttp.ClientSession, url: str, action_id: str,
                     timeout: float = 120) -> None:
    """Wait until ``action_id`` is completed in the journal (its admission may still be on
    the way: a 404 is awaited too)."""
    deadline = time.monotonic() + timeout
    while True:
        async with session.get(f"{url}{job_path(action_id)}", headers=AUTH) as r:
            if r.status == 200 and (await r.json())["status"] == "completed":
                return
        assert time.monotonic() < deadline, f"{action_id} never completed"
        await asyncio.sleep(0.05)  # polling interval of the awaited condition


async def _kill_after(pid: int, seconds: float,
                      first: Callable[[], Awaitable[None]] | None = None) -> None:
    if first is not None:
        await first()  # the condition the crash must come after
    await asyncio.sleep(seconds)  # the random moment of the crash
    os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
async def test_sigkill_during_admissions(tmp_path: Path) -> None:
    seed = int(os.environ.get("CREWFENCE_CRASH_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    crews = write_crews(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWFENCE_")}
    env.update({"CREWFENCE_CREWS_FILE": str(crews), "CREWFENCE_HOST": "127.0.0.1",
                "CREWFENCE_PORT": "0", "CREWFENCE_TOKEN": TOKEN,
                "CREWFENCE_STATE_FILE": str(state / "journal.db"),
                "CREWFENCE_MAX_RETAINED_RUNS": str(MAX_RECORDS),
                "CREWFENCE_MAX_CONCURRENCY": "8",
                "CREWAI_STORAGE_DIR": str(tmp_path / "crewai")})
    acked: dict[str, str] = {}
    refused: set[str] = set()
    unknown: set[str] = set()
    journal_id: str | None = None
    totals = {"uncertain": 0, "completed": 0, "507": 0, "killed_mid_request": 0}
    recovered_per_trial: list[int] = []
    zygote = Zygote()
    timeout = aiohttp.ClientTimeout(total=20)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            # at least TRIALS kills; a few more (bounded) when machine load kept the random
            # kills from reaching every path (a completed job, a running one, a full journal)
            for trial in range(2 * TRIALS + 1):
                log = tmp_path / f"trial-{trial}.log"
                pid = zygote.spawn(env, log)
                port = await asyncio.to_thread(wait_until, partial(_listening_port, log), 60,
                                               "the sidecar to listen")
                url = f"http://127.0.0.1:{port}"
                async with session.get(f"{url}/health") as r:
                    health = await r.json()
                journal_id = journal_id or health["journal_id"]
                assert health["journal_id"] == journal_id, f"seed {seed}: journal id changed"
                counts = await _verify(session, url, acked, refused, unknown)
                recovered_per_trial.append(health["retained_runs"])
                totals["uncertain"] = counts["uncertain"]
                totals["completed"] = counts["completed"]
                covered = totals["uncertain"] and totals["completed"] and totals["507"]
                if trial >= 2 * TRIALS or (trial >= TRIALS and covered):
                    totals["trials"] = trial
                    os.kill(pid, signal.SIGTERM)
                    zygote.reap(pid)
                    break
                # a stream of admissions; the kill lands at a random moment within it
                ids = [f"t{trial}-a{i}" for i in range(PER_TRIAL)]
                topics = [rng.choice(["quick", "[[sleep:0.3]] slow", "[[sleep:2]] slower"])
                          for _ in ids]
                kill_after = rng.uniform(0.0, 1.5)
                # Until a job has completed before a kill, the crash waits for this trial's
                # first (quick) job to complete: on a loaded machine a quick job can take
                # longer than every random moment, and once the journal is full nothing new
                # can complete, so the completed path would never be reached.
                first = None
                if not totals["completed"]:
                    topics[0] = "quick"
                    first = partial(_completed, session, url, ids[0])
                results, _ = await asyncio.gather(
                    _stream(session, url, list(zip(ids, topics, strict=True)), rng),
                    _kill_after(pid, kill_after, first))
                zygote.reap(pid)
                for aid, status, digest in results:
                    if status is not None and 200 <= status < 300:
                        assert digest is not None
                        acked[aid] = digest
                    elif status == 507:
                        refused.add(aid)
                        totals["507"] += 1
                    elif status == -1:
                        refused.add(aid)
                    elif status is None:
                        unknown.add(aid)
                        totals["killed_mid_request"] += 1
                    else:
                        raise AssertionError(f"seed {seed}: unexpected status {status}")
    finally:
        zygote.close()
    assert totals["trials"] >= TRIALS
    print(f"crash trials={totals['trials']} seed={seed} acked={len(acked)} totals={totals}")
    assert len(acked) > TRIALS  # the stream really admitted work before the kills
    assert totals["uncertain"] > 0  # some kills really hit running jobs
    assert totals["completed"] > 0  # and some jobs finished before a kill
    assert totals["507"] > 0  # the full-journal path was exercised across restarts
