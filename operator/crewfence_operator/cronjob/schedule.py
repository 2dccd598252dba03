"""When a CrewCronJob ticks: a 5-field cron expression in a time zone, or a fixed interval.

Tick times are a pure function of the spec: a cron schedule's ticks are cronsim's (Debian
cron semantics, DST included) in ``timeZone``; an interval's ticks are the multiples of the
interval since the Unix epoch. So every operator replica, and an operator after a restart or
after the CrewCronJob was re-applied from Git, computes the same tick times, and a tick time
names exactly one child (``children.py``).

Ticks are whole seconds, UTC, as ``int`` Unix seconds everywhere outside this module.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

MIN_INTERVAL_SECONDS: Final = 10
MAX_INTERVAL_SECONDS: Final = 366 * 24 * 3600

MACROS: Final = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class ScheduleError(ValueError):
    """The schedule cannot be evaluated; ``code`` is the condition reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def parse_duration(text: str) -> int:
    """``90s``, ``1m30s``, ``2h`` (Go-style h/m/s, whole seconds) -> seconds."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"{text!r} is not a duration like 90s, 5m or 1h30m")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def to_rfc3339(tick: int) -> str:
    """``2026-12-01T20:10:00Z`` (RFC 3339, UTC, whole seconds)."""
    return datetime.fromtimestamp(tick, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_rfc3339(text: str) -> int:
    """Unix seconds of an RFC 3339 time (``Z`` or an offset)."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp())


class Schedule:
    """Tick times strictly after a moment, in order."""

    def after(self, moment: int) -> Iterator[int]:  # pragma: no cover - interface
        raise NotImplementedError

    def latest_at_or_before(self, moment: int) -> int | None:  # pragma: no cover
        raise NotImplementedError

    def next_after(self, moment: int) -> int | None:
        return next(iter(self.after(moment)), None)

    def between(self, start: int, end: int, limit: int) -> tuple[list[int], bool]:
        """Ticks in ``(start, end]``, at most ``limit`` of them; True when more were left."""
        out: list[int] = []
        for tick in self.after(start):
            if tick > end:
                return out, False
            if len(out) == limit:
                return out, True
            out.append(tick)
        return out, False

    def count_between(self, start: int, end: int, limit: int) -> tuple[int, bool]:
        ticks, more = self.between(start, end, limit)
        return len(ticks), more


@dataclass(frozen=True)
class IntervalSchedule(Schedule):
    seconds: int

    def after(self, moment: int) -> Iterator[int]:
        tick = (moment // self.seconds + 1) * self.seconds
        while True:
            yield tick
            tick += self.seconds

    def latest_at_or_before(self, moment: int) -> int | None:
        return (moment // self.seconds) * self.seconds

    def count_between(self, start: int, end: int, limit: int) -> tuple[int, bool]:
        if end <= start:
            return 0, False
        count = end // self.seconds - start // self.seconds
        return min(count, limit), count > limit


@dataclass(frozen=True)
class CronSchedule(Schedule):
    expression: str
    zone: ZoneInfo

    def after(self, moment: int) -> Iterator[int]:
        start = datetime.fromtimestamp(moment, UTC).astimezone(self.zone)
        last = moment
        for value in CronSim(self.expression, start):
            tick = int(value.timestamp())
            if tick > last:  # DST fix-ups may repeat a wall time; never yield a tick twice
                last = tick
                yield tick

    def latest_at_or_before(self, moment: int) -> int | None:
        start = datetime.fromtimestamp(moment + 1, UTC).astimezone(self.zone)
        value = next(iter(CronSim(self.expression, start, reverse=True)), None)
        return int(value.timestamp()) if value is not None else None


def parse_cron(expression: str, time_zone: str | None) -> CronSchedule:
    """A 5-field cron expression (or a macro such as ``@hourly``) in ``time_zone`` (IANA;
    default UTC). Raises :class:`ScheduleError` with the reason the API server cannot decide
    (CEL checks the shape only)."""
    text = MACROS.get(expression.strip().lower(), expression.strip())
    if len(text.split()) != 5:
        raise ScheduleError("InvalidSchedule",
                            f"schedule {expression!r} must have 5 fields (minute hour "
                            "day-of-month month day-of-week) or be a macro such as @hourly")
    try:
        zone = ZoneInfo(time_zone or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError("UnknownTimeZone",
                            f"timeZone {time_zone!r} is not a known IANA time zone") from None
    try:
        probe = CronSim(text, datetime(2000, 1, 1, tzinfo=zone))
        next(probe)
    except CronSimError as exc:
        raise ScheduleError("InvalidSchedule",
                            f"schedule {expression!r} is not a valid cron expression: "
                            f"{exc}") from None
    except StopIteration:
        raise ScheduleError("InvalidSchedule",
                            f"schedule {expression!r} never matches a date") from None
    return CronSchedule(text, zone)


def parse_interval(text: str) -> IntervalSchedule:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ScheduleError("InvalidSchedule", str(exc)) from None
    if not MIN_INTERVAL_SECONDS <= seconds <= MAX_INTERVAL_SECONDS:
        raise ScheduleError("InvalidSchedule",
                            f"interval {text!r} must be between {MIN_INTERVAL_SECONDS}s and "
                            f"{MAX_INTERVAL_SECONDS // 3600}h")
    return IntervalSchedule(seconds)


def parse_schedule(schedule: str | None, time_zone: str | None,
                   interval: str | None) -> Schedule:
    """Exactly one of ``schedule`` (cron) and ``interval``."""
    if bool(schedule) == bool(interval):
        raise ScheduleError("InvalidSchedule", "set exactly one of spec.schedule and "
                                               "spec.interval")
    if interval:
        if time_zone:
            raise ScheduleError("InvalidSchedule", "spec.timeZone applies to spec.schedule only")
        return parse_interval(interval)
    assert schedule is not None
    return parse_cron(schedule, time_zone)
