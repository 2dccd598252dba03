"""One forked worker: runs a job and reports over its channel, then exits or, when its
job ended on its own and left nothing running, takes another job (worker reuse).

Runs in the child of the template's ``fork``. Invariants kept here:

- Own process group (``setpgid(0, 0)``): the sidecar's stop signals the whole group, tools'
  child processes included.
- Dies with the template (``PR_SET_PDEATHSIG`` = SIGKILL): no orphan keeps calling a model.
- Never touches the journal: it only writes frames on its channel; the sidecar persists them.
- No SQLite connection crosses its fork: crewai's kickoff-outputs file is written through a
  kept connection (``crewai_outputs_connection``) only from ``keep_in_this_process``, called
  here after the fork; the template never keeps one.
- Never returns into the template's loop: every path ends in ``os._exit``.
- Its after-job work never competes with the recording of its outcome: a worker that may
  take another job waits, after its outcome frame, for the sidecar's ``recorded`` frame
  (sent once the outcome is journaled) before its reuse checks and the next crew's build;
  on 2 cores those ran beside the sidecar's fsync and answer and delayed both.
- Reused only when nothing of its job can still run: after the outcome frame it checks
  :func:`~crewfence_sidecar.workers.reuse.refusal` (threads, tasks, process group, RSS, job
  count, no CPU limit); only then does it send ``idle`` and read another job. Otherwise it
  exits as a one-job worker does. A cancelled or timed-out job never gets here: it is
  signalled and reaped.
- One ``started`` frame per job; offline LLM calls are reported only while a job runs, so a
  job's ``llm_call`` frames are its own calls.
- Write-ahead tool calls: a job's effect-ledger events go to the sidecar as ``effect``
  frames; a tool call's start waits for the sidecar's ``effect_ack`` (sent after the journal
  committed it durably) before the tool runs, and a refusal (``ok: false``) means the tool
  never runs (see ``tools.ledger``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from crewfence_sidecar.contract import MAX_TOOL_SETUP_MESSAGE_CHARS, ToolSetupError
from crewfence_sidecar.runtime import JobContext
from crewfence_sidecar.workers.crewai_outputs_connection import keep_in_this_process
from crewfence_sidecar.workers.protocol import ProtocolError, frame, read_frame, write_frame
from crewfence_sidecar.workers.reuse import MAX_REUSE_RSS_BYTES, JobBaseline, refusal
from crewfence_sidecar.workers.settings import (
    TemplateSettings,
    apply_limits,
    become_subreaper,
    die_with_parent,
    reset_signals,
)

EXIT_OK = 0
EXIT_NO_JOB = 3
EXIT_INTERNAL = 70


class _Channel:
    """The worker's end of its channel; frames come from the loop thread (chunks) and from
    model-call threads (call reports), so every write holds a lock."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        self._ack_lock = threading.Lock()
        self._acks = 0

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            write_frame(self.sock, message)

    def effect(self, event: str, data: dict[str, Any], durable: bool,
               preceding: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool:
        """Send effect-ledger events (``preceding`` first: the sidecar journals them in one
        commit); a durable one waits for the sidecar's ``effect_ack`` (sent once the journal
        committed them) and returns its verdict. Only this method reads the channel while a
        job runs, one durable event at a time."""
        message: dict[str, Any] = {"type": "effect", "event": event, "data": data}
        if preceding:
            message["preceding"] = [[name, body] for name, body in preceding]
        if not durable:
            self.send(message)
            return True
        with self._ack_lock:
            self._acks += 1
            ack = message["ack"] = self._acks
            self.send(message)
            reply = read_frame(self.sock)
        return (reply is not None and reply.get("type") == "effect_ack"
                and reply.get("ack") == ack and reply.get("ok") is True)

    def send_outcome(self, outcome: dict[str, Any]) -> None:
        try:
            data = frame(outcome)
        except (TypeError, ValueError, ProtocolError):
            data = frame({"type": "unserialisable"})
        with self._lock:
            self.sock.sendall(data)


async def _execute(catalog: Any, job: dict[str, Any], channel: _Channel,
                   settings: TemplateSettings) -> dict[str, Any]:
    from crewfence_sidecar import operations

    def emit_chunk(data: dict[str, Any]) -> None:
        channel.send({"type": "chunk", "data": data})

    ctx = JobContext(crew_id=str(job["crew_id"]), action_id=str(job["action_id"]),
                     operation=str(job["operation"]), input=dict(job["input"]),
                     training_dir=settings.training_path, emit_chunk=emit_chunk,
                     record_effect=channel.effect, resume=job.get("resume"),
                     keep_material=bool(job.get("keep_material")))
    try:
        output = await operations.execute(catalog, ctx)
    except ToolSetupError as exc:  # names parts of the crew definition only: it crosses
        return {"type": "error", "exception": type(exc).__name__,
                "tool_setup": str(exc)[:MAX_TOOL_SETUP_MESSAGE_CHARS]}
    except Exception as exc:  # the class only crosses over (messages can carry inputs)
        return {"type": "error", "exception": type(exc).__name__}
    return {"type": "result", "output": output}


def _await_recorded(sock: socket.socket) -> bool:
    """Block until the sidecar says it recorded the outcome; False when the channel ended
    (or carried anything else: the sidecar sends nothing but ``recorded`` here)."""
    message = read_frame(sock)
    return message is not None and message.get("type") == "recorded"


MAX_PREPARED_CREWS = 4


def _prepare(catalog: Any) -> Any:
    """Build the next job's crews ahead (a spare waits anyway): the declarative ones and the
    registry's that do not opt out; a registry crew serves only while it is young
    (``PreparedCatalog.take_prepared``)."""
    from crewfence_sidecar.crews import PreparedCatalog

    ids = catalog.ahead_ids()
    if len(ids) > MAX_PREPARED_CREWS:
        ids = sorted(catalog.declarative)
    if not ids or len(ids) > MAX_PREPARED_CREWS:
        return catalog
    try:
        return PreparedCatalog.prepare(catalog, ids)
    except Exception:  # the job's own build reports what is wrong
        return catalog


def run(channel_fd: int, close_fds: list[int], catalog: Any, settings: TemplateSettings,
        template_pid: int, spare: bool = False) -> NoReturn:
    """The whole life of a worker (called in the child right after ``fork``)."""
    code = EXIT_INTERNAL
    try:
        os.setpgid(0, 0)
        die_with_parent(signal.SIGKILL, template_pid)
        subreaper = become_subreaper()
        reset_signals()
        for fd in close_fds:
            os.close(fd)
        apply_limits(settings)
        sock = socket.socket(fileno=channel_fd)
        sock.setblocking(True)
        # One event loop for the warm-up and every job of this worker; never closed: the
        # process ends in os._exit after its last outcome is sent, so no loop teardown
        # (cancelling crewai's leftover tasks, joining the default executor) delays it.
        runner = asyncio.Runner()
        keep_in_this_process()  # after the fork: no SQLite connection crosses one
        if spare and settings.warm_workers:
            from crewfence_sidecar.workers.warmup import warm_up

            # a spare pays its first-kickoff costs before its job, on the job's own loop
            warm_up(in_worker=True, runner=runner)
            catalog = _prepare(catalog)
        channel = _Channel(sock)
        from crewfence_sidecar.offline_llm import observe_calls
        from crewfence_sidecar.tools import ledger

        ledger.sole_job_process()  # one job at a time: its ledger is the process's

        job_running = False

        def report_call() -> None:
            if job_running:  # only the current job's calls (not a warm-up's)
                channel.send({"type": "llm_call"})

        observe_calls(report_call)
        jobs_done = 0
        code = EXIT_NO_JOB
        while True:
            job = read_frame(sock)
            if job is None:
                break
            baseline = JobBaseline.take()
            channel.send({"type": "started", "pid": os.getpid(),
                          "started_ns": time.monotonic_ns()})
            job_running = True
            outcome = runner.run(_execute(catalog, job, channel, settings))
            channel.send_outcome(outcome)
            jobs_done += 1
            code = EXIT_OK
            max_jobs = int(job.get("max_jobs") or 1)
            if jobs_done < max_jobs and not _await_recorded(sock):
                break  # the sidecar closed the channel: nothing more to do
            why_not = refusal(runner.get_loop(), baseline, jobs_done=jobs_done,
                              max_jobs=max_jobs, cpu_limited=settings.cpu_seconds > 0,
                              subreaper=subreaper,
                              max_rss_bytes=int(job.get("max_rss_bytes")
                                                or MAX_REUSE_RSS_BYTES))
            if why_not is not None:
                channel.send({"type": "retiring", "reason": why_not})
                break
            job_running = False
            channel.send({"type": "idle", "jobs_done": jobs_done,
                          "cpu_seconds": round(time.process_time(), 6)})
            if settings.warm_workers:  # like a spare: the next job's crew is built ahead
                catalog = _prepare(catalog)
    except BaseException:
        code = EXIT_INTERNAL
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: S110 - exiting anyway
                pass
        os._exit(code)
