"""/readyz: ready only when connected to the API server and, where admission is served, the
admission server accepts connections (a real aiohttp server, real sockets)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import aiohttp
import pytest
from crewfence_operator import readiness
from crewfence_operator.config import OperatorConfig, WebhookConfig, WebhookMode


@pytest.mark.parametrize(("connected", "admission", "ready"), [
    (True, None, True), (True, True, True), (True, False, False), (False, None, False),
    (False, True, False),
])
def test_ready_needs_connection_and_serving_admission(
    connected: bool, admission: bool | None, ready: bool
) -> None:
    assert readiness.Readiness(connected=connected, admission=admission).ready is ready


async def test_readyz_follows_the_admission_port(monkeypatch: pytest.MonkeyPatch) -> None:
    async def reachable() -> bool:
        return True

    monkeypatch.setattr(readiness, "api_reachable", reachable)
    monkeypatch.setattr(readiness, "CACHE_SECONDS", 0.0)
    # the admission port is this socket's from start to end: bound (refused) first, then the
    # admission server listens on it; no other process can bind it meanwhile (no SO_REUSEADDR)
    with socket.socket() as webhook:
        webhook.bind(("127.0.0.1", 0))
        cfg = OperatorConfig(metrics_addr="127.0.0.1", readiness_port=0,
                             webhook=WebhookConfig(mode=WebhookMode.SERVICE, addr="0.0.0.0",
                                                   port=webhook.getsockname()[1]))
        # port 0: never a port probed free here and bound later (another process could
        # take it between); start says which one it got
        port = await readiness.start(cfg)
        try:
            async with aiohttp.ClientSession() as session:
                async def get() -> tuple[int, Any]:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        return resp.status, json.loads(await resp.text())

                status, body = await get()
                assert status == 503 and body == {"ready": False, "connected": True,
                                                  "admission": False}
                server = await asyncio.start_server(lambda r, w: w.close(), sock=webhook)
                try:
                    status, body = await get()
                    assert status == 200 and body["admission"] is True
                finally:
                    server.close()
                    await server.wait_closed()
        finally:
            await readiness.stop()


async def test_unreachable_api_server_is_not_connected() -> None:
    from crewfence_operator import kube

    kube.use_api_server("http://127.0.0.1:9")
    try:
        assert await readiness.api_reachable() is False
    finally:
        kube.reset()
