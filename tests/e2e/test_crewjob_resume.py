"""Resume on the real control plane (issue 21): a four-task crew with one MCP tool call per
task is killed during the third task's tool call (its sidecar SIGKILLed by the pod runner);
the job is resolved through the plugin, and ``kubectl crewfence rerun --resume`` creates the
successor. The MCP server (tests/support/mcp_ledger_server.py, on the host's loopback, which
the pods share) writes every call it executes with the idempotency key it received.

- after ``--not-happened``: tasks 1-2's calls were executed once, the third twice with the
  same key, the fourth once;
- after ``--happened``: the third once.

In both, the third task's first model call (the one that asked for the tool, finished in the
predecessor) is answered from the journal. A ``batch_run`` resumed after two of its three
inputs completed runs only the third again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from crewjob_support import (
    REPO,
    apply_obj,
    crewjob_manifest,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness.handles import Cluster, Operator, PodRunner
from plugin_support import kubectl_plugin, plugin_dir

pytestmark = pytest.mark.slow
LEDGER_SERVER = REPO / "tests" / "support" / "mcp_ledger_server.py"


@pytest.fixture
def tickets(tmp_path: Path) -> Any:
    # the server binds port 0 and writes the port it got to port_file once it listens (a port
    # probed free here could be taken by another process before it binds)
    ledger, port_file = tmp_path / "tickets.jsonl", tmp_path / "mcp.port"
    proc = subprocess.Popen([sys.executable, str(LEDGER_SERVER), "0", str(ledger),
                             "streamable-http", str(port_file)],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "mcp.log").open("wb"))

    def listening() -> int | None:
        assert proc.poll() is None, (tmp_path / "mcp.log").read_text(errors="replace")
        return int(port_file.read_text()) if port_file.exists() else None

    try:
        port = wait_for(listening, timeout=60, what="the MCP ledger server")
        yield f"http://127.0.0.1:{port}/mcp", ledger
    finally:
        proc.terminate()
        proc.wait(30)


def _lines(ledger: Path, title: str) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    rows = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("title") == title]


def _crew(name: str, url: str) -> dict[str, Any]:
    tasks = [{"name": f"step{i}", "agent": "clerk", "description": f"Step {i}: {{t{i}}}",
              "expected_output": "A short note"} for i in range(1, 5)]
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew",
            "metadata": {"name": name},
            "spec": {"replicas": 1, "journal": {"resumeMaterial": True},
                     "tools": {"mcpServers": [{"name": "tickets", "url": url,
                                               "allowedTools": ["create_ticket"]}]},
                     "agents": {"clerk": {"role": "Clerk", "goal": "File tickets",
                                          "backstory": "Careful.", "max_retry_limit": 0,
                                          "tools": ["tickets/create_ticket"]}},
                     "tasks": tasks}}


def _ticket(title: str, sleep: float = 0) -> str:
    args = {"title": title, **({"sleep": sleep} if sleep else {})}
    return f"[[tool:tickets/create_ticket {json.dumps(args)}]]"


@pytest.mark.parametrize("outcome", ["not-happened", "happened"])
def test_a_resumed_crew_reruns_only_the_call_in_doubt(
        cluster: Cluster, operator_process: Operator, pod_runner: PodRunner, namespace: str,
        tmp_path: Path, tickets: tuple[str, Path], outcome: str) -> None:
    url, ledger = tickets
    tag = "N" if outcome == "not-happened" else "H"
    assert apply_obj(cluster, _crew("desk", url), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "desk", 1)
    inputs = {"t1": _ticket(f"{tag}-1"), "t2": _ticket(f"{tag}-2"),
              "t3": _ticket(f"{tag}-3", sleep=300), "t4": _ticket(f"{tag}-4")}
    assert apply_obj(cluster, crewjob_manifest("four", "run", inputs, crew="desk",
                                               timeoutMs=900000), namespace).returncode == 0
    wait_for(lambda: _lines(ledger, f"{tag}-3") or None, timeout=300,
             what="the third task's call at the tool server")
    pod_runner.kill(namespace, "desk-0")
    pred = wait_phase(cluster, namespace, "four", timeout=300)["status"]
    assert pred["uncertainOutcome"] is True and pred["effects"]["inDoubtCount"] == 1, pred
    key3 = pred["effects"]["inDoubt"][0]["idempotencyKey"]
    wait_crew_ready(cluster, namespace, "desk", 1)

    plugin = plugin_dir(tmp_path)
    resolved = kubectl_plugin(cluster, plugin, "resolve", "four", "-n", namespace,
                              f"--{outcome}", "--note", "checked the ticket system")
    assert resolved.returncode == 0, resolved.stderr
    made = kubectl_plugin(cluster, plugin, "rerun", "four", "-n", namespace, "--resume")
    assert made.returncode == 0, made.stderr
    succ = wait_phase(cluster, namespace, "four-rerun", timeout=400)
    status = succ["status"]
    assert succ["spec"]["resume"] is True
    assert status["phase"] == "Succeeded", json.dumps(status)
    assert status["assignment"]["ordinal"] == pred["assignment"]["ordinal"]

    assert len(_lines(ledger, f"{tag}-1")) == 1 and len(_lines(ledger, f"{tag}-2")) == 1
    assert len(_lines(ledger, f"{tag}-4")) == 1
    third = [r["meta_key"] for r in _lines(ledger, f"{tag}-3")]
    assert third == ([key3, key3] if outcome == "not-happened" else [key3])
    reused = status["effects"]["reused"]
    assert reused["fromActionId"] == f"{namespace}/four"
    assert reused["tasks"] == 2
    assert reused["toolCalls"] == (0 if outcome == "not-happened" else 1)
    # the third task's call that asked for the tool: from the journal, no second bill
    assert reused["modelCalls"] == 1
    # live: tasks 3-4 only (the third task's call after the tool, the fourth's two)
    assert status["effects"]["tasksCompleted"] == 2
    assert status["effects"]["toolCalls"] == (2 if outcome == "not-happened" else 1)
    assert status["effects"]["modelCalls"] == 3

    explained = kubectl_plugin(cluster, plugin, "explain", "four-rerun", "-n", namespace)
    assert explained.returncode == 0, explained.stderr
    assert "the two trajectories" in explained.stdout
    assert "task 0 step1: predecessor completed; successor reused from the journal" \
        in explained.stdout


def test_a_resumed_batch_run_reruns_only_the_input_that_did_not_complete(
        cluster: Cluster, operator_process: Operator, pod_runner: PodRunner, namespace: str,
        tmp_path: Path, tickets: tuple[str, Path]) -> None:
    url, ledger = tickets
    crew = _crew("single", url)
    crew["spec"]["tasks"] = [{"name": "file", "agent": "clerk",
                              "description": "Handle this request: {request}",
                              "expected_output": "A short note"}]
    crew["spec"]["operations"] = ["run", "batch_run"]
    assert apply_obj(cluster, crew, namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "single", 1)
    inputs = {"inputs": [{"request": _ticket("B-0")}, {"request": _ticket("B-1")},
                         {"request": _ticket("B-2", sleep=300)}]}
    assert apply_obj(cluster, crewjob_manifest("batch", "batch_run", inputs, crew="single",
                                               timeoutMs=900000), namespace).returncode == 0
    plugin = plugin_dir(tmp_path)

    def two_done_third_in_flight() -> bool | None:
        logs = kubectl_plugin(cluster, plugin, "logs", "batch", "-n", namespace).stdout
        return (logs.count("batch_item_completed") == 2 and bool(_lines(ledger, "B-2"))) or None

    wait_for(two_done_third_in_flight, timeout=300,
             what="two inputs to complete and the third's call to reach the tool server")
    pod_runner.kill(namespace, "single-0")
    pred = wait_phase(cluster, namespace, "batch", timeout=300)["status"]
    assert pred["uncertainOutcome"] is True, pred
    wait_crew_ready(cluster, namespace, "single", 1)
    resolved = kubectl_plugin(cluster, plugin, "resolve", "batch", "-n", namespace,
                              "--not-happened", "--note", "checked the ticket system")
    assert resolved.returncode == 0, resolved.stderr
    made = kubectl_plugin(cluster, plugin, "rerun", "batch", "-n", namespace, "--resume")
    assert made.returncode == 0, made.stderr
    status = wait_phase(cluster, namespace, "batch-rerun", timeout=400)["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)
    assert status["effects"]["reused"]["batchItems"] == 2
    assert len(_lines(ledger, "B-0")) == 1 and len(_lines(ledger, "B-1")) == 1
    assert len(_lines(ledger, "B-2")) == 2  # the input in flight ran again
