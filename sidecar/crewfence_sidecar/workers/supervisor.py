"""The sidecar's side of the workers: the template process, forks, stops and reaps.

Invariants kept here:

- Single-threaded fork: the template is forked before the sidecar starts any thread or event
  loop (:meth:`Supervisor.fork_template`), or spawned as a fresh interpreter
  (:meth:`Supervisor.spawn_template`); the sidecar itself never forks a worker.
- Reaped before recorded: :meth:`WorkerHandle.exited` resolves only when the template has
  reaped the worker (and killed the rest of its group); the executor awaits it before the
  runtime may write a terminal record.
- A lost template fails its workers: when the control socket ends, every worker is gone too
  (PR_SET_PDEATHSIG), so each pending handle resolves with an exit "template lost".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crewfence_sidecar.workers.protocol import (
    HEADER,
    MAX_CONTROL_BYTES,
    ExitStatus,
    ProtocolError,
    decode,
    frame,
    recv_control,
    send_control,
)
from crewfence_sidecar.workers.settings import TemplateSettings

log = logging.getLogger("crewfence.sidecar.workers")
TEMPLATE_LOST = ExitStatus(detail="the worker template process is gone")


class TemplateError(Exception):
    """The template could not start (the message is the one line to print)."""


@dataclass(frozen=True)
class TemplateInfo:
    crew_ids: tuple[str, ...]
    placeholders: dict[str, list[str]]
    model_credentials: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per declarative crew: model, hosted, credentials present|missing|not_needed."""
    listed_tools: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per declarative crew: its agents' ``server/tool`` names on servers without
    ``allowedTools`` (``tools.server_lists.ListedToolRef`` wire form), checked at admission."""


def _new_future() -> asyncio.Future[ExitStatus]:
    return asyncio.get_running_loop().create_future()


@dataclass
class WorkerHandle:
    """One forked worker as the sidecar sees it."""

    request_id: int
    channel: socket.socket
    forked: asyncio.Future[int]
    """The worker's pid (= its process group id)."""
    exited: asyncio.Future[ExitStatus] = field(default_factory=_new_future)
    fork_ns: int | None = None
    started_ns: int | None = None
    spare: bool = False
    """Forked ahead of its job (it warmed up, then waited)."""
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    jobs_done: int = 0
    """Jobs this worker ended on its own and reported ``idle`` after (worker reuse)."""
    cpu_seconds_before: float = 0.0
    """The worker's CPU seconds when its previous job ended (0 before its first job)."""

    @property
    def pid(self) -> int | None:
        if self.forked.done() and not self.forked.cancelled() and self.forked.exception() is None:
            return self.forked.result()
        return None

    async def open(self, job: dict[str, Any]) -> None:
        """Send a job (the channel's streams are made at the worker's first job)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_unix_connection(
                sock=self.channel, limit=2 ** 16)
        self.writer.write(frame(job))

    def send(self, message: dict[str, Any]) -> None:
        """One more frame to a worker that already has its job (``recorded``)."""
        assert self.writer is not None
        self.writer.write(frame(message))

    async def next_message(self) -> dict[str, Any] | None:
        """The worker's next frame, None when its channel ended."""
        assert self.reader is not None
        try:
            head = await self.reader.readexactly(HEADER.size)
            (size,) = HEADER.unpack(head)
            body = await self.reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        try:
            return decode(body)
        except (ValueError, ProtocolError):
            return None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        else:
            self.channel.close()


class Supervisor:
    """Talks to one template process over a SOCK_SEQPACKET control socket."""

    def __init__(self, control: socket.socket, template_pid: int,
                 popen: subprocess.Popen[bytes] | None = None) -> None:
        self.control = control
        self.template_pid = template_pid
        self._popen = popen
        self._next_id = 0
        self._pending: dict[int, WorkerHandle] = {}
        self._live: dict[int, WorkerHandle] = {}
        self._reader: asyncio.Task[None] | None = None
        self._lost = False
        self._closing = False
        self._detaching = False
        self.on_lost: Callable[[], None] | None = None
        """Called once when the template is gone while not closing (the CLI stops the
        sidecar then, so the container restarts with a fresh template)."""
        self.info: TemplateInfo | None = None

    # --- starting the template ---------------------------------------------------------------
    @classmethod
    def fork_template(cls, settings: TemplateSettings) -> Supervisor:
        """Fork the template from THIS process; call before any thread or event loop exists."""
        from crewfence_sidecar.workers import template

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        pid = os.fork()
        if pid == 0:
            ours.close()
            template.main_in_process(theirs, settings, parent)
        theirs.close()
        return cls(ours, pid)

    @classmethod
    def spawn_template(cls, settings: TemplateSettings,
                       env: Mapping[str, str] | None = None) -> Supervisor:
        """Start the template as a fresh interpreter (for a process that already has threads).

        Call it from a thread that lives as long as the template (PR_SET_PDEATHSIG follows
        the thread that forked): the main thread.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        popen = subprocess.Popen(
            [sys.executable, "-m", "crewfence_sidecar.workers.template",
             "--fd", str(theirs.fileno()), "--settings", settings.to_json(),
             "--parent", str(os.getpid())],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None)
        theirs.close()
        return cls(ours, popen.pid, popen)

    def wait_ready(self) -> TemplateInfo:
        """Block until the template loaded crewai and the crews; TemplateError otherwise."""
        self.control.setblocking(True)
        try:
            received = recv_control(self.control)
        except OSError:
            received = None
        if received is None:
            raise TemplateError("the worker template process exited while starting")
        hello, fds = received
        for fd in fds:
            os.close(fd)
        if hello.get("type") != "ready":
            raise TemplateError(str(hello.get("message") or "the worker template failed"))
        self.info = TemplateInfo(crew_ids=tuple(hello["crew_ids"]),
                                 placeholders=dict(hello.get("placeholders") or {}),
                                 model_credentials=dict(hello.get("model_credentials") or {}),
                                 listed_tools=dict(hello.get("listed_tools") or {}))
        return self.info

    # --- running -------------------------------------------------------------------------------
    def attach(self) -> None:
        """Start reading the template's messages on the running event loop."""
        self.control.setblocking(False)
        self._reader = asyncio.get_running_loop().create_task(self._read_control(),
                                                              name="worker-template")

    async def _read_control(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    body = await loop.sock_recv(self.control, MAX_CONTROL_BYTES)
                except OSError:
                    body = b""
                if not body:
                    break
                try:
                    self._on_message(json.loads(body))
                except (ValueError, KeyError, TypeError):
                    log.error("malformed message from the worker template")
        finally:
            if not self._detaching:
                self._on_lost()

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "forked":
            handle = self._pending.pop(int(message["id"]), None)
            if handle is None:
                return
            pid = int(message["pid"])
            handle.fork_ns = int(message.get("fork_ns") or 0)
            self._live[pid] = handle
            if not handle.forked.done():
                handle.forked.set_result(pid)
        elif kind == "fork_failed":
            handle = self._pending.pop(int(message["id"]), None)
            if handle is not None and not handle.forked.done():
                handle.forked.set_exception(OSError(str(message.get("message"))))
        elif kind == "exited":
            handle = self._live.pop(int(message["pid"]), None)
            if handle is not None and not handle.exited.done():
                handle.exited.set_result(ExitStatus.from_wire(message))

    def _on_lost(self) -> None:
        first = not self._lost and not self._closing
        if first:
            log.error("the worker template process is gone; running jobs fail")
        self._lost = True
        for handle in self._pending.values():
            if not handle.forked.done():
                handle.forked.set_exception(OSError("the worker template process is gone"))
        for handle in self._live.values():
            if not handle.exited.done():
                handle.exited.set_result(TEMPLATE_LOST)
        self._pending.clear()
        self._live.clear()
        if first and self.on_lost is not None:
            self.on_lost()

    @property
    def live_workers(self) -> int:
        return len(self._live) + len(self._pending)

    @property
    def available(self) -> bool:
        return not self._lost

    def request_fork(self, spare: bool = False) -> WorkerHandle:
        """Ask the template for a worker; its channel end travels as SCM_RIGHTS. A ``spare``
        warms itself up before it reads its job."""
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._next_id += 1
        handle = WorkerHandle(request_id=self._next_id, channel=ours,
                              forked=loop.create_future(), spare=spare)
        if self._lost:
            theirs.close()
            handle.forked.set_exception(OSError("the worker template process is gone"))
            return handle
        self._pending[handle.request_id] = handle
        try:
            self._send({"op": "fork", "id": handle.request_id, "spare": spare},
                       [theirs.fileno()])
        except OSError as exc:
            self._pending.pop(handle.request_id, None)
            handle.forked.set_exception(exc)
        finally:
            theirs.close()
        return handle

    def signal(self, pid: int, sig: signal.Signals) -> None:
        """Signal a worker's process group (the template ignores a pid it already reaped)."""
        with contextlib.suppress(OSError):
            self._send({"op": "signal", "pid": pid, "sig": int(sig)})

    def _send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        # Control packets are tiny and the template reads them at once; a full socket buffer
        # would mean a stuck template, which the caller sees as an OSError.
        self.control.setblocking(True)
        self.control.settimeout(5.0)
        try:
            send_control(self.control, message, fds)
        finally:
            self.control.setblocking(False)

    async def detach(self) -> None:
        """Stop reading on this event loop (no worker may be live); :meth:`attach` again."""
        if self._reader is not None:
            self._detaching = True
            self._reader.cancel()
            await asyncio.wait({self._reader})
            self._reader = None
            self._detaching = False

    async def close(self) -> None:
        """End the template (it SIGKILLs and reaps any worker left) and reap it."""
        self._closing = True
        with contextlib.suppress(OSError):
            self.control.shutdown(socket.SHUT_RDWR)
        if self._reader is not None:
            await asyncio.wait({self._reader})
        self.control.close()
        await asyncio.to_thread(self.wait_template)

    def wait_template(self) -> None:
        if self._popen is not None:
            self._popen.wait()
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.template_pid, 0)

    def close_sync(self) -> None:
        """Without an event loop (start-up refused, tests): SIGKILL the template at once (it
        may still be importing crewai; its workers die with it, PR_SET_PDEATHSIG) and reap
        it, so a refused start-up exits without waiting for the import."""
        self._closing = True
        with contextlib.suppress(OSError):
            self.control.shutdown(socket.SHUT_RDWR)
        self.control.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.template_pid, signal.SIGKILL)
        self.wait_template()
