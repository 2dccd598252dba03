"""Loopback ports and readiness polling."""

from __future__ import annotations

import fcntl
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

PORT_LOCK_DIR = Path(tempfile.gettempdir()) / "crewfence-e2e-ports"
# Reservations live as long as this process: the harness picks a port, then a child process
# binds it seconds later (etcd, kube-apiserver, the operator).
_reserved: list[IO[str]] = []


def free_port(host: str = "127.0.0.1") -> int:
    """A free port, reserved for the lifetime of this process.

    Invariant (parallel sessions: xdist workers, other engineers' clusters): a port handed out
    here is never handed out again, to this process or to any other harness process, while the
    process that got it lives, even in the window before its server binds it. The kernel alone
    would only promise that nobody listens on it at this instant."""
    PORT_LOCK_DIR.mkdir(exist_ok=True)
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        handle = (PORT_LOCK_DIR / f"{port}.lock").open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # reserved by another harness process, or by us already
            handle.close()
            continue
        _reserved.append(handle)
        return port
    raise RuntimeError(f"no unreserved free port on {host} after 100 tries")


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
