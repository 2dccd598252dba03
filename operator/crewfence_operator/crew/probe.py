"""Ask a replica's sidecar ``GET /health`` (async; used for status and scale-down decisions)."""

from __future__ import annotations

import json

import aiohttp

from crewfence_operator.crew.status import Health


async def fetch_health(
    session: aiohttp.ClientSession, address: str, token: str | None, timeout_s: float
) -> Health | None:
    """The replica's health, or None when it cannot answer (any transport or format problem)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with session.get(
            f"http://{address}/health", headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            if response.status != 200:
                return None
            body = json.loads(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return Health.from_wire(body) if isinstance(body, dict) else None
