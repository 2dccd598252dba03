"""The effect ledger end to end: the real ``crewfence-sidecar`` executable (jobs in worker
processes), a real MCP server on loopback (``tests/support/mcp_ledger_server.py``) and Python
tools (``tests/support/ledger_tools.py``); the offline LLM calls them through its
``[[tool:NAME {args}]]`` marker. Every tool writes its effect to a ledger file OUTSIDE the
sidecar's state dir with the idempotency key it received, which the tests compare with the
journal's events."""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crewfence_sidecar.contract import EFFECT_EVENTS, summarize_effects
from sidecar_helpers import (
    SidecarProcess,
    headers,
    json_call,
    mcp_ledger_server,
    metric_value,
    refused_start,
    sidecar_env,
    wait_until,
)

pytestmark = pytest.mark.timeout(300)
SUPPORT = Path(__file__).resolve().parents[2] / "support"


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(URL, ledger file) of one MCP server for the module."""
    with mcp_ledger_server(tmp_path_factory.mktemp("mcp")) as server:
        yield server


@pytest.fixture(scope="module")
def mcp_sse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(URL, ledger file) of the same MCP server over SSE, for the tests that ask for it."""
    with mcp_ledger_server(tmp_path_factory.mktemp("mcp-sse"), "sse") as server:
        yield server


def _crews_yaml(url: str, transport: str = "streamable-http") -> str:
    return f"""\
crews:
  desk:
    tools:
      mcpServers:
        - name: tickets
          url: {url}
          transport: {transport}
      python:
        - {{name: lookup, ref: "ledger_tools:lookup"}}
        - {{name: explode, ref: "ledger_tools:ExplodingTool"}}
    agents:
      clerk:
        role: Clerk
        goal: File what is asked
        backstory: A careful clerk.
        max_retry_limit: 0
        tools: [tickets, lookup, explode]
    tasks:
      - name: file
        agent: clerk
        description: "Handle this request: {{request}}"
        expected_output: A short note
  wire:
    tools:
      python:
        - {{name: tripwire, ref: "ledger_tools:kill_sidecar"}}
    agents:
      clerk: {{role: Clerk, goal: Do what is asked, backstory: Careful., max_retry_limit: 0,
              tools: [tripwire]}}
    tasks:
      - {{name: trip, agent: clerk, description: "Handle: {{request}}",
         expected_output: A note}}
"""


@pytest.fixture
def desk(request: pytest.FixtureRequest, tmp_path: Path,
         mcp_server: tuple[str, Path]) -> dict[str, Any]:
    """The ``desk`` crew's sidecar environment; its MCP server speaks streamable HTTP, or
    SSE in a test that parametrizes this fixture indirectly with ``"sse"``."""
    transport = getattr(request, "param", "streamable-http")
    if transport == "sse":
        mcp_server = request.getfixturevalue("mcp_sse_server")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    crews = tmp_path / "crews.yaml"
    crews.write_text(_crews_yaml(mcp_server[0], transport))
    tool_ledger = tmp_path / "python-tools.jsonl"
    env = sidecar_env(state / "journal.db", crews,
                      CREWFENCE_TEST_TOOL_LEDGER=str(tool_ledger),
                      CREWFENCE_REGISTRY="ledger_tools:REGISTRY",
                      CREWFENCE_TEST_MCP_URL=mcp_server[0],
                      PYTHONPATH=os.pathsep.join(p for p in (str(SUPPORT),
                                                             os.environ.get("PYTHONPATH")) if p))
    return {"env": env, "tmp": tmp_path, "mcp_ledger": mcp_server[1], "tool_ledger": tool_ledger,
            "mcp_url": mcp_server[0]}




def _start(url: str, action_id: str, request: str, *, async_: bool = False) -> tuple[int, Any]:
    body = {"crew_id": "desk", "action_id": action_id, "operation": "run",
            "input": {"request": request}}
    return json_call(f"{url}/jobs", "POST", body, headers(f"key-{action_id}", async_=async_))


def _events(url: str, action_id: str) -> list[dict[str, Any]]:
    status, page = json_call(f"{url}/jobs/{action_id}/events?cursor=0&limit=1000")
    assert status == 200, page
    return list(page["events"])


def _lines(path: Path, **match: Any) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def _ticket(title: str, sleep: float = 0) -> str:
    args = {"title": title, **({"sleep": sleep} if sleep else {})}
    return f"[[tool:tickets/create_ticket {json.dumps(args)}]]"


@pytest.mark.parametrize("desk", ["streamable-http", "sse"], indirect=True)
def test_two_tool_calls_are_journaled_in_order_with_the_keys_the_server_saw(
        desk: dict[str, Any]) -> None:
    sidecar = SidecarProcess([], desk["env"], desk["tmp"] / "sidecar.log").start()
    try:
        sidecar.wait_listening()
        status, record = _start(sidecar.url, "two-calls",
                                f"{_ticket('T2-a')} then {_ticket('T2-b')}")  # blocking
        assert status == 200, record  # the blocking answer: the run's output
        assert "Offline answer" in record["raw"]
        _, record = json_call(f"{sidecar.url}/jobs/two-calls")
        assert record["status"] == "completed"
        events = _events(sidecar.url, "two-calls")
    finally:
        sidecar.terminate()
    names = [e["event"] for e in events if e["event"] != "chunk"]
    assert names == ["started", "task_started", "model_call", "tool_call_started",
                     "tool_call_finished", "model_call", "tool_call_started",
                     "tool_call_finished", "model_call", "task_completed", "completed"]
    assert [e["sequence"] for e in events] == list(range(len(events)))
    started = [e["data"] for e in events if e["event"] == "tool_call_started"]
    finished = [e["data"] for e in events if e["event"] == "tool_call_finished"]
    assert [s["tool"] for s in started] == ["tickets/create_ticket"] * 2
    assert [s["server"] for s in started] == ["tickets"] * 2
    assert [s["call_index"] for s in started] == [0, 1]
    assert [f["idempotency_key"] for f in finished] == [s["idempotency_key"] for s in started]
    assert all(f["error"] is None and f["result_sha256"] for f in finished)
    seen = _lines(desk["mcp_ledger"], title="T2-a") + _lines(desk["mcp_ledger"], title="T2-b")
    assert len(seen) == 2  # exactly two effects, once each
    assert [r["meta_key"] for r in seen] == [s["idempotency_key"] for s in started]
    assert [r["header_key"] for r in seen] == [s["idempotency_key"] for s in started]
    assert all(e["data"]["at"].endswith("Z") for e in events if e["event"] in EFFECT_EVENTS)
    # hashes only: no argument or result of a tool call is in the ledger's events
    ledger_text = json.dumps([e for e in events if e["event"] in EFFECT_EVENTS])
    assert "T2-a" not in ledger_text and "ticket created" not in ledger_text
    summary = summarize_effects(events)
    assert (summary.tool_calls, summary.tasks_completed, summary.tasks_total) == (2, 1, 1)
    assert summary.model_calls == 3 and summary.prompt_tokens > 0
    assert summary.in_doubt == []


def test_a_sigkilled_sidecar_leaves_exactly_the_call_in_flight_in_doubt(
        desk: dict[str, Any]) -> None:
    log = desk["tmp"] / "first.log"
    first = SidecarProcess([], desk["env"], log).start().wait_listening()
    try:
        status, _ = _start(first.url, "in-flight",
                           f"{_ticket('K-first')} then {_ticket('K-second', sleep=120)}",
                           async_=True)
        assert status == 202
        # the second call reached the server (its effect is written before it sleeps)
        wait_until(lambda: _lines(desk["mcp_ledger"], title="K-second"), 120,
                   "the second create_ticket to reach the MCP server")
    finally:
        first.kill()  # SIGKILL: the worker dies with it, the call never finishes
    second = SidecarProcess([], desk["env"], desk["tmp"] / "second.log").start()
    try:
        second.wait_listening()
        status, record = json_call(f"{second.url}/jobs/in-flight")
        assert status == 200
        assert record["status"] == "failed" and record["uncertain_outcome"] is True
        events = _events(second.url, "in-flight")
    finally:
        second.terminate()
    summary = summarize_effects(events)
    assert summary.tool_calls == 2
    seen = _lines(desk["mcp_ledger"], title="K-second")
    assert len(seen) == 1
    assert [c.idempotency_key for c in summary.in_doubt] == [seen[0]["meta_key"]]
    assert summary.in_doubt[0].tool == "tickets/create_ticket"
    assert summary.in_doubt[0].task == "file"
    message = summary.in_doubt_message()
    assert message.startswith("1 tool call in doubt: `create_ticket` (server tickets)")
    assert seen[0]["meta_key"] in message


def test_a_tool_never_runs_before_its_start_is_durable(desk: dict[str, Any]) -> None:
    # started, task_started, model_call fill a record of 4 (one slot is the terminal's):
    # the tool's start cannot be journaled, so the tool must not run
    env = {**desk["env"], "CREWFENCE_MAX_EVENTS_PER_RUN": "4"}
    sidecar = SidecarProcess([], env, desk["tmp"] / "sidecar.log").start()
    try:
        sidecar.wait_listening()
        status, record = _start(sidecar.url, "no-room",
                                f"{_ticket('F-1')} and [[tool:lookup {{\"term\": \"F-2\"}}]]")
        events = _events(sidecar.url, "no-room")
    finally:
        sidecar.terminate()
    assert status == 502, record
    _, job = record, None
    assert _lines(desk["mcp_ledger"], title="F-1") == []  # the MCP tool never ran
    assert _lines(desk["tool_ledger"], term="F-2") == []
    terminal = events[-1]
    assert terminal["event"] == "failed"
    assert terminal["data"]["error"]["exception"] == "EffectNotJournaled"
    assert terminal["data"].get("uncertain_outcome") is not True  # certain: nothing ran
    assert not any(e["event"] == "tool_call_started" for e in events)
    assert summarize_effects(events).in_doubt == []
    del job


def test_a_sidecar_killed_by_the_tool_body_already_holds_its_start(
        desk: dict[str, Any]) -> None:
    """Write-ahead with a real SIGKILL: the sidecar is stopped (SIGSTOP, 1 s) just before the
    tool's start is sent, and the tool's body kills it (and its worker) at once, so only what
    was committed before the body ran survives. Fails when the worker runs the tool without
    waiting for the start's ``effect_ack`` (the body then kills a sidecar that has not
    read the start yet)."""
    pid_file = desk["tmp"] / "sidecar.pid"
    env = {**desk["env"], "CREWFENCE_TEST_SIDECAR_PID_FILE": str(pid_file)}
    first = SidecarProcess([], env, desk["tmp"] / "first.log").start().wait_listening()
    try:
        assert first.proc is not None
        pid_file.write_text(str(first.proc.pid))
        body = {"crew_id": "wire", "action_id": "tripped", "operation": "run",
                "input": {"request": '[[tool:tripwire {"note": "W-1"}]]'}}
        status, _ = json_call(f"{first.url}/jobs", "POST", body, headers("key-trip", async_=True))
        assert status == 202
        assert first.wait_exit(120) == -signal.SIGKILL
    finally:
        first.kill()
    seen = _lines(desk["tool_ledger"], tool="kill_sidecar", note="W-1")
    assert len(seen) == 1  # the body ran (and killed the sidecar)
    second = SidecarProcess([], desk["env"], desk["tmp"] / "second.log").start()
    try:
        second.wait_listening()
        _, record = json_call(f"{second.url}/jobs/tripped")
        events = _events(second.url, "tripped")
    finally:
        second.terminate()
    assert record["status"] == "failed" and record["uncertain_outcome"] is True
    started = [e["data"] for e in events if e["event"] == "tool_call_started"]
    assert [(s["tool"], s["idempotency_key"]) for s in started] == [("tripwire", seen[0]["key"])]
    summary = summarize_effects(events)
    assert [c.idempotency_key for c in summary.in_doubt] == [seen[0]["key"]]
    # the model call that chose the tool was journaled in the same commit as its start
    assert [e["event"] for e in events][-3:-1] == ["model_call", "tool_call_started"]


def test_a_tool_that_raises_is_a_finished_call_with_its_error(desk: dict[str, Any]) -> None:
    sidecar = SidecarProcess([], desk["env"], desk["tmp"] / "sidecar.log").start()
    try:
        sidecar.wait_listening()
        status, record = _start(
            sidecar.url, "raises",
            '[[tool:explode {"reason": "E-1"}]] [[tool:tickets/reject_ticket {"title": "E-2"}]]'
            ' [[tool:lookup {"term": "E-3"}]]', async_=True)
        assert status == 202
        wait_until(lambda: json_call(f"{sidecar.url}/jobs/raises")[1]["status"] != "running", 120,
                   "the job to end")
        _, record = json_call(f"{sidecar.url}/jobs/raises")
        events = _events(sidecar.url, "raises")
    finally:
        sidecar.terminate()
    assert record["status"] == "completed", record  # crewai hands the errors to the model
    finished = [e["data"] for e in events if e["event"] == "tool_call_finished"]
    assert [f["tool"] for f in finished] == ["explode", "tickets/reject_ticket", "lookup"]
    assert finished[0]["error"] == "LookupError" and finished[0]["result_sha256"] is None
    assert "tickets refused E-2" in finished[1]["error"]
    assert len(finished[1]["error"]) <= 200
    assert finished[2]["error"] is None
    assert len(_lines(desk["tool_ledger"], tool="explode", reason="E-1")) == 1
    summary = summarize_effects(events)
    assert summary.tool_calls == 3 and summary.in_doubt == []


def test_an_agent_naming_an_unknown_tool_stops_the_sidecar_at_start(
        desk: dict[str, Any], mcp_server: tuple[str, Path]) -> None:
    crews = desk["tmp"] / "bad-crews.yaml"
    crews.write_text(_crews_yaml(mcp_server[0]).replace("tools: [tickets, lookup, explode]",
                                                        "tools: [tickets, lookup, shredder]"))
    line = refused_start(desk["tmp"], {**desk["env"], "CREWFENCE_CREWS_FILE": str(crews)})
    assert "crew 'desk'" in line and "unknown tool 'shredder'" in line


def _listed_crews(url: str, down_url: str) -> str:
    """Crews whose agents name ``server/tool`` on servers without ``allowedTools``."""
    def crew(tools: str, server: str = "tickets", at: str = url) -> str:
        return f"""\
    tools:
      mcpServers: [{{name: {server}, url: "{at}"}}]
    agents:
      clerk: {{role: Clerk, goal: File what is asked, backstory: Careful., max_retry_limit: 0,
              tools: [{tools}]}}
    tasks:
      - {{name: file, agent: clerk, description: "Handle: {{request}}", expected_output: A note}}
"""
    return ("crews:\n  nope:\n" + crew("tickets/create_ticket, tickets/nope")
            + "  late:\n" + crew("tickets/late_ticket")
            + "  offered:\n" + crew("tickets/create_ticket")
            + "  down:\n" + crew("down/create_ticket", "down", down_url))


@pytest.fixture
def down_url() -> Iterator[str]:
    """An MCP URL refused for as long as the test runs: its port is held by a socket bound
    WITHOUT SO_REUSEADDR that never listens, so no other process can bind the port meanwhile
    (``reserved_port``'s SO_REUSEADDR would still let in a server that binds it with
    SO_REUSEADDR, as aiohttp and uvicorn do, and "down" would then answer)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}/mcp"


@pytest.fixture
def listed(desk: dict[str, Any], mcp_server: tuple[str, Path],
           down_url: str) -> Iterator[dict[str, Any]]:
    """A sidecar hosting :func:`_listed_crews`; ``lists()`` counts the ``tools/list`` calls
    its main process made to the MCP server (the workers' crewai client is not counted)."""
    crews = desk["tmp"] / "listed.yaml"
    crews.write_text(_listed_crews(mcp_server[0], down_url))
    lists_file = Path(f"{mcp_server[1]}.lists")
    late = Path(f"{mcp_server[1]}.late")
    late.unlink(missing_ok=True)

    def lists() -> int:
        return len(_lines(lists_file, client="crewfence-sidecar"))

    before = lists()
    sidecar = SidecarProcess([], {**desk["env"], "CREWFENCE_CREWS_FILE": str(crews)},
                             desk["tmp"] / "sidecar.log").start()
    try:
        sidecar.wait_listening()
        yield {"url": sidecar.url, "lists": lists, "before": before, "late": late}
    finally:
        sidecar.terminate()
        late.unlink(missing_ok=True)


def _start_crew(url: str, crew_id: str, action_id: str, request: str) -> tuple[int, Any]:
    body = {"crew_id": crew_id, "action_id": action_id, "operation": "run",
            "input": {"request": request}}
    return json_call(f"{url}/jobs", "POST", body, headers(f"key-{action_id}"))


def test_a_tool_the_server_does_not_offer_is_refused_at_admission_naming_it(
        listed: dict[str, Any], desk: dict[str, Any]) -> None:
    """A server without allowedTools lacking a named tool: 422 on a fresh tools/list,
    naming crew, agent, server, tool and what the server offers; nothing is journaled."""
    status, answer = _start_crew(listed["url"], "nope", "nope-1", _ticket("N-1"))
    assert status == 422, answer
    error = answer["error"]
    assert error["code"] == "unknown_tool" and error["tools"] == ["tickets/nope"], error
    for part in ("crew 'nope'", "agent 'clerk'", "MCP server 'tickets'", "tool 'nope'",
                 "offers: create_ticket, reject_ticket"):
        assert part in error["message"], error
    assert json_call(f"{listed['url']}/jobs/nope-1")[0] == 404  # not journaled
    assert _start_crew(listed["url"], "nope", "nope-1", _ticket("N-1"))[0] == 422  # again
    assert _lines(desk["mcp_ledger"], title="N-1") == []


def test_a_cached_tool_is_admitted_without_listing_again(listed: dict[str, Any]) -> None:
    """The background fill lists the server once; admissions of a cached name then never
    list it again (the hit path does no network)."""
    def answered() -> float:
        req = urllib.request.Request(f"{listed['url']}/metrics", headers=headers(None))
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
        name = 'crewfence_sidecar_tool_lists_total{outcome="answered"}'
        return metric_value(text, name) if name in text else 0.0

    wait_until(lambda: answered() == 1, 60, "the background tools/list to be answered")
    assert listed["lists"]() == listed["before"] + 1
    for action_id in ("offered-1", "offered-2"):
        status, answer = _start_crew(listed["url"], "offered", action_id, _ticket(action_id))
        assert status == 200, answer  # completed (2xx only for a completed record)
    assert listed["lists"]() == listed["before"] + 1 and answered() == 1


def test_a_tool_the_server_gained_after_the_cache_filled_is_admitted(
        listed: dict[str, Any], desk: dict[str, Any]) -> None:
    """The cache lacks the tool, the fresh list has it: admitted (a refusal rests only on a
    fresh answer); an admitted action re-posted returns its record."""
    request = '[[tool:tickets/late_ticket {"title": "L-1"}]]'
    status, answer = _start_crew(listed["url"], "late", "late-0", request)
    assert status == 422 and "tool 'late_ticket'" in answer["error"]["message"], answer
    listed["late"].touch()  # the server gains the tool
    status, answer = _start_crew(listed["url"], "late", "late-1", request)
    assert status == 200, answer  # completed
    finished = [e["data"] for e in _events(listed["url"], "late-1")
                if e["event"] == "tool_call_finished"]
    assert [f["tool"] for f in finished] == ["tickets/late_ticket"], finished
    listed["late"].unlink()
    status, again = _start_crew(listed["url"], "late", "late-1", request)
    assert (status, again) == (200, answer)  # the admitted action's record, not re-checked


def test_an_unreachable_server_admits_and_the_job_fails_certain_and_named(
        listed: dict[str, Any]) -> None:
    """A server that does not answer tools/list within the bound is not decided at
    admission: the job is admitted and its tool build fails it certain,
    ``tool_unavailable``, the message naming the server."""
    status, answer = _start_crew(listed["url"], "down", "down-1",
                                 '[[tool:down/create_ticket {"title": "D-1"}]]')
    events = _events(listed["url"], "down-1")
    assert status == 502, answer
    error = answer["record"]["error"]
    assert error["code"] == "tool_unavailable" and error["exception"] == "MCPToolError"
    assert "MCP server 'down': tools/list failed" in error["message"], error
    assert answer["record"]["uncertain_outcome"] is False
    assert [e["event"] for e in events] == ["started", "failed"]


def test_a_python_ref_that_does_not_import_stops_the_sidecar_at_start_naming_it(
        desk: dict[str, Any], mcp_server: tuple[str, Path]) -> None:
    crews = desk["tmp"] / "noref.yaml"
    crews.write_text(_crews_yaml(mcp_server[0]).replace('ref: "ledger_tools:lookup"',
                                                        'ref: "ledger_tools:nothere"'))
    line = refused_start(desk["tmp"], {**desk["env"], "CREWFENCE_CREWS_FILE": str(crews)})
    assert "crew 'desk'" in line and "ref 'ledger_tools:nothere'" in line, line


def test_a_registry_crew_using_crewais_mcp_dsl_is_journaled_and_sends_the_key(
        desk: dict[str, Any]) -> None:
    from crewai.mcp.tool_resolver import MCPToolResolver

    # crewai names the tools of `mcps=[MCPServerHTTP(url)]` after the URL
    name = MCPToolResolver._extract_server_name(desk["mcp_url"]) + "_create_ticket"
    sidecar = SidecarProcess([], desk["env"], desk["tmp"] / "sidecar.log").start()
    try:
        sidecar.wait_listening()
        body = {"crew_id": "registry-mcp", "action_id": "reg-mcp", "operation": "run",
                "input": {"request": f'[[tool:{name} {{"title": "R-1"}}]]'}}
        status, _ = json_call(f"{sidecar.url}/jobs", "POST", body, headers("key-reg-mcp"))
        assert status == 200
        events = _events(sidecar.url, "reg-mcp")
    finally:
        sidecar.terminate()
    started = [e["data"] for e in events if e["event"] == "tool_call_started"]
    finished = [e["data"] for e in events if e["event"] == "tool_call_finished"]
    assert len(started) == 1 and len(finished) == 1
    assert finished[0]["idempotency_key"] == started[0]["idempotency_key"]
    seen = _lines(desk["mcp_ledger"], title="R-1")
    assert len(seen) == 1
    assert seen[0]["meta_key"] == started[0]["idempotency_key"]  # _meta reaches crewai's tools
    # crewai 1.15.30's own MCPNativeTool._run reports this call as failed although the
    # server did it (its HTTP teardown re-raises the "no running event loop" RuntimeError it
    # chained while choosing asyncio.run); crewfence's own MCP tools avoid that (mcp_tools)
    assert finished[0]["error"] == "RuntimeError"
