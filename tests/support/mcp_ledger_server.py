"""A real MCP server for the effect-ledger tests (the ``mcp`` package's FastMCP on loopback):
``python mcp_ledger_server.py PORT LEDGER_FILE [TRANSPORT [PORT_FILE]]``, TRANSPORT
``streamable-http`` (the default; endpoint ``/mcp``) or ``sse`` (``/sse``, messages POSTed to
``/messages/``). PORT 0 lets the kernel choose a free port; once the server listens, the port
it bound is written to PORT_FILE (atomically: the file appears complete or not at all), so a
test needs no port that was probed free and bound later (another process can take it between).

``create_ticket(title, sleep=0)`` appends one JSON line to LEDGER_FILE (outside any sidecar
state dir; fsync'd BEFORE it sleeps, so a test can await the line and then kill the sidecar
while the call is in flight) with the idempotency key it received in ``_meta`` and in the
``Idempotency-Key`` header; a call with a title it saw before does not sleep.
``reject_ticket`` answers an MCP error (``isError``). ``late_ticket`` is listed only while
the file ``LEDGER_FILE.late`` exists (a server that gains a tool); every ``tools/list`` adds
one line (the client's ``clientInfo.name``) to ``LEDGER_FILE.lists``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Literal

import anyio
import uvicorn
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import Tool

META_KEY = "crewfence.dev/idempotency-key"


def _received(ctx: Context[Any, Any, Any]) -> tuple[str | None, str | None]:
    request = ctx.request_context
    meta = request.meta.model_dump() if request.meta is not None else {}
    http = request.request
    header = http.headers.get("idempotency-key") if http is not None else None
    return meta.get(META_KEY), header


class CountingServer(FastMCP):
    """Logs who lists the tools; hides ``late_ticket`` until ``<ledger>.late`` exists."""

    def __init__(self, ledger: Path, **settings: Any) -> None:
        super().__init__("tickets", **settings)
        self.ledger = ledger

    async def list_tools(self) -> list[Tool]:
        session = self.get_context().session
        params = session.client_params
        client = params.clientInfo.name if params is not None else None
        with Path(f"{self.ledger}.lists").open("a", encoding="utf-8") as out:
            out.write(json.dumps({"client": client, "at": time.time()}) + "\n")
        tools = await super().list_tools()
        if Path(f"{self.ledger}.late").exists():
            return tools
        return [t for t in tools if t.name != "late_ticket"]


class ReportingServer(uvicorn.Server):
    """Writes the port it listens on to ``port_file`` (when given) once it listens."""

    def __init__(self, config: uvicorn.Config, port_file: Path | None) -> None:
        super().__init__(config)
        self.port_file = port_file

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.port_file is not None and sockets:
            partial = self.port_file.with_name(self.port_file.name + ".partial")
            partial.write_text(str(sockets[0].getsockname()[1]), encoding="utf-8")
            partial.replace(self.port_file)


def serve(server: FastMCP, transport: Literal["streamable-http", "sse"], port: int,
          port_file: Path | None) -> None:
    """What ``server.run(transport)`` does (same app, uvicorn settings and event loop), on a
    socket bound here: with PORT 0 only this process knows the port the kernel chose."""
    app = server.sse_app() if transport == "sse" else server.streamable_http_app()
    # like uvicorn's own bind (asyncio's create_server): SO_REUSEADDR, so an explicit PORT
    # left in TIME_WAIT by an earlier server binds as it did under server.run
    sock = socket.create_server((server.settings.host, port))
    config = uvicorn.Config(app, log_level=server.settings.log_level.lower())
    anyio.run(ReportingServer(config, port_file).serve, [sock])


def main() -> None:
    port, ledger = int(sys.argv[1]), Path(sys.argv[2])
    named = sys.argv[3] if len(sys.argv) > 3 else "streamable-http"
    port_file = Path(sys.argv[4]) if len(sys.argv) > 4 else None
    if named not in ("streamable-http", "sse"):
        sys.exit(f"unknown transport {named!r}: streamable-http or sse")
    transport: Literal["streamable-http", "sse"] = "sse" if named == "sse" else "streamable-http"
    server = CountingServer(ledger, host="127.0.0.1", port=port, log_level="WARNING")

    @server.tool()
    async def create_ticket(title: str, ctx: Context[Any, Any, Any], sleep: float = 0) -> str:
        """Create a ticket titled ``title`` (its effect: one line in the ledger file)."""
        meta_key, header_key = _received(ctx)
        # a title seen before does not sleep again (a resumed or rerun job repeats the call
        # the first attempt was killed in; the test must not wait for that attempt's sleep)
        seen = ledger.exists() and any(
            json.loads(line).get("title") == title
            for line in ledger.read_text(encoding="utf-8").splitlines() if line.strip())
        with ledger.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": "create_ticket", "title": title, "meta_key": meta_key,
                                  "header_key": header_key}) + "\n")
            out.flush()
            os.fsync(out.fileno())
        if sleep and not seen:
            await anyio.sleep(min(float(sleep), 600))  # never blocks the other calls
        return f"ticket created: {title}"

    @server.tool()
    def reject_ticket(title: str) -> str:
        """Always refuses (an MCP tool error)."""
        raise ValueError(f"tickets refused {title}")

    @server.tool()
    def late_ticket(title: str) -> str:
        """Create a late ticket (listed only once the server has gained it)."""
        return f"late ticket created: {title}"

    serve(server, transport, port, port_file)


if __name__ == "__main__":
    main()
