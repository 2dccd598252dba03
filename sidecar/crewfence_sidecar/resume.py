"""Resume: what a successor reuses of its predecessor's journaled trajectory (pure, no crewai).

A start with ``resume_from`` (``contract.StartRequest``) gets a :class:`ResumePlan` built
from the predecessor's journal events (:func:`build_plan`) and its resolution. The worker
then consults the plan:

- **Tasks.** The predecessor's completed tasks that form a prefix of the crew (0..k-1), each
  with its full output journaled (resume material), are not run again: their outputs are
  given to crewai as the tasks' outputs, so the tasks that follow get them as context.
- **Tool calls** of the tasks that do run, position by position (:class:`ToolReplay`):

  | the predecessor's call at (task, call)          | the successor                            |
  |-------------------------------------------------|------------------------------------------|
  | none, another tool or other arguments (diverged) | runs it live, with its own key; so do   |
  |                                                 | all later calls of that task             |
  | finished, result journaled                      | does not run it: the journaled result   |
  |                                                 | goes to the agent (``REPLAY``)          |
  | finished, result not journaled (too large, or  | runs it again with the predecessor's key |
  | material off)                                   | (``RERUN_SAME_KEY``)                    |
  | in doubt, resolved NotHappened / Compensated    | runs it again with the predecessor's key |
  | in doubt, resolved Happened                     | never runs it; the agent is told it was  |
  |                                                 | already made (``ALREADY_MADE``)          |
  | in doubt, not resolved                          | never runs it (admission refuses such a  |
  |                                                 | resume: :func:`unresolved_in_doubt`)    |

- **Model calls** of the tasks that do run, position by position (task index, the call's
  index within its task; :class:`ModelReplay`): a call whose request (messages, model, tools,
  structured-output schema: ``request_sha256``) matches the predecessor's call at that
  position and whose response was journaled is answered from the journal (``REPLAY``: no
  second bill). The first call that diverges (another request, no journaled call there: the
  call that was in doubt, or no response journaled) runs live, and so does every later model
  call of that task.
- **batch_run.** Inputs whose output the predecessor journaled (``batch_item_completed``)
  are not run again; the others run live.

Invariants: a tool call that finished in the predecessor is never executed by the successor
unless its result was not journaled, and then only with the predecessor's idempotency key;
an in-doubt call runs again only with that key and only when resolved NotHappened or
Compensated. A model call is answered from the journal only when its request hash equals the
journaled one at its position and no earlier model call of its task ran live. A resumed
record's ``task_reused`` / ``tool_call_reused`` / ``model_call_reused`` events carry the same
material, so a successor of a successor reuses them too (keys stay the first ones).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from crewfence_sidecar.contract import EventName, JobEvent, ResolutionOutcome

MAX_RESUME_MATERIAL_CHARS: Final = 64 * 1024
"""A task output or tool result longer than this is not journaled as material (it is not
reusable: on resume its task or call runs again)."""

MAX_PLAN_MATERIAL_CHARS: Final = 32 * 1024 * 1024
"""Material one plan carries to its worker at most (in journal order: tasks first, then tool
results); beyond it, outputs and results are dropped from the plan (those tasks and calls run
again, a call with the predecessor's key), so the job frame stays far below its bound."""

ALREADY_MADE_TEXT: Final = (
    "crewfence: this tool call was already made by an earlier attempt of this job (a person "
    "confirmed it happened), so it is not made again and its result is not known here. "
    "Continue as if it succeeded.")
NOT_RESOLVED_TEXT: Final = (
    "crewfence: this tool call may have been made by an earlier attempt of this job and its "
    "outcome is not resolved, so it is not made again.")


class ModelAction(StrEnum):
    LIVE = "live"
    REPLAY = "replay"


@dataclass(frozen=True)
class JournaledModelCall:
    """One model call of the predecessor, at (task_index, model_index within the task)."""

    request_sha256: str
    response: str | None = None
    """The response as the ledger encodes it (``ledger.encode_model_response``; resume
    material), None when not journaled."""


@dataclass(frozen=True)
class ModelDecision:
    action: ModelAction
    response: str | None = None
    """For REPLAY: the journaled (encoded) response the caller receives instead of a call."""
    reason: str = ""


class ToolAction(StrEnum):
    LIVE = "live"
    REPLAY = "replay"
    RERUN_SAME_KEY = "rerun_same_key"
    ALREADY_MADE = "already_made"


@dataclass(frozen=True)
class JournaledCall:
    """One tool call of the predecessor, at (task_index, call_index)."""

    tool: str
    arguments_sha256: str | None
    idempotency_key: str
    finished: bool
    result: str | None = None
    """The text the agent received (resume material), None when not journaled."""


@dataclass(frozen=True)
class ToolDecision:
    action: ToolAction
    key: str | None
    """The idempotency key to run (or report) the call with; None: the successor's own."""
    result: str | None = None
    """For REPLAY and ALREADY_MADE: what the agent receives instead of a live call."""
    reason: str = ""


def _ix(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ResumePlan:
    predecessor: str
    resolution: str | None = None
    """The predecessor's resolution outcome (``ResolutionOutcome`` value) or None."""
    task_outputs: tuple[str, ...] = ()
    """Outputs of the predecessor's completed prefix of tasks (index 0..k-1)."""
    tasks_total: int = 0
    calls: dict[tuple[int, int], JournaledCall] = field(default_factory=dict)
    batch_outputs: dict[int, Any] = field(default_factory=dict)
    """batch_run: the output of each input the predecessor completed, by input index."""
    model_calls: dict[tuple[int, int], JournaledModelCall] = field(default_factory=dict)
    """The predecessor's model calls of a task, by (task index, model index in the task)."""

    def to_wire(self) -> dict[str, Any]:
        """JSON for the worker's job frame (see :meth:`from_wire`)."""
        return {"predecessor": self.predecessor, "resolution": self.resolution,
                "task_outputs": list(self.task_outputs), "tasks_total": self.tasks_total,
                "calls": [{"task_index": t, "call_index": c, "tool": j.tool,
                           "arguments_sha256": j.arguments_sha256,
                           "idempotency_key": j.idempotency_key, "finished": j.finished,
                           "result": j.result} for (t, c), j in sorted(self.calls.items())],
                "batch_outputs": [{"index": i, "output": o}
                                  for i, o in sorted(self.batch_outputs.items())],
                "model_calls": [{"task_index": t, "model_index": m,
                                 "request_sha256": j.request_sha256, "response": j.response}
                                for (t, m), j in sorted(self.model_calls.items())]}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ResumePlan:
        calls = {(int(c["task_index"]), int(c["call_index"])): JournaledCall(
            tool=str(c["tool"]), arguments_sha256=c.get("arguments_sha256"),
            idempotency_key=str(c["idempotency_key"]), finished=bool(c["finished"]),
            result=c.get("result")) for c in data.get("calls") or []}
        return cls(predecessor=str(data["predecessor"]), resolution=data.get("resolution"),
                   task_outputs=tuple(str(o) for o in data.get("task_outputs") or []),
                   tasks_total=int(data.get("tasks_total") or 0), calls=calls,
                   batch_outputs={int(b["index"]): b["output"]
                                  for b in data.get("batch_outputs") or []},
                   model_calls={(int(m["task_index"]), int(m["model_index"])): JournaledModelCall(
                       request_sha256=str(m["request_sha256"]), response=m.get("response"))
                       for m in data.get("model_calls") or []})


def build_plan(predecessor: str, events: Iterable[JobEvent], resolution: str | None) -> ResumePlan:
    """The plan for resuming ``predecessor`` from its events (sequence order); pure.

    A task counts as reusable only with its full output journaled; only the prefix of
    reusable tasks is skipped (a later task's output would be stale once an earlier one
    runs again).
    """
    outputs: dict[int, str] = {}
    total = 0
    calls: dict[tuple[int, int], JournaledCall] = {}
    by_key: dict[str, tuple[int, int]] = {}
    batch: dict[int, Any] = {}
    models: dict[tuple[int, int], JournaledModelCall] = {}
    for event in events:
        data = event.data
        name = event.event
        if name in (EventName.TASK_COMPLETED, EventName.TASK_REUSED):
            index = _ix(data.get("index"))
            total = max(total, _ix(data.get("total")) or 0)
            if index is not None and isinstance(data.get("output"), str):
                outputs[index] = data["output"]
        elif name == EventName.TASK_STARTED:
            total = max(total, _ix(data.get("total")) or 0)
        elif name in (EventName.TOOL_CALL_STARTED, EventName.TOOL_CALL_REUSED):
            task_index, call_index = _ix(data.get("task_index")), _ix(data.get("call_index"))
            key = data.get("idempotency_key")
            if task_index is None or call_index is None or not isinstance(key, str):
                continue
            reused = name == EventName.TOOL_CALL_REUSED
            result = data.get("result") if isinstance(data.get("result"), str) else None
            # a reused call that was "already made" stays what it was: made, result unknown
            calls[(task_index, call_index)] = JournaledCall(
                tool=str(data.get("tool") or ""), arguments_sha256=data.get("arguments_sha256"),
                idempotency_key=key,
                finished=reused and data.get("action") != ToolAction.ALREADY_MADE.value,
                result=result if reused else None)
            by_key[key] = (task_index, call_index)
        elif name == EventName.TOOL_CALL_FINISHED:
            where = by_key.get(str(data.get("idempotency_key") or ""))
            if where is not None:
                started = calls[where]
                result = data.get("result") if isinstance(data.get("result"), str) else None
                calls[where] = JournaledCall(
                    tool=started.tool, arguments_sha256=started.arguments_sha256,
                    idempotency_key=started.idempotency_key, finished=True, result=result)
        elif name in (EventName.MODEL_CALL, EventName.MODEL_CALL_REUSED):
            task_index, model_index = _ix(data.get("task_index")), _ix(data.get("model_index"))
            request = data.get("request_sha256")
            if task_index is not None and model_index is not None and isinstance(request, str):
                response = data.get("response")
                models[(task_index, model_index)] = JournaledModelCall(
                    request_sha256=request,
                    response=response if isinstance(response, str) else None)
        elif name in (EventName.BATCH_ITEM_COMPLETED, EventName.BATCH_ITEM_REUSED):
            index = _ix(data.get("index"))
            if index is not None and "output" in data:
                batch[index] = data["output"]
    prefix: list[str] = []
    budget = MAX_PLAN_MATERIAL_CHARS
    while len(prefix) in outputs and len(outputs[len(prefix)]) <= budget:
        budget -= len(outputs[len(prefix)])
        prefix.append(outputs[len(prefix)])
    for where in sorted(calls):
        result = calls[where].result
        if result is not None:
            if len(result) > budget:
                calls[where] = JournaledCall(
                    tool=calls[where].tool, arguments_sha256=calls[where].arguments_sha256,
                    idempotency_key=calls[where].idempotency_key,
                    finished=calls[where].finished, result=None)
            else:
                budget -= len(result)
    for where in sorted(models):
        response = models[where].response
        if response is not None:
            if len(response) > budget:  # beyond the plan's bound: that call runs live
                models[where] = JournaledModelCall(models[where].request_sha256, None)
            else:
                budget -= len(response)
    return ResumePlan(predecessor=predecessor, resolution=resolution,
                      task_outputs=tuple(prefix), tasks_total=total, calls=calls,
                      batch_outputs=batch, model_calls=models)


def unresolved_in_doubt(plan: ResumePlan) -> list[str]:
    """Keys of the predecessor's calls in doubt when it has no resolution (a resume of such a
    predecessor is refused: nobody said whether those calls happened)."""
    if plan.resolution is not None:
        return []
    return [c.idempotency_key for c in plan.calls.values() if not c.finished]


def decide_tool(plan: ResumePlan, task_index: int, call_index: int, tool: str,
                arguments_sha256: str | None) -> ToolDecision:
    """The replay decision for the successor's call at (task_index, call_index) when no
    earlier call of its task diverged (see the module's table); pure."""
    journaled = plan.calls.get((task_index, call_index))
    if journaled is None:
        return ToolDecision(ToolAction.LIVE, None, reason="not in the predecessor")
    if journaled.tool != tool or journaled.arguments_sha256 != arguments_sha256:
        return ToolDecision(ToolAction.LIVE, None, reason="diverged")
    key = journaled.idempotency_key
    if journaled.finished:
        if journaled.result is not None:
            return ToolDecision(ToolAction.REPLAY, key, result=journaled.result,
                                reason="finished")
        return ToolDecision(ToolAction.RERUN_SAME_KEY, key, reason="result not journaled")
    if plan.resolution in (ResolutionOutcome.NOT_HAPPENED.value,
                           ResolutionOutcome.COMPENSATED.value):
        return ToolDecision(ToolAction.RERUN_SAME_KEY, key, reason=f"in doubt, resolved "
                            f"{plan.resolution}")
    if plan.resolution == ResolutionOutcome.HAPPENED.value:
        return ToolDecision(ToolAction.ALREADY_MADE, key, result=ALREADY_MADE_TEXT,
                            reason="in doubt, resolved Happened")
    return ToolDecision(ToolAction.ALREADY_MADE, key, result=NOT_RESOLVED_TEXT,
                        reason="in doubt, not resolved")


@dataclass
class ToolReplay:
    """The successor's replay state: which tasks diverged from the predecessor (thread-safe).

    Invariant: once a call of a task diverged, every later call of that task runs live (the
    model's trajectory is no longer the journaled one, so positions no longer match)."""

    plan: ResumePlan
    _diverged: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(self, task_index: int, call_index: int, tool: str,
               arguments_sha256: str | None) -> ToolDecision:
        with self._lock:
            if task_index in self._diverged:
                return ToolDecision(ToolAction.LIVE, None, reason="diverged earlier")
            decision = decide_tool(self.plan, task_index, call_index, tool, arguments_sha256)
            if decision.action is ToolAction.LIVE:
                self._diverged.add(task_index)
            return decision


def decide_model(plan: ResumePlan, task_index: int, model_index: int,
                 request_sha256: str) -> ModelDecision:
    """The replay decision for the successor's model call at (task_index, model_index) when
    no earlier model call of its task ran live; pure."""
    journaled = plan.model_calls.get((task_index, model_index))
    if journaled is None:
        return ModelDecision(ModelAction.LIVE, reason="not in the predecessor")
    if journaled.request_sha256 != request_sha256:
        return ModelDecision(ModelAction.LIVE, reason="diverged")
    if journaled.response is None:
        return ModelDecision(ModelAction.LIVE, reason="response not journaled")
    return ModelDecision(ModelAction.REPLAY, response=journaled.response, reason="matched")


@dataclass
class ModelReplay:
    """The successor's model-call replay state: which tasks ran a model call live (thread-safe).

    Invariant: once a model call of a task ran live, every later model call of that task runs
    live (the conversation is no longer the journaled one: no response of the predecessor is
    handed on for it, even were a later request to hash alike)."""

    plan: ResumePlan
    _diverged: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(self, task_index: int, model_index: int, request_sha256: str) -> ModelDecision:
        with self._lock:
            if task_index in self._diverged:
                return ModelDecision(ModelAction.LIVE, reason="diverged earlier")
            decision = decide_model(self.plan, task_index, model_index, request_sha256)
            if decision.action is ModelAction.LIVE:
                self._diverged.add(task_index)
            return decision
