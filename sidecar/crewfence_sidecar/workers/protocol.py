"""Messages between the sidecar, the template process and the workers (no crewai here).

Two kinds of channel:

- The control socket (``AF_UNIX``/``SOCK_SEQPACKET``, one message per packet) between the
  sidecar and the template: ``fork`` requests carry the worker's channel end as
  ``SCM_RIGHTS``; the template answers ``ready``/``startup_error`` once, then ``forked``,
  ``fork_failed`` and ``exited`` (after it reaped a worker).
- One job channel per worker (``AF_UNIX``/``SOCK_STREAM``): length-prefixed JSON frames. The
  sidecar writes the job first; the worker answers ``started``, any number of ``chunk``,
  ``llm_call`` and ``effect`` frames (``{event, data}``: the job's effect ledger, see
  ``tools.ledger``), then exactly one ``result`` or ``error``. An ``effect`` frame may carry
  ``preceding`` (``[[event, data], ...]``), events journaled before it in the same commit.
  One with an ``ack`` number (a tool call's start) is answered by the sidecar with
  ``effect_ack`` ``{ack, ok}`` once the journal committed it (and its ``preceding``) durably
  (``ok: true``) or could not (``ok: false``); the worker runs the tool only after
  ``ok: true``. A channel that ends
  without a ``result`` or ``error`` means the worker died. After its outcome a worker that
  may take another job (worker reuse) waits for the sidecar's ``recorded`` (the outcome is
  journaled and answered), then sends ``idle`` (with its CPU seconds so far) and waits for
  the next job frame; one that may not sends ``retiring`` (with the reason) and exits. The
  job frame's ``max_jobs`` bounds the jobs per worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
from dataclasses import dataclass
from typing import Any, Final

HEADER: Final = struct.Struct(">I")
MAX_FRAME_BYTES: Final = 256 * 1024 * 1024
MAX_CONTROL_BYTES: Final = 4 * 1024 * 1024


class ProtocolError(Exception):
    """A malformed or oversized frame."""


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    return body


def decode(body: bytes) -> dict[str, Any]:
    value = json.loads(body)
    if not isinstance(value, dict):
        raise ProtocolError("a message must be a JSON object")
    return value


def frame(message: dict[str, Any]) -> bytes:
    body = encode(message)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        data = sock.recv(min(remaining, 1 << 20))
        if not data:
            if chunks:
                raise ProtocolError("the channel ended inside a frame")
            return None
        chunks.append(data)
        remaining -= len(data)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> dict[str, Any] | None:
    """One frame from a blocking stream socket; None at a clean end of the channel."""
    head = _read_exactly(sock, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    body = _read_exactly(sock, size)
    if body is None:
        raise ProtocolError("the channel ended inside a frame")
    return decode(body)


def write_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(frame(message))


def send_control(sock: socket.socket, message: dict[str, Any],
                 fds: list[int] | None = None) -> None:
    """One control packet (blocking socket), with file descriptors when given."""
    body = encode(message)
    if fds:
        socket.send_fds(sock, [body], fds)
    else:
        sock.send(body)


def recv_control(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One control packet and the descriptors it carried; None when the peer is gone."""
    body, fds, _flags, _addr = socket.recv_fds(sock, MAX_CONTROL_BYTES, 4)
    if not body:
        for fd in fds:
            os.close(fd)
        return None
    return decode(body), list(fds)


@dataclass(frozen=True)
class ExitStatus:
    """How a reaped worker ended: its exit code, or the signal that killed it."""

    exit_code: int | None = None
    signal: int | None = None
    detail: str | None = None
    """Set when no wait status exists (e.g. the template itself is gone)."""
    cpu_seconds: float | None = None
    """User + system CPU time of the worker (and its reaped children), from wait4."""
    max_rss_kib: int | None = None

    @classmethod
    def from_wait_status(cls, status: int) -> ExitStatus:
        if os.WIFSIGNALED(status):
            return cls(signal=os.WTERMSIG(status))
        return cls(exit_code=os.waitstatus_to_exitcode(status))

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {self.signal_name}"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return self.detail or "ended"

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        if self.signal is not None:
            out["signal"] = self.signal_name
        if self.detail is not None:
            out["detail"] = self.detail
        return out

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> ExitStatus:
        sig = raw.get("signal_number")
        code = raw.get("exit_code")
        cpu = raw.get("cpu_seconds")
        rss = raw.get("max_rss_kib")
        return cls(exit_code=int(code) if code is not None else None,
                   signal=int(sig) if sig is not None else None,
                   detail=raw.get("detail"),
                   cpu_seconds=float(cpu) if cpu is not None else None,
                   max_rss_kib=int(rss) if rss is not None else None)

    def to_control(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "signal_number": self.signal,
                "detail": self.detail}
