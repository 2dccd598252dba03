"""The runtime's ``Executor`` that runs every job in its own worker process.

Invariants kept here:

- Reaped before a stop or a failure is recorded: every path out of
  :meth:`WorkerExecutor.__call__` but a result (error, death, cancel, timeout, sidecar stop)
  first waits until the worker was reaped; the runtime writes those terminal records only
  after this returns or raises. A second cancellation while a worker is being stopped does
  not cut that wait short. A result is handed to ``JobContext.on_output`` as it arrives (the
  worker has nothing left to run but its exit), so a blocking answer does not wait for the
  kernel to tear a process down.
- Live workers count against maxConcurrency (busy + idle): the runtime holds its concurrency
  slot for the whole call, and the call lasts until the worker is gone, or, for a reused
  worker, until it reported ``idle`` (it runs nothing then) and went back to the pool. Idle
  workers (spares and reused ones) are only kept while ``max_live`` is set and are counted
  by the supervisor's ``live_workers`` like any live worker, so busy + idle <= max_live.
- Spares never compete with the job that takes one: the pool is refilled when a job ends
  (its worker reaped or idle again), and at take time only when the pool has run dry, so a
  replacement's fork and warm-up kickoff happen after the job that triggered them, not
  beside it.
- A worker that may be reused starts its after-job work (reuse checks, the next crew's
  build) only when told ``recorded``, which is sent after ``on_output`` journaled the
  outcome and ``JobContext.answered`` returned (the blocking answers of the job were
  written), so that work does not compete with the fsync and the answer for the 2 cores.
- A job whose worker ended before its ``started`` frame ran nothing (a worker sends it
  before anything of the job runs): it is offered to another worker (at most
  ``MAX_ATTEMPTS`` in all), and when none starts it, it fails as certain (``job_started:
  false``), never as an uncertain outcome.
- A burst's workers stay warm: an idle reused worker goes back to the pool while it is alive
  (it is counted as live anyway, so busy + idle <= max_live holds), so the next burst finds
  as many warm workers as the last one used instead of forking cold ones beside its jobs
  (a fork at admission costs the job ~3x the CPU of a reused worker; a spare's warm-up
  kickoff runs beside the jobs). So a sidecar keeps up to maxConcurrency workers after a
  burst that used them (the pod must fit that many running anyway); they exit when their
  job count or resident set reaches its bound, or with the sidecar.
- Reuse only after a job ended on its own: a worker goes back to the pool only when its job
  sent a result or an error and then the worker itself reported ``idle`` (its checks in
  :mod:`crewfence_sidecar.workers.reuse` passed). A cancelled, timed-out or stopped job's
  worker is always signalled and reaped; a worker whose channel ended is never reused, so a
  dead worker fails only its own job. Reused workers are given out first (warmest).
- Stop = SIGTERM to the group, ``stop_grace`` seconds, SIGKILL, reap; the
  :class:`~crewfence_sidecar.workers.outcomes.StopReport` goes to the runtime through
  ``JobContext.on_stopped`` before the cancellation propagates.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections import deque
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from crewfence_sidecar.config import BOUNDS
from crewfence_sidecar.journal import utc_now
from crewfence_sidecar.runtime import JobContext
from crewfence_sidecar.tools.server_lists import ListedToolRef
from crewfence_sidecar.workers.counters import count_offline_llm_call
from crewfence_sidecar.workers.outcomes import RemoteExecutionError, StopReport, WorkerDied
from crewfence_sidecar.workers.protocol import ExitStatus
from crewfence_sidecar.workers.supervisor import Supervisor, TemplateInfo, WorkerHandle

T = TypeVar("T")
log = logging.getLogger("crewfence.sidecar.workers")
DEFAULT_STOP_GRACE_SECONDS = 2.0
DEFAULT_SPARES = 2
DEFAULT_MAX_JOBS = BOUNDS["worker_max_jobs"].default
DEFAULT_MAX_RSS_BYTES = BOUNDS["worker_max_rss_mb"].default * 1024 * 1024


MAX_ATTEMPTS = 3
"""Workers a job may be offered to when each ended before the job started."""


@dataclass
class _Progress:
    started: bool = False
    """The worker's ``started`` frame arrived: from then on the job may have had effects."""


def _preceding(raw: Any) -> list[tuple[str, dict[str, Any]]] | None:
    """An effect frame's ``preceding`` events as ``(event, data)``; None when malformed."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        return None
    out: list[tuple[str, dict[str, Any]]] = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], dict)):
            return None
        out.append((str(item[0]), item[1]))
    return out


class _NotSerialisable:
    """Stands for a worker output that was not JSON: the runtime records it as such."""


async def _uncancellable(awaitable: Awaitable[T]) -> T:
    """Await to the end even if the waiting task is cancelled again meanwhile."""
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        current = asyncio.current_task()
        if current is not None:
            current.cancel()  # re-deliver after the work is done
    return result


@dataclass
class WorkerStats:
    """Start latencies (fork to first instruction of the job), for the benchmark."""

    start_ns: list[int]
    job_cpu_seconds: list[float] = field(default_factory=list)
    """CPU time of each job: the worker's CPU time since its previous job ended (a worker's
    first job includes its fork and, for a spare, its warm-up)."""
    reused_jobs: int = 0
    """Jobs that ran in a worker which had run an earlier job."""
    not_reused: list[str] = field(default_factory=list)
    """Why workers that could have been reused exited instead (the worker's own words)."""

    def __iter__(self) -> Iterator[int]:
        return iter(self.start_ns)


class WorkerCrews:
    """The crew set the runtime checks admissions against, as the template loaded it."""

    def __init__(self, info: TemplateInfo) -> None:
        self._ids = frozenset(info.crew_ids)
        self.placeholders = info.placeholders
        self.credentials = info.model_credentials
        self.listed_tools = {crew_id: [ListedToolRef.from_wire(crew_id, raw) for raw in refs]
                             for crew_id, refs in info.listed_tools.items()}
        """Per crew, the ``server/tool`` names only the server can decide (admission)."""

    def crew_ids(self) -> list[str]:
        return sorted(self._ids)

    def __contains__(self, crew_id: object) -> bool:
        return crew_id in self._ids

    def required_inputs(self, crew_id: str) -> list[str]:
        return list(self.placeholders.get(crew_id, []))

    def model_credentials(self) -> dict[str, dict[str, Any]]:
        """For /health: per declarative crew, whether its model's credentials are present."""
        return {crew_id: dict(entry) for crew_id, entry in sorted(self.credentials.items())}


class WorkerExecutor:
    """Runs each job in a worker. Keeps up to ``spares`` warm spare workers (forked ahead,
    oldest given out first) while ``live workers < max_live``, so spares never push the
    process count past maxConcurrency; without ``max_live`` every job forks its own worker.
    A worker may run up to ``max_jobs`` jobs (worker reuse; 1 = one job per worker); an idle
    reused worker is kept (a burst's workers stay warm for the next burst).
    """

    def __init__(self, supervisor: Supervisor,
                 stop_grace: float = DEFAULT_STOP_GRACE_SECONDS,
                 max_live: int | None = None, spares: int = DEFAULT_SPARES,
                 max_jobs: int = DEFAULT_MAX_JOBS,
                 max_rss_bytes: int = DEFAULT_MAX_RSS_BYTES) -> None:
        self.supervisor = supervisor
        self.stop_grace = stop_grace
        self.max_live = max_live
        self.spares = spares
        self.max_jobs = max_jobs
        self.max_rss_bytes = max_rss_bytes
        self.stats = WorkerStats([])
        self._spares: deque[WorkerHandle] = deque()
        self._returning = 0
        """Workers between their job's outcome and ``idle``: in the pool again in a moment."""

    @property
    def spare_pids(self) -> list[int]:
        return [pid for pid in (h.pid for h in self._spares) if pid is not None]

    def _take_worker(self) -> WorkerHandle:
        while self._spares:
            spare = self._spares.popleft()
            if not spare.exited.done() and not (
                    spare.forked.done() and spare.forked.exception() is not None):
                return spare
            spare.close()
        return self.supervisor.request_fork()

    def _refill(self) -> None:
        """Fork spares up to ``spares`` while one more live worker stays within max_live."""
        if self.max_live is None or not self.supervisor.available:
            return
        while (len(self._spares) < self.spares
               and self.supervisor.live_workers + 1 <= self.max_live):
            self._spares.append(self.supervisor.request_fork(spare=True))

    async def close(self) -> None:
        """End the spares (their channels close, they exit without a job); wait for reaps."""
        spares, self._spares = list(self._spares), deque()
        for spare in spares:
            spare.close()
        for spare in spares:
            try:
                await asyncio.shield(spare.forked)
            except OSError:
                continue
            await asyncio.shield(spare.exited)

    def prime(self) -> None:
        """Fork the first spares (call on the running event loop)."""
        self._refill()

    def _put_back(self, handle: WorkerHandle) -> bool:
        """Return an idle worker to the pool (first in line); False when it cannot stay.
        It stays even beyond ``max(spares, 1)``: it is counted as live either way (busy +
        idle <= max_live), and the next burst then finds it warm."""
        if self.max_live is None or not self.supervisor.available or handle.exited.done():
            return False
        handle.spare = True  # its next start includes waiting: not a start latency
        self._spares.appendleft(handle)
        return True

    async def __call__(self, ctx: JobContext) -> Any:
        """Run the job in a worker; on another one when a worker ended before the job
        started (an idle or spare worker that died in the pool: nothing of the job ran, so
        running it elsewhere keeps it at most once), up to :data:`MAX_ATTEMPTS` workers."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                return await self._attempt(ctx)
            except WorkerDied as died:
                if died.job_started or attempt == MAX_ATTEMPTS or not self.supervisor.available:
                    raise
                log.warning("a worker %s before its job started; the job goes to another "
                            "worker", died.exit.describe(), extra={"action_id": ctx.action_id})
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(self, ctx: JobContext) -> Any:
        handle = self._take_worker()
        progress = _Progress()
        if not self._spares and not self._returning:
            # Run dry: a burst must not find the pool empty twice. Not while a worker is on
            # its way back: jobs sent back to back would each fork a spare whose fork and
            # warm-up kickoff compete with the job just started, for a worker the pool is
            # about to get back anyway (the end of every job refills what is still missing).
            self._refill()
        idle = False
        exit_status: ExitStatus | None = None
        try:
            try:
                await asyncio.shield(handle.forked)
            except OSError as exc:  # no worker could be forked: nothing ran
                lost = ExitStatus(detail=f"no worker process: {exc}")
                raise WorkerDied(lost, StopReport(stopped_at=utc_now(), exit=lost,
                                                  escalated=None), job_started=False) from None
            if handle.jobs_done:
                self.stats.reused_jobs += 1
            may_reuse = self.max_live is not None and handle.jobs_done + 1 < self.max_jobs
            await handle.open({"crew_id": ctx.crew_id, "action_id": ctx.action_id,
                               "operation": ctx.operation, "input": ctx.input,
                               "resume": ctx.resume, "keep_material": ctx.keep_material,
                               "max_jobs": self.max_jobs if self.max_live is not None else 1,
                               "max_rss_bytes": self.max_rss_bytes})
            outcome = await self._follow(handle, ctx, progress)
            if outcome is not None and ctx.on_output is not None:
                if outcome["type"] == "result":
                    ctx.on_output(outcome.get("output"))
                elif outcome["type"] == "unserialisable":
                    ctx.on_output(_NotSerialisable())
            if outcome is not None and may_reuse:
                self._returning += 1
                try:
                    idle = await self._return(handle, ctx)
                finally:
                    self._returning -= 1
            if not idle:
                exit_status = await asyncio.shield(handle.exited)
                if exit_status.cpu_seconds is not None:
                    self.stats.job_cpu_seconds.append(
                        max(0.0, exit_status.cpu_seconds - handle.cpu_seconds_before))
        except asyncio.CancelledError:
            idle = False  # a cancelled job's worker is stopped, never reused
            report = await _uncancellable(self._stop(handle))
            if report is not None and ctx.on_stopped is not None:
                ctx.on_stopped(report)
            raise
        finally:
            if not idle:
                handle.close()
            self._refill()
        if exit_status is None:  # idle again: the job ended with its outcome
            exit_status = ExitStatus(exit_code=0)
        return self._conclude(outcome, exit_status, progress)

    async def _return(self, handle: WorkerHandle, ctx: JobContext) -> bool:
        """A reusable worker's way back after its outcome: once the job's answers are
        written it is told ``recorded``, checks itself and reports ``idle``; True when it is
        in the pool again."""
        if ctx.answered is not None:
            await ctx.answered()
        handle.send({"type": "recorded"})  # the worker's after-job work may start
        idle_cpu = await self._await_idle(handle)
        if idle_cpu is None:
            return False
        self.stats.job_cpu_seconds.append(max(0.0, idle_cpu - handle.cpu_seconds_before))
        handle.cpu_seconds_before = idle_cpu
        handle.jobs_done += 1
        if self._put_back(handle):
            return True
        handle.close()  # the sidecar is losing its template: it exits
        return False

    async def _await_idle(self, handle: WorkerHandle) -> float | None:
        """After the outcome: the worker's CPU seconds when it reported ``idle`` (it may take
        another job), None when its channel ended (it exits)."""
        while True:
            message = await handle.next_message()
            if message is None:
                return None
            kind = message.get("type")
            if kind == "llm_call":
                count_offline_llm_call()
            elif kind == "idle":
                return float(message.get("cpu_seconds") or 0.0)
            elif kind == "retiring":
                reason = str(message.get("reason") or "")
                self.stats.not_reused.append(reason)
                log.debug("worker %s is not reused: %s", handle.pid, reason)

    async def _follow(self, handle: WorkerHandle, ctx: JobContext,
                      progress: _Progress) -> dict[str, Any] | None:
        """Chunks to the runtime until the result; None when the channel ended without one."""
        while True:
            message = await handle.next_message()
            if message is None:
                return None
            kind = message.get("type")
            if kind == "chunk":
                ctx.emit_chunk(dict(message.get("data") or {}))
            elif kind == "llm_call":
                count_offline_llm_call()
            elif kind == "effect":
                self._record_effect(handle, ctx, message)
            elif kind == "started":
                progress.started = True
                if handle.fork_ns and not handle.spare:  # a spare's start includes waiting
                    self.stats.start_ns.append(int(message["started_ns"]) - handle.fork_ns)
            elif kind in ("result", "error", "unserialisable"):
                return message

    @staticmethod
    def _record_effect(handle: WorkerHandle, ctx: JobContext, message: dict[str, Any]) -> None:
        """Journal one effect frame (its ``preceding`` events first, one commit); a frame
        asking for an ``ack`` (a tool call's start, which waits for it before the tool runs)
        is answered only after the journal committed it durably (``ok: true``) or failed to
        (``ok: false``: the tool does not run)."""
        durable = "ack" in message
        data = message.get("data")
        preceding = _preceding(message.get("preceding"))
        ok = (ctx.record_effect is not None and isinstance(data, dict) and preceding is not None
              and ctx.record_effect(str(message.get("event")), data, durable, preceding))
        if durable:
            handle.send({"type": "effect_ack", "ack": message["ack"], "ok": bool(ok)})

    @staticmethod
    def _conclude(outcome: dict[str, Any] | None, exit_status: ExitStatus,
                  progress: _Progress) -> Any:
        if outcome is None:
            raise WorkerDied(exit_status, StopReport(stopped_at=utc_now(), exit=exit_status,
                                                     escalated=None),
                             job_started=progress.started)
        kind = outcome["type"]
        if kind == "result":
            return outcome.get("output")
        if kind == "unserialisable":
            return _NotSerialisable()
        setup = outcome.get("tool_setup")
        raise RemoteExecutionError(str(outcome.get("exception") or "Exception"),
                                   tool_setup=str(setup) if setup is not None else None)

    async def _stop(self, handle: WorkerHandle) -> StopReport | None:
        try:
            pid = await asyncio.shield(handle.forked)
        except OSError:
            return None  # never forked: nothing ran
        escalated = False
        if not handle.exited.done():
            self.supervisor.signal(pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(handle.exited), self.stop_grace)
            except TimeoutError:
                escalated = True
                self.supervisor.signal(pid, signal.SIGKILL)
        exit_status = await asyncio.shield(handle.exited)
        return StopReport(stopped_at=utc_now(), exit=exit_status, escalated=escalated)
