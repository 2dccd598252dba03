"""A small asyncio client for the API server (the pod runner's only dependency besides aiohttp)."""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

Obj = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


def _ssl_from_kubeconfig(path: Path) -> tuple[str, ssl.SSLContext, dict[str, str]]:
    config = yaml.safe_load(path.read_text())
    ctx_name = config["current-context"]
    context = next(c["context"] for c in config["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    ssl_ctx = ssl.create_default_context(cadata=ca)
    headers: dict[str, str] = {}
    if "client-certificate-data" in user:
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "c.crt", Path(tmp) / "c.key"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            ssl_ctx.load_cert_chain(str(cert), str(key))
    elif "token" in user:
        headers["Authorization"] = f"Bearer {user['token']}"
    return cluster["server"], ssl_ctx, headers


class Api:
    def __init__(self, kubeconfig: Path) -> None:
        self.server, self._ssl, self._headers = _ssl_from_kubeconfig(kubeconfig)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers, connector=aiohttp.TCPConnector(ssl=self._ssl)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Obj | None:
        """The decoded answer; None for 404; ApiError for other failures."""
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(
            method,
            self.server + path,
            data=data,
            headers=headers,
            params=params,
            timeout=aiohttp.ClientTimeout(total=30),
        ) as resp:
            text = await resp.text()
            if resp.status == 404:
                return None
            if resp.status >= 400:
                raise ApiError(resp.status, text)
            return json.loads(text) if text else {}

    async def get(self, path: str) -> Obj | None:
        return await self.request("GET", path)

    async def create(self, path: str, body: Obj) -> Obj | None:
        return await self.request("POST", path, body)

    async def merge_patch(self, path: str, body: Obj) -> Obj | None:
        return await self.request("PATCH", path, body, content_type="application/merge-patch+json")

    async def delete(self, path: str, body: Obj | None = None) -> Obj | None:
        return await self.request("DELETE", path, body)

    async def list_and_watch(self, path: str) -> AsyncIterator[tuple[str, Obj]]:
        """("ADDED"/"MODIFIED"/"DELETED", object) forever, relisting after expired watches.

        After each (re)list comes ("SYNCED", the list), so a consumer can drop objects that
        vanished while no watch was open."""
        while True:
            listed = await self.get(path)
            assert listed is not None
            for item in listed["items"]:
                yield "ADDED", item
            yield "SYNCED", listed
            version = listed["metadata"]["resourceVersion"]
            params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
            try:
                async with self.session.get(
                    self.server + path,
                    params=params,
                    timeout=aiohttp.ClientTimeout(total=None, sock_read=600),
                ) as resp:
                    if resp.status != 200:
                        continue
                    async for line in resp.content:
                        event = json.loads(line)
                        kind = event["type"]
                        if kind == "ERROR":  # 410 Gone: resourceVersion too old
                            break
                        if kind != "BOOKMARK":
                            yield kind, event["object"]
            except (aiohttp.ClientError, TimeoutError, ValueError):  # ValueError: huge line
                continue
