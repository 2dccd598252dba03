"""What to do with a replica above ``spec.replicas``: pure decisions, no API calls.

A state claim is deleted only after its own sidecar said its journal retains no record
(``/health`` ``retained_runs == 0``); that answer is written onto the claim as an annotation
before the pod goes, so the decision survives an operator restart. Any doubt keeps the claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crewfence_operator import constants as c
from crewfence_operator.crew.status import Health, RetainedClaim

RELEASED_ANNOTATION = f"{c.GROUP}/journal-empty"
"""On a state claim: its sidecar reported zero retained records (value: the journal id)."""
RETAINED_ANNOTATION = f"{c.GROUP}/retained-runs"
"""On a kept state claim: records its sidecar reported when its pod was removed ("" unknown)."""


@dataclass(frozen=True)
class ExcessReplica:
    ordinal: int
    claim: str
    claim_obj: Mapping[str, Any] | None
    pod: Mapping[str, Any] | None
    health: Health | None
    drain_announced: bool
    """Status already showed this replica as not ready long enough for dispatchers to notice."""


@dataclass(frozen=True)
class Decision:
    ordinal: int
    claim: str
    annotate: Mapping[str, str] | None = None
    """Annotations to put on the claim before deleting the pod."""
    delete_pod: bool = False
    delete_claim: bool = False
    draining: str | None = None
    """The pod stays for now; this says why (shown in status)."""
    retained: RetainedClaim | None = None


def claim_released(claim_obj: Mapping[str, Any] | None) -> bool:
    annotations = ((claim_obj or {}).get("metadata") or {}).get("annotations") or {}
    return RELEASED_ANNOTATION in annotations


def _terminating(obj: Mapping[str, Any] | None) -> bool:
    return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))


def _retained(ex: ExcessReplica, runs: int | None, why: str) -> RetainedClaim:
    return RetainedClaim(
        ordinal=ex.ordinal, claim=ex.claim, retained_runs=runs,
        reason=(
            f"{why}; scale up to archive them (`crewfence journal archive`) or delete the claim "
            f"yourself to discard them"
        ),
    )


def decide(ex: ExcessReplica) -> Decision:
    pod, health = ex.pod, ex.health
    if pod is not None and not _terminating(pod):
        if not ex.drain_announced:
            return Decision(ex.ordinal, ex.claim, draining="scaling down: no new jobs")
        if health is not None and (health.active_runs or 0) > 0:
            waiting = f"scaling down: waiting for {health.active_runs} active run(s)"
            return Decision(ex.ordinal, ex.claim, draining=waiting)
        if health is not None and health.retained_runs == 0 and health.journal_id:
            return Decision(ex.ordinal, ex.claim, delete_pod=True,
                            annotate={RELEASED_ANNOTATION: health.journal_id})
        if health is not None and health.retained_runs:
            return Decision(
                ex.ordinal, ex.claim, delete_pod=True,
                annotate={RETAINED_ANNOTATION: str(health.retained_runs)},
                retained=_retained(ex, health.retained_runs,
                                   f"journal holds {health.retained_runs} unarchived record(s)"))
        return Decision(
            ex.ordinal, ex.claim, delete_pod=True, annotate={RETAINED_ANNOTATION: ""},
            retained=_retained(ex, None, "the replica could not report its journal, so it may "
                                         "hold unarchived records"))
    if pod is not None:  # terminating: wait until it is gone before touching the claim
        if claim_released(ex.claim_obj):
            return Decision(ex.ordinal, ex.claim, draining="scaling down: pod terminating")
        return Decision(ex.ordinal, ex.claim,
                        retained=_retained(ex, None, "pod terminating before its journal was "
                                                     "confirmed empty"))
    if ex.claim_obj is None:
        return Decision(ex.ordinal, ex.claim)
    if claim_released(ex.claim_obj):
        return Decision(ex.ordinal, ex.claim, delete_claim=not _terminating(ex.claim_obj))
    annotations = (ex.claim_obj.get("metadata") or {}).get("annotations") or {}
    known = annotations.get(RETAINED_ANNOTATION)
    if known and known.isdigit():
        return Decision(ex.ordinal, ex.claim,
                        retained=_retained(ex, int(known),
                                           f"journal holds {known} unarchived record(s)"))
    return Decision(
        ex.ordinal, ex.claim,
        retained=_retained(ex, None, "its journal was never confirmed empty, so it may hold "
                                     "unarchived records"))
