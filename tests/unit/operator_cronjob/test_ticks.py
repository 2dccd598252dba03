"""The tick decisions, case by case (the simulated-clock property test covers the mix)."""

from __future__ import annotations

from crewfence_operator.cronjob.children import Child, child_name
from crewfence_operator.cronjob.schedule import IntervalSchedule
from crewfence_operator.cronjob.spec import ConcurrencyPolicy, CronSpec, OnUncertain
from crewfence_operator.cronjob.ticks import (
    CancelChild,
    Create,
    DeleteChild,
    Facts,
    Record,
    SkipReason,
    decide,
)

C = 1_800_000_000  # creation time (a multiple of 60)


def spec(**kw: object) -> CronSpec:
    return CronSpec(schedule=IntervalSchedule(60), **kw)  # type: ignore[arg-type]


def child(tick: int, phase: str | None = None, **kw: object) -> Child:
    return Child(name=child_name("r", tick), tick=tick, phase=phase, created=tick, **kw)  # type: ignore[arg-type]


def test_first_tick_after_creation_runs_and_is_recorded_after_the_create() -> None:
    plan = decide(spec(), Facts(created=C), [], C + 60)
    assert plan.steps[0] == Create(C + 60)
    assert isinstance(plan.steps[1], Record) and plan.steps[1].last_schedule == C + 60
    assert plan.next_schedule == C + 120
    # the creation second itself is not a tick of this object
    assert decide(spec(), Facts(created=C), [], C).creates == ()


def test_a_deleted_child_of_a_recorded_tick_is_not_created_again() -> None:
    plan = decide(spec(), Facts(created=C, last_schedule=C + 60), [], C + 90)
    assert plan.creates == () and plan.next_schedule == C + 120


def test_a_lost_status_write_is_covered_by_the_observed_child() -> None:
    plan = decide(spec(), Facts(created=C), [child(C + 60, "Running")], C + 90)
    assert plan.creates == () and plan.final.last_schedule == C + 60


def test_outage_beyond_the_window_records_missed_ticks_then_catches_up() -> None:
    s = spec(catchup_seconds=180)
    plan = decide(s, Facts(created=C), [], C + 600)
    # ticks C+60..C+360 are older than 3 minutes at C+600; C+420..C+600 run
    assert plan.missed == 6 and plan.creates == (C + 420, C + 480, C + 540, C + 600)
    first = plan.steps[0]
    assert isinstance(first, Record) and first.missed == 6 and first.last_schedule == C + 360
    assert plan.final.last_missed == C + 360


def test_forbid_skips_while_a_child_runs() -> None:
    plan = decide(spec(concurrency=ConcurrencyPolicy.FORBID),
                  Facts(created=C, last_schedule=C + 60), [child(C + 60, "Running")], C + 120)
    assert plan.creates == () and plan.skipped == ((C + 120, SkipReason.FORBID),)
    assert plan.final.skipped == 1 and plan.final.last_schedule == C + 120


def test_forbid_after_an_outage_runs_one() -> None:
    plan = decide(spec(concurrency=ConcurrencyPolicy.FORBID), Facts(created=C), [], C + 240)
    assert plan.creates == (C + 60,) and len(plan.skipped) == 3


def test_replace_cancels_then_runs_the_latest() -> None:
    plan = decide(spec(concurrency=ConcurrencyPolicy.REPLACE),
                  Facts(created=C, last_schedule=C + 60), [child(C + 60, "Running")], C + 180)
    assert plan.steps[0] == CancelChild(child_name("r", C + 60))
    assert plan.creates == (C + 180,) and plan.skipped == ((C + 120, SkipReason.REPLACE),)


def test_buffer_one_keeps_the_latest_and_runs_it_when_the_child_ends() -> None:
    s = spec(concurrency=ConcurrencyPolicy.BUFFER_ONE)
    running = [child(C + 60, "Running")]
    plan = decide(s, Facts(created=C, last_schedule=C + 60), running, C + 180)
    assert plan.creates == () and plan.final.buffered == C + 180
    assert plan.skipped == ((C + 120, SkipReason.BUFFER_ONE),)
    done = [child(C + 60, "Succeeded")]
    facts = Facts(created=C, last_schedule=C + 180, buffered=C + 180, skipped=1)
    plan = decide(s, facts, done, C + 200)
    assert plan.creates == (C + 180,) and plan.final.buffered is None
    # a Record written before that create still names the buffered tick (crash-safe)
    assert all(r.buffered == C + 180 for r in plan.steps[:plan.steps.index(Create(C + 180))]
               if isinstance(r, Record))


def test_an_unresolved_uncertain_child_pauses_and_is_never_deleted() -> None:
    uncertain = child(C + 60, "Failed", uncertain=True)
    s = spec(failed_history=0)
    plan = decide(s, Facts(created=C, last_schedule=C + 60), [uncertain], C + 120)
    assert plan.paused_by == uncertain.name and plan.creates == ()
    assert plan.skipped == ((C + 120, SkipReason.PAUSED),)
    assert not any(isinstance(step, DeleteChild) for step in plan.steps)
    resolved = child(C + 60, "Failed", uncertain=True, resolved=True)
    plan = decide(s, Facts(created=C, last_schedule=C + 120), [resolved], C + 180)
    assert plan.paused_by is None and plan.creates == (C + 180,)
    assert DeleteChild(resolved.name) in plan.steps
    cont = decide(spec(on_uncertain=OnUncertain.CONTINUE),
                  Facts(created=C, last_schedule=C + 60), [uncertain], C + 120)
    assert cont.creates == (C + 120,)


def test_suspend_skips_and_never_runs_later() -> None:
    plan = decide(spec(suspend=True), Facts(created=C), [], C + 180)
    assert plan.creates == () and plan.final.skipped == 3
    plan = decide(spec(), Facts(created=C, last_schedule=plan.final.last_schedule,
                                skipped=3), [], C + 200)
    assert plan.creates == ()


def test_history_keeps_the_newest_and_only_owned_children() -> None:
    kids = [child(C + 60 * i, "Succeeded") for i in range(1, 6)]
    kids.append(child(C + 400, "Failed", owned=False))
    plan = decide(spec(successful_history=2, failed_history=0),
                  Facts(created=C, last_schedule=C + 400), kids, C + 410)
    deleted = [s.name for s in plan.steps if isinstance(s, DeleteChild)]
    assert deleted == [child_name("r", C + 60 * i) for i in (1, 2, 3)]


def test_reapplied_from_git_no_tick_of_the_old_object_runs_again() -> None:
    # Deleted and re-applied: a new object (new uid, new creationTimestamp, no status). A
    # child of the old object that survived (orphaned) is not this incarnation's, and its
    # tick is before the new creation time anyway.
    old = child(C + 60, "Succeeded", owned=False)
    plan = decide(spec(), Facts(created=C + 100), [old], C + 130)
    assert plan.creates == (C + 120,)
    assert DeleteChild(old.name) not in plan.steps  # never deletes another incarnation's
    # an old child still running counts for Forbid: the new object does not overlap it
    running = child(C + 60, "Running", owned=False)
    forbid = decide(spec(concurrency=ConcurrencyPolicy.FORBID), Facts(created=C + 100),
                    [running], C + 130)
    assert forbid.creates == () and forbid.skipped == ((C + 120, SkipReason.FORBID),)
