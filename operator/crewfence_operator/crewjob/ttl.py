"""When a finished CrewJob is deleted (``spec.ttlSecondsAfterFinished``): a pure function.

Invariants kept by :func:`deletion_due`:

T1  Only a terminal CrewJob with a ``status.finishedAt`` is ever due; its own TTL wins over the
    Crew's ``spec.crewJobDefaults.ttlSecondsAfterFinished``; without either it is kept.
T2  Never a CrewJob whose outcome is uncertain and unresolved (``status.uncertainOutcome``
    without an accepted ``status.resolution``): it is the evidence a person needs.
T3  Never one whose status is behind its spec (``observedGeneration`` < ``generation``): the
    operator has not yet said what the latest spec (e.g. ``cancel``) did.

Deleting is safe for the Action: the action id is ``<namespace>/<name>`` (or
``spec.actionId``), so a re-created CrewJob finds the journal's record or tombstone and is an
exact repeat, never a second run (crewjob/machine.py I6).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from crewfence_operator.crewjob.outcome import TERMINAL_PHASES


def _parse(raw: object) -> float | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:  # the sidecar's record times carry milliseconds; the operator's do not
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def ttl_seconds(spec: Mapping[str, Any], crew_spec: Mapping[str, Any] | None) -> int | None:
    """T1: the CrewJob's own TTL, else the Crew's default, else None."""
    own = spec.get("ttlSecondsAfterFinished")
    if isinstance(own, int) and own >= 0:
        return own
    default = ((crew_spec or {}).get("crewJobDefaults") or {}).get("ttlSecondsAfterFinished")
    return default if isinstance(default, int) and default >= 0 else None


def deletion_due(obj: Mapping[str, Any], crew_spec: Mapping[str, Any] | None,
                 now: float) -> float | None:
    """Seconds until the CrewJob is to be deleted (<= 0: now); None: never (T1-T3)."""
    status = obj.get("status") or {}
    meta = obj.get("metadata") or {}
    if status.get("phase") not in {p.value for p in TERMINAL_PHASES}:
        return None
    if meta.get("deletionTimestamp"):
        return None
    resolution = status.get("resolution")
    resolved = isinstance(resolution, Mapping) and bool(resolution.get("outcome"))
    if status.get("uncertainOutcome") and not resolved:
        return None
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        return None
    ttl = ttl_seconds(obj.get("spec") or {}, crew_spec)
    finished = _parse(status.get("finishedAt"))
    if ttl is None or finished is None:
        return None
    return finished + ttl - now
