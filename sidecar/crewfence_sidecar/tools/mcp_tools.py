"""MCP tools of a declarative crew, through crewai's own MCP client (``crewai.mcp``).

A crew's ``tools.mcpServers`` entry is ``{name, url, transport, headersFile?,
allowedTools?}``. Its tools are discovered (``tools/list``) when the crew is built and become
:class:`LedgerMCPTool` objects, known to the agent as ``<server>/<tool>`` (crewai sanitises
that to ``<server>_<tool>`` for the model).

Invariants:

- Every ``tools/call`` carries the call's idempotency key (the one journaled in its
  ``tool_call_started``) in ``params._meta["crewfence.dev/idempotency-key"]`` and, on HTTP
  transports, as the ``Idempotency-Key`` header. crewai's ``MCPNativeTool`` opens a fresh
  client per call from a factory; our factory reads the key from the call's context (copied
  into the thread that runs the call) for the header, and :func:`install_idempotency_meta`
  wraps crewai's ``MCPClient._call_tool_impl`` to pass it as ``meta`` to
  ``ClientSession.call_tool``: the narrowest hooks crewai 1.15 offers. The ``_meta`` key
  therefore reaches crewai's own MCP tools of registry crews too (not the header: their
  transports are built by crewai from fixed headers).
- Header values (from ``headersFile``, re-read at every build so a rotated Secret is used by
  the next job) are never logged or journaled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from crewai.mcp.client import MCPClient
from crewai.mcp.tool_resolver import MCPToolResolver
from crewai.mcp.transports.http import HTTPTransport
from crewai.mcp.transports.sse import SSETransport
from crewai.tools import BaseTool
from crewai.tools.mcp_native_tool import MCPNativeTool

from crewfence_sidecar.contract import IDEMPOTENCY_KEY_HEADER, MCP_IDEMPOTENCY_META_KEY
from crewfence_sidecar.tool_context import current_idempotency_key
from crewfence_sidecar.tools.mcp_servers import MCPServerDefinition, MCPToolError

T = TypeVar("T")


async def _call_tool_with_key(self: MCPClient, tool_name: str, arguments: dict[str, Any]) -> Any:
    """crewai's ``MCPClient._call_tool_impl`` with the current call's idempotency key in the
    ``tools/call`` request's ``_meta`` (unchanged outside a journaled call)."""
    key = current_idempotency_key()
    if key is None:
        return await _ORIGINAL_CALL_TOOL_IMPL(self, tool_name, arguments)
    from crewai.mcp.client import _MCPToolResult
    from crewai.mcp.content import content_blocks_to_text

    result = await asyncio.wait_for(
        self.session.call_tool(tool_name, arguments, meta={MCP_IDEMPOTENCY_META_KEY: key}),
        timeout=self.execution_timeout)
    is_error = bool(getattr(result, "isError", False))
    if getattr(result, "content", None):
        return _MCPToolResult(content_blocks_to_text(result.content), is_error)
    return _MCPToolResult(str(result), is_error)


_ORIGINAL_CALL_TOOL_IMPL = MCPClient._call_tool_impl


def install_idempotency_meta() -> None:
    """Every ``tools/call`` crewai's MCP client sends (ours and crewai's own MCP tools of
    registry crews, ``Agent(mcps=[...])``) carries the current call's key in ``_meta``
    (once per process; the ledger installs it with its hooks)."""
    if MCPClient._call_tool_impl is not _call_tool_with_key:
        MCPClient._call_tool_impl = _call_tool_with_key  # type: ignore[method-assign]


def _transport(server: MCPServerDefinition, headers: dict[str, str]) -> Any:
    if server.transport == "sse":
        return SSETransport(url=server.url, headers=headers)
    return HTTPTransport(url=server.url, headers=headers, streamable=True)


def client_factory(server: MCPServerDefinition,
                   headers: dict[str, str]) -> Callable[[], MCPClient]:
    """A factory of one client per call, keyed with the current call's idempotency key."""

    def make() -> MCPClient:
        key = current_idempotency_key()
        call_headers = dict(headers)
        if key is not None:
            call_headers[IDEMPOTENCY_KEY_HEADER] = key
        return MCPClient(transport=_transport(server, call_headers))

    return make


class LedgerMCPTool(MCPNativeTool):
    """One MCP tool; ``crewfence_name`` (``server/tool``) and ``crewfence_server`` are what
    the ledger journals."""

    crewfence_name: str = ""
    crewfence_server: str | None = None

    def _run(self, **kwargs: Any) -> Any:
        # crewai's own _run calls asyncio.run inside ``except RuntimeError`` (no running
        # loop), so every error of the call chains to that RuntimeError and crewai 1.15's
        # HTTP transport teardown re-raises it as the call's failure, even after the
        # server answered. A fresh thread outside any handler keeps the chain clean; the
        # context (the call's idempotency key) is copied into it.
        return _run_sync(lambda: self._run_async(**kwargs))


def _run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on a fresh loop in a fresh thread (the caller may be on
    a running loop already)."""
    ctx = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(ctx.run, asyncio.run, make()).result()


async def _list_tools(server: MCPServerDefinition, headers: dict[str, str]) -> list[dict[str, Any]]:
    client = MCPClient(transport=_transport(server, headers))
    await client.connect()
    try:
        listed: Awaitable[list[dict[str, Any]]] = client.list_tools()
        return await listed
    finally:
        await client.disconnect()


def build_mcp_tools(server: MCPServerDefinition) -> dict[str, BaseTool]:
    """The server's (allowed) tools, by the name the agent knows (``server/tool``)."""
    headers = server.headers()
    try:
        listed = _run_sync(lambda: _list_tools(server, headers))
    except Exception as exc:  # crewai wraps connection failures in several classes
        raise MCPToolError(f"MCP server {server.name!r}: tools/list failed "
                           f"({type(exc).__name__})") from None
    by_name = {str(t.get("name")): t for t in listed if t.get("name")}
    wanted = list(server.allowed_tools) if server.allowed_tools is not None else list(by_name)
    missing = [name for name in wanted if name not in by_name]
    if missing:
        raise MCPToolError(f"MCP server {server.name!r} does not offer tool(s) "
                           f"{', '.join(missing)}; it offers {', '.join(sorted(by_name))}")
    factory = client_factory(server, headers)
    tools: dict[str, BaseTool] = {}
    for name in wanted:
        definition = by_name[name]
        schema = None
        if definition.get("inputSchema"):
            schema = MCPToolResolver._json_schema_to_pydantic(name, definition["inputSchema"])
        tool = LedgerMCPTool(  # type: ignore[call-arg]  # MCPNativeTool's own __init__
            client_factory=factory, tool_name=name, server_name=server.name,
            tool_schema={"description": definition.get("description") or f"{name} ({server.name})",
                         "args_schema": schema})
        tool.crewfence_name = f"{server.name}/{name}"
        tool.crewfence_server = server.name
        tools[tool.crewfence_name] = tool
    return tools
