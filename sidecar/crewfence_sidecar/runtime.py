"""Admission, execution, events and cancellation of jobs (no HTTP, no crewai import).

Admission order (the heart of the product): validate -> hash -> exact repeat / 409 / 410 ->
persist durably -> only then create the asyncio task. Everything between the lookup and the
task creation runs without yielding to the event loop, and a per-action lock keeps it so even
if a future change adds an ``await``: N concurrent identical admissions execute once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, cast

from crewfence_sidecar.contract import (
    EFFECT_EVENTS,
    MAX_TOOL_SETUP_MESSAGE_CHARS,
    OPERATION_TRAITS,
    RESUMABLE_OPERATIONS,
    SUCCESSOR_ALLOWING,
    TOOL_UNAVAILABLE,
    UNRECORDED_GRACE_SECONDS,
    ContractError,
    DrainState,
    EffectSink,
    EventName,
    JobEvent,
    JobRecord,
    Operation,
    ResolutionRequest,
    StartRequest,
    Status,
    SuccessorRequest,
    Tombstone,
    TombstoneImportResult,
    ToolSetupError,
    check_template_inputs,
    finding_of,
    request_hash,
    validate_idempotency_key,
    validate_operation_input,
)
from crewfence_sidecar.journal import (
    Journal,
    JournalFull,
    PersistError,
    dumps,
    resume_pending,
    utc_iso,
    utc_now,
)
from crewfence_sidecar.metrics import SidecarMetrics
from crewfence_sidecar.resume import build_plan, unresolved_in_doubt
from crewfence_sidecar.tools.server_lists import ServerToolLists
from crewfence_sidecar.workers.outcomes import StopReport, WorkerDied

log = logging.getLogger("crewfence.sidecar.runtime")
_MATERIAL_KEYS = ("output", "result")
"""Resume material in an effect event's data (see ``tools.ledger``)."""


@dataclass(frozen=True)
class JobContext:
    """What an executor needs to run one admitted job."""

    crew_id: str
    action_id: str
    operation: str
    """A :class:`crewfence_sidecar.contract.Operation` value."""
    input: dict[str, Any]
    """Already validated by ``contract.validate_operation_input``."""
    training_dir: Path | None
    emit_chunk: Callable[[dict[str, Any]], None]
    """Appends the data of one ``chunk`` event; called on the job's event loop, in the
    order the chunks were streamed (see :mod:`crewfence_sidecar.chunks`)."""
    on_stopped: Callable[[StopReport], None] | None = None
    """Told by a worker executor that it stopped and reaped the job's worker (see workers)."""
    on_output: Callable[[Any], None] | None = None
    """Told the operation's output as soon as a worker reports it, before that worker is
    reaped: the runtime records the completion at once (see ``Runtime._record_output``)."""
    answered: Callable[[], Awaitable[None]] | None = None
    """Returns once every blocking answer that waits for this job was written (bounded):
    a worker executor awaits it after ``on_output`` before the worker's after-job work."""
    record_effect: EffectSink | None = None
    """``record_effect(event, data, durable, preceding=()) -> journaled``: appends
    effect-ledger events (``contract.EFFECT_EVENTS``) in one commit; with ``durable`` it
    returns only once they are committed durably. Callable from any thread (see
    ``Runtime.effect_recorder``)."""
    resume: dict[str, Any] | None = None
    """A resumed job: its ``resume.ResumePlan`` as JSON (``to_wire``), built at admission
    from the predecessor's journal."""
    keep_material: bool = False
    """Journal resume material (full task outputs, tool results; bounded) for this job."""


class Executor(Protocol):
    def __call__(self, ctx: JobContext) -> Awaitable[Any]: ...


class CrewSet(Container[object], Protocol):
    def crew_ids(self) -> list[str]: ...


@dataclass(frozen=True)
class RuntimeSettings:
    allowed_operations: frozenset[Operation]
    max_concurrency: int = 4
    training_dir: Path | None = None
    resume_material: bool = False
    """Every run/batch_run journals its resume material (``JobContext.keep_material``)."""


@dataclass(frozen=True)
class Admission:
    record: JobRecord
    created: bool
    """False for an exact repeat (nothing scheduled)."""


class JournalUnavailable(Exception):
    """Persisting the admission failed (507); nothing was kept or scheduled."""

    def __init__(self, message: str, *, full: bool) -> None:
        super().__init__(message)
        self.full = full


class Draining(Exception):
    """The sidecar is draining: a new admission is refused (503 ``draining``); known actions
    (exact repeats, lookups, events, cancel, archive) keep being answered."""


class Gone(Exception):
    """The action was archived; the tombstone answers instead of running it again (410)."""

    def __init__(self, tombstone: Tombstone) -> None:
        super().__init__(f"action {tombstone.action_id!r} was archived")
        self.tombstone = tombstone


@dataclass
class _Job:
    task: asyncio.Task[None]
    thread_backed: bool
    cancel_reason: str | None = None
    cancel_requested: bool = False
    dropped_chunks: int = 0
    dropped_effects: int = 0
    stop: StopReport | None = None
    """Set when the job's worker process was stopped and reaped (work_stopped)."""
    resume: dict[str, Any] | None = None
    """A resumed job's plan (``ResumePlan.to_wire``), read from the journal at admission and
    held here until the job ends, so archiving the predecessor meanwhile loses nothing."""

    def stop_fields(self) -> dict[str, Any]:
        return self.stop.to_error_fields() if self.stop is not None else {}

    def record_stop(self, report: StopReport) -> None:
        self.stop = report


@dataclass
class _Watch:
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


def _wake(watches: dict[str, _Watch], action_id: str) -> None:
    watch = watches.pop(action_id, None)
    for fut in watch.waiters if watch is not None else []:
        if not fut.done():
            fut.set_result(None)


async def _until_woken(watches: dict[str, _Watch], action_id: str,
                       timeout: float | None) -> None:  # noqa: ASYNC109
    """Wait for ``_wake(watches, action_id)`` or the timeout, whichever comes first."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    watches.setdefault(action_id, _Watch()).waiters.append(fut)
    try:
        # asyncio.timeout, not wait_for: the waiter resumes in the loop turn after the wake
        # (wait_for's own waiter future adds one more turn to every blocking answer)
        async with asyncio.timeout(timeout):
            await fut
    except TimeoutError:
        pass
    finally:
        watch = watches.get(action_id)
        if watch is not None and fut in watch.waiters:
            watch.waiters.remove(fut)
            if not watch.waiters:
                del watches[action_id]


def _log_admitted(req: StartRequest) -> None:
    log.info("admitted", extra={"action_id": req.action_id, "crew_id": req.crew_id,
                                "operation": req.operation.value})


EFFECT_WAIT_SECONDS = 60.0
"""How long a tool call waits for its durable start before it is refused (not run)."""
ANSWER_WAIT_SECONDS = 1.0
"""How long a job's worker may wait for the blocking answers of its job to be written."""


class Runtime:
    def __init__(self, journal: Journal, crews: CrewSet, settings: RuntimeSettings,
                 executor: Executor, metrics: SidecarMetrics,
                 tool_lists: ServerToolLists | None = None) -> None:
        self.journal = journal
        self.tool_lists = tool_lists
        """Decides at admission the ``server/tool`` names only their server can decide."""
        self.crews = crews
        self.settings = settings
        self.executor = executor
        self.metrics = metrics
        self._jobs: dict[str, _Job] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._lock_users: dict[str, int] = {}
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self._train_lock = asyncio.Lock()  # crewai trains relative to the process cwd
        self._watches: dict[str, _Watch] = {}
        self._answering: dict[str, int] = {}
        self._answers_written: dict[str, _Watch] = {}
        self._closing = False
        self.metrics.watch_journal(lambda: len(journal.records), journal.state_bytes)

    # --- admission -------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _action_lock(self, action_id: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(action_id, asyncio.Lock())
        self._lock_users[action_id] = self._lock_users.get(action_id, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._lock_users[action_id] -= 1
            if self._lock_users[action_id] == 0:
                del self._lock_users[action_id]
                del self._locks[action_id]

    async def admit(self, req: StartRequest, raw_key: str | None) -> Admission:
        """Admit a start request; raises ContractError, Gone or JournalUnavailable."""
        # ContractErrors are counted by the HTTP layer (rejections_total{code}).
        key = validate_idempotency_key(raw_key)
        digest = request_hash(req, key)
        async with self._action_lock(req.action_id):
            existing = self.journal.get(req.action_id)
            if existing is not None:
                if existing.request_hash != digest:
                    self.metrics.conflict()
                    raise ContractError(409, "request_conflict",
                                        "this action id was admitted with a different request")
                self.metrics.exact_repeat()
                return Admission(existing, created=False)
            stone = self.journal.tombstone(req.action_id)
            if stone is not None:
                if stone.request_hash != digest:
                    self.metrics.conflict()
                    raise ContractError(409, "request_conflict",
                                        "this archived action id had a different request")
                self.metrics.rejection("archived")
                raise Gone(stone)
            self._check_admissible(req)
            if self.tool_lists is not None and self.tool_lists.misses(req.crew_id):
                # Only a name missing from its server's cached list waits (one fresh
                # tools/list, bounded); a 422 here journals nothing. Whatever changed during
                # that wait (shutdown, the draining switch) is checked again.
                await self.tool_lists.check(req.crew_id)
                self._check_open()
            plan = self._resume_plan(req)
            record = self._persist_admission(req, digest)
            self._start(record, req, plan)
            self.metrics.admission(req.operation.value)
            # written once the answer is on its way (the next turn of the event loop): the
            # record is durable already, and the answer does not wait for a log line
            asyncio.get_running_loop().call_soon(_log_admitted, req)
            return Admission(record, created=True)

    def _check_admissible(self, req: StartRequest) -> None:
        self._check_open()
        if req.crew_id not in self.crews:
            raise ContractError(404, "unknown_crew", "no crew with this crew_id is hosted here")
        if req.operation not in self.settings.allowed_operations:
            raise ContractError(403, "operation_not_enabled",
                                f"operation {req.operation.value} is not enabled")
        validate_operation_input(req.operation, req.input)
        required = getattr(self.crews, "required_inputs", None)
        if required is not None:
            check_template_inputs(req.operation, req.input, required(req.crew_id))

    def _check_open(self) -> None:
        if self._closing:
            raise ContractError(503, "shutting_down", "the sidecar is shutting down")
        if self.journal.draining:
            # Invariant (draining): no new action is admitted while the journaled switch is
            # on; an exact repeat or an archived action was answered before this point.
            self.metrics.rejection("draining")
            raise Draining()

    def _resume_plan(self, req: StartRequest) -> dict[str, Any] | None:
        """The plan of a start with ``resume_from`` (None without), from the predecessor's
        journaled events and resolution; refuses (404/409) what cannot be resumed.

        Invariant: a predecessor with tool calls in doubt is resumed only once resolved (the
        resolution decides whether those calls run again)."""
        if req.resume_from is None:
            return None
        pred = self.journal.get(req.resume_from)
        if pred is None:
            if self.journal.tombstone(req.resume_from) is not None:
                raise ContractError(409, "predecessor_archived",
                                    "the predecessor was archived: its journaled trajectory is "
                                    "gone; start without resume_from")
            raise ContractError(404, "predecessor_unknown",
                                "resume_from names no action in this journal")
        if pred.crew_id != req.crew_id or pred.operation != req.operation.value:
            raise ContractError(409, "resume_mismatch",
                                "resume_from names an action of another crew or operation")
        if not pred.terminal:
            raise ContractError(409, "predecessor_running",
                                "the predecessor is still running; stop it first")
        events = self.journal.events(req.resume_from, 0, pred.event_count + 1)
        resolution = self.journal.resolution(req.resume_from)
        outcome = None if resolution is None else str(resolution.data.get("outcome"))
        plan = build_plan(req.resume_from, events, outcome)
        unresolved = unresolved_in_doubt(plan)
        if unresolved:
            raise ContractError(409, "predecessor_unresolved",
                                f"the predecessor has {len(unresolved)} tool call(s) in doubt; "
                                "resolve it first (Happened / NotHappened / Compensated)")
        return plan.to_wire()

    def _persist_admission(self, req: StartRequest, digest: str) -> JobRecord:
        now = utc_now()
        record = JobRecord(action_id=req.action_id, crew_id=req.crew_id,
                           operation=req.operation.value, request_hash=digest,
                           status=Status.RUNNING, event_count=0, created_at=now,
                           updated_at=now)
        started: dict[str, Any] = {"operation": req.operation.value,
                                   "timeout_ms": req.effective_timeout_ms}
        if req.resume_from is not None:
            started["resume_from"] = req.resume_from
        if self.settings.resume_material and req.operation in RESUMABLE_OPERATIONS:
            started["resume_material"] = True  # retention keeps it for a resume (journal)
        try:
            with self.metrics.persist_timer():
                self.journal.admit(record, started)
        except JournalFull as exc:
            self.metrics.rejection("journal_full")
            log.warning("journal full", extra={"action_id": req.action_id,
                                               "crew_id": req.crew_id})
            raise JournalUnavailable(str(exc), full=True) from None
        except PersistError as exc:
            self.metrics.rejection("persist_failed")
            log.error("journal persist failed: %s", type(exc.__cause__).__name__,
                      extra={"action_id": req.action_id, "crew_id": req.crew_id})
            raise JournalUnavailable("the journal could not persist the admission",
                                     full=False) from None
        return record

    def _start(self, record: JobRecord, req: StartRequest,
               plan: dict[str, Any] | None = None) -> None:
        traits = OPERATION_TRAITS[req.operation]
        task = asyncio.create_task(self._job(record, req), name=f"job:{record.action_id}")
        self._jobs[record.action_id] = _Job(task=task, thread_backed=traits.thread_backed,
                                            resume=plan)
        self._notify(record.action_id)

    # --- execution -------------------------------------------------------------------------
    async def _execute(self, req: StartRequest) -> Any:
        def emit_chunk(data: dict[str, Any]) -> None:
            self._append_chunk(req.action_id, data)

        job = self._jobs.get(req.action_id)
        ctx = JobContext(crew_id=req.crew_id, action_id=req.action_id,
                         operation=req.operation.value, input=req.input,
                         training_dir=self.settings.training_dir, emit_chunk=emit_chunk,
                         on_stopped=job.record_stop if job is not None else None,
                         on_output=lambda output: self._record_output(req.action_id, output),
                         answered=lambda: self.answers_written(req.action_id),
                         record_effect=self.effect_recorder(req.action_id),
                         resume=job.resume if job is not None else None,
                         keep_material=(self.settings.resume_material
                                        and req.operation in RESUMABLE_OPERATIONS))
        if req.operation is Operation.TRAIN:
            async with self._train_lock:
                return await self.executor(ctx)
        return await self.executor(ctx)

    async def _execute_in_slot(self, req: StartRequest) -> Any:
        """Wait for a concurrency slot, then execute under the request's timeout.

        The timeout covers execution, not the wait for a slot; the blocking HTTP route waits
        from admission, which is how its 504 can come first.
        """
        async with self._slots:
            self.metrics.active_runs.inc()
            try:
                # in this task (asyncio.timeout): wait_for would run the execution in a task
                # of its own, one more loop turn at its start and one at its end of every job
                async with asyncio.timeout(req.effective_timeout_ms / 1000):
                    return await self._execute(req)
            finally:
                self.metrics.active_runs.dec()

    async def _job(self, record: JobRecord, req: StartRequest) -> None:
        action_id = record.action_id
        job = self._jobs[action_id]
        try:
            output = await self._execute_in_slot(req)
        except asyncio.CancelledError:
            if job.cancel_requested:
                self._finish(action_id, Status.CANCELLED, None,
                             {"code": "cancelled", "message": "cancelled on request",
                              **({"reason": job.cancel_reason} if job.cancel_reason else {}),
                              **job.stop_fields()},
                             uncertain=job.thread_backed)
                return
            # not our cancel route: the server is stopping; the outcome is unknown
            self._finish(action_id, Status.FAILED, None,
                         {"code": "sidecar_stopped",
                          "message": "the sidecar stopped while this job was running",
                          **job.stop_fields()},
                         uncertain=True)
            raise
        except TimeoutError:
            self._finish(action_id, Status.FAILED, None,
                         {"code": "timeout",
                          "message": f"the job exceeded timeout_ms={req.effective_timeout_ms}",
                          **job.stop_fields()},
                         uncertain=job.thread_backed)
        except WorkerDied as died:
            # Invariant (containment): a dead worker fails only its own job, uncertain when
            # the job had started (it may have had effects before it died); its group was
            # killed and reaped first. One that ended before the job started ran nothing.
            self._finish(action_id, Status.FAILED, None, died.error_fields(),
                         uncertain=died.job_started)
            log.warning("job worker died: %s", died.exit.describe(),
                        extra={"action_id": action_id, "crew_id": record.crew_id})
        except Exception as exc:
            # The exception class only: messages can carry inputs or provider details; a
            # crew whose tools cannot be built says which (ToolSetupError: nothing ran).
            name = str(getattr(exc, "exception_name", type(exc).__name__))
            setup = (str(exc)[:MAX_TOOL_SETUP_MESSAGE_CHARS] if isinstance(exc, ToolSetupError)
                     else getattr(exc, "tool_setup", None))
            error = ({"code": TOOL_UNAVAILABLE, "exception": name, "message": setup}
                     if setup else {"code": "execution_error", "exception": name,
                                    "message": f"the operation raised {name}"})
            self._finish(action_id, Status.FAILED, None, error, uncertain=False)
            log.warning("job failed: %s", name,
                        extra={"action_id": action_id, "crew_id": record.crew_id})
        else:
            self._record_output(action_id, output)
        finally:
            self._jobs.pop(action_id, None)

    def _record_output(self, action_id: str, output: Any) -> None:
        """Record a completion (or an output that is not JSON); a no-op once terminal.

        A worker executor calls this when the worker sends its result, before the worker is
        reaped, so the answer does not wait for the process to be torn down. Sound because
        the worker has nothing left to run but ``os._exit`` (its threads die with it), and
        the concurrency slot stays held until the reap: ``maxConcurrency`` still counts
        live workers. A cancel or timeout arriving in between leaves the record unchanged.
        """
        try:
            dumps(output)
        except (TypeError, ValueError):
            self._finish(action_id, Status.FAILED, None,
                         {"code": "output_not_serialisable",
                          "message": "the operation returned output that is not JSON"},
                         uncertain=False)
        else:
            self._finish(action_id, Status.COMPLETED, output, None, uncertain=False)

    def record_effect(self, action_id: str, name: str, data: dict[str, Any], *,
                      durable: bool) -> bool:
        """Append one effect-ledger event of a running job (see :meth:`record_effects`)."""
        return self.record_effects(action_id, [(name, data)], durable=durable)

    def record_effects(self, action_id: str, events: Sequence[tuple[str, dict[str, Any]]], *,
                       durable: bool) -> bool:
        """Append effect-ledger events of a running job in one commit (on the loop's thread);
        False when they were not journaled (an unknown name, no running record, journal
        full, persist error): then none of them is.

        Invariant (write-ahead tool calls): with ``durable`` True is returned only after the
        journal committed the events with a synced WAL; the caller runs the tool only then.
        Resume material that does not fit the event bound is left out (not reusable), the
        event itself is kept.
        """
        record = self.journal.get(action_id)
        job = self._jobs.get(action_id)
        if (not events or record is None or record.terminal
                or any(name not in EFFECT_EVENTS for name, _ in events)):
            return False
        batch: list[tuple[str, dict[str, Any]]] = []
        for name, data in events:
            if any(k in data for k in _MATERIAL_KEYS) and not self.journal.event_fits(name,
                                                                                      data):
                data = {k: v for k, v in data.items() if k not in _MATERIAL_KEYS}
                data["material"] = "too_large"
            batch.append((name, data))
        try:
            self.journal.append_events(action_id, batch, durable=durable)
        except (JournalFull, PersistError, TypeError, ValueError) as exc:
            if job is not None:
                job.dropped_effects += len(batch)
            if durable:
                log.warning("effect not journaled: %s", type(exc).__name__,
                            extra={"action_id": action_id, "crew_id": record.crew_id})
            return False
        self._notify(action_id)
        return True

    def effect_recorder(self, action_id: str) -> EffectSink:
        """``JobContext.record_effect`` of a job: :meth:`record_effects` from any thread.

        Off the loop's thread, best-effort events are queued and journaled by one loop
        callback per batch (one wake-up of the loop and one commit, not one per event); a
        durable event is journaled on the loop in one commit with every event queued before
        it and its ``preceding`` (their order is kept), and the calling thread waits for its
        verdict.
        """
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        queued: deque[tuple[str, dict[str, Any]]] = deque()
        scheduled = threading.Event()  # set while a flush is pending on the loop

        def take_queued() -> list[tuple[str, dict[str, Any]]]:
            taken: list[tuple[str, dict[str, Any]]] = []
            while queued:
                taken.append(queued.popleft())
            return taken

        def flush() -> None:
            scheduled.clear()
            taken = take_queued()
            if taken:
                self.record_effects(action_id, taken, durable=False)

        def record(name: str, data: dict[str, Any], durable: bool,
                   preceding: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool:
            if threading.get_ident() == loop_thread:
                flush()
                return self.record_effects(action_id, [*preceding, (name, data)],
                                           durable=durable)
            if not durable:
                queued.extend(preceding)
                queued.append((name, data))
                if not scheduled.is_set():
                    scheduled.set()
                    try:
                        loop.call_soon_threadsafe(flush)
                    except RuntimeError:  # the loop is closed: nothing can be journaled
                        return False
                return True
            done: concurrent.futures.Future[bool] = concurrent.futures.Future()

            def run() -> None:
                try:
                    earlier = take_queued()
                    if earlier:  # best effort: their failure must not refuse the tool
                        self.record_effects(action_id, earlier, durable=False)
                    done.set_result(self.record_effects(
                        action_id, [*preceding, (name, data)], durable=True))
                except BaseException as exc:  # handed to the waiting thread
                    done.set_exception(exc)

            try:
                loop.call_soon_threadsafe(run)
            except RuntimeError:
                return False
            try:
                return done.result(timeout=EFFECT_WAIT_SECONDS)
            except Exception:  # a timeout or a failure: not known to be journaled
                return False

        return cast(EffectSink, record)  # mypy drops the default of a nested def

    def _append_chunk(self, action_id: str, data: dict[str, Any]) -> None:
        job = self._jobs.get(action_id)
        record = self.journal.get(action_id)
        if job is None or record is None or record.terminal:
            return
        if self.journal.room_for_chunks(action_id) < 1:
            job.dropped_chunks += 1  # the rest of the run's events stay for its effects
            return
        try:
            self.journal.append_event(action_id, EventName.CHUNK.value, data)
        except (JournalFull, PersistError, TypeError, ValueError):
            job.dropped_chunks += 1  # chunks are best effort; the terminal event is not
            return
        self._notify(action_id)

    def _finish(self, action_id: str, status: Status, output: Any,
                error: dict[str, Any] | None, *, uncertain: bool) -> None:
        record = self.journal.get(action_id)
        if record is None or record.terminal:
            return
        job = self._jobs.get(action_id)
        event_data: dict[str, Any] = {}
        if status is Status.COMPLETED:
            # AIP: the `completed` event's data is the operation's output itself.
            event_data = dict(output) if isinstance(output, dict) else {"output": output}
        if error is not None:
            event_data["error"] = error
            if error.get("work_stopped"):
                event_data["work_stopped"] = True
                event_data["stopped_at"] = error.get("stopped_at")
        if job is not None and job.dropped_chunks:
            event_data["dropped_chunks"] = job.dropped_chunks
        if job is not None and job.dropped_effects:
            event_data["dropped_effects"] = job.dropped_effects
        try:
            with self.metrics.persist_timer():
                self.journal.finish(action_id, status, output=output, error=error,
                                    uncertain=uncertain, event_data=event_data)
        except PersistError as exc:
            # Keep answering truthfully from memory; after a restart the journal still says
            # running, which restore turns into failed + uncertain.
            log.error("terminal state not persisted: %s", type(exc.__cause__).__name__,
                      extra={"action_id": action_id, "crew_id": record.crew_id})
            record.status = status
            record.output = output
            record.error = error
            record.uncertain_outcome = True
            record.updated_at = utc_now()
        self.metrics.finished(record.operation, record.status.value)
        log.info("finished", extra={"action_id": action_id, "crew_id": record.crew_id,
                                    "status": record.status.value,
                                    "uncertain_outcome": record.uncertain_outcome})
        self._notify(action_id)

    def _crews_record(self, crew_id: str, action_id: str) -> JobRecord:
        """This crew's record of the action; Gone for its tombstone, 404 otherwise."""
        record = self.journal.get(action_id)
        if record is None or record.crew_id != crew_id:
            stone = self.journal.tombstone(action_id)
            if stone is not None and stone.crew_id == crew_id:
                raise Gone(stone)
            raise ContractError(404, "unknown_job", "no such job for this crew")
        return record

    # --- cancellation ----------------------------------------------------------------------
    async def cancel(self, crew_id: str, action_id: str, reason: str | None) -> JobRecord:
        record = self._crews_record(crew_id, action_id)
        job = self._jobs.get(action_id)
        if record.terminal or job is None:
            return record  # terminal records are unchanged
        job.cancel_requested = True
        job.cancel_reason = reason
        job.task.cancel()
        # Wait for the task to record `cancelled` (its waiter on a thread returns at once).
        await asyncio.wait({job.task})
        self._settle(action_id, job)
        log.info("cancelled", extra={"action_id": action_id, "crew_id": crew_id})
        return record

    # --- observation -----------------------------------------------------------------------
    def _notify(self, action_id: str) -> None:
        _wake(self._watches, action_id)

    async def wait_change(self, action_id: str, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until the action gets a new event (or the timeout passes)."""
        await _until_woken(self._watches, action_id, timeout)

    async def wait_terminal(self, action_id: str, timeout: float) -> bool:  # noqa: ASYNC109
        """True when the record is terminal within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            record = self.journal.get(action_id)
            if record is None or record.terminal:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await self.wait_change(action_id, remaining)

    @contextlib.contextmanager
    def answering(self, action_id: str) -> Iterator[None]:
        """Held by a blocking route from its wait until its answer is written.

        Invariant (a worker's after-job work never competes with the answer): the worker
        executor awaits :meth:`answers_written` after recording a result and only then lets
        the worker start its reuse checks and its next crew's build, which on 2 cores
        otherwise ran beside the answer and delayed it by milliseconds.
        """
        self._answering[action_id] = self._answering.get(action_id, 0) + 1
        try:
            yield
        finally:
            left = self._answering[action_id] - 1
            if left:
                self._answering[action_id] = left
            else:
                del self._answering[action_id]
                _wake(self._answers_written, action_id)

    async def answers_written(self, action_id: str,
                              timeout: float = ANSWER_WAIT_SECONDS) -> None:  # noqa: ASYNC109
        """Return once no blocking route is answering for ``action_id`` (or after
        ``timeout`` seconds: a slow client does not hold a worker back for long)."""
        if action_id in self._answering:
            await _until_woken(self._answers_written, action_id, timeout)

    def events(self, action_id: str, cursor: int, limit: int) -> list[JobEvent]:
        return self.journal.events(action_id, cursor, limit)

    # --- archive ---------------------------------------------------------------------------
    def archive(self, action_id: str) -> Tombstone:
        record = self.journal.get(action_id)
        if record is None:
            stone = self.journal.tombstone(action_id)
            if stone is not None:
                raise Gone(stone)
            raise ContractError(404, "unknown_job", "no such job")
        if not record.terminal:
            raise ContractError(409, "job_running", "only terminal records can be archived; "
                                "cancel the job first")
        if record.uncertain_outcome and resume_pending(self.journal.resume_facts(action_id)):
            raise ContractError(409, "resume_pending",
                                "a successor resuming this action's journaled trajectory has "
                                "not ended; archive it once that successor has ended")
        try:
            stone = self.journal.archive(action_id)
        except PersistError:
            raise JournalUnavailable("the journal could not persist the archive",
                                     full=False) from None
        log.info("archived", extra={"action_id": action_id, "crew_id": record.crew_id})
        return stone

    def archive_older_than(self, seconds: int, *, recorded_only: bool = False,
                           ) -> list[Tombstone]:
        """Archive every terminal record last updated at least ``seconds`` ago (tombstones);
        ``recorded_only``: only those marked recorded, or older than the window plus
        ``UNRECORDED_GRACE_SECONDS`` (see ``Journal.archive_older_than``)."""
        now = datetime.now(UTC)
        cutoff = utc_iso(now - timedelta(seconds=seconds))
        unrecorded = (utc_iso(now - timedelta(seconds=seconds + UNRECORDED_GRACE_SECONDS))
                      if recorded_only else None)
        try:
            stones = self.journal.archive_older_than(cutoff, unrecorded)
        except PersistError:
            raise JournalUnavailable("the journal could not persist the archive",
                                     full=False) from None
        log.info("archived in bulk", extra={"count": len(stones), "older_than_s": seconds})
        return stones

    def mark_recorded(self, crew_id: str, action_id: str) -> tuple[JobRecord, str]:
        """A client recorded this finished action's outcome (the operator: in its CrewJob's
        status); recorded-only retention may archive it from now on. Idempotent."""
        record = self._crews_record(crew_id, action_id)
        if not record.terminal:
            raise ContractError(409, "job_running", "the job is still running")
        try:
            return record, self.journal.mark_recorded(action_id)
        except PersistError:
            raise JournalUnavailable("the journal could not persist the mark",
                                     full=False) from None

    def import_tombstones(self, stones: tuple[Tombstone, ...]) -> TombstoneImportResult:
        """Take over a retiring replica's tombstones (see ``Journal.import_tombstones``).

        Synchronous on purpose: an admission checks for a record and a tombstone and persists
        its record without yielding to the event loop, so an import can never slip between
        them and leave an action id both admitted and tombstoned.
        """
        try:
            result = self.journal.import_tombstones(stones)
        except PersistError:
            raise JournalUnavailable("the journal could not persist the tombstones",
                                     full=False) from None
        log.info("tombstones imported", extra={"count": result.imported, "known": result.known,
                                               "conflicts": len(result.conflicts)})
        return result

    # --- draining --------------------------------------------------------------------------
    def drain_state(self) -> DrainState:
        return DrainState(draining=self.journal.draining,
                          unarchived_records=len(self.journal.records))

    def set_draining(self, draining: bool) -> DrainState:
        """Switch draining on or off; journaled first, so a restart keeps it."""
        try:
            self.journal.set_draining(draining)
        except PersistError:
            raise JournalUnavailable("the journal could not persist the draining switch",
                                     full=False) from None
        log.info("draining" if draining else "not draining")
        return self.drain_state()

    # --- resolution ------------------------------------------------------------------------
    def _finished_record(self, crew_id: str, action_id: str) -> JobRecord:
        record = self.journal.get(action_id)
        if record is None or record.crew_id != crew_id:
            stone = self.journal.tombstone(action_id)
            if stone is not None and stone.crew_id == crew_id:
                raise Gone(stone)
            raise ContractError(404, "unknown_job", "no such job for this crew")
        return record

    def resolve(self, req: ResolutionRequest) -> tuple[JobEvent, bool]:
        """Journal a person's finding on a finished action; ``(event, created)``.

        Invariants: written once (an exact repeat of the finding, outcome, note and evidence,
        returns the journaled event, created False, whoever re-sent it: a re-applied manifest
        is written by another field manager; a different finding is refused with 409
        ``resolution_conflict`` naming the journaled one); only a terminal record takes one
        (409 while running); the record itself never changes (see Journal.append_resolution).
        An archived action is answered the same way from its tombstone's finding
        (:meth:`_resolve_archived`).
        """
        record = self.journal.get(req.action_id)
        if record is None or record.crew_id != req.crew_id:
            stone = self.journal.tombstone(req.action_id)
            if stone is None or stone.crew_id != req.crew_id:
                raise ContractError(404, "unknown_job", "no such job for this crew")
            return self._resolve_archived(req, stone)
        existing = self.journal.resolution(req.action_id)
        if existing is not None:
            return _journaled_finding(existing, req, where="")
        if not record.terminal:
            raise ContractError(409, "job_running",
                                "only a finished job can be resolved; it is still running")
        event = self._write_resolution(self.journal.append_resolution, req)
        log.info("resolved", extra={"action_id": req.action_id, "crew_id": req.crew_id,
                                    "code": req.outcome.value})
        self._notify(req.action_id)
        return event, True

    def _resolve_archived(self, req: ResolutionRequest,
                          stone: Tombstone) -> tuple[JobEvent, bool]:
        """:meth:`resolve` for an archived action: answered exactly as for its record.

        Invariant (findings outlive the record): the finding kept with the tombstone answers
        (an identical one: that event, created False; another: 409 ``resolution_conflict``
        naming it); with none kept, this one is written with the tombstone, once.
        """
        if stone.resolution is not None:
            return _journaled_finding(stone.resolution, req, where=", kept with its tombstone")
        event = self._write_resolution(self.journal.append_tombstone_resolution, req)
        log.info("resolved (archived)", extra={"action_id": req.action_id,
                                               "crew_id": req.crew_id,
                                               "code": req.outcome.value})
        return event, True

    @staticmethod
    def _write_resolution(write: Callable[[str, dict[str, Any]], JobEvent],
                          req: ResolutionRequest) -> JobEvent:
        """Journal ``req``'s finding with ``write`` (on the record or on its tombstone)."""
        try:
            return write(req.action_id, {**req.identity(), "recorded_at": utc_now()})
        except JournalFull as exc:
            raise JournalUnavailable(str(exc), full=True) from None
        except PersistError:
            raise JournalUnavailable("the journal could not persist the resolution",
                                     full=False) from None

    def claim_successor(self, req: SuccessorRequest) -> tuple[JobEvent, JobEvent, bool]:
        """Claim the one successor slot of an uncertain action; ``(claim, resolution,
        created)``.

        Invariants (at most once across delete and re-apply of any CrewJob): the journal, not
        a status, decides: only a terminal, uncertain record whose journaled resolution is
        NotHappened or Compensated takes a claim (409 ``job_running``, ``not_uncertain``,
        ``unresolved``, ``happened`` otherwise); one claim per action, written once (an exact
        repeat answers the journaled claim, created False; another successor gets 409
        ``already_superseded`` naming the one journaled).
        """
        record = self._finished_record(req.crew_id, req.action_id)  # Gone: archived
        if not record.terminal:
            raise ContractError(409, "job_running",
                                "the predecessor is still running; its outcome is not known")
        if not record.uncertain_outcome:
            raise ContractError(409, "not_uncertain",
                                "the predecessor's outcome is known (not uncertain): a "
                                "successor is only for an uncertain outcome")
        resolution = self.journal.resolution(req.action_id)
        if resolution is None:
            raise ContractError(409, "unresolved",
                                "the predecessor's uncertain outcome has no journaled "
                                "resolution yet")
        if resolution.data.get("outcome") not in SUCCESSOR_ALLOWING and not req.resume:
            raise ContractError(409, "happened",
                                f"the predecessor was resolved {resolution.data.get('outcome')}:"
                                " its work took effect; running it again would duplicate it",
                                {"resolution": resolution.to_wire()})
        existing = self.journal.successor(req.action_id)
        if existing is not None:
            if existing.data.get("successor_action_id") != req.successor_action_id:
                raise ContractError(
                    409, "already_superseded",
                    f"the predecessor is already superseded by action "
                    f"{existing.data.get('successor_action_id')!r}; one successor per "
                    "uncertain outcome", {"successor": existing.to_wire()})
            return existing, resolution, False
        data: dict[str, Any] = {"crew_id": req.crew_id,
                                "successor_action_id": req.successor_action_id,
                                "recorded_at": utc_now()}
        if req.resume:
            data["resume"] = True  # retention keeps the material until it ends (journal)
        try:
            event = self.journal.append_successor(req.action_id, data)
        except JournalFull as exc:
            raise JournalUnavailable(str(exc), full=True) from None
        except PersistError:
            raise JournalUnavailable("the journal could not persist the successor claim",
                                     full=False) from None
        log.info("superseded", extra={"action_id": req.action_id, "crew_id": req.crew_id})
        self._notify(req.action_id)
        return event, resolution, True

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def active_runs(self) -> int:
        return len(self._jobs)

    async def close(self) -> None:
        """Stop: running jobs end as failed + uncertain (as a restart would record them)."""
        self._closing = True
        if self.tool_lists is not None:
            await self.tool_lists.close()
        jobs = dict(self._jobs)
        for job in jobs.values():
            job.task.cancel()
        if jobs:
            await asyncio.wait([job.task for job in jobs.values()])
        for action_id, job in jobs.items():
            self._settle(action_id, job)

    def _settle(self, action_id: str, job: _Job) -> None:
        """A task cancelled before its first step never ran its handlers: record it here."""
        self._jobs.pop(action_id, None)
        record = self.journal.get(action_id)
        if record is None or record.terminal:
            return
        if job.cancel_requested:
            self._finish(action_id, Status.CANCELLED, None,
                         {"code": "cancelled", "message": "cancelled on request",
                          **({"reason": job.cancel_reason} if job.cancel_reason else {})},
                         uncertain=False)
        else:
            self._finish(action_id, Status.FAILED, None,
                         {"code": "sidecar_stopped",
                          "message": "the sidecar stopped while this job was running"},
                         uncertain=True)


def _journaled_finding(existing: JobEvent, req: ResolutionRequest,
                       where: str) -> tuple[JobEvent, bool]:
    """The answer to a resolution of an action already resolved (``existing``, journaled
    ``where``): the same finding is an exact repeat (that event, created False); another is
    409 ``resolution_conflict`` naming the journaled one (a resolution is written once)."""
    if finding_of(existing.data) != finding_of(req.identity()):
        raise ContractError(
            409, "resolution_conflict",
            f"this action was already resolved {existing.data.get('outcome')} "
            f"(journal event {existing.sequence}{where}); a resolution is written once",
            {"journaled": existing.to_wire()})
    return existing, False
