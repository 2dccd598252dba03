"""Execute one admitted job on a fresh crew, per the reference's execution table.

| operation          | mechanism                                                        |
|--------------------|------------------------------------------------------------------|
| ``run``            | native ``akickoff``; streamed model text -> ``chunk`` events     |
|                    | (a crew with knowledge: on a private loop, see below)            |
| ``batch_run``      | ``akickoff`` of one fresh crew per input in a TaskGroup, 8 at a  |
|                    | time (``akickoff_for_each`` shares one LLM object between copies) |
| ``replay``         | ``Crew.replay`` in a worker thread                               |
| ``train``          | ``Crew.train`` in a worker thread, one at a time, feedback from  |
|                    | the job input through a per-job HumanInputProvider               |
| ``test``           | ``Crew.test`` in a worker thread, scores from the event bus      |
| ``knowledge_query``| worker thread: crewai 1.15's ``aquery_knowledge`` needs an async |
|                    | chromadb client it never creates, logs an error and returns []   |
| ``memory_reset``   | ``Crew.reset_memories`` in a worker thread                       |

Caveat (crewai 1.15.30): even ``akickoff`` runs each agent step (``call_llm_and_parse``)
in a worker thread with the sync ``LLM.call``; cancelling a ``run`` therefore cancels the
asyncio side at once but an LLM call already in flight finishes in its thread. The
offline LLM honours the job's cancel event (see :func:`_cancel_aware`), a hosted one does not.

Knowledge (crewai 1.15.30): ``Agent.aexecute_task`` rewrites the knowledge search query with
the sync ``LLM.call`` on the event loop's thread, so a crew with knowledge kicks off on a
private loop in its own thread (:mod:`crewfence_sidecar.private_loop`); a slow model then
never stalls the sidecar's loop. Its knowledge is searched through
:mod:`crewfence_sidecar.knowledge_storage` (crewai's own storage fails in the async path).

The runtime owns timeouts, cancellation, events other than chunks, and the journal. A
cancelled waiter does not stop a worker thread; a thread-backed job that was cancelled
before its crewai call began never begins it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from crewai import Crew
from crewai.core.providers.human_input import SyncHumanInputProvider, set_provider
from crewai.crews.crew_output import CrewOutput
from crewai.events.base_events import BaseEvent
from crewai.events.event_bus import crewai_event_bus
from crewai.events.listeners.tracing.utils import set_suppress_tracing_messages
from crewai.events.types.crew_events import CrewTestResultEvent
from crewai.utilities.constants import TRAINING_DATA_FILE
from pydantic_core import to_jsonable_python

from crewfence_sidecar.chunks import streamed_chunks
from crewfence_sidecar.contract import ARTIFACT_NAME_RE, Operation
from crewfence_sidecar.crews import CrewCatalog
from crewfence_sidecar.offline_llm import bind_cancel_event, resolve_llm, unbind_cancel_event
from crewfence_sidecar.private_loop import run_on_private_loop
from crewfence_sidecar.resume import (
    MAX_RESUME_MATERIAL_CHARS,
    ModelReplay,
    ResumePlan,
    ToolReplay,
)
from crewfence_sidecar.runtime import JobContext
from crewfence_sidecar.tools import ledger

T = TypeVar("T")
EVENT_FLUSH_SECONDS = 30.0


# The runtime owns the job context; it stays free of crewai, so it is defined there.
ExecutionContext = JobContext


class ExecutionError(Exception):
    """A job that cannot run as asked (the message is safe to show the caller)."""


class CancelledBeforeStart(ExecutionError):
    """The waiter was cancelled before the worker thread began the crewai call."""


def jsonable(value: Any) -> Any:
    """A JSON-serialisable copy: pydantic models dumped in JSON mode as their own class
    (``serialize_as_any``: a field typed ``BaseModel`` keeps its subclass's fields), UUIDs and
    other leftovers as str."""
    return to_jsonable_python(value, fallback=str, serialize_as_any=True)


def crew_output(crew: Crew | None, result: CrewOutput) -> dict[str, Any]:
    """The reference's ``run`` output: crewai's ``CrewOutput`` serialized in JSON mode.

    ``raw``, ``pydantic``, ``json_dict``, ``tasks_output`` (each ``TaskOutput`` serialized) and
    ``token_usage`` (always present; ``{}`` when crewai reports none). crewfence extension
    inside it: each ``tasks_output`` item whose task is known carries the task's ``id``, the
    name a ``replay`` takes.
    """
    output: dict[str, Any] = jsonable(result)
    for field_name in ("raw", "pydantic", "json_dict"):
        output.setdefault(field_name, None)
    if not isinstance(output.get("token_usage"), dict):
        output["token_usage"] = {}
    tasks_output = output.get("tasks_output")
    if not isinstance(tasks_output, list):
        tasks_output = output["tasks_output"] = []
    if crew is not None:
        ids = {id(task.output): str(task.id) for task in crew.tasks if task.output is not None}
        for item, task_out in zip(tasks_output, result.tasks_output, strict=False):
            if id(task_out) in ids and isinstance(item, dict):
                item["id"] = ids[id(task_out)]
    return output


async def _build(catalog: CrewCatalog, crew_id: str) -> Crew:
    """The job's crew: one built ahead of the job (by a spare or a reused worker) is taken
    on the loop, since there is nothing left to build; building may embed knowledge sources
    (chromadb I/O), so it runs off the event loop (a thread hop: ~0.3 ms after a quiet
    spell, on the serial path of every run)."""
    prepared = catalog.take_prepared(crew_id)
    if prepared is not None:
        return prepared
    return await asyncio.to_thread(catalog.build, crew_id)


async def _cancel_aware(work: Callable[[threading.Event], Awaitable[T]]) -> T:
    """Run ``work`` with a cancel event that is set when this coroutine is cancelled.

    The event reaches worker threads through the context (``asyncio.to_thread`` and crewai's
    flow threads copy it): a thread that has not begun its crewai call never begins it, and
    the offline LLM stops at once instead of finishing a ``[[sleep:N]]``.
    """
    cancelled = threading.Event()
    token = bind_cancel_event(cancelled)
    try:
        return await work(cancelled)
    except asyncio.CancelledError:
        cancelled.set()
        raise
    finally:
        unbind_cancel_event(token)


async def _in_thread(work: Callable[[threading.Event], T]) -> T:
    return await _cancel_aware(lambda cancelled: asyncio.to_thread(work, cancelled))


def _check_not_cancelled(cancelled: threading.Event) -> None:
    if cancelled.is_set():
        raise CancelledBeforeStart("the job was cancelled before its work began")


# --- run / batch_run ---------------------------------------------------------------------------
def uses_knowledge(crew: Crew) -> bool:
    """Whether crewai's knowledge retrieval runs for some agent of ``crew``."""
    return (crew.knowledge is not None or bool(crew.knowledge_sources)
            or any(agent.knowledge is not None or agent.knowledge_sources
                   for agent in crew.agents))


async def _off_the_loop_if_needed(crew: Crew, kickoff: Coroutine[Any, Any, T],
                                  cancelled: threading.Event) -> T:
    """Await ``kickoff``; for a crew with knowledge, on a private loop (see private_loop).

    crewai 1.15.30's ``Agent.aexecute_task`` rewrites the knowledge search query with the
    SYNC ``LLM.call`` on the loop's own thread: on the sidecar's loop a slow model (or
    ``[[sleep:N]]``) would stall every job, ``/health`` and the cancel route.
    """
    if not uses_knowledge(crew):
        return await kickoff
    return await run_on_private_loop(kickoff, name=crew.name or "crew", wake=cancelled.set)


def _plan(ctx: ExecutionContext) -> ResumePlan | None:
    return ResumePlan.from_wire(ctx.resume) if ctx.resume else None


async def _run(catalog: CrewCatalog, ctx: ExecutionContext, cancelled: threading.Event) -> Any:
    crew = await _build(catalog, ctx.crew_id)
    crew.stream = False  # chunks come through streamed_chunks (a factory may have set it)
    plan = _plan(ctx)
    job_ledger = ledger.current()
    if job_ledger is not None and job_ledger.tracks_models():
        from crewfence_sidecar.resume_llm import wrap_crew_llms

        wrap_crew_llms(crew)  # model calls get their request hash, response, replay
    if plan is not None:
        from crewfence_sidecar.resume_crew import reuse_completed_tasks

        reuse_completed_tasks(crew, plan, job_ledger)
    # The sink is in this task's context, which a knowledge crew's private loop copies; its
    # chunks are journaled on the sidecar's loop, not on the private one.
    with streamed_chunks(crew, ctx.emit_chunk):
        result = await _off_the_loop_if_needed(crew, crew.akickoff(inputs=dict(ctx.input)),
                                               cancelled)
    if not isinstance(result, CrewOutput):  # pragma: no cover - crewai contract
        raise ExecutionError("run: crewai returned no CrewOutput")
    return crew_output(crew, result)


BATCH_CONCURRENCY = 8


async def _batch_run(catalog: CrewCatalog, ctx: ExecutionContext,
                     cancelled: threading.Event) -> Any:
    # The equivalent of crewai's akickoff_for_each with a FRESH crew per input (its own
    # crew.copy() shares one LLM object between the copies, so token usage is summed wrongly)
    # and at most BATCH_CONCURRENCY kickoffs at a time (it starts all inputs at once).
    # Resume: an input whose output the predecessor journaled (batch_item_completed) is not
    # run again; with resume material on, each finished input's output is journaled as it
    # ends, so a successor can skip it.
    inputs = [dict(item) for item in ctx.input["inputs"]]
    slots = asyncio.Semaphore(BATCH_CONCURRENCY)
    plan = _plan(ctx)
    job_ledger = ledger.current()

    def journal_item(event: str, index: int, output: dict[str, Any]) -> None:
        if job_ledger is None or ctx.record_effect is None:
            return
        data: dict[str, Any] = {"index": index, "total": len(inputs), "at": ledger.utc_at()}
        if plan is not None:
            data["from_action"] = plan.predecessor
        if len(json.dumps(output, ensure_ascii=False)) <= MAX_RESUME_MATERIAL_CHARS:
            data["output"] = output
        else:
            data["material"] = "too_large"
        ctx.record_effect(event, data, False)

    async def one(index: int, item: dict[str, Any]) -> dict[str, Any]:
        if plan is not None and index in plan.batch_outputs:
            output = dict(plan.batch_outputs[index])
            journal_item("batch_item_reused", index, output)
            return output
        async with slots:
            crew = await _build(catalog, ctx.crew_id)
            crew.stream = False
            result = await _off_the_loop_if_needed(crew, crew.akickoff(inputs=item), cancelled)
            if not isinstance(result, CrewOutput):  # pragma: no cover - crewai contract
                raise ExecutionError("batch_run: crewai returned no CrewOutput")
            output = crew_output(None, result)
            if ctx.keep_material:
                journal_item("batch_item_completed", index, output)
            return output

    try:
        async with asyncio.TaskGroup() as group:  # one failure cancels the siblings
            jobs = [group.create_task(one(i, item)) for i, item in enumerate(inputs)]
    except ExceptionGroup as failed:
        # Report the first input's own failure (the runtime records its class), not a group.
        raise failed.exceptions[0] from failed
    # Like akickoff_for_each: batch outputs are not replayable, so clear the stored ones.
    reset_crew = await _build(catalog, ctx.crew_id)
    await asyncio.to_thread(reset_crew.reset_memories, command_type="kickoff_outputs")
    # The reference's batch_run output: {results: [<run output>, ...], count}; the summed
    # ``token_usage`` is crewfence's extension.
    outputs = [job.result() for job in jobs]
    usages = [out["token_usage"] for out in outputs if out["token_usage"]]
    total = ({key: sum(u.get(key, 0) for u in usages) for key in usages[0]} if usages else {})
    return {"results": outputs, "count": len(outputs), "token_usage": total}


# --- replay ------------------------------------------------------------------------------------
def _replay(catalog: CrewCatalog, ctx: ExecutionContext, cancelled: threading.Event) -> Any:
    crew = catalog.build(ctx.crew_id)
    _check_not_cancelled(cancelled)
    inputs = ctx.input.get("inputs")
    result = crew.replay(task_id=str(ctx.input["task_id"]),
                         inputs=dict(inputs) if inputs is not None else None)
    # The run output shape; ``replayed_task_id`` is a crewfence extension inside it.
    return {**crew_output(crew, result), "replayed_task_id": ctx.input["task_id"]}


# --- train -------------------------------------------------------------------------------------
# crewai writes training_data.pkl relative to the working directory: one train at a time.
_TRAIN_LOCK = threading.Lock()
_LOCK_POLL_SECONDS = 0.2


class TrainingPathError(ExecutionError):
    """An artifact name or training directory that would write outside the training dir."""


def artifact_path(training_dir: Path | None, artifact_name: str) -> Path:
    """The artifact's absolute path, proven to be a plain file directly inside the directory."""
    if training_dir is None:
        raise TrainingPathError("train needs a training directory (CREWFENCE_TRAINING_DIR)")
    if not ARTIFACT_NAME_RE.fullmatch(artifact_name):
        raise TrainingPathError(f"artifact_name must match {ARTIFACT_NAME_RE.pattern}")
    file_name = artifact_name if artifact_name.endswith(".pkl") else f"{artifact_name}.pkl"
    if file_name == TRAINING_DATA_FILE:
        raise TrainingPathError(f"artifact_name {artifact_name!r} is reserved by crewai")
    try:
        root = training_dir.resolve(strict=True)
    except OSError:
        raise TrainingPathError("the training directory does not exist") from None
    if not root.is_dir():
        raise TrainingPathError("the training directory is not a directory")
    candidate = root / file_name
    if candidate.is_symlink() or (candidate.exists() and not candidate.is_file()):
        raise TrainingPathError(f"artifact {file_name!r} exists and is not a regular file")
    target = candidate.resolve()
    if target.parent != root:
        raise TrainingPathError(f"artifact {file_name!r} escapes the training directory")
    return target


DEFAULT_TRAINING_FEEDBACK = "No further feedback: keep the answer as it is."


class FeedbackProvider(SyncHumanInputProvider):
    """Answers crewai's human-input prompts from the job's ``feedback`` list, never stdin.

    Each prompt takes the next item. When the list is used up, a training prompt gets
    :data:`DEFAULT_TRAINING_FEEDBACK` (crewai 1.15 rejects training data whose feedback is
    empty) and any other prompt gets "" (which ends crewai's feedback loop).
    """

    def __init__(self, feedback: list[str]) -> None:
        self._feedback = list(feedback)
        self._lock = threading.Lock()
        self.asked = 0

    def _prompt_input(self, crew: Any) -> str:  # type: ignore[override]
        with self._lock:
            self.asked += 1
            if self._feedback:
                return self._feedback.pop(0)
        return DEFAULT_TRAINING_FEEDBACK if getattr(crew, "_train", False) else ""

    async def _prompt_input_async(self, crew: Any) -> str:  # type: ignore[override]
        return self._prompt_input(crew)


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    """cwd = ``path`` for the block (process-wide; only under the train lock)."""
    previous = os.getcwd()
    if Path(previous).resolve() == path:
        yield
        return
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def _acquire_train_lock(cancelled: threading.Event) -> None:
    while not _TRAIN_LOCK.acquire(timeout=_LOCK_POLL_SECONDS):
        _check_not_cancelled(cancelled)


def _train(catalog: CrewCatalog, ctx: ExecutionContext, cancelled: threading.Event) -> Any:
    target = artifact_path(ctx.training_dir, str(ctx.input["artifact_name"]))
    feedback = [str(item) for item in ctx.input.get("feedback") or []]
    inputs = dict(ctx.input.get("inputs") or {})
    crew = catalog.build(ctx.crew_id)
    _acquire_train_lock(cancelled)
    try:
        _check_not_cancelled(cancelled)
        provider = FeedbackProvider(feedback)
        set_provider(provider)  # this worker thread's context copy only
        with _working_directory(target.parent):
            crew.train(n_iterations=int(ctx.input["n_iterations"]), filename=str(target),
                       inputs=inputs)
    finally:
        _TRAIN_LOCK.release()
    data = target.read_bytes()
    # The reference's train output is {status, artifact_name, n_iterations}; the rest is
    # crewfence's extension (where the artifact landed and what it holds).
    return {
        "status": "completed",
        "artifact_name": str(ctx.input["artifact_name"]),
        "artifact": target.name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "n_iterations": int(ctx.input["n_iterations"]),
        "agents": [agent.role for agent in crew.agents],
        "feedback_prompts": provider.asked,
    }


# --- test --------------------------------------------------------------------------------------
_TEST_SCORES: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "crewfence_test_scores", default=None
)
_HANDLER_LOCK = threading.Lock()
_handler_registered = False


def _on_test_result(source: Any, event: BaseEvent) -> None:
    # The bus runs sync handlers in a copy of the emitting context: the job's list is visible.
    scores = _TEST_SCORES.get()
    if scores is not None and isinstance(event, CrewTestResultEvent):
        scores.append({
            "quality": event.quality,
            "execution_duration": event.execution_duration,
            "model": event.model,
        })


def _ensure_test_handler() -> None:
    global _handler_registered
    with _HANDLER_LOCK:
        if not _handler_registered:
            crewai_event_bus.register_handler(CrewTestResultEvent, _on_test_result)
            _handler_registered = True


def _test(catalog: CrewCatalog, ctx: ExecutionContext, cancelled: threading.Event) -> Any:
    _ensure_test_handler()
    crew = catalog.build(ctx.crew_id)
    eval_llm = resolve_llm(str(ctx.input["eval_llm"]))
    n_iterations = int(ctx.input["n_iterations"])
    scores: list[dict[str, Any]] = []
    _TEST_SCORES.set(scores)  # this worker thread's context copy only
    _check_not_cancelled(cancelled)
    crew.test(n_iterations=n_iterations, eval_llm=eval_llm,
              inputs=dict(ctx.input.get("inputs") or {}))
    if not crewai_event_bus.flush(timeout=EVENT_FLUSH_SECONDS):
        raise ExecutionError("test: crewai's event bus did not deliver the scores in time")
    qualities = [s["quality"] for s in scores]
    # The reference's test output is {status, n_iterations, eval_llm}; the scores are
    # crewfence's extension.
    return jsonable({
        "status": "completed",
        "n_iterations": n_iterations,
        "eval_llm": str(ctx.input["eval_llm"]),
        "scores": scores,
        "average_quality": round(sum(qualities) / len(qualities), 3) if qualities else None,
    })


# --- knowledge_query / memory_reset ------------------------------------------------------------
def _knowledge_query(catalog: CrewCatalog, ctx: ExecutionContext,
                     cancelled: threading.Event) -> Any:
    crew = catalog.build(ctx.crew_id)
    if crew.knowledge is None:
        raise ExecutionError(f"crew {ctx.crew_id!r} has no knowledge sources")
    _check_not_cancelled(cancelled)
    results = crew.query_knowledge(
        [str(q) for q in ctx.input["query"]],
        results_limit=int(ctx.input.get("results_limit", 3)),
        score_threshold=float(ctx.input.get("score_threshold", 0.35)),
    )
    return {"results": jsonable(results or [])}


def _memory_reset(catalog: CrewCatalog, ctx: ExecutionContext,
                  cancelled: threading.Event) -> Any:
    crew = catalog.build(ctx.crew_id)
    _check_not_cancelled(cancelled)
    command_type = str(ctx.input["command_type"])
    crew.reset_memories(command_type=command_type)
    return {"status": "completed", "command_type": command_type}


ThreadWork = Callable[[CrewCatalog, ExecutionContext, threading.Event], Any]
_THREAD_WORK: dict[Operation, ThreadWork] = {
    Operation.REPLAY: _replay,
    Operation.TRAIN: _train,
    Operation.TEST: _test,
    Operation.KNOWLEDGE_QUERY: _knowledge_query,
    Operation.MEMORY_RESET: _memory_reset,
}


async def execute(catalog: CrewCatalog, ctx: ExecutionContext) -> Any:
    """Run ``ctx.operation`` on a fresh crew and return its JSON-serialisable output.

    With ``ctx.record_effect`` the job's effect ledger is bound for the whole operation
    (crewai's hooks report tasks, model calls and tool calls to it, see ``tools.ledger``);
    a job one of whose tool starts could not be journaled raises
    :class:`~crewfence_sidecar.tools.ledger.EffectNotJournaled` whatever crewai returned
    (that tool did not run: the failure is certain).
    """
    set_suppress_tracing_messages(True)  # crewai's "tracing is disabled" panels on stdout
    if ctx.crew_id not in catalog:
        raise ExecutionError(f"unknown crew {ctx.crew_id!r}")
    if ctx.record_effect is None:
        return await _execute(catalog, ctx)
    plan = _plan(ctx)
    # batch_run inputs share the job's call counter in timing order: their positions are not
    # stable, so only a run's tool calls are replayed (a batch reuses whole inputs)
    resumed_run = plan is not None and ctx.operation == Operation.RUN.value
    job_ledger = ledger.JobLedger(
        ctx.action_id, ctx.record_effect, keep_material=ctx.keep_material,
        replay=ToolReplay(plan) if plan is not None and resumed_run else None,
        model_replay=ModelReplay(plan) if plan is not None and resumed_run else None,
        track_models=ctx.operation == Operation.RUN.value and (ctx.keep_material
                                                               or resumed_run))
    try:
        with ledger.bound(job_ledger):
            output = await _execute(catalog, ctx)
    except Exception:
        if job_ledger.refused:
            raise ledger.EffectNotJournaled("a tool call's start could not be journaled; "
                                            "the tool did not run") from None
        raise
    if job_ledger.refused:
        raise ledger.EffectNotJournaled("a tool call's start could not be journaled; the "
                                        "tool did not run")
    return output


async def _execute(catalog: CrewCatalog, ctx: ExecutionContext) -> Any:
    operation = Operation(ctx.operation)
    if operation is Operation.RUN:
        return await _cancel_aware(lambda cancelled: _run(catalog, ctx, cancelled))
    if operation is Operation.BATCH_RUN:
        return await _cancel_aware(lambda cancelled: _batch_run(catalog, ctx, cancelled))
    work = _THREAD_WORK[operation]
    return await _in_thread(lambda cancelled: work(catalog, ctx, cancelled))
