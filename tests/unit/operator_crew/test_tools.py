"""spec.tools: parsing, the crews file, header Secrets as read-only files, ToolsReady.

The API server's CEL refusal of unknown tool names is checked for real in
tests/e2e/test_crew_tools.py; here the operator's own copy of that rule and the CRD's shape.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from crewfence_operator import constants as c
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.pod import PodSettings, replica_pod
from crewfence_operator.crew.resources import crews_configmap, render_crews_file
from crewfence_operator.crew.spec import SpecError, parse_spec
from crewfence_operator.crew.status import CrewObservation, crew_status
from crewfence_operator.crew.tool_servers import (
    REASON_NONE,
    REASON_REACHABLE,
    REASON_UNREACHABLE,
    decide,
    probe,
)
from crewfence_operator.crew.tools import HEADERS_MODE, headers_dir, parse_tools

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "crew-tools.yaml"
SECRET_VALUE = "Bearer s3cr3t-header-value"


def example_crew() -> dict[str, Any]:
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    return next(d for d in docs if d["kind"] == "Crew")


def spec_with(tools: dict[str, Any], agent_tools: list[str]) -> dict[str, Any]:
    return {"tools": tools,
            "agents": {"clerk": {"role": "Clerk", "goal": "g", "backstory": "b",
                                 "tools": agent_tools}},
            "tasks": [{"name": "file", "agent": "clerk", "description": "d",
                       "expected_output": "o"}]}


TICKETS = {"mcpServers": [{"name": "tickets", "url": "http://t:8000/mcp",
                           "headersFrom": {"secretRef": {"name": "tickets-mcp"}},
                           "allowedTools": ["create_ticket"]},
                          {"name": "search", "url": "http://s:8000/sse", "transport": "sse"}],
           "python": [{"name": "lookup", "ref": "mypkg.tools:lookup"}]}


# --- the operator's copy of the CEL rule ----------------------------------------------------------
@pytest.mark.parametrize("refs", [["tickets/create_ticket"], ["tickets"], ["lookup"],
                                  ["search/anything", "search", "lookup"]])
def test_tools_that_resolve_are_accepted(refs: list[str]) -> None:
    assert parse_spec(spec_with(TICKETS, refs)).tools.server("tickets") is not None


@pytest.mark.parametrize(("refs", "named"), [
    (["nosuch/create_ticket"], "agent clerk names nosuch/create_ticket"),
    (["tickets/delete_ticket"], "agent clerk names tickets/delete_ticket"),  # not allowed
    (["lookupp"], "agent clerk names lookupp"),
])
def test_an_agent_naming_an_undefined_tool_is_refused_by_name(refs: list[str],
                                                              named: str) -> None:
    with pytest.raises(SpecError, match="unknown tool") as err:
        parse_spec(spec_with(TICKETS, refs))
    assert named in str(err.value)


def test_tools_without_a_tools_section_are_refused() -> None:
    with pytest.raises(SpecError, match="agent clerk names lookup"):
        parse_spec(spec_with({}, ["lookup"]))


def test_transport_defaults_to_streamable_http() -> None:
    tools = parse_tools(TICKETS)
    assert [s.transport for s in tools.mcp_servers] == ["streamable-http", "sse"]
    assert tools.mcp_servers[1].allowed_tools is None  # "all the server's tools"


# --- rendering --------------------------------------------------------------------------------
@pytest.fixture
def crew() -> CrewRef:
    return CrewRef(name="desk", namespace="team-a", uid="u-1")


def test_the_crews_file_carries_tools_as_the_sidecar_reads_them(crew: CrewRef) -> None:
    spec = parse_spec(spec_with(TICKETS, ["tickets/create_ticket", "lookup"]))
    definition = yaml.safe_load(render_crews_file(crew, spec))["crews"]["desk"]
    assert definition["tools"] == {
        "mcpServers": [
            {"name": "tickets", "url": "http://t:8000/mcp", "transport": "streamable-http",
             "headersDir": headers_dir("tickets"), "allowedTools": ["create_ticket"]},
            {"name": "search", "url": "http://s:8000/sse", "transport": "sse"},
        ],
        "python": [{"name": "lookup", "ref": "mypkg.tools:lookup"}],
    }
    assert definition["agents"]["clerk"]["tools"] == ["tickets/create_ticket", "lookup"]


def test_a_crew_without_tools_renders_no_tools_key(crew: CrewRef) -> None:
    spec = parse_spec(spec_with({}, []))
    assert "tools" not in yaml.safe_load(render_crews_file(crew, spec))["crews"]["desk"]


@pytest.mark.parametrize("sidecar_tls", [False, True])
def test_header_secrets_are_read_only_files_never_env_or_crews_file(
        crew: CrewRef, sidecar_tls: bool) -> None:
    spec = parse_spec(example_crew()["spec"])
    pod = replica_pod(crew, spec, 0, PodSettings(sidecar_tls=sidecar_tls))
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["tool-headers-tickets"] == {
        "name": "tool-headers-tickets",
        "secret": {"secretName": "tickets-mcp", "defaultMode": 0o400}}
    assert HEADERS_MODE == 0o400  # as the credentials volume (crew/credentials.py)
    (container,) = pod["spec"]["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["tool-headers-tickets"] == {"name": "tool-headers-tickets",
                                              "mountPath": headers_dir("tickets"),
                                              "readOnly": True}
    env_text = yaml.safe_dump(container["env"])
    assert "tickets-mcp" not in env_text  # no secretKeyRef to the header Secret
    rendered = crews_configmap(crew, spec)["data"][c.CREWS_FILE_KEY]
    assert "tickets-mcp" not in rendered and "Authorization" not in rendered
    assert SECRET_VALUE not in yaml.safe_dump(pod)


def test_changing_a_servers_url_rolls_the_pods(crew: CrewRef) -> None:
    from crewfence_operator.crew.children import desired_hash

    raw = example_crew()["spec"]
    before = desired_hash(crew, parse_spec(raw), 0, PodSettings())
    raw["tools"]["mcpServers"][0]["url"] = "http://elsewhere:8000/mcp"
    assert desired_hash(crew, parse_spec(raw), 0, PodSettings()) != before


# --- ToolsReady -------------------------------------------------------------------------------
def test_tools_ready_names_every_unreachable_server() -> None:
    tools = parse_tools(TICKETS)
    verdict = decide(tools, {"tickets": "connection failed: ConnectionRefusedError",
                             "search": None})
    assert (verdict.status, verdict.reason) == (False, REASON_UNREACHABLE)
    assert "tickets (connection failed" in verdict.message and "search" not in verdict.message
    ok = decide(tools, {"tickets": None, "search": None})
    assert (ok.status, ok.reason) == (True, REASON_REACHABLE)
    assert decide(tools, {"tickets": None}).status is False  # an unchecked server is not ready
    none = decide(parse_tools({"python": [{"name": "x", "ref": "m:x"}]}), {})
    assert (none.status, none.reason) == (True, REASON_NONE)


def test_tools_ready_is_a_crew_condition() -> None:
    verdict = decide(parse_tools(TICKETS), {"tickets": "no answer within 2s", "search": None})
    status = crew_status(CrewObservation(generation=1, desired_replicas=0, replicas=[],
                                         retained_claims=[], previous_conditions=[],
                                         tools=verdict), now="2026-12-01T00:00:00Z")
    cond = next(x for x in status["conditions"] if x["type"] == c.COND_TOOLS_READY)
    assert (cond["status"], cond["reason"]) == ("False", REASON_UNREACHABLE)
    assert "tickets (no answer within 2s)" in cond["message"]


@pytest.fixture
def refused_url() -> Iterator[str]:
    """Refused for as long as the test runs: a port held bound, never listening, without
    SO_REUSEADDR (so no other process can bind it and answer there meanwhile)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}/mcp"


@pytest.fixture
async def http_server() -> AsyncIterator[str]:
    async def not_allowed(_: web.Request) -> web.Response:
        return web.Response(status=405)  # what an MCP endpoint may say to a bare GET

    app = web.Application()
    app.router.add_get("/mcp", not_allowed)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/mcp"
    await runner.cleanup()


@pytest.fixture
async def silent_server() -> AsyncIterator[str]:
    """Accepts connections and never answers (a hung server)."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/mcp"
    server.close()


async def test_probe_any_http_answer_is_reachable_refused_and_silent_are_not(
        http_server: str, silent_server: str, refused_url: str) -> None:
    tools = parse_tools({"mcpServers": [
        {"name": "up", "url": http_server},
        {"name": "refused", "url": refused_url},
        {"name": "hung", "url": silent_server}]})
    loop = asyncio.get_running_loop()
    began = loop.time()
    async with aiohttp.ClientSession() as session:
        answers = await probe(session, tools, limit_seconds=0.5)
    assert loop.time() - began < 2.0  # bounded: all at once, each within its timeout
    assert answers["up"] is None
    assert answers["refused"] is not None and "connection failed" in answers["refused"]
    assert answers["hung"] == "no answer within 0.5s"


# --- the CRD -------------------------------------------------------------------------------------
def test_the_crd_declares_tools_as_the_operator_reads_them() -> None:
    from crewfence_operator.crew.tools import TRANSPORTS

    crd = yaml.safe_load((REPO / "crds" / "crew.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    servers = spec["properties"]["tools"]["properties"]["mcpServers"]
    assert servers["x-kubernetes-list-type"] == "map"  # names are unique (the API server)
    assert servers["x-kubernetes-list-map-keys"] == ["name"]
    item = servers["items"]["properties"]
    assert set(item["transport"]["enum"]) == TRANSPORTS
    assert item["transport"]["default"] == "streamable-http"
    # a server name becomes a volume name: tool-headers-<name> must stay a DNS label
    assert len(f"tool-headers-{'x' * item['name']['maxLength']}") <= 63
    agent_tools = spec["properties"]["agents"]["additionalProperties"]["properties"]["tools"]
    assert agent_tools["x-kubernetes-list-type"] == "set"
    (rule,) = [r for r in spec["x-kubernetes-validations"] if "tools" in r["rule"]]
    # The refusal names the references; format(), because + and join() over strings of
    # unbounded estimated size exceed the API server's CEL cost budget (it refuses the CRD).
    assert rule["messageExpression"].startswith("'unknown tool(s) %s of agent(s) %s")
    assert ".format([" in rule["messageExpression"]
    assert "allowedTools" in rule["rule"] and "python" in rule["rule"]


@pytest.fixture
async def counting_server() -> AsyncIterator[tuple[str, list[int]]]:
    hits: list[int] = []

    async def answer(_: web.Request) -> web.Response:
        hits.append(1)
        return web.Response(status=401)  # any HTTP answer is "reachable"

    app = web.Application()
    app.router.add_get("/mcp", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/mcp", hits
    await runner.cleanup()


async def test_servers_are_asked_at_most_every_check_interval_and_per_generation(
        counting_server: tuple[str, list[int]]) -> None:
    from crewfence_operator.crew.tool_servers import CHECK_SECONDS
    from crewfence_operator.handlers.crew import DaemonState, _check_tools

    url, hits = counting_server
    spec = parse_spec(spec_with({"mcpServers": [{"name": "up", "url": url}]}, ["up"]))
    state = DaemonState()
    async with aiohttp.ClientSession() as session:
        await _check_tools(session, state, spec, 1, 1000.0)
        await _check_tools(session, state, spec, 1, 1000.0 + CHECK_SECONDS - 1)  # not yet due
        assert len(hits) == 1 and state.tool_answers == {"up": None}
        await _check_tools(session, state, spec, 2, 1000.0 + 1)  # a new generation: at once
        assert len(hits) == 2
        await _check_tools(session, state, spec, 2, 1001.0 + CHECK_SECONDS)  # due again
        assert len(hits) == 3
