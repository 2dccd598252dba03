"""Two trajectories side by side: a resumed CrewJob's and its predecessor's, from their
journal events (pure; ``kubectl crewfence explain`` prints it for a job with ``spec.resume``).

One row per task and per tool call position (task index, call index): what the predecessor
did there and what the successor did (reused from the journal, ran again with the same key,
not made again, or ran live); and per task, its model calls (the successor's answered from
the journal apart from those it made live).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Events = Sequence[Mapping[str, Any]]


def _tasks(events: Events) -> dict[int, tuple[str, str]]:
    """index -> (name, what happened: started / completed / reused)."""
    out: dict[int, tuple[str, str]] = {}
    for event in events:
        data, name = event.get("data") or {}, event.get("event")
        index = data.get("index")
        if not isinstance(index, int):
            continue
        word = {"task_started": "started", "task_completed": "completed",
                "task_reused": "reused from the journal"}.get(str(name))
        if word is not None:
            out[index] = (str(data.get("task") or f"task-{index}"), word)
    return out


def _calls(events: Events) -> dict[tuple[int, int], tuple[str, str]]:
    """(task index, call index) -> (tool, what happened)."""
    out: dict[tuple[int, int], tuple[str, str]] = {}
    keys: dict[str, tuple[int, int]] = {}
    for event in events:
        data, name = event.get("data") or {}, event.get("event")
        where = (data.get("task_index"), data.get("call_index"))
        key = str(data.get("idempotency_key") or "")
        short = key[:17]
        if name == "tool_call_started" and all(isinstance(w, int) for w in where):
            how = {"rerun_same_key": "ran again, same key", "live": "ran live"}.get(
                str(data.get("resume")), "ran")
            out[where] = (str(data.get("tool")), f"{how} ({short}), in doubt")  # type: ignore[index]
            keys[key] = where  # type: ignore[assignment]
        elif name == "tool_call_finished" and key in keys:
            tool, how = out[keys[key]]
            error = f", error {data['error']}" if data.get("error") else ""
            out[keys[key]] = (tool, how.replace(", in doubt", ", finished") + error)
        elif name == "tool_call_reused" and all(isinstance(w, int) for w in where):
            how = ("not made again (resolved Happened)" if data.get("action") == "already_made"
                   else "answered from the journal")
            out[where] = (str(data.get("tool")), f"{how} ({short})")  # type: ignore[index]
    return out


def _models(events: Events) -> dict[int, tuple[int, int]]:
    """task index -> (model calls made, model calls answered from the journal)."""
    out: dict[int, tuple[int, int]] = {}
    for event in events:
        data, name = event.get("data") or {}, event.get("event")
        index = data.get("task_index")
        if isinstance(index, int) and name in ("model_call", "model_call_reused"):
            made, reused = out.get(index, (0, 0))
            out[index] = (made + 1, reused) if name == "model_call" else (made, reused + 1)
    return out


def _model_words(counts: tuple[int, int] | None) -> str:
    if counts is None:
        return "none"
    made, reused = counts
    return f"{made} made" + (f", {reused} from the journal" if reused else "")


def side_by_side(predecessor: Events, successor: Events) -> list[str]:
    """Rows naming, per task and per tool call, the predecessor's and the successor's part."""
    rows: list[str] = []
    pred_tasks, succ_tasks = _tasks(predecessor), _tasks(successor)
    pred_calls, succ_calls = _calls(predecessor), _calls(successor)
    pred_models, succ_models = _models(predecessor), _models(successor)
    for index in sorted(set(pred_tasks) | set(succ_tasks)):
        name = (pred_tasks.get(index) or succ_tasks.get(index) or ("?", ""))[0]
        rows.append(f"    task {index} {name}: predecessor "
                    f"{pred_tasks.get(index, ('', 'did not reach it'))[1]}; successor "
                    f"{succ_tasks.get(index, ('', 'did not reach it'))[1]}")
        if index in pred_models or index in succ_models:
            rows.append(f"      model calls: predecessor {_model_words(pred_models.get(index))}"
                        f"; successor {_model_words(succ_models.get(index))}")
        for where in sorted(w for w in set(pred_calls) | set(succ_calls) if w[0] == index):
            tool = (pred_calls.get(where) or succ_calls.get(where) or ("?", ""))[0]
            rows.append(f"      call {where[1]} {tool}: predecessor "
                        f"{pred_calls.get(where, ('', 'no call'))[1]}; successor "
                        f"{succ_calls.get(where, ('', 'no call'))[1]}")
    for kind in ("batch_item_completed", "batch_item_reused"):
        done = sorted(int((e.get("data") or {}).get("index", -1)) for e in successor
                      if e.get("event") == kind)
        if done:
            word = "ran live" if kind == "batch_item_completed" else "reused from the journal"
            rows.append(f"    batch inputs {done}: {word}")
    return rows
