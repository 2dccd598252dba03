"""The ``tools`` of a declarative crew and of its agents (parsed, then built per crew).

Crew level::

    tools:
      mcpServers:
        - name: tickets                 # [a-z0-9-], unique among servers and Python tools
          url: http://tickets:8080/mcp
          transport: streamable-http    # (default) | sse
          headersFile: /var/run/secrets/tickets/headers.yaml   # optional (headers_file):
                                        # a YAML/JSON mapping header name -> value
          headersDir: /etc/crewfence/tool-headers/tickets  # optional (headers_dir), what the
                                        # operator renders: a mounted Secret, one file per
                                        # header (file name = header, content = value)
          allowedTools: [create_ticket] # optional (allowed_tools): default all it lists
      python:
        - name: lookup
          ref: my_tools.lookup:LookupTool   # module:attribute importable in the image

Agent level: ``tools: [tickets/create_ticket, tickets, lookup]`` — one MCP tool, every
(allowed) tool of a server, a Python tool. A name that is none of these is a
``DefinitionError`` at start-up naming it; a ``server/tool`` outside a server's
``allowedTools`` too. A tool the server does not list is only known when it answers: the
sidecar's admission asks it (``server_lists``, 422 ``unknown_tool``); when that could not
decide, the job's crew build fails (``MCPToolError`` naming it) before anything ran.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from crewfence_sidecar.tools.mcp_servers import TRANSPORTS, MCPServerDefinition, MCPToolError
from crewfence_sidecar.tools.mcp_tools import build_mcp_tools
from crewfence_sidecar.tools.python_tools import (
    ToolReferenceError,
    build_python_tool,
    resolve_reference,
)

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
_CAMEL = {"mcpServers": "mcp_servers", "headersFile": "headers_file",
          "headersDir": "headers_dir", "allowedTools": "allowed_tools"}
_TOOLS_KEYS = {"mcp_servers", "python"}
_SERVER_KEYS = {"name", "url", "transport", "headers_file", "headers_dir", "allowed_tools"}
_PYTHON_KEYS = {"name", "ref"}

Fail = Callable[[str], Exception]


@dataclass(frozen=True)
class PythonToolDefinition:
    name: str
    ref: str


@dataclass(frozen=True)
class ToolsDefinition:
    servers: tuple[MCPServerDefinition, ...] = ()
    python: tuple[PythonToolDefinition, ...] = ()

    def server(self, name: str) -> MCPServerDefinition | None:
        return next((s for s in self.servers if s.name == name), None)

    def python_tool(self, name: str) -> PythonToolDefinition | None:
        return next((p for p in self.python if p.name == name), None)

    def builder(self) -> ToolBuilder:
        return ToolBuilder(self)


class ToolBuilder:
    """Builds the tools of ONE crew: each MCP server is listed once, each tool object is
    fresh for this crew."""

    def __init__(self, definition: ToolsDefinition) -> None:
        self.definition = definition
        self._servers: dict[str, dict[str, Any]] = {}

    def _server_tools(self, name: str) -> dict[str, Any]:
        if name not in self._servers:
            server = self.definition.server(name)
            assert server is not None  # checked at parse time
            self._servers[name] = build_mcp_tools(server)
        return self._servers[name]

    def for_agent(self, refs: tuple[str, ...]) -> list[Any]:
        tools: list[Any] = []
        for ref in refs:
            if "/" in ref:
                server, _, tool = ref.partition("/")
                offered = self._server_tools(server)
                if ref not in offered:
                    raise MCPToolError(f"MCP server {server!r} does not offer tool {tool!r}")
                tools.append(offered[ref])
            elif self.definition.server(ref) is not None:
                tools.extend(self._server_tools(ref).values())
            else:
                spec = self.definition.python_tool(ref)
                assert spec is not None  # checked at parse time
                tools.append(build_python_tool(spec.name, spec.ref))
        return tools


def _mapping(value: object, where: str, fail: Fail) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise fail(f"{where} must be a mapping")
    return {_CAMEL.get(str(k), str(k)): v for k, v in value.items()}


def _only(value: dict[str, Any], allowed: set[str], where: str, fail: Fail) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise fail(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: "
                   f"{', '.join(sorted(allowed))}")


def _name(value: object, where: str, fail: Fail) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise fail(f"{where} must match {_NAME_RE.pattern}")
    return value


def _text(value: object, where: str, fail: Fail) -> str:
    if not isinstance(value, str) or not value.strip():
        raise fail(f"{where} must be a non-empty string")
    return value


def parse_tools(raw: object, fail: Fail) -> ToolsDefinition:
    """Validate a crew's ``tools``; ``fail(message)`` makes the error to raise."""
    if raw is None:
        return ToolsDefinition()
    spec = _mapping(raw, "tools", fail)
    _only(spec, _TOOLS_KEYS, "tools", fail)
    names: set[str] = set()
    servers = []
    for index, value in enumerate(spec.get("mcp_servers") or []):
        where = f"tools.mcpServers[{index}]"
        entry = _mapping(value, where, fail)
        _only(entry, _SERVER_KEYS, where, fail)
        name = _name(entry.get("name"), f"{where}.name", fail)
        url = _text(entry.get("url"), f"{where}.url", fail)
        if not url.startswith(("http://", "https://")):
            raise fail(f"{where}.url must be an http(s) URL")
        transport = entry.get("transport", "streamable-http")
        if transport not in TRANSPORTS:
            raise fail(f"{where}.transport must be one of {', '.join(TRANSPORTS)}")
        headers_file = entry.get("headers_file")
        if headers_file is not None:
            headers_file = _text(headers_file, f"{where}.headersFile", fail)
        headers_dir = entry.get("headers_dir")
        if headers_dir is not None:
            headers_dir = _text(headers_dir, f"{where}.headersDir", fail)
        allowed = entry.get("allowed_tools")
        if allowed is not None and (not isinstance(allowed, list) or not all(
                isinstance(t, str) and t.strip() for t in allowed)):
            raise fail(f"{where}.allowedTools must be a list of tool names")
        if name in names:
            raise fail(f"{where}.name {name!r} is not unique among the crew's tools")
        names.add(name)
        servers.append(MCPServerDefinition(
            name=name, url=url, transport=str(transport), headers_file=headers_file,
            headers_dir=headers_dir,
            allowed_tools=tuple(allowed) if allowed is not None else None))
    python = []
    for index, value in enumerate(spec.get("python") or []):
        where = f"tools.python[{index}]"
        entry = _mapping(value, where, fail)
        _only(entry, _PYTHON_KEYS, where, fail)
        name = _name(entry.get("name"), f"{where}.name", fail)
        ref = _text(entry.get("ref"), f"{where}.ref", fail)
        try:
            resolve_reference(ref)
        except ToolReferenceError as exc:
            raise fail(f"{where}: {exc}") from None
        if name in names:
            raise fail(f"{where}.name {name!r} is not unique among the crew's tools")
        names.add(name)
        python.append(PythonToolDefinition(name=name, ref=ref))
    return ToolsDefinition(servers=tuple(servers), python=tuple(python))


def parse_agent_tools(raw: object, tools: ToolsDefinition, where: str,
                      fail: Fail) -> tuple[str, ...]:
    """An agent's ``tools`` list; every name must be known (``DefinitionError`` naming it)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(r, str) and r for r in raw):
        raise fail(f"{where} must be a list of tool names")
    for ref in raw:
        if "/" in ref:
            server_name, _, tool = ref.partition("/")
            server = tools.server(server_name)
            if server is None or not tool:
                raise fail(f"{where}: unknown tool {ref!r} (no MCP server {server_name!r})")
            if server.allowed_tools is not None and tool not in server.allowed_tools:
                raise fail(f"{where}: unknown tool {ref!r} (not in the allowedTools of "
                           f"{server_name!r})")
        elif tools.server(ref) is None and tools.python_tool(ref) is None:
            raise fail(f"{where}: unknown tool {ref!r}; known: "
                       + ", ".join(sorted([s.name for s in tools.servers]
                                          + [p.name for p in tools.python])))
    if len(set(raw)) != len(raw):
        raise fail(f"{where} names a tool twice")
    return tuple(raw)
