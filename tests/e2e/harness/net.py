"""Loopback ports and readiness polling."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def http_ok(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> str | None:
    """The body of a 200 answer, or None on any error."""
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
            return resp.read().decode() if resp.status == 200 else None
    except (OSError, urllib.error.URLError, ssl.SSLError):
        return None


def wait_for(
    condition: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    abort: Callable[[], str | None] = lambda: None,
) -> None:
    """Poll `condition` until true; `abort` returns a reason to give up early (a dead process)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        reason = abort()
        if reason:
            raise RuntimeError(f"{what}: {reason}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
