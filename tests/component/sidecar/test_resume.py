"""Resume end to end: the real ``crewfence-sidecar`` executable (jobs in worker processes),
real crewai with the offline LLM and a real MCP server on loopback that writes every call it
receives, with its idempotency key, to a ledger file outside the sidecar's state.

A predecessor is SIGKILLed (the sidecar, its worker with it) while one tool call is in
flight; a second sidecar on the same journal then admits a successor with ``resume_from``.
The tests count what the tool server saw."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sidecar_helpers import (
    SidecarProcess,
    headers,
    json_call,
    mcp_ledger_server,
    sidecar_env,
    wait_until,
)

pytestmark = pytest.mark.timeout(400)
SUPPORT = Path(__file__).resolve().parents[2] / "support"


@pytest.fixture
def mcp_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(URL, ledger file) of one MCP server for the test (its ledger counts only this
    test's calls)."""
    with mcp_ledger_server(tmp_path) as server:
        yield server


def _crews_yaml(url: str) -> str:
    tasks = "\n".join(
        f"""      - name: step{i}
        agent: clerk
        description: "Step {i}: {{t{i}}}"
        expected_output: A short note"""
        for i in range(1, 5))
    return f"""\
crews:
  desk:
    tools:
      mcpServers:
        - name: tickets
          url: {url}
          transport: streamable-http
    agents:
      clerk:
        role: Clerk
        goal: File what is asked
        backstory: A careful clerk.
        max_retry_limit: 0
        tools: [tickets]
    tasks:
{tasks}
  single:
    tools:
      mcpServers:
        - name: tickets
          url: {url}
          transport: streamable-http
    agents:
      clerk:
        role: Clerk
        goal: File what is asked
        backstory: A careful clerk.
        max_retry_limit: 0
        tools: [tickets]
    tasks:
      - name: file
        agent: clerk
        description: "Handle this request: {{request}}"
        expected_output: A short note
"""


@pytest.fixture
def env(tmp_path: Path, mcp_server: tuple[str, Path]) -> dict[str, str]:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    crews = tmp_path / "crews.yaml"
    crews.write_text(_crews_yaml(mcp_server[0]))
    return sidecar_env(state / "journal.db", crews, CREWFENCE_RESUME_MATERIAL="1",
                       CREWFENCE_OFFLINE_LLM_LEDGER=str(tmp_path / "llm.jsonl"),
                       CREWFENCE_ALLOWED_OPERATIONS="run,batch_run",
                       PYTHONPATH=os.pathsep.join(p for p in (str(SUPPORT),
                                                              os.environ.get("PYTHONPATH"))
                                                  if p))


def _call(url: str, method: str = "GET", body: dict[str, Any] | None = None,
          extra: dict[str, str] | None = None) -> tuple[int, Any]:
    return json_call(url, method, body, extra, timeout=180)


def _ticket(title: str, sleep: float = 0) -> str:
    args = {"title": title, **({"sleep": sleep} if sleep else {})}
    return f"[[tool:tickets/create_ticket {json.dumps(args)}]]"


def _lines(path: Path, title: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("title") == title]


def _lines_all(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _model_calls_made(env: dict[str, str]) -> dict[str, int]:
    """How often the offline LLM was called per step of the four-task crew (its own ledger,
    outside every journal)."""
    path = Path(env["CREWFENCE_OFFLINE_LLM_LEDGER"])
    counts: dict[str, int] = {}
    for row in _lines_all(path) if path.exists() else []:
        if row["task"].startswith("Step "):  # not the workers' warm-up calls
            counts[row["task"]] = counts.get(row["task"], 0) + 1
    return counts


def _events(url: str, action_id: str) -> list[dict[str, Any]]:
    status, page = _call(f"{url}/jobs/{action_id}/events?cursor=0&limit=1000")
    assert status == 200, page
    return [e for e in page["events"] if e["event"] != "chunk"]


def _kill_during(env: dict[str, str], tmp: Path, ledger: Path, body: dict[str, Any],
                 in_flight: str) -> None:
    """Start ``body`` and SIGKILL the sidecar once the call titled ``in_flight`` reached the
    tool server (the server writes its line before it sleeps)."""
    first = SidecarProcess([], env, tmp / "first.log").start().wait_listening()
    try:
        status, _ = _call(f"{first.url}/jobs", "POST", body,
                          headers(f"key-{body['action_id']}", async_=True))
        assert status == 202
        wait_until(lambda: _lines(ledger, in_flight), 180,
                   f"the call {in_flight} to reach the tool server")
    finally:
        first.kill()


def _resolve(url: str, crew: str, action_id: str, outcome: str) -> None:
    status, answer = _call(f"{url}/jobs/{action_id}/resolution", "POST",
                           {"crew_id": crew, "action_id": action_id, "outcome": outcome,
                            "note": "checked the ticket system"})
    assert status in (200, 201), answer


def _four_task_inputs() -> dict[str, str]:
    return {"t1": _ticket("S-1"), "t2": _ticket("S-2"), "t3": _ticket("S-3", sleep=120),
            "t4": _ticket("S-4")}


@pytest.mark.parametrize("outcome", ["NotHappened", "Happened"])
def test_a_resumed_four_task_crew_reruns_only_what_is_in_doubt(
        env: dict[str, str], tmp_path: Path, mcp_server: tuple[str, Path],
        outcome: str) -> None:
    ledger = mcp_server[1]
    body = {"crew_id": "desk", "action_id": "pred", "operation": "run",
            "input": _four_task_inputs()}
    _kill_during(env, tmp_path, ledger, body, in_flight="S-3")
    second = SidecarProcess([], env, tmp_path / "second.log").start().wait_listening()
    try:
        status, pred = _call(f"{second.url}/jobs/pred")
        assert pred["status"] == "failed" and pred["uncertain_outcome"] is True
        succ = {**body, "action_id": "succ", "resume_from": "pred"}
        # an unresolved predecessor with a call in doubt is not resumed
        status, refused = _call(f"{second.url}/jobs", "POST", succ, headers("key-succ"))
        assert status == 409 and refused["error"]["code"] == "predecessor_unresolved", refused
        _resolve(second.url, "desk", "pred", outcome)
        status, record = _call(f"{second.url}/jobs", "POST", succ, headers("key-succ"))
        assert status == 200, record
        _, job = _call(f"{second.url}/jobs/succ")
        assert job["status"] == "completed"
        pred_events = _events(second.url, "pred")
        events = _events(second.url, "succ")
        served = {r["title"]: len(_lines(ledger, r["title"])) for r in _lines_all(ledger)}
        billed = _model_calls_made(env)
        fresh: list[dict[str, Any]] = []
        if outcome == "NotHappened":  # the same crew uninterrupted, for its task outputs
            status, _ = _call(f"{second.url}/jobs", "POST", {**body, "action_id": "fresh"},
                              headers("key-fresh"))
            assert status == 200
            fresh = _events(second.url, "fresh")
    finally:
        second.terminate()
    if fresh:
        # the reused outputs fed tasks 3-4 as context exactly as in an uninterrupted run: the
        # offline model's answer carries a digest of its whole prompt, context included
        def outputs(evs: list[dict[str, Any]], name: str) -> dict[int, str]:
            return {e["data"]["index"]: e["data"]["output_sha256"] for e in evs
                    if e["event"] == name}

        assert outputs(events, "task_completed") == {
            i: h for i, h in outputs(fresh, "task_completed").items() if i >= 2}
        assert outputs(events, "task_reused") == outputs(pred_events, "task_completed")
    pred_keys = {e["data"]["task_index"]: e["data"]["idempotency_key"]
                 for e in pred_events if e["event"] == "tool_call_started"}
    assert sorted(pred_keys) == [0, 1, 2]
    # tasks 1-2 and their calls: once (the predecessor's); the fourth: once (the successor's)
    assert served == {"S-1": 1, "S-2": 1, "S-3": 2 if outcome == "NotHappened" else 1,
                      "S-4": 1}
    assert [r["meta_key"] for r in _lines(ledger, "S-1")][:1] == [pred_keys[0]]
    assert [r["meta_key"] for r in _lines(ledger, "S-2")][:1] == [pred_keys[1]]
    fourth = _lines(ledger, "S-4")[:1]
    assert fourth[0]["meta_key"] not in pred_keys.values()
    third = _lines(ledger, "S-3")[:served["S-3"]]
    if outcome == "NotHappened":  # rerun, with the key the predecessor used
        assert [r["meta_key"] for r in third] == [pred_keys[2], pred_keys[2]]
        assert [r["header_key"] for r in third] == [pred_keys[2], pred_keys[2]]
    else:  # resolved Happened: never again
        assert [r["meta_key"] for r in third] == [pred_keys[2]]
    names = [e["event"] for e in events]
    assert names.count("task_reused") == 2
    assert [e["data"]["index"] for e in events if e["event"] == "task_reused"] == [0, 1]
    assert [e["data"]["index"] for e in events if e["event"] == "task_started"] == [2, 3]
    reused_calls = [e["data"] for e in events if e["event"] == "tool_call_reused"]
    started = [e["data"] for e in events if e["event"] == "tool_call_started"]
    if outcome == "NotHappened":
        assert reused_calls == []
        assert [(s["task_index"], s["idempotency_key"], s.get("resume")) for s in started] == [
            (2, pred_keys[2], "rerun_same_key"), (3, fourth[0]["meta_key"], "live")]
    else:
        assert [(c["task_index"], c["action"], c["idempotency_key"])
                for c in reused_calls] == [(2, "already_made", pred_keys[2])]
        assert [(s["task_index"], s.get("resume")) for s in started] == [(3, "live")]
    # model calls: none for the two reused tasks; in the third, the call that asked for the
    # tool (finished in the predecessor, same request) is answered from the journal, the one
    # after the tool's result (in doubt: never journaled) runs live
    models = [e["data"] for e in events if e["event"] == "model_call"]
    assert {m["task"] for m in models} == {"step3", "step4"}
    pred_models = [e["data"] for e in pred_events if e["event"] == "model_call"]
    assert [(m["task_index"], m["model_index"]) for m in pred_models] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    reused_models = [e["data"] for e in events if e["event"] == "model_call_reused"]
    assert [(m["task_index"], m["model_index"], m["request_sha256"], m["response"])
            for m in reused_models] == [(2, 0, pred_models[4]["request_sha256"],
                                         pred_models[4]["response"])]
    assert [(m["task_index"], m["model_index"]) for m in models] == [(2, 1), (3, 0), (3, 1)]
    # the offline LLM's own log: the reused call was not made a second time
    assert billed == {"Step 1:": 2, "Step 2:": 2, "Step 3:": 2, "Step 4:": 2}, billed


def test_a_finished_call_of_the_task_in_flight_is_answered_from_the_journal(
        env: dict[str, str], tmp_path: Path, mcp_server: tuple[str, Path]) -> None:
    ledger = mcp_server[1]
    body = {"crew_id": "single", "action_id": "p1", "operation": "run",
            "input": {"request": f"{_ticket('R-1')} then {_ticket('R-2', sleep=120)}"}}
    _kill_during(env, tmp_path, ledger, body, in_flight="R-2")
    second = SidecarProcess([], env, tmp_path / "second.log").start().wait_listening()
    try:
        _resolve(second.url, "single", "p1", "NotHappened")
        succ = {**body, "action_id": "s1", "resume_from": "p1"}
        status, record = _call(f"{second.url}/jobs", "POST", succ, headers("key-s1"))
        assert status == 200, record
        events = _events(second.url, "s1")
        pred_events = _events(second.url, "p1")
    finally:
        second.terminate()
    pred_started = [e["data"] for e in pred_events if e["event"] == "tool_call_started"]
    pred_finished = [e["data"] for e in pred_events if e["event"] == "tool_call_finished"]
    assert len(pred_started) == 2 and len(pred_finished) == 1
    assert pred_finished[0]["result"].startswith("ticket created: R-1")  # resume material
    assert len(_lines(ledger, "R-1")) == 1  # finished in the predecessor: not executed again
    assert [r["meta_key"] for r in _lines(ledger, "R-2")] == [
        pred_started[1]["idempotency_key"]] * 2
    reused = [e["data"] for e in events if e["event"] == "tool_call_reused"]
    assert [(r["call_index"], r["action"], r["idempotency_key"], r["result"])
            for r in reused] == [(0, "replay", pred_started[0]["idempotency_key"],
                                  pred_finished[0]["result"])]
    started = [e["data"] for e in events if e["event"] == "tool_call_started"]
    assert [(s["call_index"], s["resume"]) for s in started] == [(1, "rerun_same_key")]


def test_a_diverging_call_runs_live_with_its_own_key(
        env: dict[str, str], tmp_path: Path, mcp_server: tuple[str, Path]) -> None:
    ledger = mcp_server[1]
    body = {"crew_id": "single", "action_id": "p2", "operation": "run",
            "input": {"request": f"{_ticket('D-1')} then {_ticket('D-2', sleep=120)}"}}
    _kill_during(env, tmp_path, ledger, body, in_flight="D-2")
    second = SidecarProcess([], env, tmp_path / "second.log").start().wait_listening()
    try:
        _resolve(second.url, "single", "p2", "NotHappened")
        # the successor's first call has other arguments: it and every later call run live
        succ = {"crew_id": "single", "action_id": "s2", "operation": "run",
                "resume_from": "p2",
                "input": {"request": f"{_ticket('D-0')} then {_ticket('D-2')}"}}
        status, record = _call(f"{second.url}/jobs", "POST", succ, headers("key-s2"))
        assert status == 200, record
        events = _events(second.url, "s2")
    finally:
        second.terminate()
    started = [e["data"] for e in events if e["event"] == "tool_call_started"]
    assert [s["resume"] for s in started] == ["live", "live"]
    assert len(_lines(ledger, "D-1")) == 1 and len(_lines(ledger, "D-0")) == 1
    d2 = _lines(ledger, "D-2")
    assert len(d2) == 2 and d2[0]["meta_key"] != d2[1]["meta_key"]  # a new trajectory


def test_a_resumed_batch_run_reruns_only_the_inputs_that_did_not_finish(
        env: dict[str, str], tmp_path: Path, mcp_server: tuple[str, Path]) -> None:
    ledger = mcp_server[1]
    inputs = [{"request": _ticket("B-0")}, {"request": _ticket("B-1")},
              {"request": _ticket("B-2", sleep=120)}]
    body = {"crew_id": "single", "action_id": "pb", "operation": "batch_run",
            "input": {"inputs": inputs}}
    first = SidecarProcess([], env, tmp_path / "first.log").start().wait_listening()
    try:
        status, _ = _call(f"{first.url}/jobs", "POST", body, headers("key-pb", async_=True))
        assert status == 202

        def two_items_done() -> bool:
            done = [e for e in _events(first.url, "pb") if e["event"] == "batch_item_completed"]
            return len(done) == 2 and bool(_lines(ledger, "B-2"))

        wait_until(two_items_done, 180, "two inputs to finish and the third to be in flight")
    finally:
        first.kill()
    second = SidecarProcess([], env, tmp_path / "second.log").start().wait_listening()
    try:
        _resolve(second.url, "single", "pb", "NotHappened")
        succ = {**body, "action_id": "sb", "resume_from": "pb"}
        status, record = _call(f"{second.url}/jobs", "POST", succ, headers("key-sb"))
        assert status == 200, record
        events = _events(second.url, "sb")
    finally:
        second.terminate()
    assert record["count"] == 3 and len(record["results"]) == 3
    assert len(_lines(ledger, "B-0")) == 1 and len(_lines(ledger, "B-1")) == 1
    assert len(_lines(ledger, "B-2")) == 2  # the input in flight ran again
    assert sorted(e["data"]["index"] for e in events if e["event"] == "batch_item_reused") == [
        0, 1]
    assert [e["data"]["index"] for e in events if e["event"] == "batch_item_completed"] == [2]

