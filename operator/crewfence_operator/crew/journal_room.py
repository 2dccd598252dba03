"""The Crew's ``JournalFull`` condition: which replicas refuse new jobs for lack of room.

A replica whose journal is at or over a bound (``/health``'s ``journal_over_bounds``: full,
or a bound lowered below what it already holds) keeps serving everything it holds and answers
only new admissions with 507; new CrewJobs then go to a replica with room or wait
``Pending/JournalFull``. This condition names the Crew field of each bound, so a person sees
within one status pass why, instead of a crash loop (issue 19: lowered journal bounds never
brick a journal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

BOUND_FIELDS: Final[Mapping[str, str]] = {
    "max_retained_runs": "spec.journal.maxRetainedRuns",
    "max_state_bytes": "spec.journal.maxStateBytes",
    "max_events_per_run": "spec.journal.maxEventsPerRun",
    "max_event_bytes": "spec.journal.maxEventBytes",
}
"""Sidecar bound (``JournalLimits`` field) -> the Crew field that sets it."""

ADMISSION_BOUNDS: Final = frozenset({"max_retained_runs", "max_state_bytes"})
"""The bounds that refuse new admissions; the other two only limit records kept from an
earlier, larger bound (terminal: nothing appends to them)."""


@dataclass(frozen=True)
class BoundReport:
    """One entry of ``journal_over_bounds``."""

    bound: str
    held: int
    limit: int


@dataclass(frozen=True)
class JournalRoomVerdict:
    status: bool
    """True: at least one replica refuses new admissions (or holds more than a bound)."""
    reason: str
    message: str


def journal_room(over: Mapping[int, Sequence[BoundReport]]) -> JournalRoomVerdict:
    """The condition from each listed replica's reported bounds (ordinal -> reports)."""
    parts: list[str] = []
    refusing = False
    for ordinal in sorted(over):
        for report in over[ordinal]:
            field = BOUND_FIELDS.get(report.bound, report.bound)
            admits = report.bound not in ADMISSION_BOUNDS
            refusing = refusing or not admits
            effect = ("keeps its records, refuses new jobs (507) until retention or archiving "
                      "brings it under" if not admits else
                      "keeps records of an earlier, larger bound")
            parts.append(f"replica {ordinal} holds {report.held}, {field} is {report.limit}: "
                         f"it {effect}")
    if not parts:
        return JournalRoomVerdict(False, "Room", "every journal has room for new jobs")
    return JournalRoomVerdict(True, "JournalFull" if refusing else "OverBound",
                              "; ".join(parts))


def reports_from_wire(raw: object) -> tuple[BoundReport, ...] | None:
    """``journal_over_bounds`` as sent; None when the sidecar did not say."""
    if not isinstance(raw, list):
        return None
    found: list[BoundReport] = []
    for item in raw:
        if not isinstance(item, Mapping):
            continue
        bound, held, limit = item.get("bound"), item.get("held"), item.get("limit")
        if isinstance(bound, str) and isinstance(held, int) and isinstance(limit, int):
            found.append(BoundReport(bound, held, limit))
    return tuple(found)
