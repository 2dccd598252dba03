"""Resume benchmark: a resumed successor against a fresh rerun of the same crew, killed at the
same point.

    .venv/bin/python tests/bench/bench_resume.py [--tasks N]

The real ``crewfence-sidecar`` (jobs in worker processes, resume material on), real crewai
with the offline LLM and the real MCP server fixture (``tests/support/mcp_ledger_server.py``).
A crew of N equal tasks (default 5), one MCP tool call each, is SIGKILLed during the LAST
task's tool call; the predecessor is resolved NotHappened; then on the same journal

- a fresh rerun (a new action, no ``resume_from``) and
- a resume (``resume_from`` the predecessor)

run to completion (blocking ``POST /jobs``, one after the other, in alternating order over
``--rounds``). Printed per side: model calls made (the record's ``model_call`` events),
model calls answered from the journal (``model_call_reused``), tool calls the tool server
executed, tool calls executed twice (a key or title the server had
already seen from the predecessor), and wall time (the blocking POST).

Goal (exit status 1 otherwise): the resume makes at most the last task's model calls (its
share: 1/N of the fresh rerun's), and no tool call that finished in the predecessor is
executed again (only the call in doubt, with its key).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.update({"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false",
                   "OTEL_SDK_DISABLED": "true", "CREWAI_DISABLE_TRACKING": "true"})
HERE = Path(__file__).resolve().parent
SUPPORT = HERE.parent / "support"
sys.path.insert(0, str(SUPPORT))
sys.path.insert(0, str(HERE.parent / "component" / "sidecar"))

from sidecar_helpers import (  # noqa: E402
    SidecarProcess,
    headers,
    json_call,
    mcp_ledger_server,
    sidecar_env,
    wait_until,
)


def crews_yaml(url: str, tasks: int) -> str:
    rows = "\n".join(f"""      - name: step{i}
        agent: clerk
        description: "Step {i}: {{t{i}}}"
        expected_output: A short note""" for i in range(1, tasks + 1))
    return f"""\
crews:
  desk:
    tools:
      mcpServers:
        - {{name: tickets, url: "{url}", transport: streamable-http}}
    agents:
      clerk:
        role: Clerk
        goal: File what is asked
        backstory: A careful clerk.
        max_retry_limit: 0
        tools: [tickets]
    tasks:
{rows}
"""


def call(url: str, method: str = "GET", body: dict[str, Any] | None = None,
         extra: dict[str, str] | None = None) -> tuple[int, Any]:
    return json_call(url, method, body, extra, timeout=600)


def ticket(title: str, sleep: float = 0) -> str:
    args = {"title": title, **({"sleep": sleep} if sleep else {})}
    return f"[[tool:tickets/create_ticket {json.dumps(args)}]]"


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def events(url: str, action_id: str) -> list[dict[str, Any]]:
    _, page = call(f"{url}/jobs/{action_id}/events?cursor=0&limit=1000")
    return list(page["events"])


def one_round(work: Path, env: dict[str, str], ledger: Path, tasks: int, tag: str,
              order: tuple[str, str]) -> dict[str, dict[str, float]]:
    inputs = {f"t{i}": ticket(f"{tag}-{i}", sleep=600 if i == tasks else 0)
              for i in range(1, tasks + 1)}
    pred = f"pred-{tag}"
    body = {"crew_id": "desk", "action_id": pred, "operation": "run", "input": inputs}
    first = SidecarProcess([], env, work / f"first-{tag}.log").start().wait_listening()
    try:
        status, _ = call(f"{first.url}/jobs", "POST", body, headers(f"k-{pred}", async_=True))
        assert status == 202
        wait_until(lambda: any(r["title"] == f"{tag}-{tasks}" for r in lines(ledger)), 600,
                   "the last task's call to reach the tool server")
    finally:
        first.kill()
    before = lines(ledger)
    seen_keys = {r["meta_key"] for r in before}
    seen_titles = {r["title"] for r in before if r["title"] != f"{tag}-{tasks}"}
    second = SidecarProcess([], env, work / f"second-{tag}.log").start().wait_listening()
    out: dict[str, dict[str, float]] = {}
    try:
        status, _ = call(f"{second.url}/jobs/{pred}/resolution", "POST",
                         {"crew_id": "desk", "action_id": pred, "outcome": "NotHappened",
                          "note": "bench"})
        assert status in (200, 201)
        for side in order:
            action = f"{side}-{tag}"
            succ = {**body, "action_id": action}
            if side == "resume":
                succ["resume_from"] = pred
            mark = len(lines(ledger))
            started = time.perf_counter()
            status, answer = call(f"{second.url}/jobs", "POST", succ, headers(f"k-{action}"))
            wall = time.perf_counter() - started
            assert status == 200, answer
            ran = lines(ledger)[mark:]
            journaled = events(second.url, action)
            models = sum(1 for e in journaled if e["event"] == "model_call")
            reused = sum(1 for e in journaled if e["event"] == "model_call_reused")
            twice = sum(1 for r in ran if r["meta_key"] in seen_keys)
            finished_again = sum(1 for r in ran if r["title"] in seen_titles)
            out[side] = {"model_calls": models, "model_calls_reused": reused,
                         "tool_calls": len(ran),
                         "same_key_repeats": twice, "finished_calls_executed_again":
                         finished_again, "wall_s": wall}
    finally:
        second.terminate()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crewfence-bench-resume-") as raw:
        work = Path(raw)
        with mcp_ledger_server(work) as (mcp_url, ledger):
            crews = work / "crews.yaml"
            crews.write_text(crews_yaml(mcp_url, args.tasks))
            state = work / "state"
            state.mkdir(mode=0o700)
            env = sidecar_env(state / "journal.db", crews, CREWFENCE_RESUME_MATERIAL="1",
                              PYTHONPATH=os.pathsep.join(
                                  p for p in (str(SUPPORT), os.environ.get("PYTHONPATH")) if p))
            rounds = []
            for n in range(args.rounds):
                order = ("rerun", "resume") if n % 2 == 0 else ("resume", "rerun")
                rounds.append(one_round(work, env, ledger, args.tasks, f"r{n}", order))
    ok = True
    for side in ("rerun", "resume"):
        rows = [r[side] for r in rounds]
        summary = {k: (statistics.median(row[k] for row in rows)) for k in rows[0]}
        print(f"{side:7s} " + "  ".join(f"{k}={v:.3f}" if k == "wall_s" else f"{k}={v:g}"
                                        for k, v in summary.items()))
    for r in rounds:
        share = r["rerun"]["model_calls"] / args.tasks
        if r["resume"]["model_calls"] > share or r["resume"]["finished_calls_executed_again"]:
            ok = False
        print(f"round: resume model calls {r['resume']['model_calls']:g} <= rerun's / "
              f"{args.tasks} = {share:g}: {r['resume']['model_calls'] <= share}; finished "
              f"calls executed again by the resume: "
              f"{r['resume']['finished_calls_executed_again']:g}, by the rerun: "
              f"{r['rerun']['finished_calls_executed_again']:g}")
    print("GOAL MET" if ok else "GOAL MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
