"""A CrewCronJob's spec as the decisions need it (parsed once per round, never mutated)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from crewfence_operator.cronjob.schedule import (
    Schedule,
    ScheduleError,
    parse_duration,
    parse_schedule,
)

DEFAULT_CATCHUP_SECONDS: Final = 3600
DEFAULT_SUCCESSFUL_HISTORY: Final = 3
DEFAULT_FAILED_HISTORY: Final = 1


class ConcurrencyPolicy(StrEnum):
    ALLOW = "Allow"
    FORBID = "Forbid"
    REPLACE = "Replace"
    BUFFER_ONE = "BufferOne"


class OnUncertain(StrEnum):
    PAUSE = "Pause"
    CONTINUE = "Continue"


@dataclass(frozen=True)
class CronSpec:
    schedule: Schedule
    concurrency: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    catchup_seconds: int = DEFAULT_CATCHUP_SECONDS
    starting_deadline_seconds: int | None = None
    suspend: bool = False
    on_uncertain: OnUncertain = OnUncertain.PAUSE
    successful_history: int = DEFAULT_SUCCESSFUL_HISTORY
    failed_history: int = DEFAULT_FAILED_HISTORY
    job_template: Mapping[str, Any] = field(default_factory=dict)

    @property
    def window_seconds(self) -> int:
        """How old a tick may be and still run: the catch-up window, or the starting
        deadline when that is shorter."""
        if self.starting_deadline_seconds is None:
            return self.catchup_seconds
        return min(self.catchup_seconds, self.starting_deadline_seconds)

    @classmethod
    def from_resource(cls, spec: Mapping[str, Any]) -> CronSpec:
        """Raises :class:`ScheduleError` for what the CRD's CEL cannot decide."""
        schedule = parse_schedule(spec.get("schedule"), spec.get("timeZone"),
                                  spec.get("interval"))
        try:
            catchup = parse_duration(str(spec.get("catchupWindow") or "1h"))
        except ValueError as exc:
            raise ScheduleError("InvalidCatchupWindow", str(exc)) from None
        deadline = spec.get("startingDeadlineSeconds")
        return cls(
            schedule=schedule,
            concurrency=ConcurrencyPolicy(str(spec.get("concurrencyPolicy") or "Allow")),
            catchup_seconds=catchup,
            starting_deadline_seconds=int(deadline) if deadline is not None else None,
            suspend=bool(spec.get("suspend", False)),
            on_uncertain=OnUncertain(str(spec.get("onUncertain") or "Pause")),
            successful_history=int(spec.get("successfulJobsHistoryLimit",
                                            DEFAULT_SUCCESSFUL_HISTORY)),
            failed_history=int(spec.get("failedJobsHistoryLimit", DEFAULT_FAILED_HISTORY)),
            job_template=dict(spec.get("jobTemplate") or {}),
        )
