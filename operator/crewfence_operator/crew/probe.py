"""Ask a replica's sidecar ``GET /health`` (async; used for status and scale-down decisions)."""

from __future__ import annotations

import json
import ssl

import aiohttp

from crewfence_operator.crew.status import Health


async def fetch_health(
    session: aiohttp.ClientSession, address: str, token: str | None, timeout_s: float,
    ssl_context: ssl.SSLContext | None = None, server_name: str | None = None,
) -> Health | None:
    """The replica's health, or None when it cannot answer (any transport or format problem).

    With ``ssl_context`` over HTTPS, verifying the replica's certificate for ``server_name``.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    scheme = "https" if ssl_context is not None else "http"
    try:
        async with session.get(
            f"{scheme}://{address}/health", headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            ssl=ssl_context if ssl_context is not None else True, server_hostname=server_name,
        ) as response:
            if response.status != 200:
                return None
            body = json.loads(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return Health.from_wire(body) if isinstance(body, dict) else None
