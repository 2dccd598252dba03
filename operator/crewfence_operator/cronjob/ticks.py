"""The tick decisions of one CrewCronJob, as a pure function of what was observed.

``decide(spec, facts, children, now)`` returns the steps to carry out, in order. It keeps:

T1 *At most one Action per tick.* A tick is a candidate only when it is later than every
   tick already handled: ``status.lastScheduleTime`` and the scheduled time of every observed
   child of this CrewCronJob. A handled tick is never a candidate again, so a deleted child of
   a tick that already ran is not created again, and never "moves" to a later tick (every
   tick has its own name and action id). Where a write was lost (the child was created, the
   status patch was not), the observed child counts as handled.
T2 *No tick inside the catch-up window is lost.* Every tick in ``(handled, now]`` is run,
   skipped by a policy (recorded, counted), or, when older than the window
   (``catchupWindow``, or ``startingDeadlineSeconds`` when shorter), recorded as missed
   (counted). Nothing is dropped without a record.
T3 *Records before and after every create.* ``Record`` steps carry absolute values
   (``lastScheduleTime``, counters), never increments: a ``Record`` before a ``Create``
   covers only the ticks before it (a crash then loses no tick), the ``Create`` itself is
   covered by the observed child (T1), and the final ``Record`` covers the rest.
T4 *A person decides about an uncertain outcome* (``onUncertain: Pause``): while a child's
   outcome is uncertain and unresolved, due ticks are skipped (reason ``Paused``), and
   history limits never delete such a child.
T5 *The policies.* Allow: every due tick runs. Forbid: a due tick is skipped while any child
   is active. Replace: the active children are cancelled (``spec.cancel``) and the latest due
   tick runs; earlier due ticks of the same round are skipped (replaced before they began).
   BufferOne: while a child is active the latest due tick is buffered (an older buffered
   tick is skipped) and runs once no child is active.

Where each fact lives, and what a re-apply from Git loses: the tick times come from the spec;
the child (name, annotation, owner reference) says a tick's Action exists; the Crew's journal
says it was admitted; the CrewCronJob's status says a tick was handled. Deleting the
CrewCronJob deletes its children (owner references) and its status; re-applied, it is a new
object whose first candidate tick is after its own ``creationTimestamp``, so no tick of the
old object can run again, and a re-created child would still carry its tick's action id (an
exact repeat at the sidecar, never a second run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from crewfence_operator.cronjob.children import Child
from crewfence_operator.cronjob.spec import ConcurrencyPolicy, CronSpec, OnUncertain

ENUMERATION_LIMIT: Final = 100_000
"""At most this many ticks are enumerated (or counted, for cron) per decision."""


class SkipReason(StrEnum):
    FORBID = "Forbid"
    REPLACE = "Replace"
    BUFFER_ONE = "BufferOne"
    SUSPENDED = "Suspended"
    PAUSED = "Paused"


@dataclass(frozen=True)
class Facts:
    """What the CrewCronJob's own metadata and status say."""

    created: int
    """metadata.creationTimestamp: no tick at or before it belongs to this object."""
    last_schedule: int | None = None
    buffered: int | None = None
    missed: int = 0
    skipped: int = 0
    last_missed: int | None = None


@dataclass(frozen=True)
class Create:
    tick: int


@dataclass(frozen=True)
class CancelChild:
    name: str


@dataclass(frozen=True)
class DeleteChild:
    name: str


@dataclass(frozen=True)
class Record:
    """Absolute status values (T3)."""

    last_schedule: int | None
    buffered: int | None
    missed: int
    skipped: int
    last_missed: int | None


Step = Create | CancelChild | DeleteChild | Record


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    next_schedule: int | None
    paused_by: str | None
    """The child whose unresolved uncertain outcome pauses the schedule."""
    ran: tuple[int, ...] = ()
    skipped: tuple[tuple[int, SkipReason], ...] = ()
    missed: int = 0
    missed_more: bool = False
    """More ticks were missed than could be counted (``ENUMERATION_LIMIT``)."""
    final: Record = field(default_factory=lambda: Record(None, None, 0, 0, None))

    @property
    def creates(self) -> tuple[int, ...]:
        return tuple(s.tick for s in self.steps if isinstance(s, Create))


def handled_until(facts: Facts, children: Sequence[Child], now: int) -> int:
    """The latest handled tick (T1): ticks at or before it are never candidates."""
    ticks = [ch.tick for ch in children if ch.owned and ch.tick is not None and ch.tick <= now]
    return max([facts.created, facts.last_schedule or facts.created, *ticks])


def pausing_child(spec: CronSpec, children: Sequence[Child]) -> str | None:
    if spec.on_uncertain is not OnUncertain.PAUSE:
        return None
    waiting = sorted((ch for ch in children if ch.needs_person), key=lambda ch: ch.order)
    return waiting[0].name if waiting else None


def history_deletions(spec: CronSpec, children: Sequence[Child]) -> list[str]:
    """Finished children beyond the history limits, oldest first; never an active child, one
    that needs a person (T4), or one of another incarnation."""
    finished = [ch for ch in children if ch.owned and not ch.active and not ch.needs_person]
    out: list[str] = []
    for keep, group in ((spec.successful_history, [ch for ch in finished if ch.succeeded]),
                        (spec.failed_history, [ch for ch in finished if not ch.succeeded])):
        ordered = sorted(group, key=lambda ch: (ch.order, ch.name), reverse=True)
        out += [ch.name for ch in reversed(ordered[keep:])]
    return out


def decide(spec: CronSpec, facts: Facts, children: Sequence[Child], now: int) -> Plan:
    handled = handled_until(facts, children, now)
    cutoff = now - spec.window_seconds
    # T2: ticks older than the window are missed; counted without running them.
    missed, missed_more = spec.schedule.count_between(handled, min(cutoff - 1, now),
                                                      ENUMERATION_LIMIT)
    last_missed = facts.last_missed
    if missed:
        last_missed = spec.schedule.latest_at_or_before(cutoff - 1)
    due, _ = spec.schedule.between(max(handled, cutoff - 1), now, ENUMERATION_LIMIT)

    paused_by = pausing_child(spec, children)
    existing = {ch.tick for ch in children if ch.owned and ch.tick is not None}
    buffered = facts.buffered if facts.buffered not in existing else None
    active = sum(ch.active for ch in children)
    active_uncancelled = [ch.name for ch in children if ch.active and not ch.cancel_requested]

    steps: list[Step] = []
    ran: list[int] = []
    skipped: list[tuple[int, SkipReason]] = []
    last = max(handled, last_missed or handled)
    counters = {"missed": facts.missed + missed, "skipped": facts.skipped}
    unrecorded = bool(missed) or buffered != facts.buffered

    def record() -> Record:
        return Record(last_schedule=last if last > facts.created else facts.last_schedule,
                      buffered=buffered, missed=counters["missed"],
                      skipped=counters["skipped"], last_missed=last_missed)

    def create(tick: int) -> None:
        nonlocal unrecorded, active
        if unrecorded:
            steps.append(record())
            unrecorded = False
        steps.append(Create(tick))
        ran.append(tick)
        active += 1

    def skip(tick: int, reason: SkipReason) -> None:
        nonlocal unrecorded
        skipped.append((tick, reason))
        counters["skipped"] += 1
        unrecorded = True

    blocked = SkipReason.SUSPENDED if spec.suspend else (
        SkipReason.PAUSED if paused_by is not None else None)
    if blocked is None and buffered is not None and active == 0:
        create(buffered)  # a Record before it still names the buffered tick (T3)
        buffered = None
        unrecorded = True
    for index, tick in enumerate(due):
        if blocked is not None:
            skip(tick, blocked)
        elif spec.concurrency is ConcurrencyPolicy.ALLOW:
            create(tick)
        elif spec.concurrency is ConcurrencyPolicy.FORBID:
            if active:
                skip(tick, SkipReason.FORBID)
            else:
                create(tick)
        elif spec.concurrency is ConcurrencyPolicy.REPLACE:
            if index < len(due) - 1:
                skip(tick, SkipReason.REPLACE)
            else:
                steps += [CancelChild(name) for name in active_uncancelled]
                active_uncancelled = []
                create(tick)
        else:  # BufferOne
            if active == 0:
                create(tick)
            else:
                if buffered is not None:
                    skip(buffered, SkipReason.BUFFER_ONE)
                buffered = tick
                unrecorded = True
        last = max(last, tick)
    final = record()
    steps.append(final)
    steps += [DeleteChild(name) for name in history_deletions(spec, children)]
    return Plan(steps=tuple(steps), next_schedule=spec.schedule.next_after(max(now, last)),
                paused_by=paused_by, ran=tuple(ran), skipped=tuple(skipped), missed=missed,
                missed_more=missed_more, final=final)
