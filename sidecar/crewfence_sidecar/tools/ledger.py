"""The effect ledger: crewai's execution hooks turned into journal events, write-ahead.

Installed once per process (:func:`install`); a job binds its :class:`JobLedger` with
:func:`bound` and the hooks report to it (no ledger bound: the hooks do nothing).

| crewai hook (``crewai.hooks``)        | event                                        |
|---------------------------------------|----------------------------------------------|
| ``pre_step`` (kind task)              | ``task_started``                             |
| ``post_step`` (kind task)             | ``task_completed``                           |
| ``pre_model_call`` .. its end         | ``model_call`` (end: ``post_model_call``, the |
|                                       | task's next tool call or model call, the end |
|                                       | of its task or of the job; ``request_id``:   |
|                                       | the provider's response id); one answered    |
|                                       | from the journal: ``model_call_reused``      |
| ``pre_tool_call``                     | ``tool_call_started`` (durable, acknowledged) |
| ``post_tool_call``                    | ``tool_call_finished``                       |

Invariants:

- Write-ahead (a tool never runs before its start is durable; kept by
  :meth:`JobLedger.tool_started`): a tool runs only after its ``tool_call_started`` was
  committed durably by the journal's one writer (the sink returns True only then). When it
  cannot be (journal full, persist failure, channel gone), the hook aborts the call
  (``HookAborted``: crewai does not run the tool), the ledger is ``refused``, every later
  model or tool call of the job is aborted too, and the job fails certain
  (:class:`EffectNotJournaled`). An error of the ledger's own before the start is journaled
  refuses the call the same way (fail closed: crewai runs a tool whose pre-tool hook raised
  anything but ``HookAborted``). Tests: ``tests/component/sidecar/test_tool_ledger.py::``
  ``test_a_tool_never_runs_before_its_start_is_durable``,
  ``::test_a_sidecar_killed_by_the_tool_body_already_holds_its_start`` (a real SIGKILL from
  the tool's body), ``tests/component/crewai/test_tools.py::``
  ``test_in_process_a_tool_whose_start_cannot_be_journaled_never_runs``,
  ``::test_in_process_a_ledger_error_before_the_start_refuses_the_call``.
- One commit per tool call start: the ``model_call`` that ended at the call's start (the
  model chose the tool) is handed to the sink as the start's ``preceding`` and journaled in
  the same durable transaction, never in one of its own on the path the tool waits for.
  ``tool_call_finished`` (like task and model events) is committed unsynced; it becomes
  durable with the next synced commit. A crash that loses it leaves the call *in doubt*:
  conservative, never a false "finished".
- The call's idempotency key (``contract.tool_idempotency_key``) is bound in
  ``tool_context`` while the tool runs, from the same numbers the event carries.
- A tool that raises is a finished call with ``error`` set (class name), never a call in
  doubt; an MCP ``isError`` answer too (its text, bounded).
- Events carry hashes and bounded previews only (``MAX_EFFECT_PREVIEW_CHARS``), never
  arguments or results themselves: the journal's per-event bound always holds.
- Hooks run synchronously in the thread that runs the model or tool call (crewai copies
  contexts into its threads), so the events of one task arrive in the order they happened.
- Resume material (``keep_material``, opt-in: ``CREWFENCE_RESUME_MATERIAL``): the full task
  output and the tool result the agent received ride on ``task_completed`` and
  ``tool_call_finished`` themselves (no extra transaction), only up to
  ``resume.MAX_RESUME_MATERIAL_CHARS``; larger material is left out (``material: "too_large"``)
  and so is not reusable.
- Model calls (``resume_llm`` wraps the LLM's ``call``): each carries its position
  (``task_index``, ``model_index`` within the task) and ``request_sha256``; with material on,
  the response (``response``, bounded like the rest). A resumed job's call that
  :class:`~crewfence_sidecar.resume.ModelReplay` answers from the journal is never made: the
  wrapper returns the journaled response, journaled as ``model_call_reused`` (no tokens).
- Replay (``replay``, a resumed job): a call the :class:`~crewfence_sidecar.resume.ToolReplay`
  answers from the journal (``REPLAY``, ``ALREADY_MADE``) never runs: the pre-tool hook aborts
  it (crewai then runs no tool) and the post-tool hook hands crewai the journaled text as the
  result; it is journaled as ``tool_call_reused``. A call rerun with the predecessor's key
  runs through the normal write-ahead path with that key.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from crewfence_sidecar.contract import (
    MAX_EFFECT_ERROR_CHARS,
    MAX_EFFECT_PREVIEW_CHARS,
    EffectSink,
    EventName,
    arguments_sha256,
    tool_idempotency_key,
)
from crewfence_sidecar.resume import (
    MAX_RESUME_MATERIAL_CHARS,
    ModelAction,
    ModelReplay,
    ToolAction,
    ToolReplay,
)
from crewfence_sidecar.tool_context import reset_idempotency_key, set_idempotency_key

__all__ = ["EffectNotJournaled", "EffectSink", "JobLedger", "bound", "current", "install"]
Effect = tuple[str, dict[str, Any]]


class EffectNotJournaled(RuntimeError):
    """A tool call's start could not be journaled: the tool did not run, the job fails."""


def utc_at() -> str:
    """RFC 3339 UTC with milliseconds (the ``at`` of every effect event)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit]


_response_ids: dict[int, str] = {}
"""The provider's id of each LLM instance's last response (``id(llm)`` -> id), noted by
crewai's ``_emit_call_completed_event`` in the thread of the call, before it returns."""
_response_lock = threading.Lock()


def _note_response_id(emit: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(emit)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        response_id = kwargs.get("response_id")
        if isinstance(response_id, str) and response_id:
            with _response_lock:
                _response_ids[id(self)] = response_id[:MAX_EFFECT_ERROR_CHARS]
        return emit(self, *args, **kwargs)

    wrapper.__crewfence_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def _take_response_id(llm: Any) -> str | None:
    with _response_lock:
        return _response_ids.pop(id(llm), None) if llm is not None else None


@dataclass
class _ModelCall:
    started: float
    model: str
    task: str | None
    llm: Any
    tokens: tuple[int | None, int | None]
    task_index: int | None = None
    """The call's task's index (None: a call outside a task, never replayed)."""
    model_index: int = 0
    """The call's index among its task's model calls."""
    request_sha256: str | None = None
    response: str | None = None
    """The encoded response (``resume_llm.encode_response``), as material or as replayed."""
    reused: bool = False


@dataclass
class _ToolCall:
    tool: str
    server: str | None
    task: str | None
    task_index: int
    call_index: int
    key: str
    started: float
    token: contextvars.Token[str | None] | None
    refused: bool = False
    replayed: str | None = None
    """A call answered from the journal: the text crewai hands the agent as its result."""


def _tokens(llm: Any) -> tuple[int | None, int | None]:
    usage = getattr(llm, "_token_usage", None)
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else None,
            completion if isinstance(completion, int) else None)


def _task_place(task: Any, crew: Any) -> tuple[str | None, int, int]:
    """(name, index, total) of ``task`` in its crew (``task-<index>`` when it has no name)."""
    return _find_task_place(task, crew)[0]


def _find_task_place(task: Any, crew: Any) -> tuple[tuple[str | None, int, int], bool]:
    """:func:`_task_place`, and whether the task was found in its crew's task list."""
    if task is None:
        return (None, 0, 0), False
    if crew is None:
        crew = getattr(getattr(task, "agent", None), "crew", None)
    tasks = list(getattr(crew, "tasks", None) or [])
    index = next((i for i, t in enumerate(tasks) if t is task), None)
    name = getattr(task, "name", None) or f"task-{index or 0}"
    return (str(name), index or 0, len(tasks) or 1), index is not None


def _tool_identity(ctx: Any) -> tuple[str, str | None]:
    """(name as the agent knows it, MCP server or None) of a hook context's tool."""
    structured = getattr(ctx, "tool", None)
    original = getattr(structured, "_original_tool", None) or structured
    name = getattr(original, "crewfence_name", None) or getattr(ctx, "tool_name", "") or ""
    server = getattr(original, "crewfence_server", None)
    if server is None:
        server = getattr(original, "server_name", None)  # crewai's own MCP tools
    return str(name), (str(server) if server else None)


_errors = threading.local()
"""The class name of the exception the current thread's last tool raised."""


def _note_errors(run: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(run)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return run(self, *args, **kwargs)
        except Exception as exc:
            _errors.name = type(exc).__name__
            raise

    wrapper.__crewfence_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


_CREWAI_ERROR_PREFIX = "Error executing tool"
"""How crewai 1.15's native tool path words the result of a tool that raised."""


def _tool_error(raw: Any, result: Any) -> str | None:
    """The ``error`` of a finished call: an MCP ``isError`` text (bounded), the class of the
    exception the tool raised (noted by ``BaseTool.run``/``Tool.run``), or None."""
    raised = getattr(_errors, "name", None)
    _errors.name = None
    from crewai.tools.tool_failure import ToolFailure

    if isinstance(raw, ToolFailure):
        return _bounded(str(raw.message or raw.reason), MAX_EFFECT_ERROR_CHARS)
    text = raw if isinstance(raw, str) else result if isinstance(result, str) else ""
    if text.startswith(_CREWAI_ERROR_PREFIX):
        return raised or "ToolError"
    return None


@dataclass
class JobLedger:
    """The effect events of one job, sent to the journal's writer through ``sink``."""

    action_id: str
    sink: EffectSink
    keep_material: bool = False
    """Journal full task outputs and tool results (bounded) so a successor can resume."""
    replay: ToolReplay | None = None
    """A resumed job: the predecessor's journaled calls it may reuse."""
    model_replay: ModelReplay | None = None
    """A resumed job: the predecessor's journaled model calls it may reuse."""
    track_models: bool = False
    """Model calls go through ``resume_llm``'s wrapper: request hash, response material (with
    ``keep_material``), replay (with ``model_replay``). A run's ledger only: batch inputs are
    reused whole, their model calls never one by one."""
    refused: bool = False
    dropped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _model_index: int = 0
    _next_call: dict[int, int] = field(default_factory=dict)
    _next_model: dict[int, int] = field(default_factory=dict)
    _models: dict[int, _ModelCall] = field(default_factory=dict)
    _tools: threading.local = field(default_factory=threading.local)
    _places: dict[int, tuple[Any, tuple[str | None, int, int]]] = field(default_factory=dict)
    """Task places found (``id(task)`` -> (task, place)); the task is held so its id is not
    reused while the job runs. Only places found in a crew's task list."""
    _identities: dict[tuple[int, str], tuple[Any, tuple[str, str | None]]] = field(
        default_factory=dict)
    """Tool identities found (``(id(tool), tool_name)`` -> (tool, identity)), likewise."""

    def _place(self, task: Any, crew: Any) -> tuple[str | None, int, int]:
        """:func:`_task_place`, remembered per task for the job (on every tool call's path)."""
        if task is None:
            return None, 0, 0
        known = self._places.get(id(task))
        if known is not None and known[0] is task:
            return known[1]
        place, in_crew = _find_task_place(task, crew)
        if in_crew:
            self._places[id(task)] = (task, place)
        return place

    def _identity(self, ctx: Any) -> tuple[str, str | None]:
        """:func:`_tool_identity`, remembered per tool object for the job."""
        tool = getattr(ctx, "tool", None)
        if tool is None:
            return _tool_identity(ctx)
        key = (id(tool), str(getattr(ctx, "tool_name", "") or ""))
        known = self._identities.get(key)
        if known is not None and known[0] is tool:
            return known[1]
        identity = _tool_identity(ctx)
        self._identities[key] = (tool, identity)
        return identity

    def _send(self, event: EventName, data: dict[str, Any], durable: bool = False,
              preceding: Sequence[Effect] = ()) -> bool:
        data["at"] = utc_at()
        try:
            ok = self.sink(event.value, data, durable, preceding)
        except Exception:  # a sink that broke is a sink that did not journal
            ok = False
        if not ok:
            self.dropped += len(preceding) + (0 if durable else 1)
        return ok

    def _send_held(self, held: list[Effect]) -> None:
        """Journal events held for a durable one that is not sent after all (best effort)."""
        for name, data in held:
            try:
                ok = self.sink(name, data, False)
            except Exception:
                ok = False
            self.dropped += 0 if ok else 1

    # --- tasks ------------------------------------------------------------------------------
    def task_started(self, task: Any, agent: Any) -> None:
        name, index, total = _task_place(task, None)
        self._send(EventName.TASK_STARTED, {"task": name, "index": index, "total": total,
                                            "agent": getattr(agent, "role", None)})

    def task_completed(self, task: Any, output: Any) -> None:
        self._end_models(task)
        name, index, total = _task_place(task, None)
        raw = str(getattr(output, "raw", "") if output is not None else "")
        data: dict[str, Any] = {
            "task": name, "index": index, "total": total, "output_sha256": _sha256_text(raw),
            "output_preview": _bounded(raw, MAX_EFFECT_PREVIEW_CHARS)}
        if self.keep_material:
            _add_material(data, "output", raw)
        self._send(EventName.TASK_COMPLETED, data)

    def task_reused(self, index: int, total: int, name: str, output: str) -> None:
        """A task of the predecessor's completed prefix, not run again (resume)."""
        data: dict[str, Any] = {"task": name, "index": index, "total": total,
                                "output_sha256": _sha256_text(output),
                                "from_action": self.replay.plan.predecessor
                                if self.replay is not None else None}
        _add_material(data, "output", output)  # the next successor may reuse it too
        self._send(EventName.TASK_REUSED, data)

    # --- model calls --------------------------------------------------------------------------
    def model_started(self, ctx: Any) -> None:
        if self.refused:
            from crewai.hooks.dispatch import HookAborted

            raise HookAborted("crewfence: a tool call's start could not be journaled; the job "
                              "stops", source="crewfence-ledger")
        task = getattr(ctx, "task", None)
        self._end_models(task)
        llm = getattr(ctx, "llm", None)
        name, task_index, _ = _task_place(task, getattr(ctx, "crew", None))
        _take_response_id(llm)  # an id noted before this call is not this call's
        with self._lock:
            model_index = self._next_model.get(task_index, 0) if task is not None else 0
            if task is not None:
                self._next_model[task_index] = model_index + 1
            self._models[id(task)] = _ModelCall(
                started=time.perf_counter(), model=str(getattr(llm, "model", None) or ""),
                task=name, llm=llm, tokens=_tokens(llm),
                task_index=task_index if task is not None else None, model_index=model_index)

    def tracks_models(self) -> bool:
        """Whether model calls need the LLM wrapper (material kept, or a resumed job)."""
        return self.track_models

    def model_request(self, task: Any, request_sha256: str) -> str | None:
        """The call of ``task`` about to be made has this request: the journaled (encoded)
        response when the journal answers it (the caller then makes no call), else None."""
        with self._lock:
            call = self._models.get(id(task))
            if call is None:
                return None
            call.request_sha256 = request_sha256
            if (self.model_replay is None or self.refused or task is None
                    or call.task_index is None):
                return None
            decision = self.model_replay.decide(call.task_index, call.model_index,
                                                request_sha256)
            if decision.action is not ModelAction.REPLAY or decision.response is None:
                return None
            call.reused = True
            call.response = decision.response
            return decision.response

    def model_not_replayed(self, task: Any) -> None:
        """The journaled response did not fit the call: it runs live after all."""
        with self._lock:
            call = self._models.get(id(task))
            if call is not None:
                call.reused = False
                call.response = None

    def model_response(self, task: Any, encoded: str | None) -> None:
        """The live call of ``task`` answered ``encoded`` (None: not reusable)."""
        with self._lock:
            call = self._models.get(id(task))
            if call is not None and not call.reused:
                call.response = encoded

    def _end_models(self, task: Any, hold: list[Effect] | None = None) -> None:
        """End the task's open model call; with ``hold``, its event is put there to be
        journaled with the tool call's start (one commit) instead of being sent now."""
        with self._lock:
            call = self._models.pop(id(task), None)
            if call is None:
                return
            index = self._model_index
            if not call.reused:  # call_index counts the calls made
                self._model_index += 1
        self._emit_model(call, index, hold)

    def _emit_model(self, call: _ModelCall, index: int,
                    hold: list[Effect] | None = None) -> None:
        where: dict[str, Any] = {}
        if call.task_index is not None:
            where = {"task_index": call.task_index, "model_index": call.model_index}
        if call.request_sha256 is not None:
            where["request_sha256"] = call.request_sha256
        if call.reused:
            data: dict[str, Any] = {
                "model": call.model, "task": call.task, **where,
                "from_action": self.model_replay.plan.predecessor
                if self.model_replay is not None else None}
            _add_material(data, "response", call.response or "")  # a successor reuses it too
            self._hold_or_send(EventName.MODEL_CALL_REUSED, data, hold)
            return
        after = _tokens(call.llm)
        prompt = (after[0] - call.tokens[0]
                  if after[0] is not None and call.tokens[0] is not None else None)
        completion = (after[1] - call.tokens[1]
                      if after[1] is not None and call.tokens[1] is not None else None)
        data = {"model": call.model, "call_index": index, "task": call.task, **where,
                "prompt_tokens": prompt, "completion_tokens": completion,
                "request_id": _take_response_id(call.llm),
                "duration_ms": round((time.perf_counter() - call.started) * 1000, 3)}
        if self.keep_material and call.response is not None:
            _add_material(data, "response", call.response)
        self._hold_or_send(EventName.MODEL_CALL, data, hold)

    def _hold_or_send(self, event: EventName, data: dict[str, Any],
                      hold: list[Effect] | None) -> None:
        """Send now, or put into ``hold`` to be journaled with the tool call's start."""
        if hold is None:
            self._send(event, data)
        else:
            data["at"] = utc_at()
            hold.append((event.value, data))

    def model_finished(self, ctx: Any) -> None:
        self._end_models(getattr(ctx, "task", None))

    def close(self) -> None:
        """End the job: model calls still open (one that raised) are journaled now."""
        with self._lock:
            pending = list(self._models.values())
            self._models.clear()
            first = self._model_index
            self._model_index += len(pending)
        for offset, call in enumerate(pending):
            self._emit_model(call, first + offset)

    # --- tool calls ----------------------------------------------------------------------------
    def _stack(self) -> list[_ToolCall]:
        stack: list[_ToolCall] | None = getattr(self._tools, "stack", None)
        if stack is None:
            stack = self._tools.stack = []
        return stack

    def tool_started(self, ctx: Any) -> None:
        """Journal the call's start durably, or abort it (``HookAborted``: crewai runs no
        tool).

        Invariant (fail closed): crewai swallows any other exception a hook raises and runs
        the tool anyway, so an error of the ledger's own before the start is journaled (a
        tool identity it cannot read, arguments it cannot hash) refuses the call and the
        job, as a start the journal refused does."""
        from crewai.hooks.dispatch import HookAborted

        stack = len(self._stack())
        try:
            self._tool_started(ctx)
        except HookAborted:
            raise
        except Exception as exc:
            self.refused = True
            if len(self._stack()) == stack:  # the post-tool hook pops one entry per call
                self._stack().append(_ToolCall(
                    tool=str(getattr(ctx, "tool_name", "") or ""), server=None, task=None,
                    task_index=0, call_index=0, key="", started=time.perf_counter(),
                    token=None, refused=True))
            raise HookAborted(f"crewfence: the tool call's start could not be journaled "
                              f"({type(exc).__name__})", source="crewfence-ledger") from None

    def _tool_started(self, ctx: Any) -> None:
        from crewai.hooks.dispatch import HookAborted

        task = getattr(ctx, "task", None)
        held: list[Effect] = []  # the model call that chose this tool: one commit with it
        self._end_models(task, hold=held)
        tool, server = self._identity(ctx)
        name, task_index, _ = self._place(task, getattr(ctx, "crew", None))
        with self._lock:
            call_index = self._next_call.get(task_index, 0)
            self._next_call[task_index] = call_index + 1
        args_sha = arguments_sha256(dict(getattr(ctx, "tool_input", {}) or {}))
        decision = (self.replay.decide(task_index, call_index, tool, args_sha)
                    if self.replay is not None and not self.refused else None)
        if decision is not None and decision.key is not None and decision.action in (
                ToolAction.REPLAY, ToolAction.ALREADY_MADE):
            self._send_held(held)
            self._reuse_call(tool, server, name, task_index, call_index, args_sha,
                             decision.key, decision.action, decision.result or "")
            raise HookAborted("crewfence: answered from the journal (resume)",
                              source="crewfence-resume")
        if decision is not None and decision.action is ToolAction.RERUN_SAME_KEY:
            key = str(decision.key)  # the predecessor's key: a deduplicating tool acts once
        else:
            key = tool_idempotency_key(self.action_id, task_index, call_index)
        call = _ToolCall(tool=tool, server=server, task=name, task_index=task_index,
                         call_index=call_index, key=key, started=time.perf_counter(),
                         token=None)
        started: dict[str, Any] = {
            "tool": tool, "server": server, "task": name, "task_index": task_index,
            "call_index": call_index, "arguments_sha256": args_sha, "idempotency_key": key}
        if decision is not None:
            started["resume"] = decision.action.value
        if self.refused:
            self._send_held(held)
        if self.refused or not self._send(EventName.TOOL_CALL_STARTED, started, durable=True,
                                          preceding=held):
            self.refused = True
            call.refused = True
            self._stack().append(call)
            raise HookAborted("crewfence: the tool call's start could not be journaled",
                              source="crewfence-ledger")
        _errors.name = None
        call.token = set_idempotency_key(key)
        self._stack().append(call)

    def _reuse_call(self, tool: str, server: str | None, task: str | None, task_index: int,
                    call_index: int, args_sha: str, key: str, action: ToolAction,
                    result: str) -> None:
        """Journal a call answered from the journal; the post-tool hook hands ``result`` on."""
        data: dict[str, Any] = {
            "tool": tool, "server": server, "task": task, "task_index": task_index,
            "call_index": call_index, "arguments_sha256": args_sha, "idempotency_key": key,
            "action": action.value,
            "from_action": self.replay.plan.predecessor if self.replay is not None else None}
        if action is ToolAction.REPLAY:
            _add_material(data, "result", result)  # a successor of this job reuses it too
        self._send(EventName.TOOL_CALL_REUSED, data)
        self._stack().append(_ToolCall(tool=tool, server=server, task=task,
                                       task_index=task_index, call_index=call_index, key=key,
                                       started=time.perf_counter(), token=None,
                                       replayed=result))

    def tool_finished(self, ctx: Any) -> str | None:
        """Journal the call's end; for a call answered from the journal, return the text
        crewai must hand the agent (nothing ran, nothing is journaled here)."""
        stack = self._stack()
        if not stack:
            return None
        call = stack.pop()
        if call.token is not None:
            reset_idempotency_key(call.token)
        if call.replayed is not None:
            return call.replayed
        if call.refused:
            return None  # the tool did not run: nothing finished
        result = getattr(ctx, "tool_result", None)
        raw = getattr(ctx, "raw_tool_result", None)
        error = _tool_error(raw, result)
        text = raw if isinstance(raw, str) else "" if raw is None else str(raw)
        data: dict[str, Any] = {
            "tool": call.tool, "server": call.server, "task": call.task,
            "task_index": call.task_index, "call_index": call.call_index,
            "idempotency_key": call.key,
            "result_sha256": None if error is not None else _sha256_text(text),
            "error": error,
            "duration_ms": round((time.perf_counter() - call.started) * 1000, 3)}
        if self.keep_material:
            # what the agent received (crewai's formatted text), so a replay gives it the same
            _add_material(data, "result", result if isinstance(result, str) else text)
        self._send(EventName.TOOL_CALL_FINISHED, data)
        return None


def _add_material(data: dict[str, Any], name: str, text: str) -> None:
    """Put ``text`` in ``data[name]`` when within the material bound, else note it is not."""
    if len(text) <= MAX_RESUME_MATERIAL_CHARS:
        data[name] = text
    else:
        data["material"] = "too_large"


# --- binding and hooks ------------------------------------------------------------------------
_CURRENT: contextvars.ContextVar[JobLedger | None] = contextvars.ContextVar(
    "crewfence_job_ledger", default=None)
_sole: JobLedger | None = None
_sole_job_process = False


def sole_job_process() -> None:
    """This process runs one job at a time (a worker): threads crewai starts without copying
    the context still find the job's ledger."""
    global _sole_job_process
    _sole_job_process = True


def current() -> JobLedger | None:
    return _CURRENT.get() or _sole


@contextlib.contextmanager
def bound(ledger: JobLedger) -> Iterator[JobLedger]:
    """``ledger`` receives the hooks' reports of this context (and this process, in a
    worker) for the block; open model calls are journaled when it ends."""
    global _sole
    install()
    token = _CURRENT.set(ledger)
    if _sole_job_process:
        _sole = ledger
    try:
        yield ledger
    finally:
        ledger.close()
        _CURRENT.reset(token)
        if _sole is ledger:
            _sole = None


def _on_pre_step(ctx: Any) -> None:
    ledger = current()
    if ledger is not None and getattr(ctx, "kind", None) == "task":
        ledger.task_started(ctx.task, ctx.agent)


def _on_post_step(ctx: Any) -> None:
    ledger = current()
    if ledger is not None and getattr(ctx, "kind", None) == "task":
        ledger.task_completed(ctx.task, getattr(ctx, "output", None))


def _on_pre_model(ctx: Any) -> None:
    ledger = current()
    if ledger is not None:
        ledger.model_started(ctx)


def _on_post_model(ctx: Any) -> None:
    ledger = current()
    if ledger is not None:
        ledger.model_finished(ctx)


def _on_pre_tool(ctx: Any) -> None:
    ledger = current()
    if ledger is not None:
        ledger.tool_started(ctx)


def _on_post_tool(ctx: Any) -> str | None:
    ledger = current()
    if ledger is not None:
        return ledger.tool_finished(ctx)  # a str replaces the result (a replayed call)
    return None


_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Register the hooks with crewai (once per process; a forked worker inherits them), note
    the class of exceptions tools raise (``BaseTool.run``/``Tool.run``) and the provider's
    response id of model calls (``BaseLLM._emit_call_completed_event``), and send the call's
    key in every MCP ``tools/call`` ``_meta`` (``mcp_tools.install_idempotency_meta``)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from crewai.hooks.dispatch import InterceptionPoint, register
        from crewai.tools.base_tool import BaseTool, Tool

        for point, hook in ((InterceptionPoint.PRE_STEP, _on_pre_step),
                            (InterceptionPoint.POST_STEP, _on_post_step),
                            (InterceptionPoint.PRE_MODEL_CALL, _on_pre_model),
                            (InterceptionPoint.POST_MODEL_CALL, _on_post_model),
                            (InterceptionPoint.PRE_TOOL_CALL, _on_pre_tool),
                            (InterceptionPoint.POST_TOOL_CALL, _on_post_tool)):
            register(point, hook)
        for cls in (BaseTool, Tool):
            if not getattr(cls.run, "__crewfence_wrapped__", False):
                cls.run = _note_errors(cls.run)  # type: ignore[method-assign]
        from crewai.llms.base_llm import BaseLLM

        emit = BaseLLM._emit_call_completed_event
        if not getattr(emit, "__crewfence_wrapped__", False):
            BaseLLM._emit_call_completed_event = _note_response_id(emit)  # type: ignore[method-assign]
        from crewfence_sidecar.tools.mcp_tools import install_idempotency_meta

        install_idempotency_meta()
        _installed = True
