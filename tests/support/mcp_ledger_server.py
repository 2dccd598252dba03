"""A real MCP server for the effect-ledger tests (the ``mcp`` package's FastMCP, streamable
HTTP on loopback): ``python mcp_ledger_server.py PORT LEDGER_FILE``.

``create_ticket(title, sleep=0)`` appends one JSON line to LEDGER_FILE (outside any sidecar
state dir; fsync'd BEFORE it sleeps, so a test can await the line and then kill the sidecar
while the call is in flight) with the idempotency key it received in ``_meta`` and in the
``Idempotency-Key`` header; a call with a title it saw before does not sleep.
``reject_ticket`` answers an MCP error (``isError``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server.fastmcp import Context, FastMCP

META_KEY = "crewfence.dev/idempotency-key"


def _received(ctx: Context[Any, Any, Any]) -> tuple[str | None, str | None]:
    request = ctx.request_context
    meta = request.meta.model_dump() if request.meta is not None else {}
    http = request.request
    header = http.headers.get("idempotency-key") if http is not None else None
    return meta.get(META_KEY), header


def main() -> None:
    port, ledger = int(sys.argv[1]), Path(sys.argv[2])
    server = FastMCP("tickets", host="127.0.0.1", port=port, log_level="WARNING")

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

    server.run(transport="streamable-http")


if __name__ == "__main__":
    main()
