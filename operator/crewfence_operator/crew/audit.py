"""The shared-state audit: a state claim mounted by any pod other than its replica's own pod.

The Crew daemon (handlers/crew.py) runs it every ``--audit-interval`` seconds over the pods of
the Crew's namespace; a finding fences that replica (``fenced: true`` in status, so no CrewJob
is dispatched there), sets the ``StateVolumeShared`` condition, counts in the
``crewfence_operator_fenced_replicas`` gauge and posts a Warning Event naming claim and pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from crewfence_operator.crew.fencing import ForeignMount, foreign_mounts

EVENT_REASON_SHARED = "StateVolumeShared"
EVENT_REASON_UNSHARED = "StateVolumeUnshared"


def find_foreign_mounts(
    crew: str, claims_by_ordinal: Mapping[int, str], pods: Iterable[Mapping[str, Any]]
) -> list[ForeignMount]:
    return foreign_mounts(crew, claims_by_ordinal, pods)


def _previous_reasons(previous_status: Mapping[str, Any]) -> set[str]:
    return {
        str(r.get("fenceReason"))
        for r in previous_status.get("replicas") or ()
        if r.get("fenced") and r.get("fenceReason")
    }


def announce(
    body: kopf.Body, mounts: list[ForeignMount], announced: set[str],
    previous_status: Mapping[str, Any],
) -> None:
    """Post one Warning Event per newly found mount and one Normal Event when one is gone.

    Fences already shown in the previous status count as announced (no repeat after restarts).
    """
    if not announced:
        announced.update(_previous_reasons(previous_status))
    current = {m.reason for m in mounts}
    for mount in mounts:
        if mount.reason not in announced:
            kopf.warn(body, reason=EVENT_REASON_SHARED, message=mount.reason)
            announced.add(mount.reason)
    for gone in sorted(announced - current):
        kopf.event(body, type="Normal", reason=EVENT_REASON_UNSHARED,
                  message=f"fence lifted; this no longer holds: {gone}")
        announced.discard(gone)
