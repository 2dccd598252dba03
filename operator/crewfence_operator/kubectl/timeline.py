"""A job's journaled events as the lines a person reads (``explain``'s timeline, ``logs``).

One line per event, from the event's own data: the effect ledger's tasks, model calls and
tool calls (with the idempotency key a tool saw), the lifecycle events, a resolution. Events
this version does not know are shown by name (clients ignore unknown events, people should
not). Only hashes and bounded previews are in the events, so nothing here can print a tool's
arguments or a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crewfence_sidecar.contract import RESOLUTION_EVENT, EventName


def _at(data: Mapping[str, Any]) -> str:
    at = data.get("at") or data.get("recorded_at")
    return f"{at} " if at else ""


def _ms(value: object) -> str:
    return f" in {float(value):.1f} ms" if isinstance(value, int | float) else ""


def _short(digest: object) -> str:
    return f"{str(digest)[:12]}…" if digest else "-"


def _task(data: Mapping[str, Any]) -> str:
    index, total = data.get("index"), data.get("total")
    place = f" {int(index) + 1}/{total}" if isinstance(index, int) and total else ""
    return f"task{place} `{data.get('task')}`"


def _tool(data: Mapping[str, Any]) -> str:
    return (f"tool call `{data.get('tool')}` (task `{data.get('task')}`, call "
            f"{data.get('call_index')}, key {data.get('idempotency_key')})")


def event_line(event: Mapping[str, Any]) -> str:
    """``#<sequence> <when> <what>`` for one event of ``GET /jobs/{id}/events``."""
    name = str(event.get("event"))
    data = event.get("data") if isinstance(event.get("data"), Mapping) else {}
    assert isinstance(data, Mapping)
    head = f"#{event.get('sequence')} {_at(data)}"
    if name == EventName.TASK_STARTED:
        what = f"{_task(data)} started (agent {data.get('agent')})"
    elif name == EventName.TASK_COMPLETED:
        what = f"{_task(data)} completed (output sha256 {_short(data.get('output_sha256'))})"
    elif name == EventName.MODEL_CALL:
        tokens = (f", {data.get('prompt_tokens')} prompt + {data.get('completion_tokens')} "
                  "completion tokens" if data.get("prompt_tokens") is not None else "")
        request = f", request {data['request_id']}" if data.get("request_id") else ""
        what = (f"model call {data.get('call_index')} to {data.get('model')} (task "
                f"`{data.get('task')}`{tokens}{request}){_ms(data.get('duration_ms'))}")
    elif name == EventName.TASK_REUSED:
        what = f"{_task(data)} reused from {data.get('from_action')}'s journal (not run again)"
    elif name == EventName.TOOL_CALL_REUSED:
        how = ("not made again (resolved Happened)" if data.get("action") == "already_made"
               else "answered from the journal (not executed again)")
        what = f"{_tool(data)} {how}"
    elif name == EventName.MODEL_CALL_REUSED:
        what = (f"model call {data.get('model_index')} of task `{data.get('task')}` answered "
                f"from {data.get('from_action')}'s journal (request matched; no call made)")
    elif name == EventName.TOOL_CALL_STARTED:
        what = (f"{_tool(data)} STARTED, arguments sha256 "
                f"{_short(data.get('arguments_sha256'))}")
    elif name == EventName.TOOL_CALL_FINISHED:
        result = (f"failed: {data['error']}" if data.get("error")
                  else f"finished, result sha256 {_short(data.get('result_sha256'))}")
        what = f"{_tool(data)} {result}{_ms(data.get('duration_ms'))}"
    elif name == RESOLUTION_EVENT:
        what = f"resolution {data.get('outcome')}: {data.get('note')}"
    elif name in (EventName.COMPLETED, EventName.FAILED, EventName.CANCELLED):
        error = data.get("error") if isinstance(data.get("error"), Mapping) else None
        code = error.get("code") if error else data.get("reason")
        why = f" ({code})" if code else ""
        uncertain = ", outcome UNCERTAIN" if data.get("uncertain_outcome") else ""
        what = f"{name}{why}{uncertain}"
    else:
        what = name
    return f"{head}{what}".rstrip()


def in_doubt_lines(status: Mapping[str, Any]) -> list[str]:
    """``status.effects`` in words: counts, and each tool call in doubt."""
    effects = status.get("effects")
    if not isinstance(effects, Mapping):
        return []
    lines = [f"  Effects: {effects.get('tasksCompleted')}/{effects.get('tasksTotal')} tasks "
             f"completed, {effects.get('modelCalls')} model calls, {effects.get('toolCalls')} "
             "tool calls."]
    reused = effects.get("reused")
    if isinstance(reused, Mapping):
        lines.append(f"  Reused from {reused.get('fromActionId')}'s journal: "
                     f"{reused.get('tasks')} tasks, {reused.get('modelCalls', 0)} model calls, "
                     f"{reused.get('toolCalls')} tool calls, {reused.get('batchItems')} batch "
                     "inputs (the counts above are what ran live).")
    doubt = effects.get("inDoubt") or []
    if not doubt:
        lines.append("  No tool call was in flight (none in doubt).")
    for call in doubt:
        lines.append(f"  IN DOUBT: `{call.get('tool')}` (task `{call.get('task')}`, started "
                     f"{call.get('startedAt')}, idempotency key {call.get('idempotencyKey')}): "
                     "ask that system whether it happened, by this key.")
    more = int(effects.get("inDoubtCount") or 0) - len(doubt)
    if more > 0:
        lines.append(f"  ... and {more} more call(s) in doubt (see the events).")
    return lines
