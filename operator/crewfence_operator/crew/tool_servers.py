"""The Crew's ``ToolsReady`` condition: does every MCP server of ``spec.tools`` answer?

The check is the operator's own, cheap and bounded: one ``GET`` of each server's URL with a
short timeout, all servers at once, at most once per :data:`CHECK_SECONDS` per Crew (and again
when the spec's generation changes). Any HTTP answer (even 401, 404 or 405) means the server
is reachable; a refused connection, a DNS failure, a TLS failure or a timeout means it is not.
No credential is sent (the header Secrets are the sidecar's, as files) and no body is read.

Invariant (a Crew whose tools cannot be reached says so before a job needs them): a Crew with
MCP servers gets ``ToolsReady=False`` (reason ``ToolServersUnreachable``) whose message names
every server that did not answer, and ``True`` (``ToolServersReachable``) only when all did. A
Crew without MCP servers gets ``True`` with reason ``NoToolServers`` (Python tools live in the
image; there is nothing to reach), so the condition is always present and GitOps readers need
no special case for its absence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import aiohttp

from crewfence_operator.crew.tools import ToolsSpec, server_urls

REASON_REACHABLE: Final = "ToolServersReachable"
REASON_UNREACHABLE: Final = "ToolServersUnreachable"
REASON_NONE: Final = "NoToolServers"
CHECK_SECONDS: Final = 30.0
"""A Crew's servers are asked at most this often (plus once per new generation)."""
TIMEOUT_SECONDS: Final = 2.0


@dataclass(frozen=True)
class ToolsVerdict:
    status: bool
    reason: str
    message: str


def decide(tools: ToolsSpec, answers: Mapping[str, str | None]) -> ToolsVerdict:
    """``answers``: server name -> None when it answered, else why not (short, no secrets)."""
    servers = [name for name, _ in server_urls(tools)]
    if not servers:
        return ToolsVerdict(True, REASON_NONE, "the Crew has no MCP servers")
    why = {n: answers.get(n, "not checked yet") for n in servers}
    down = [(n, reason) for n, reason in why.items() if reason is not None]
    if down:
        named = "; ".join(f"{n} ({why})" for n, why in down)
        return ToolsVerdict(False, REASON_UNREACHABLE,
                            f"{len(down)} of {len(servers)} MCP server(s) unreachable: {named}")
    return ToolsVerdict(True, REASON_REACHABLE,
                        f"all {len(servers)} MCP server(s) answered: {', '.join(servers)}")


async def probe_one(session: aiohttp.ClientSession, url: str,
                    limit_seconds: float = TIMEOUT_SECONDS) -> str | None:
    """None when ``url`` gave any HTTP answer; otherwise a short reason."""
    try:
        async with session.get(url, allow_redirects=False,
                               timeout=aiohttp.ClientTimeout(total=limit_seconds)):
            return None  # headers arrived: an HTTP server answers (the body is never read)
    except TimeoutError:
        return f"no answer within {limit_seconds:g}s"
    except aiohttp.ClientConnectorError as exc:
        return f"connection failed: {type(exc.os_error).__name__}"
    except aiohttp.ClientError as exc:
        return f"not an HTTP answer: {type(exc).__name__}"
    except (OSError, ValueError) as exc:
        return f"connection failed: {type(exc).__name__}"


async def probe(session: aiohttp.ClientSession, tools: ToolsSpec,
                limit_seconds: float = TIMEOUT_SECONDS) -> dict[str, str | None]:
    """Every server at once; never takes much longer than ``limit_seconds``."""
    pairs: Sequence[tuple[str, str]] = server_urls(tools)
    results = await asyncio.gather(*(probe_one(session, url, limit_seconds) for _, url in pairs))
    return {name: result for (name, _), result in zip(pairs, results, strict=True)}
