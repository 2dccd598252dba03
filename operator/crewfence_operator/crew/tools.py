"""``spec.tools``: the Crew's MCP servers and Python tools, as the sidecar's crews file names
them, and the header Secrets they need, as files.

Invariants kept here:

* **Header secrets only as files.** A server's ``headersFrom`` Secret reaches the sidecar as
  a read-only Secret volume (``defaultMode: 0400``; with the pod's ``fsGroup`` the kubelet
  makes the files ``0440`` root-owned, the shape the sidecar accepts for the model API key) at
  :func:`headers_dir`; the crews file carries only that directory's path, never a header
  value, and no environment variable names the Secret.
* **Every agent tool names something.** :func:`unknown_agent_tools` is the operator's copy of
  the CRD's CEL rule (the API server refuses such a Crew; kmock does not), so a Crew that
  slipped past the schema is refused with the same names instead of failing every job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

HEADERS_ROOT: Final = "/etc/crewfence/tool-headers"
VOLUME_PREFIX: Final = "tool-headers-"
HEADERS_MODE: Final = 0o400
TRANSPORTS: Final = frozenset({"streamable-http", "sse"})


@dataclass(frozen=True)
class McpServer:
    name: str
    url: str
    transport: str = "streamable-http"
    headers_secret: str | None = None
    allowed_tools: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PythonTool:
    name: str
    ref: str


@dataclass(frozen=True)
class ToolsSpec:
    mcp_servers: tuple[McpServer, ...] = ()
    python: tuple[PythonTool, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.mcp_servers or self.python)

    def server(self, name: str) -> McpServer | None:
        return next((s for s in self.mcp_servers if s.name == name), None)


def parse_tools(raw: Mapping[str, Any] | None) -> ToolsSpec:
    """``spec.tools`` as typed values (the CRD's default transport applied)."""
    raw = raw or {}
    servers = []
    for s in raw.get("mcpServers") or []:
        allowed = s.get("allowedTools")
        secret = ((s.get("headersFrom") or {}).get("secretRef") or {}).get("name")
        transport = str(s.get("transport") or "streamable-http")
        if transport not in TRANSPORTS:
            raise ValueError(f"tools.mcpServers[{s.get('name')}].transport {transport!r} "
                             f"must be one of {sorted(TRANSPORTS)}")
        servers.append(McpServer(
            name=str(s["name"]), url=str(s["url"]), transport=transport,
            headers_secret=str(secret) if secret else None,
            allowed_tools=tuple(str(t) for t in allowed) if allowed is not None else None))
    python = tuple(PythonTool(name=str(p["name"]), ref=str(p["ref"]))
                   for p in raw.get("python") or [])
    return ToolsSpec(mcp_servers=tuple(servers), python=python)


def resolves(tools: ToolsSpec, reference: str) -> bool:
    """Whether an agent's tool reference names a server, a server's tool, or a Python tool."""
    if "/" in reference:
        server_name, tool = reference.split("/", 1)
        server = tools.server(server_name)
        return server is not None and (server.allowed_tools is None
                                       or tool in server.allowed_tools)
    return tools.server(reference) is not None or any(p.name == reference for p in tools.python)


def unknown_agent_tools(tools: ToolsSpec,
                        agents: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Agent name -> the tool references of that agent that resolve to nothing."""
    out: dict[str, list[str]] = {}
    for name, agent in agents.items():
        bad = [str(t) for t in agent.get("tools") or [] if not resolves(tools, str(t))]
        if bad:
            out[name] = bad
    return out


def volume_name(server: str) -> str:
    return f"{VOLUME_PREFIX}{server}"


def headers_dir(server: str) -> str:
    """Where the server's header files are: one file per header, named as the header."""
    return f"{HEADERS_ROOT}/{server}"


def render_tools(tools: ToolsSpec) -> dict[str, Any]:
    """The crews file's crew-level ``tools`` (paths only; no header value)."""
    servers: list[dict[str, Any]] = []
    for s in tools.mcp_servers:
        entry: dict[str, Any] = {"name": s.name, "url": s.url, "transport": s.transport}
        if s.headers_secret:
            entry["headersDir"] = headers_dir(s.name)
        if s.allowed_tools is not None:
            entry["allowedTools"] = list(s.allowed_tools)
        servers.append(entry)
    out: dict[str, Any] = {}
    if servers:
        out["mcpServers"] = servers
    if tools.python:
        out["python"] = [{"name": p.name, "ref": p.ref} for p in tools.python]
    return out


def header_volumes(tools: ToolsSpec) -> list[dict[str, Any]]:
    """One read-only Secret volume per server with ``headersFrom``."""
    return [{"name": volume_name(s.name),
             "secret": {"secretName": s.headers_secret, "defaultMode": HEADERS_MODE}}
            for s in tools.mcp_servers if s.headers_secret]


def header_mounts(tools: ToolsSpec) -> list[dict[str, Any]]:
    return [{"name": volume_name(s.name), "mountPath": headers_dir(s.name), "readOnly": True}
            for s in tools.mcp_servers if s.headers_secret]


def server_urls(tools: ToolsSpec) -> Sequence[tuple[str, str]]:
    """(name, url) of every MCP server, in spec order (what ``ToolsReady`` checks)."""
    return [(s.name, s.url) for s in tools.mcp_servers]
