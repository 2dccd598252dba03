"""Schedules: cron (cronsim, zoneinfo) and epoch-aligned intervals; what CEL cannot decide."""

from __future__ import annotations

import pytest
from crewfence_operator.cronjob.schedule import (
    IntervalSchedule,
    ScheduleError,
    from_rfc3339,
    parse_cron,
    parse_duration,
    parse_schedule,
    to_rfc3339,
)
from crewfence_operator.cronjob.spec import CronSpec

T = from_rfc3339("2026-12-01T10:07:30Z")


def test_interval_ticks_are_epoch_multiples_strictly_after() -> None:
    sched = parse_schedule(None, None, "90s")
    assert isinstance(sched, IntervalSchedule) and sched.seconds == 90
    ticks, more = sched.between(T, T + 400, 10)
    assert all(t % 90 == 0 and t > T for t in ticks) and len(ticks) == 4 and not more
    assert sched.next_after(ticks[0]) == ticks[1]
    assert sched.latest_at_or_before(ticks[1]) == ticks[1]
    assert sched.count_between(T, T + 90 * 10_000, 100) == (100, True)


@pytest.mark.parametrize(("text", "seconds"), [("10s", 10), ("1m30s", 90), ("2h", 7200),
                                                ("1h0m5s", 3605)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "1.5m", "5d", "-10s", "s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_interval_below_minimum_is_refused() -> None:
    with pytest.raises(ScheduleError, match="between 10s"):
        parse_schedule(None, None, "9s")


@pytest.mark.parametrize(("schedule", "interval"), [(None, None), ("* * * * *", "60s")])
def test_exactly_one_of_schedule_and_interval(schedule: str | None,
                                              interval: str | None) -> None:
    with pytest.raises(ScheduleError, match="exactly one"):
        parse_schedule(schedule, None, interval)


def test_cron_in_a_time_zone_and_macros() -> None:
    sched = parse_cron("0 9 * * MON", "Europe/Berlin")
    tick = sched.next_after(T)
    assert tick is not None and to_rfc3339(tick) == "2026-12-07T08:00:00Z"  # 09:00 CET
    assert parse_cron("@hourly", None).next_after(T) == from_rfc3339("2026-12-01T11:00:00Z")
    assert sched.latest_at_or_before(tick) == tick
    assert sched.latest_at_or_before(tick - 1) == tick - 7 * 86400


@pytest.mark.parametrize(("expr", "zone", "code"), [
    ("61 * * * *", None, "InvalidSchedule"),
    ("* * * * * *", None, "InvalidSchedule"),
    ("* * 31 2 *", None, "InvalidSchedule"),
    ("* * * * *", "Mars/Olympus", "UnknownTimeZone"),
])
def test_what_cel_cannot_decide(expr: str, zone: str | None, code: str) -> None:
    with pytest.raises(ScheduleError) as err:
        parse_cron(expr, zone)
    assert err.value.code == code and err.value.message


def test_dst_never_repeats_a_tick() -> None:
    # 2027-10-31: Berlin repeats 02:00-03:00; a daily 02:30 job runs once (Debian cron).
    sched = parse_cron("30 2 * * *", "Europe/Berlin")
    ticks, _ = sched.between(from_rfc3339("2027-10-30T00:00:00Z"),
                             from_rfc3339("2027-11-01T00:00:00Z"), 10)
    assert len(ticks) == len(set(ticks)) == 2
    every, _ = parse_cron("*/30 * * * *", "Europe/Berlin").between(
        from_rfc3339("2027-10-30T23:00:00Z"), from_rfc3339("2027-10-31T03:00:00Z"), 100)
    assert every == sorted(set(every))


def test_spec_window_is_the_narrower_of_catchup_and_deadline() -> None:
    spec = CronSpec.from_resource({"interval": "60s", "catchupWindow": "30m",
                                   "startingDeadlineSeconds": 120, "jobTemplate": {}})
    assert spec.window_seconds == 120
    assert CronSpec.from_resource({"interval": "60s"}).window_seconds == 3600
