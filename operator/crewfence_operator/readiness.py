"""The operator's readiness endpoint (``GET /readyz`` on ``--readiness-port``).

kopf's own endpoint (``/healthz``) says the process is alive. Readiness says more, and only
that: the operator can reach the API server *and*, where it serves admission, its admission
server accepts connections. A Service or a rollout then never counts an operator whose webhook
is not up yet.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiohttp import web
from kubernetes import client

from crewfence_operator import config, kube

CHECK_TIMEOUT = 3.0
CACHE_SECONDS = 2.0


@dataclass(frozen=True)
class Readiness:
    connected: bool
    admission: bool | None
    """None: this operator serves no admission."""

    @property
    def ready(self) -> bool:
        """Invariant: ready only when connected and, where admission is served, serving it."""
        return self.connected and self.admission is not False

    def body(self) -> dict[str, object]:
        return {"ready": self.ready, "connected": self.connected, "admission": self.admission}


def _api_version() -> None:
    client.VersionApi(kube.api_client()).get_code(_request_timeout=CHECK_TIMEOUT)


async def api_reachable() -> bool:
    try:
        await asyncio.wait_for(asyncio.to_thread(_api_version), CHECK_TIMEOUT + 1)
    except Exception:
        return False
    return True


async def port_open(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CHECK_TIMEOUT)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


class Checker:
    """Checks on demand, cached briefly so frequent probes do not load the API server."""

    def __init__(self, cfg: config.OperatorConfig) -> None:
        self.cfg = cfg
        self._last: tuple[float, Readiness] | None = None

    async def check(self) -> Readiness:
        now = time.monotonic()
        if self._last and now - self._last[0] < CACHE_SECONDS:
            return self._last[1]
        webhook = self.cfg.webhook
        admission: bool | None = None
        if webhook.mode is not config.WebhookMode.OFF:
            host = "127.0.0.1" if webhook.addr in ("0.0.0.0", "") else webhook.addr  # noqa: S104
            admission = await port_open(host, webhook.port)
        result = Readiness(connected=await api_reachable(), admission=admission)
        self._last = (now, result)
        return result


_runner: web.AppRunner | None = None


def _bound_port(runner: web.AppRunner) -> int:
    return int(runner.addresses[0][1])


async def start(cfg: config.OperatorConfig) -> int:
    """Serve /readyz (idempotent); the port it listens on (``readiness_port`` 0: one the
    kernel chose)."""
    global _runner
    if _runner is not None:
        return _bound_port(_runner)
    checker = Checker(cfg)

    async def readyz(_: web.Request) -> web.Response:
        result = await checker.check()
        return web.json_response(result.body(), status=200 if result.ready else 503)

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, cfg.metrics_addr, cfg.readiness_port).start()
    _runner = runner
    return _bound_port(runner)


async def stop() -> None:
    global _runner
    if _runner is not None:
        await _runner.cleanup()
        _runner = None
