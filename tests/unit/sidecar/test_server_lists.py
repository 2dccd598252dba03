"""Admission's check of ``server/tool`` names only their MCP server can decide
(``tools.server_lists``) with an in-test lister; the real MCP client and server are
exercised in tests/component/sidecar/test_tool_ledger.py."""

from __future__ import annotations

import asyncio

import pytest
from crewfence_sidecar.contract import ContractError, Operation, StartRequest
from crewfence_sidecar.journal import Journal
from crewfence_sidecar.metrics import SidecarMetrics
from crewfence_sidecar.runtime import Draining, JobContext, Runtime, RuntimeSettings
from crewfence_sidecar.tools.mcp_servers import MCPServerDefinition
from crewfence_sidecar.tools.server_lists import ListedToolRef, ServerToolLists

TICKETS = MCPServerDefinition(name="tickets", url="http://tickets.invalid/mcp")


class Lister:
    """Answers ``offered`` (or raises TimeoutError when None); counts the lists; waits for
    ``gate`` when one is set."""

    def __init__(self, *offered: str) -> None:
        self.offered: frozenset[str] | None = frozenset(offered)
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.waiting = asyncio.Event()

    async def __call__(self, server: MCPServerDefinition, timeout: float) -> frozenset[str]:
        self.calls += 1
        if self.gate is not None:
            self.waiting.set()
            await self.gate.wait()
        if self.offered is None:
            raise TimeoutError
        return self.offered


def _lists(lister: Lister, *tools: str, outcomes: list[str] | None = None) -> ServerToolLists:
    refs = [ListedToolRef("crew", "clerk", TICKETS, t) for t in tools]
    return ServerToolLists({"crew": refs}, lister=lister,
                           on_list=outcomes.append if outcomes is not None else None)


async def test_a_cached_name_is_admitted_without_listing() -> None:
    lister = Lister("create_ticket")
    lists = _lists(lister, "create_ticket")
    lists.start()
    await lists.settled()
    assert lister.calls == 1 and lists.misses("crew") == []
    for _ in range(3):
        await lists.check("crew")
    assert lister.calls == 1


async def test_a_name_the_fresh_answer_lacks_is_422_naming_it() -> None:
    lister = Lister("create_ticket", "reject_ticket")
    with pytest.raises(ContractError) as err:
        await _lists(lister, "create_ticket", "nope").check("crew")
    assert err.value.status == 422 and err.value.code == "unknown_tool"
    assert err.value.extra == {"tools": ["tickets/nope"]}
    assert err.value.message == (
        "crew 'crew': unknown tool(s): agent 'clerk': MCP server 'tickets' does not offer "
        "tool 'nope' (tools/list now offers: create_ticket, reject_ticket)")
    assert lister.calls == 1  # one fresh list for the server, whatever its names


async def test_a_refusal_rests_on_a_fresh_answer_so_a_gained_tool_is_admitted() -> None:
    lister = Lister("create_ticket")
    lists = _lists(lister, "late_ticket")
    with pytest.raises(ContractError):
        await lists.check("crew")
    lister.offered = frozenset({"create_ticket", "late_ticket"})  # the server gains it
    await lists.check("crew")
    assert lister.calls == 2 and lists.misses("crew") == []


async def test_a_server_that_does_not_answer_is_not_decided() -> None:
    lister, outcomes = Lister(), []
    lister.offered = None
    lists = _lists(lister, "nope", outcomes=outcomes)
    await lists.check("crew")  # admitted: the worker's tool build decides
    assert outcomes == ["unanswered"] and lists.misses("crew") != []


class Crews:
    def __contains__(self, crew_id: object) -> bool:
        return crew_id == "crew"

    def crew_ids(self) -> list[str]:
        return ["crew"]


async def _done(ctx: JobContext) -> dict[str, bool]:
    return {"done": True}


def _runtime(journal: Journal, lists: ServerToolLists) -> Runtime:
    return Runtime(journal, Crews(), RuntimeSettings(allowed_operations=frozenset(Operation)),
                   _done, SidecarMetrics(), tool_lists=lists)


def _req(action_id: str) -> StartRequest:
    return StartRequest("crew", action_id, Operation.RUN, {})


async def test_admission_refuses_journals_nothing_and_an_admitted_repeat_is_not_rechecked(
        journal: Journal) -> None:
    lister = Lister("late_ticket")
    runtime = _runtime(journal, _lists(lister, "late_ticket"))
    admitted = await runtime.admit(_req("a"), "k")
    assert admitted.created and await runtime.wait_terminal("a", 10)
    lister.offered = frozenset()  # the server drops the tool: the cache still admits
    runtime.tool_lists = _lists(lister, "late_ticket")  # a cold cache: a fresh list refuses
    calls = lister.calls
    repeat = await runtime.admit(_req("a"), "k")
    assert not repeat.created and lister.calls == calls  # the record, no list
    with pytest.raises(ContractError) as err:
        await runtime.admit(_req("b"), "k")
    assert err.value.code == "unknown_tool"
    assert journal.get("b") is None


async def test_the_draining_switch_set_during_the_fresh_list_is_honoured(
        journal: Journal) -> None:
    lister = Lister("create_ticket")
    lister.gate = asyncio.Event()
    runtime = _runtime(journal, _lists(lister, "create_ticket"))
    admission = asyncio.create_task(runtime.admit(_req("a"), "k"))
    await lister.waiting.wait()
    runtime.set_draining(True)
    lister.gate.set()
    with pytest.raises(Draining):
        await admission
    assert journal.get("a") is None
