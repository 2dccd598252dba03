"""The one kubelet API the pod runner serves: container logs, so `kubectl logs` works.

The API server proxies GET /containerLogs/{ns}/{pod}/{container} to the Node's
daemonEndpoints.kubeletEndpoint port over TLS (verified against the cluster CA).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

# (namespace, pod, container, previous) -> (log file, container still running) or None
Locate = Callable[[str, str, str, bool], tuple[Path, bool] | None]


def _select(data: bytes, query: dict[str, str]) -> bytes:
    if query.get("tailLines"):
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-int(query["tailLines"]) :]) if int(query["tailLines"]) else b""
    if query.get("limitBytes"):
        data = data[: int(query["limitBytes"])]
    return data


async def start(locate: Locate, port: int, cert: Path, key: Path) -> web.AppRunner:
    async def container_logs(request: web.Request) -> web.StreamResponse:
        m = request.match_info
        query = dict(request.query)
        previous = query.get("previous") == "true"
        found = locate(m["namespace"], m["pod"], m["container"], previous)
        if found is None or not found[0].exists():
            which = "previous terminated" if previous else "current"
            return web.Response(status=404, text=f'no {which} log of container "{m["container"]}"')
        path, running = found
        data = path.read_bytes()
        if query.get("follow") != "true" or not running:
            return web.Response(body=_select(data, query), content_type="text/plain")
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        await resp.write(_select(data, query))
        offset = len(data)
        while True:  # follow until the container stops
            now = locate(m["namespace"], m["pod"], m["container"], False)
            with path.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            if chunk:
                offset += len(chunk)
                await resp.write(chunk)
            if now is None or now[0] != path or not now[1]:
                break
            await asyncio.sleep(0.2)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx).start()
    return runner
