"""Tools in crews and the effect ledger in one process: declarative tool definitions, the
offline LLM's ``[[tool:NAME {args}]]`` marker, and the in-process execution path (the
runtime's executor without workers) journaling every tool call write-ahead. The worker
path and MCP servers are covered by tests/component/sidecar/test_tool_ledger.py."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

SUPPORT = Path(__file__).resolve().parents[2] / "support"
sys.path.insert(0, str(SUPPORT))

from crewfence_sidecar.contract import (  # noqa: E402
    Operation,
    StartRequest,
    summarize_effects,
    tool_idempotency_key,
)
from crewfence_sidecar.declarative import DefinitionError, parse_crew  # noqa: E402
from crewfence_sidecar.offline_llm import next_tool_call, tool_markers  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}},
         {"type": "function", "function": {"name": "tickets_create_ticket", "parameters": {}}}]


def _agent(tools: list[str]) -> dict[str, Any]:
    return {"role": "Clerk", "goal": "File", "backstory": "Careful.", "tools": tools}


def _crew(tools: dict[str, Any], agent_tools: list[str]) -> dict[str, Any]:
    return {"tools": tools, "agents": {"clerk": _agent(agent_tools)},
            "tasks": [{"name": "file", "agent": "clerk", "description": "File {request}",
                       "expected_output": "A note"}]}


PY = {"python": [{"name": "lookup", "ref": "ledger_tools:lookup"}]}
MCP = {"mcpServers": [{"name": "tickets", "url": "http://127.0.0.1:9/mcp",
                       "allowedTools": ["create_ticket"]}]}


# --- the offline LLM's tool marker ------------------------------------------------------------
def test_markers_are_called_in_order_each_once() -> None:
    prompt = ('File [[tool:lookup {"term": "a"}]] and [[tool:tickets/create_ticket '
              '{"title": "b", "tags": {"x": [1]}}]] now')
    messages: list[Any] = [{"role": "system", "content": "You are a clerk."},
                           {"role": "user", "content": prompt}]
    first = next_tool_call(messages, TOOLS)
    assert first is not None
    assert first["function"]["name"] == "lookup"
    assert json.loads(first["function"]["arguments"]) == {"term": "a"}
    messages += [{"role": "assistant", "content": None, "tool_calls": [first]},
                 {"role": "tool", "tool_call_id": first["id"], "content": "ok"}]
    second = next_tool_call(messages, TOOLS)
    assert second is not None
    assert second["function"]["name"] == "tickets_create_ticket"  # the sanitised spelling
    assert json.loads(second["function"]["arguments"]) == {"title": "b", "tags": {"x": [1]}}
    messages += [{"role": "assistant", "content": None, "tool_calls": [second]},
                 {"role": "tool", "tool_call_id": second["id"], "content": "ok"}]
    assert next_tool_call(messages, TOOLS) is None  # all called: the agent answers


def test_markers_need_tools_and_come_from_the_first_message_that_has_them() -> None:
    text = "[[tool:lookup]]"
    assert next_tool_call([{"role": "user", "content": text}], None) is None
    assert tool_markers([{"role": "system", "content": text},
                         {"role": "user", "content": text + " [[tool:lookup]]"}]) == [
        ("lookup", {})]


def test_the_marker_is_not_echoed_into_the_answer() -> None:
    from crewfence_sidecar.offline_llm import OfflineLLM

    answer = OfflineLLM().call('Current Task: file [[tool:lookup {"term": "z"}]] it\n\n')
    assert "[[tool" not in answer and "file it" in answer


# --- definitions ---------------------------------------------------------------------------------
def test_an_unknown_tool_is_a_definition_error_naming_it() -> None:
    with pytest.raises(DefinitionError, match=r"agents\.clerk\.tools: unknown tool 'nope'"):
        parse_crew("desk", _crew(PY, ["lookup", "nope"]))
    with pytest.raises(DefinitionError, match=r"unknown tool 'tickets/close_ticket'"):
        parse_crew("desk", _crew(MCP, ["tickets/close_ticket"]))
    with pytest.raises(DefinitionError, match=r"unknown tool 'crm/create'"):
        parse_crew("desk", _crew(MCP, ["crm/create"]))


def test_tool_definitions_are_checked() -> None:
    with pytest.raises(DefinitionError, match=r"tools.python\[0\]: ref 'nowhere:thing'"):
        parse_crew("desk", _crew({"python": [{"name": "x", "ref": "nowhere:thing"}]}, ["x"]))
    with pytest.raises(DefinitionError, match=r"transport must be one of"):
        parse_crew("desk", _crew({"mcpServers": [{"name": "t", "url": "http://h/mcp",
                                                  "transport": "stdio"}]}, ["t"]))
    with pytest.raises(DefinitionError, match=r"'lookup' is not unique"):
        parse_crew("desk", _crew({**PY, "mcpServers": [{"name": "lookup",
                                                        "url": "http://h/mcp"}]}, ["lookup"]))
    with pytest.raises(DefinitionError, match=r"unknown field\(s\) command"):
        parse_crew("desk", _crew({"mcpServers": [{"name": "t", "url": "http://h/mcp",
                                                  "command": "sh"}]}, ["t"]))


def test_headers_come_from_the_operators_secret_directory(tmp_path: Path) -> None:
    """The operator renders ``headersDir`` (a mounted Secret: one file per header). Its own
    ``..data`` entries are skipped; a value never appears in an error."""
    from crewfence_sidecar.tools.mcp_servers import MCPToolError, read_headers_dir

    (tmp_path / "Authorization").write_text("Bearer s3cret\n")
    (tmp_path / "X-Team").write_text("blue")
    (tmp_path / "..data").mkdir()
    (tmp_path / "..2026_12_01").write_text("ignored")
    assert read_headers_dir(tmp_path) == {"Authorization": "Bearer s3cret", "X-Team": "blue"}
    definition = parse_crew("desk", _crew({"mcpServers": [{
        "name": "tickets", "url": "http://h/mcp", "headersDir": str(tmp_path)}]}, ["tickets"]))
    assert definition is not None
    (tmp_path / "X-Bad").write_text("two\nlines")
    with pytest.raises(MCPToolError) as err:
        read_headers_dir(tmp_path)
    assert "X-Bad" in str(err.value) and "two" not in str(err.value)
    with pytest.raises(MCPToolError, match="cannot read headers directory"):
        read_headers_dir(tmp_path / "missing")


def test_an_unreachable_mcp_server_fails_the_build_naming_it() -> None:
    from crewfence_sidecar.tools.mcp_servers import MCPToolError

    definition = parse_crew("desk", _crew(MCP, ["tickets/create_ticket"]))
    with pytest.raises(MCPToolError, match="MCP server 'tickets'"):
        definition.build()


def test_a_python_tool_is_known_by_its_declared_name() -> None:
    crew = parse_crew("desk", _crew(
        {"python": [{"name": "glossary", "ref": "ledger_tools:lookup"},
                    {"name": "boom", "ref": "ledger_tools:ExplodingTool"}]},
        ["glossary", "boom"])).build()
    assert [t.name for t in crew.agents[0].tools] == ["glossary", "boom"]


# --- the in-process execution path ----------------------------------------------------------------
def _runtime(catalog: Any, max_events: int = 10_000) -> Any:
    from crewfence_sidecar.journal import Journal, JournalLimits
    from crewfence_sidecar.metrics import SidecarMetrics
    from crewfence_sidecar.runtime import Runtime, RuntimeSettings
    from crewfence_sidecar.server import crewai_executor

    journal = Journal.open(None, JournalLimits(max_events_per_run=max_events))
    return Runtime(journal, catalog, RuntimeSettings(allowed_operations=frozenset(Operation)),
                   crewai_executor(catalog), SidecarMetrics())


async def _run(runtime: Any, crew_id: str, action_id: str, request: str) -> Any:
    req = StartRequest(crew_id=crew_id, action_id=action_id, operation=Operation.RUN,
                       input={"request": request})
    await runtime.admit(req, f"key-{action_id}")
    assert await runtime.wait_terminal(action_id, 120)
    return runtime.journal.get(action_id), runtime.events(action_id, 0, 1000)


@pytest.fixture
def tool_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tools.jsonl"
    monkeypatch.setenv("CREWFENCE_TEST_TOOL_LEDGER", str(path))
    return path


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _catalog(tmp_path: Path) -> Any:
    from crewfence_sidecar.crews import CrewCatalog

    crews = tmp_path / "crews.yaml"
    crews.write_text(json.dumps({"crews": {"desk": _crew(
        {"python": [{"name": "lookup", "ref": "ledger_tools:lookup"}]}, ["lookup"])}}))
    return CrewCatalog.load("ledger_tools:REGISTRY", crews)


async def test_in_process_jobs_journal_tool_calls_with_the_keys_the_tools_saw(
        tmp_path: Path, tool_ledger: Path) -> None:
    runtime = _runtime(_catalog(tmp_path))
    try:
        record, events = await _run(runtime, "desk", "ip-1",
                                    '[[tool:lookup {"term": "a"}]] [[tool:lookup {"term": "b"}]]')
        registry_record, registry_events = await _run(
            runtime, "registry-desk", "ip-2", '[[tool:stamp {"note": "n"}]]')
    finally:
        await runtime.close()
    assert record.status.value == "completed"
    started = [e.data for e in events if e.event == "tool_call_started"]
    assert [s["idempotency_key"] for s in started] == [
        tool_idempotency_key("ip-1", 0, 0), tool_idempotency_key("ip-1", 0, 1)]
    ran = _lines(tool_ledger)
    assert [(r["tool"], r["key"]) for r in ran[:2]] == [
        ("lookup", s["idempotency_key"]) for s in started]
    # the registry crew's tool is journaled too
    assert registry_record.status.value == "completed"
    assert [e.data["tool"] for e in registry_events if e.event == "tool_call_started"] == [
        "stamp"]
    assert ran[2]["tool"] == "stamp" and ran[2]["key"] == tool_idempotency_key("ip-2", 0, 0)
    assert summarize_effects(e.to_wire() for e in registry_events).tool_calls == 1


async def test_in_process_a_tool_whose_start_cannot_be_journaled_never_runs(
        tmp_path: Path, tool_ledger: Path) -> None:
    runtime = _runtime(_catalog(tmp_path), max_events=4)
    try:
        record, events = await _run(runtime, "desk", "ip-full", '[[tool:lookup {"term": "a"}]]')
    finally:
        await runtime.close()
    assert record.status.value == "failed" and record.uncertain_outcome is False
    assert record.error["exception"] == "EffectNotJournaled"
    assert _lines(tool_ledger) == []
    assert not any(e.event == "tool_call_started" for e in events)


async def test_in_process_a_ledger_error_before_the_start_refuses_the_call(
        tmp_path: Path, tool_ledger: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed: crewai runs a tool whose pre-tool hook raised anything but HookAborted,
    so the ledger's own error before the start is journaled must refuse the call."""
    from crewfence_sidecar.tools import ledger

    def unhashable(_arguments: Any) -> str:
        raise RuntimeError("cannot hash")

    monkeypatch.setattr(ledger, "arguments_sha256", unhashable)
    runtime = _runtime(_catalog(tmp_path))
    try:
        record, events = await _run(runtime, "desk", "ip-err", '[[tool:lookup {"term": "a"}]]')
    finally:
        await runtime.close()
    assert _lines(tool_ledger) == []
    assert record.status.value == "failed" and record.uncertain_outcome is False
    assert record.error["exception"] == "EffectNotJournaled"
    assert not any(e.event == "tool_call_started" for e in events)


def test_the_python_accessor_is_none_outside_a_tool_call() -> None:
    from crewfence_sidecar.tool_context import current_idempotency_key, idempotency_key

    assert current_idempotency_key() is None
    with idempotency_key("cfk1-x"):
        assert asyncio.run(asyncio.to_thread(current_idempotency_key)) == "cfk1-x"
    assert current_idempotency_key() is None
