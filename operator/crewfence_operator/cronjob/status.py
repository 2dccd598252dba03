"""A CrewCronJob's status as the API stores it: patches built from a decision (pure).

The status mirrors the decisions; the facts a fence rests on are the children's names and
action ids (``children.py``). ``lastScheduleTime`` means "every tick up to here is handled"
(run, skipped or missed), which is what keeps a deleted child from being created again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from crewfence_operator.cronjob import children as ch
from crewfence_operator.cronjob.schedule import to_rfc3339
from crewfence_operator.cronjob.ticks import Plan, Record

COND_READY = "Ready"
COND_SUSPENDED = "Suspended"
COND_PAUSED = "Paused"
COND_STALLED = "Stalled"
COND_TICKS_MISSED = "TicksMissed"


def _time(tick: int | None) -> str | None:
    return to_rfc3339(tick) if tick is not None else None


def record_patch(record: Record) -> dict[str, Any]:
    """What one ``Record`` step writes (null removes a field)."""
    return {
        "lastScheduleTime": _time(record.last_schedule),
        "bufferedScheduleTime": _time(record.buffered),
        "missedTicks": record.missed,
        "skippedTicks": record.skipped,
        "lastMissedTime": _time(record.last_missed),
    }


def condition(ctype: str, status: bool, reason: str, message: str, generation: int,
              now: str, previous: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    value = "True" if status else "False"
    since = now
    for old in previous:
        if old.get("type") == ctype and old.get("status") == value and old.get(
                "lastTransitionTime"):
            since = str(old["lastTransitionTime"])
    return {"type": ctype, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": since, "observedGeneration": generation}


def active_refs(namespace: str, cronjob: str, observed: Sequence[ch.Child],
                created: Sequence[int]) -> list[dict[str, Any]]:
    refs: dict[str, dict[str, Any]] = {}
    for child in observed:
        if child.active:
            ref: dict[str, Any] = {"name": child.name}
            if child.tick is not None:
                ref["scheduledTime"] = to_rfc3339(child.tick)
                ref["actionId"] = ch.action_id(namespace, cronjob, child.tick)
            refs[child.name] = ref
    for tick in created:
        name = ch.child_name(cronjob, tick)
        refs[name] = {"name": name, "scheduledTime": to_rfc3339(tick),
                      "actionId": ch.action_id(namespace, cronjob, tick)}
    return sorted(refs.values(), key=lambda r: (r.get("scheduledTime") or "", r["name"]))


def last_successful(previous: str | None, observed: Sequence[ch.Child]) -> str | None:
    """The latest finish time of a succeeded child (kept when history deletes it)."""
    times = [c.finished or c.order for c in observed if c.succeeded]
    best = max(times) if times else None
    if previous is not None and (best is None or to_rfc3339(best) <= previous):
        return previous
    return _time(best)


def final_patch(*, namespace: str, cronjob: str, plan: Plan, observed: Sequence[ch.Child],
                previous: Mapping[str, Any], generation: int, now: str,
                suspended: bool) -> dict[str, Any]:
    """The status after a round: the final record, next tick, active children, conditions."""
    old = list(previous.get("conditions") or [])
    patch = record_patch(plan.final)
    patch["nextScheduleTime"] = _time(plan.next_schedule)
    patch["active"] = active_refs(namespace, cronjob, observed, plan.creates)
    patch["lastSuccessfulTime"] = last_successful(previous.get("lastSuccessfulTime"), observed)
    patch["observedGeneration"] = generation
    if plan.paused_by is not None:
        paused = condition(COND_PAUSED, True, "OutcomeUncertain",
                           f"CrewJob {plan.paused_by} has an uncertain outcome: resolve it "
                           "(kubectl crewfence resolve) to resume the schedule",
                           generation, now, old)
    else:
        paused = condition(COND_PAUSED, False, "NoUncertainOutcome",
                           "no child waits for a resolution", generation, now, old)
    # kstatus (Flux without health expressions, kpt, Config Sync) reads Stalled=True as
    # Failed: a schedule paused by an unresolved uncertain outcome must not read Current.
    halted = plan.paused_by is not None
    why = ("paused until the uncertain outcome of CrewJob "
           f"{plan.paused_by} is resolved" if halted else "the schedule is valid")
    conditions = [
        condition(COND_READY, not halted, "Paused" if halted else "Scheduling", why,
                  generation, now, old),
        condition(COND_STALLED, halted, "OutcomeUncertain" if halted else "Scheduling", why,
                  generation, now, old),
        condition(COND_SUSPENDED, suspended, "SpecSuspend" if suspended else "NotSuspended",
                  "spec.suspend is true: due ticks are skipped" if suspended
                  else "spec.suspend is false", generation, now, old),
        paused,
    ]
    if plan.final.missed:
        more = "at least " if plan.missed_more else ""
        conditions.append(condition(
            COND_TICKS_MISSED, True, "OutsideCatchupWindow",
            f"{more}{plan.final.missed} tick(s) missed in total, the latest at "
            f"{_time(plan.final.last_missed)}: older than the catch-up window when the "
            "operator could run them", generation, now, old))
    patch["conditions"] = conditions
    return patch


def invalid_patch(code: str, message: str, previous: Mapping[str, Any], generation: int,
                  now: str) -> dict[str, Any]:
    """The spec cannot be scheduled (what CEL cannot decide): no tick runs until it is fixed."""
    old = list(previous.get("conditions") or [])
    return {
        "observedGeneration": generation,
        "nextScheduleTime": None,
        "conditions": [
            condition(COND_READY, False, code, message, generation, now, old),
            condition(COND_STALLED, True, code, message, generation, now, old),
        ],
    }
