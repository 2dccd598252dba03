"""Admission's check of ``server/tool`` names on MCP servers without ``allowedTools``, in the
sidecar's main process (the ``mcp`` package's client; no crewai).

Such a name can only be decided by the server itself. The main process keeps, per server,
the tool names of its last ``tools/list`` answer (filled in the background at start and by
every fresh list), and at admission:

- every name of the crew in its server's cached list: admitted, no network (the hit path
  never waits);
- otherwise one fresh ``tools/list`` per server concerned, bounded by
  :data:`LIST_TIMEOUT_SECONDS`: a name the fresh answer lacks is refused (``422
  unknown_tool``, naming crew, agent, server, tool and what the server offers); a server
  that does not answer in time (or whose headers cannot be read) is not decided here, the
  job is admitted and its worker's tool build fails it certain as before.

Invariant: a refusal rests only on an answer received during this admission, never on the
cache, so a server that gained a tool is never refused for it. A cached list is only ever
used to admit; if it is stale (the server dropped the tool), the job fails certain in its
worker exactly as without the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from crewfence_sidecar.contract import ContractError
from crewfence_sidecar.tools.mcp_servers import MCPServerDefinition

log = logging.getLogger("crewfence.sidecar.tools")

LIST_TIMEOUT_SECONDS: Final = 2.0
"""How long an admission waits for a fresh ``tools/list`` before it admits undecided."""
UNKNOWN_TOOL: Final = "unknown_tool"
"""The error code of a ``422`` refusing a tool the server does not offer."""
CLIENT_NAME: Final = "crewfence-sidecar"
"""The ``clientInfo.name`` the main process's MCP client announces."""
MAX_OFFERED_IN_MESSAGE: Final = 50

ServerKey = tuple[str, str, str, str | None, str | None]
Lister = Callable[[MCPServerDefinition, float], Awaitable[frozenset[str]]]


@dataclass(frozen=True)
class ListedToolRef:
    """An agent's ``server/tool`` on a server without ``allowedTools``."""

    crew_id: str
    agent: str
    server: MCPServerDefinition
    tool: str

    def to_wire(self) -> dict[str, Any]:
        s = self.server
        return {"agent": self.agent, "tool": self.tool,
                "server": {"name": s.name, "url": s.url, "transport": s.transport,
                           "headers_file": s.headers_file, "headers_dir": s.headers_dir}}

    @classmethod
    def from_wire(cls, crew_id: str, raw: Mapping[str, Any]) -> ListedToolRef:
        s = raw["server"]
        return cls(crew_id=crew_id, agent=str(raw["agent"]), tool=str(raw["tool"]),
                   server=MCPServerDefinition(
                       name=str(s["name"]), url=str(s["url"]), transport=str(s["transport"]),
                       headers_file=s.get("headers_file"), headers_dir=s.get("headers_dir")))


def server_key(server: MCPServerDefinition) -> ServerKey:
    """Servers with the same address and header sources answer the same list."""
    return (server.name, server.url, server.transport, server.headers_file, server.headers_dir)


def _mcp_modules() -> tuple[Any, Any, Any, Any]:
    session = importlib.import_module("mcp")
    http = importlib.import_module("mcp.client.streamable_http")
    sse = importlib.import_module("mcp.client.sse")
    types = importlib.import_module("mcp.types")
    return session.ClientSession, http.streamablehttp_client, sse.sse_client, types


async def list_tool_names(server: MCPServerDefinition, timeout: float) -> frozenset[str]:  # noqa: ASYNC109
    """The names the server's ``tools/list`` answers (all pages), within ``timeout`` seconds
    (TimeoutError); the headers are read now, as the worker reads them (``mcp_servers``)."""
    # the first import of mcp (and reading header files) stays off the event loop
    session_cls, http_client, sse_client, types = await asyncio.to_thread(_mcp_modules)
    headers = await asyncio.to_thread(server.headers)
    info = types.Implementation(name=CLIENT_NAME, version="1")
    async with asyncio.timeout(timeout):
        if server.transport == "sse":
            transport = sse_client(server.url, headers=headers, timeout=timeout)
        else:
            transport = http_client(server.url, headers=headers, timeout=timeout)
        async with transport as streams:
            async with session_cls(streams[0], streams[1], client_info=info) as session:
                await session.initialize()
                names: set[str] = set()
                cursor: str | None = None
                while True:
                    page = await session.list_tools(cursor=cursor)
                    names.update(t.name for t in page.tools)
                    cursor = page.nextCursor
                    if not cursor:
                        return frozenset(names)


class ServerToolLists:
    """The per-server tool-name cache and the admission check (see the module)."""

    def __init__(self, refs: Mapping[str, Iterable[ListedToolRef]], *,
                 timeout: float = LIST_TIMEOUT_SECONDS, lister: Lister = list_tool_names,
                 on_list: Callable[[str], None] | None = None) -> None:
        self._on_list = on_list
        """Told ``answered`` or ``unanswered`` after each list (metrics)."""
        self._refs = {crew_id: tuple(r) for crew_id, r in refs.items() if r}
        self._timeout = timeout
        self._lister = lister
        self._cache: dict[ServerKey, frozenset[str]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self) -> None:
        """Fill the cache in the background (one list per server; failures are left for
        the admissions to retry)."""
        servers = {server_key(r.server): r.server for refs in self._refs.values() for r in refs}
        for server in servers.values():
            task = asyncio.get_running_loop().create_task(self._fresh(server),
                                                          name=f"tools-list:{server.name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def settled(self) -> None:
        """Returns once the background lists started so far have ended."""
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    def misses(self, crew_id: str) -> list[ListedToolRef]:
        """The crew's names not in their server's cached list (no network)."""
        return [r for r in self._refs.get(crew_id, ())
                if r.tool not in self._cache.get(server_key(r.server), frozenset())]

    async def _fresh(self, server: MCPServerDefinition) -> frozenset[str] | None:
        """One fresh list (cached on success); None when the server did not answer."""
        try:
            names = await self._lister(server, self._timeout)
        except Exception as exc:  # unreachable, timed out, headers unreadable, MCP error
            log.info("tools/list not answered", extra={"server": server.name,
                                                       "error": type(exc).__name__})
            if self._on_list is not None:
                self._on_list("unanswered")
            return None
        self._cache[server_key(server)] = names
        if self._on_list is not None:
            self._on_list("answered")
        return names

    async def check(self, crew_id: str) -> None:
        """Raises ``ContractError(422, unknown_tool)`` for a name a fresh answer lacks."""
        missing = self.misses(crew_id)
        if not missing:
            return
        servers = {server_key(r.server): r.server for r in missing}
        keys = list(servers)
        answers = await asyncio.gather(*(self._fresh(servers[k]) for k in keys))
        fresh = dict(zip(keys, answers, strict=True))
        refused = []
        for ref in missing:
            offered = fresh[server_key(ref.server)]
            if offered is not None and ref.tool not in offered:
                refused.append((ref, offered))
        if refused:
            raise ContractError(422, UNKNOWN_TOOL, _message(crew_id, refused),
                                {"tools": [f"{r.server.name}/{r.tool}" for r, _ in refused]})


def _message(crew_id: str, refused: list[tuple[ListedToolRef, frozenset[str]]]) -> str:
    parts = []
    for ref, offered in refused:
        names = sorted(offered)
        shown = ", ".join(names[:MAX_OFFERED_IN_MESSAGE]) or "no tools"
        if len(names) > MAX_OFFERED_IN_MESSAGE:
            shown += f", ... ({len(names)} in all)"
        parts.append(f"agent {ref.agent!r}: MCP server {ref.server.name!r} does not offer "
                     f"tool {ref.tool!r} (tools/list now offers: {shown})")
    return f"crew {crew_id!r}: unknown tool(s): " + "; ".join(parts)


def listed_tool_refs(definitions: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per declarative crew (``declarative.CrewDefinition``), the wire form of its agents'
    ``server/tool`` names on servers without ``allowedTools`` (what the template reports)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for crew_id, definition in definitions.items():
        refs = []
        for agent in definition.agents:
            for name in agent.tools:
                server_name, slash, tool = name.partition("/")
                server = definition.tools.server(server_name) if slash else None
                if server is not None and server.allowed_tools is None:
                    refs.append(ListedToolRef(crew_id, agent.name, server, tool).to_wire())
        if refs:
            out[crew_id] = refs
    return out
