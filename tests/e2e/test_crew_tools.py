"""spec.tools on the real control plane: the API server refuses an agent naming an undefined
tool (the CRD's CEL rule), the operator renders tools into the crews file with the header
Secret mounted as read-only files, ToolsReady names unreachable MCP servers, a killed sidecar
leaves exactly the in-flight call in status.effects.inDoubt, and a Python tool from the
sidecar's image (``ledger_tools:lookup``: tests/support is on every container's PYTHONPATH)
runs once with the key its journaled start carries, called by the offline LLM's marker and
by a hosted model's native tool call (the loopback OpenAI fixture as ``spec.llm.baseUrl``)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from crewjob_support import (
    REPO,
    apply_obj,
    condition,
    crew_access,
    crew_replicas,
    crewjob_manifest,
    sidecar_get,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness import controlplane
from harness.handles import Cluster, Operator, PodRunner

sys.path.insert(0, str(REPO / "tests" / "support"))
from openai_fixture import OpenAIFixture

HEADER_VALUE = "Bearer e2e-header-value-not-to-leak"
HEADERS_DIR = "/etc/crewfence/tool-headers"


def crew(name: str, tools: dict[str, Any], agent_tools: list[str],
         description: str = "File a ticket.", replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew",
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "tools": tools,
                     "agents": {"clerk": {"role": "Clerk", "goal": "File tickets",
                                          "backstory": "Careful.", "tools": agent_tools}},
                     "tasks": [{"name": "file", "agent": "clerk", "description": description,
                                "expected_output": "A ticket id."}]}}


TOOLS = {"mcpServers": [{"name": "tickets", "url": "http://127.0.0.1:9/mcp",
                         "allowedTools": ["create_ticket"]},
                        {"name": "search", "url": "http://127.0.0.1:9/sse",
                         "transport": "sse"}],
         "python": [{"name": "lookup", "ref": "mypkg.tools:lookup"}]}


# --- the API server refuses what names nothing ---------------------------------------------------
@pytest.mark.parametrize(("agent_tools", "named"), [
    (["nosuch/create_ticket"], '"nosuch/create_ticket"'),  # no such server
    (["tickets/delete_ticket"], '"tickets/delete_ticket"'),  # not in its allowedTools
    (["lookupp", "lookup"], '"lookupp"'),  # no such Python tool
    (["nosuch"], '"nosuch"'),
])
def test_an_agent_naming_an_undefined_tool_is_refused(
        cluster: Cluster, operator_process: Operator, namespace: str,
        agent_tools: list[str], named: str) -> None:
    result = apply_obj(cluster, crew("refused", TOOLS, agent_tools), namespace)
    assert result.returncode != 0, result.stdout
    # e.g. `spec.agents: Invalid value: unknown tool(s) [["lookupp"]] of agent(s) ["clerk"]: ...`
    assert "spec.agents" in result.stderr and "unknown tool(s)" in result.stderr, result.stderr
    assert named in result.stderr and '["clerk"]' in result.stderr, result.stderr
    assert '"lookup"' not in result.stderr  # only what names nothing
    assert cluster.get_json("crew", "refused", "-n", namespace) is None


def test_tool_names_are_checked_by_the_schema(
        cluster: Cluster, operator_process: Operator, namespace: str) -> None:
    dup = {"mcpServers": [{"name": "tickets", "url": "http://a:1/mcp"},
                          {"name": "tickets", "url": "http://b:1/mcp"}]}
    result = apply_obj(cluster, crew("dup", dup, ["tickets"]), namespace)
    assert result.returncode != 0 and "Duplicate value" in result.stderr, result.stderr
    bad_name = {"mcpServers": [{"name": "Tickets_1", "url": "http://a:1/mcp"}]}
    result = apply_obj(cluster, crew("badname", bad_name, []), namespace)
    assert result.returncode != 0 and "mcpServers[0].name" in result.stderr, result.stderr
    clash = {"mcpServers": [{"name": "x", "url": "http://a:1/mcp"}],
             "python": [{"name": "x", "ref": "m:x"}]}
    result = apply_obj(cluster, crew("clash", clash, ["x"]), namespace)
    assert result.returncode != 0 and "must differ" in result.stderr, result.stderr


def test_tools_that_resolve_are_accepted_with_defaults(
        cluster: Cluster, operator_process: Operator, namespace: str) -> None:
    refs = ["tickets/create_ticket", "search", "search/anything", "lookup"]
    result = apply_obj(cluster, crew("accepted", TOOLS, refs), namespace)
    assert result.returncode == 0, result.stderr
    stored = cluster.get_json("crew", "accepted", "-n", namespace)["spec"]
    assert stored["tools"]["mcpServers"][0]["transport"] == "streamable-http"  # default
    assert stored["agents"]["clerk"]["tools"] == refs
    example = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f",
                              str(REPO / "examples" / "crew-tools.yaml"))
    assert example.returncode == 0, example.stderr


# --- rendering: crews file and header files ------------------------------------------------------
def test_tools_are_rendered_and_header_secrets_are_read_only_files(
        cluster: Cluster, operator_process: Operator, pod_runner: PodRunner,
        namespace: str) -> None:
    cluster.apply({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "tickets-mcp", "namespace": namespace},
                   "stringData": {"Authorization": HEADER_VALUE, "X-Tenant": "acme"}})
    tools = {"mcpServers": [{"name": "tickets", "url": "http://127.0.0.1:9/mcp",
                             "headersFrom": {"secretRef": {"name": "tickets-mcp"}},
                             "allowedTools": ["create_ticket"]}]}
    assert apply_obj(cluster, crew("render", tools, ["tickets/create_ticket"]),
                     namespace).returncode == 0

    cm = wait_for(lambda: cluster.get_json("configmap", "render-crewfence-crews", "-n",
                                           namespace), timeout=60, what="crews ConfigMap")
    text = cm["data"]["crews.yaml"]
    definition = yaml.safe_load(text)["crews"]["render"]
    assert definition["tools"]["mcpServers"] == [{
        "name": "tickets", "url": "http://127.0.0.1:9/mcp", "transport": "streamable-http",
        "headersDir": f"{HEADERS_DIR}/tickets", "allowedTools": ["create_ticket"]}]
    assert definition["agents"]["clerk"]["tools"] == ["tickets/create_ticket"]
    assert HEADER_VALUE not in text and "tickets-mcp" not in text

    pod = wait_for(lambda: cluster.get_json("pod", "render-0", "-n", namespace),
                   timeout=60, what="pod render-0")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "tool-headers-tickets")
    assert volume["secret"] == {"secretName": "tickets-mcp", "defaultMode": 0o400}
    (container,) = pod["spec"]["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tool-headers-tickets")
    assert mount == {"name": "tool-headers-tickets", "mountPath": f"{HEADERS_DIR}/tickets",
                     "readOnly": True}
    assert HEADER_VALUE not in json.dumps(pod) and "tickets-mcp" not in json.dumps(
        container.get("env"))

    # What the kubelet (here: the pod runner) writes: one file per header, 0440 with fsGroup.
    folder = pod_runner.pod_dir(namespace, "render-0") / "volumes" / "tool-headers-tickets"
    header = wait_for(lambda: (folder / "Authorization") if (folder / "Authorization").exists()
                      else None, timeout=60, what="the header file")
    assert header.read_text() == HEADER_VALUE
    assert stat.S_IMODE(header.stat().st_mode) == 0o440
    assert (folder / "X-Tenant").read_text() == "acme"


# --- ToolsReady ----------------------------------------------------------------------------------
@pytest.fixture
def dead_url() -> Iterator[str]:
    """An MCP URL that refuses connections while the test runs: its port is held by a socket
    bound without SO_REUSEADDR that never listens, so no other process can serve there (a port
    probed free and released could be taken by another test's server meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}/mcp"


@pytest.fixture
def answering_server() -> Iterator[str]:
    """Answers every request with 405 (as an MCP endpoint may answer a bare GET)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(405)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    server.shutdown()
    server.server_close()


def test_tools_ready_names_the_unreachable_server(
        cluster: Cluster, operator_process: Operator, namespace: str,
        answering_server: str, dead_url: str) -> None:
    dead = dead_url
    tools = {"mcpServers": [{"name": "up", "url": answering_server},
                            {"name": "down", "url": dead}]}
    assert apply_obj(cluster, crew("ready", tools, ["up", "down"], replicas=0),
                     namespace).returncode == 0

    def tools_ready(status: str) -> dict[str, Any] | None:
        obj = cluster.get_json("crew", "ready", "-n", namespace) or {}
        cond = condition(obj, "ToolsReady")
        return cond if cond and cond["status"] == status else None

    cond = wait_for(lambda: tools_ready("False"), timeout=60, what="ToolsReady=False")
    assert cond["reason"] == "ToolServersUnreachable"
    assert "down (connection failed" in cond["message"] and "up (" not in cond["message"]

    # A new generation is checked at once (not only every 30 s).
    tools["mcpServers"] = [tools["mcpServers"][0]]
    assert apply_obj(cluster, crew("ready", tools, ["up"], replicas=0),
                     namespace).returncode == 0
    cond = wait_for(lambda: tools_ready("True"), timeout=60, what="ToolsReady=True")
    assert cond["reason"] == "ToolServersReachable" and "up" in cond["message"]


# --- status.effects on every terminal CrewJob -----------------------------------------------------
def python_tool_calls(cluster: Cluster, term: str) -> list[dict[str, Any]]:
    """What ``ledger_tools:lookup`` recorded for ``term`` (tests/support is on every
    container's PYTHONPATH; the ledger file is the pod runner's, shared by the session)."""
    return [line for line in ledger_lines(controlplane.python_tool_ledger(cluster.info))
            if line.get("tool") == "lookup" and line.get("term") == term]


def test_a_finished_job_and_its_exact_repeat_both_carry_effects(
        cluster: Cluster, operator_process: Operator, namespace: str) -> None:
    """A Python tool in the sidecar's image (``ledger_tools:lookup``) called once through the
    offline LLM's marker: journaled write-ahead with the key the tool got. The first run's
    effects come from the followed stream; the exact repeat (deleted and re-applied: the
    operator finds the terminal record on a probe and never followed it) reads the record's
    events from 0 (``ReadEffects``): both write the same summary, and the tool ran once."""
    glossary = {"python": [{"name": "lookup", "ref": "ledger_tools:lookup"}]}
    marker = f'[[tool:lookup {{"term": "{namespace}"}}]]'
    assert apply_obj(cluster, crew("glossary", glossary, ["lookup"],
                                   description=f"{marker} Say hello."),
                     namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "glossary", 1)
    job = crewjob_manifest("hello", "run", {}, crew="glossary")
    assert apply_obj(cluster, job, namespace).returncode == 0
    first = wait_phase(cluster, namespace, "hello", timeout=240)["status"]
    assert first["phase"] == "Succeeded", first
    assert first["effects"]["inDoubt"] == [] and first["effects"]["inDoubtCount"] == 0
    assert set(first["usage"]) == {"promptTokens", "completionTokens", "modelCalls",
                                   "toolCalls"}
    assert first["effects"]["toolCalls"] == first["usage"]["toolCalls"] == 1, first
    assert first["usage"]["modelCalls"] == 2, first  # the tool call, then the answer
    assert "tool call" not in first["message"]

    events = job_events(cluster, namespace, "glossary", first["actionId"])
    started = [e["data"] for e in events if e["event"] == "tool_call_started"]
    finished = [e["data"] for e in events if e["event"] == "tool_call_finished"]
    assert [s["tool"] for s in started] == ["lookup"] and len(finished) == 1, events
    key = started[0]["idempotency_key"]
    assert key.startswith("cfk1-") and finished[0]["idempotency_key"] == key
    assert finished[0]["error"] is None
    (ran,) = python_tool_calls(cluster, namespace)
    assert ran["key"] == key, "the tool ran with the key its start was journaled with"

    cluster.kubectl("delete", "crewjob", "hello", "-n", namespace, check=True)
    assert apply_obj(cluster, job, namespace).returncode == 0
    again = wait_phase(cluster, namespace, "hello", timeout=240)["status"]
    assert again["phase"] == "Succeeded" and again["startedAt"] == first["startedAt"]
    assert again["effects"] == first["effects"] and again["usage"] == first["usage"]
    assert python_tool_calls(cluster, namespace) == [ran]  # the repeat ran nothing


# --- a hosted model: native tool calling --------------------------------------------------------
@pytest.fixture
def openai_server() -> Iterator[OpenAIFixture]:
    server = OpenAIFixture().start()
    yield server
    server.stop()


def test_a_hosted_model_calls_a_python_tool_natively(
        cluster: Cluster, operator_process: Operator, namespace: str,
        openai_server: OpenAIFixture) -> None:
    """``spec.llm`` names an OpenAI model at a base URL (the loopback fixture of
    tests/support/openai_fixture.py, started here) with its key from a Secret: the model asks
    for ``lookup`` with a native ``tool_calls`` answer, crewai runs the image's Python tool
    through the ledger, and the model answers once the tool's result is in its messages."""
    cluster.apply({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "llm-key", "namespace": namespace},
                   "stringData": {"api-key": "sk-fixture-e2e"}})
    glossary = {"python": [{"name": "lookup", "ref": "ledger_tools:lookup"}]}
    hosted = crew("hosted", glossary, ["lookup"], description="Handle: {request}")
    hosted["spec"]["llm"] = {"model": "openai/gpt-4o-mini", "baseUrl": openai_server.base_url,
                             "apiKeySecretRef": {"name": "llm-key"}}
    assert apply_obj(cluster, hosted, namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "hosted", 1)
    term = f"hosted-{namespace}"
    job = crewjob_manifest("hosted", "run",
                           {"request": f'find [[tool:lookup {{"term": "{term}"}}]] please'},
                           crew="hosted")
    assert apply_obj(cluster, job, namespace).returncode == 0
    status = wait_phase(cluster, namespace, "hosted", timeout=240)["status"]
    assert status["phase"] == "Succeeded", status
    assert status["effects"]["toolCalls"] == status["usage"]["toolCalls"] == 1, status
    assert status["usage"]["modelCalls"] >= 2, status
    assert status["effects"]["inDoubt"] == [], status

    # The model asked for the tool natively, then answered after its result; with the key.
    seen = [r for r in openai_server.snapshot() if term in r.user_texts]
    assert [len(r.tool_calls) for r in seen] == [1, 0], seen
    assert seen[0].tools == ["lookup"] and seen[0].tool_calls[0]["name"] == "lookup"
    assert seen[1].tool_results == 1
    assert {r.api_key for r in seen} == {"sk-fixture-e2e"}
    events = job_events(cluster, namespace, "hosted", status["actionId"])
    started = [e["data"] for e in events if e["event"] == "tool_call_started"]
    finished = [e["data"] for e in events if e["event"] == "tool_call_finished"]
    assert [s["tool"] for s in started] == ["lookup"] and len(finished) == 1, events
    assert finished[0]["idempotency_key"] == started[0]["idempotency_key"]
    (ran,) = python_tool_calls(cluster, term)
    assert ran["key"] == started[0]["idempotency_key"]
    models = [e["data"] for e in events if e["event"] == "model_call"]
    assert [m["request_id"] for m in models] == [r.response_id for r in seen]
    assert status["usage"]["modelCalls"] == len(seen)


# --- the whole story: a killed sidecar and the call it left in doubt ------------------------------
LEDGER_SERVER = REPO / "tests" / "support" / "mcp_ledger_server.py"


def start_ledger_server(ledger: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The FastMCP test server (tests/support/mcp_ledger_server.py: ``PORT LEDGER_FILE
    [TRANSPORT [PORT_FILE]]``): one JSON line per ``create_ticket`` call as it arrives (with
    the idempotency key it saw in ``_meta`` and in the header), then it holds the call for its
    ``sleep`` argument. It binds port 0 and writes the port it got to PORT_FILE once it
    listens (a port probed free here could be taken by another process before it binds)."""
    port_file = ledger.with_name(f"{ledger.name}.port")
    port_file.unlink(missing_ok=True)  # never an earlier server's port
    proc = subprocess.Popen([sys.executable, str(LEDGER_SERVER), "0", str(ledger),
                             "streamable-http", str(port_file)],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def listening() -> int | None:
        assert proc.poll() is None, f"the MCP ledger server exited with {proc.returncode}"
        return int(port_file.read_text()) if port_file.exists() else None

    port = wait_for(listening, timeout=30, what="the MCP ledger server")
    return proc, f"http://127.0.0.1:{port}/mcp"


def ledger_lines(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]


def job_events(cluster: Cluster, namespace: str, crew_name: str,
               action_id: str) -> list[dict[str, Any]]:
    access = crew_access(cluster, namespace, crew_name)
    (replica,) = [r for r in crew_replicas(cluster, namespace, crew_name) if r.get("address")]
    status, text = sidecar_get(replica, f"/jobs/{quote(action_id, safe='')}/events?cursor=0",
                               access)
    return list(json.loads(text).get("events") or []) if status == 200 else []


@pytest.mark.slow
def test_a_killed_sidecar_leaves_exactly_the_call_in_flight_in_doubt(
        cluster: Cluster, operator_process: Operator, pod_runner: PodRunner,
        namespace: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    proc, url = start_ledger_server(ledger)
    try:
        two_calls = ('[[tool:tickets/create_ticket {"title": "first"}]] '
                     '[[tool:tickets/create_ticket {"title": "second", "sleep": 300}]]')
        tools = {"mcpServers": [{"name": "tickets", "url": url,
                                 "allowedTools": ["create_ticket"]}]}
        assert apply_obj(cluster, crew("desk", tools, ["tickets/create_ticket"], two_calls),
                         namespace).returncode == 0
        wait_crew_ready(cluster, namespace, "desk", 1)
        ready = wait_for(lambda: condition(cluster.get_json("crew", "desk", "-n", namespace),
                                           "ToolsReady"), timeout=60, what="ToolsReady")
        assert ready["status"] == "True", ready

        job = crewjob_manifest("two-calls", "run", {}, crew="desk")
        assert apply_obj(cluster, job, namespace).returncode == 0
        # The second call reached the server (it holds it): kill the sidecar now.
        wait_for(lambda: len(ledger_lines(ledger)) >= 2 or None, timeout=240,
                 what="the second create_ticket call at the server")
        pod_runner.kill(namespace, "desk-0")

        status = wait_phase(cluster, namespace, "two-calls", timeout=300)["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "SidecarRestarted"), status
        assert status["uncertainOutcome"] is True
        effects = status["effects"]
        seen = ledger_lines(ledger)
        seen_key = seen[1]["meta_key"]
        assert seen[1]["header_key"] == seen_key, "the key in _meta and as the header"
        assert effects["toolCalls"] == 2 and effects["inDoubtCount"] == 1
        assert effects["inDoubt"] == [{
            "tool": "tickets/create_ticket", "server": "tickets", "task": "file",
            "startedAt": effects["inDoubt"][0]["startedAt"], "idempotencyKey": seen_key}]
        assert seen_key != seen[0]["meta_key"] and seen_key.startswith("cfk1-")
        assert (f"1 tool call in doubt: `create_ticket` (server tickets), task `file`, "
                f"key {seen_key}") in status["message"]
        assert status["usage"]["toolCalls"] == 2 and status["usage"]["modelCalls"] >= 1

        # A job whose sidecar dies between calls: its first task's call finished, its second
        # task's model call sleeps (another agent, no tools): nothing is in flight.
        between = crew("desk2", tools, ["tickets/create_ticket"],
                       '[[tool:tickets/create_ticket {"title": "only"}]]')
        between["spec"]["agents"]["waiter"] = {"role": "Waiter", "goal": "Wait",
                                               "backstory": "Patient."}
        between["spec"]["tasks"].append({"name": "wait", "agent": "waiter",
                                         "description": "[[sleep:300]] Wait.",
                                         "expected_output": "Nothing."})
        assert apply_obj(cluster, between, namespace).returncode == 0
        wait_crew_ready(cluster, namespace, "desk2", 1)
        before = len(ledger_lines(ledger))
        assert apply_obj(cluster, crewjob_manifest("between", "run", {}, crew="desk2"),
                         namespace).returncode == 0
        running = wait_phase(cluster, namespace, "between", ("Running",), timeout=180)
        action_id = running["status"]["actionId"]
        wait_for(lambda: any(e["event"] == "tool_call_finished"
                             for e in job_events(cluster, namespace, "desk2", action_id))
                 or None, timeout=240, what="the only call to finish")
        assert len(ledger_lines(ledger)) == before + 1
        pod_runner.kill(namespace, "desk2-0")
        status = wait_phase(cluster, namespace, "between", timeout=300)["status"]
        assert (status["reason"], status["uncertainOutcome"]) == ("SidecarRestarted", True)
        assert status["effects"]["inDoubt"] == [] and status["effects"]["inDoubtCount"] == 0
        assert status["effects"]["toolCalls"] == 1
        assert "no tool call was in flight" in status["message"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_tool_the_server_does_not_offer_fails_the_crewjob_rejected_naming_it(
        cluster: Cluster, operator_process: Operator, namespace: str, tmp_path: Path) -> None:
    """A server without allowedTools (the API server cannot decide its names): the sidecar's
    admission lists its tools and refuses (422 unknown_tool); the CrewJob ends Failed,
    Rejected, naming crew, agent, server and tool, certain and not retried."""
    proc, url = start_ledger_server(tmp_path / "ledger.jsonl")
    try:
        tools = {"mcpServers": [{"name": "tickets", "url": url}]}
        assert apply_obj(cluster, crew("nope", tools, ["tickets/nope"]),
                         namespace).returncode == 0
        wait_crew_ready(cluster, namespace, "nope", 1)
        assert apply_obj(cluster, crewjob_manifest("no-tool", "run", {}, crew="nope"),
                         namespace).returncode == 0
        status = wait_phase(cluster, namespace, "no-tool", timeout=240)["status"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert (status["phase"], status["reason"]) == ("Failed", "Rejected"), status
    assert status.get("uncertainOutcome") in (None, False), status
    failure = status["failure"]
    assert (failure["category"], failure["code"]) == ("Permanent", "unknown_tool"), failure
    for part in ("agent 'clerk'", "MCP server 'tickets' does not offer tool 'nope'",
                 "create_ticket"):
        assert part in status["message"], status
    assert ledger_lines(tmp_path / "ledger.jsonl") == []
