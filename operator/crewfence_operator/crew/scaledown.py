"""What to do with each replica ordinal as ``spec.replicas`` moves: pure decisions, no API calls.

Invariants kept here (each has a unit test in tests/unit/operator_crew/test_scaledown.py):

- **A journal that may hold an unarchived record stays reachable.** A replica above
  ``spec.replicas`` keeps its pod, switched to draining, while its journal holds unarchived
  records, while it runs jobs, and whenever its sidecar cannot say (no answer, or a sidecar
  without a draining mode). A kept claim without a pod gets a (draining) pod again.
- **A replica is retired only on its own word.** Its pod is deleted only when one ``/health``
  answer of that sidecar says: draining, no active run, zero unarchived records, with a journal
  id. Draining refuses admissions, so that zero cannot grow afterwards. The answer is written
  onto the claim (``RELEASED_ANNOTATION``) before the pod goes, so it survives an operator
  restart; only a claim carrying it may be deleted, and only with ``storage.whenScaled: Delete``.
- **A tombstone outlives its replica.** Archived records leave tombstones, and a tombstone is
  what makes a later identical request answer 410 instead of running again. A drained
  replica whose journal holds tombstones is removed only after every one of them was handed
  over to a serving replica (``GET``/``POST /admin/tombstones``), which the claim records
  (``HANDED_OVER_ANNOTATION``: journal id and count) before the pod goes. With no serving
  replica to take them (scaled to zero, or none answering), the replica stays, draining.
  A sidecar that cannot report its tombstones stays too.
- **Every journal that may hold an action is listed** (``Active``, ``Draining`` or
  ``Retained``; see :class:`ReplicaState`), so the CrewJob probe asks it before any admission.
- **Scaling back up undrains**: a replica at an ordinal below ``spec.replicas`` whose sidecar
  says it is draining is switched back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crewfence_operator import constants as c
from crewfence_operator.crew.status import Health, ReplicaState, RetainedClaim

RELEASED_ANNOTATION = f"{c.GROUP}/journal-empty"
"""On a state claim: its draining sidecar reported zero unarchived records (value: journal id)."""
HANDED_OVER_ANNOTATION = f"{c.GROUP}/tombstones-handed-over"
"""On a state claim: ``<journal id>:<count>`` of the tombstones handed over to serving replicas."""
RETAINED_ANNOTATION = f"{c.GROUP}/retained-runs"
"""Written by operators before draining existed: records its sidecar reported at pod removal."""

RETENTION_MIN_INTERVAL = 5.0
RETENTION_MAX_INTERVAL = 300.0


@dataclass(frozen=True)
class ExcessReplica:
    """What was observed for one ordinal at or above ``spec.replicas``."""

    ordinal: int
    claim: str
    claim_obj: Mapping[str, Any] | None
    pod: Mapping[str, Any] | None
    health: Health | None
    delete_claim_when_empty: bool = False
    """``storage.whenScaled: Delete``."""
    survivors: tuple[int, ...] = ()
    """Serving replicas (below ``spec.replicas``, answering, not draining, not fenced) that can
    take this replica's tombstones over."""


@dataclass(frozen=True)
class Decision:
    ordinal: int
    claim: str
    state: ReplicaState | None = None
    """How the replica is listed in status; None: not listed (nothing unarchived is left)."""
    message: str | None = None
    drain: bool = False
    """Ask the sidecar to switch to draining."""
    create_pod: bool = False
    """A (draining) pod for a claim kept without one."""
    annotate: Mapping[str, str | None] | None = None
    """Claim annotations to set (None removes one), before deleting the pod."""
    hand_over_to: tuple[int, ...] = ()
    """Hand the journal's tombstones over to these serving replicas, then mark the claim."""
    delete_pod: bool = False
    delete_claim: bool = False
    retained: RetainedClaim | None = None
    """The claim as listed in ``status.retainedClaims`` (kept for compatibility)."""


def handed_over_mark(journal_id: str, tombstones: int) -> str:
    """The value of ``HANDED_OVER_ANNOTATION`` once ``tombstones`` of ``journal_id`` moved."""
    return f"{journal_id}:{tombstones}"


def claim_released(claim_obj: Mapping[str, Any] | None) -> bool:
    return RELEASED_ANNOTATION in _annotations(claim_obj)


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def _terminating(obj: Mapping[str, Any] | None) -> bool:
    return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))


def _kept(ex: ExcessReplica, records: int | None, why: str) -> RetainedClaim:
    return RetainedClaim(
        ordinal=ex.ordinal, claim=ex.claim, retained_runs=records,
        reason=(f"{why}; its pod stays (draining: lookups only) until the journal holds no "
                f"unarchived record: archive them (`crewfence journal archive`, or set "
                f"spec.journal.retention) or scale back up"))


def _unreleased(ex: ExcessReplica) -> Mapping[str, str | None] | None:
    """Drop a release mark that the sidecar's live answer contradicts."""
    return {RELEASED_ANNOTATION: None} if claim_released(ex.claim_obj) else None


def _live_pod(ex: ExcessReplica) -> Decision:
    health = ex.health
    draining = ReplicaState.DRAINING
    if health is None:
        return Decision(
            ex.ordinal, ex.claim, draining,
            "scaling down: the replica does not answer /health; kept until it reports an "
            "empty journal",
            retained=_kept(ex, None, "the replica cannot report its journal"))
    if health.draining is None:
        return Decision(
            ex.ordinal, ex.claim, draining,
            "scaling down: this sidecar has no draining mode; kept (upgrade its image)",
            retained=_kept(ex, health.retained_runs, "the sidecar cannot drain"))
    if not health.draining:
        return Decision(ex.ordinal, ex.claim, draining,
                        "scaling down: switching the sidecar to draining", drain=True,
                        annotate=_unreleased(ex))
    if (health.active_runs or 0) > 0:
        return Decision(ex.ordinal, ex.claim, draining,
                        f"draining: waiting for {health.active_runs} running job(s) to end",
                        annotate=_unreleased(ex),
                        retained=_kept(ex, health.unarchived_records, "jobs still run there"))
    records = health.unarchived_records
    if records is None or records > 0 or not health.journal_id:
        shown = "an unknown number of" if records is None else str(records)
        return Decision(
            ex.ordinal, ex.claim, draining,
            f"draining: journal holds {shown} unarchived record(s)", annotate=_unreleased(ex),
            retained=_kept(ex, records, f"journal holds {shown} unarchived record(s)"))
    stones = health.tombstones
    if stones is None:
        return Decision(
            ex.ordinal, ex.claim, draining,
            "draining: this sidecar cannot report its tombstones; kept (upgrade its image)",
            retained=RetainedClaim(ordinal=ex.ordinal, claim=ex.claim, retained_runs=0,
                                   reason="its tombstones cannot be handed over"))
    moved = _annotations(ex.claim_obj).get(HANDED_OVER_ANNOTATION)
    if stones and moved != handed_over_mark(health.journal_id, stones):
        if not ex.survivors:
            return Decision(
                ex.ordinal, ex.claim, draining,
                f"draining: journal holds {stones} tombstone(s) and no serving replica can "
                "take them over; kept so that archived actions never run again",
                retained=RetainedClaim(
                    ordinal=ex.ordinal, claim=ex.claim, retained_runs=0,
                    reason=f"its {stones} tombstone(s) wait for a serving replica"))
        return Decision(
            ex.ordinal, ex.claim, draining,
            f"draining: handing {stones} tombstone(s) over to replica(s) "
            f"{', '.join(map(str, ex.survivors))}", hand_over_to=ex.survivors)
    return Decision(ex.ordinal, ex.claim, draining,
                    "draining: journal holds no unarchived record and its tombstones live on; "
                    "removing the pod",
                    annotate={RELEASED_ANNOTATION: health.journal_id}, delete_pod=True)


def decide(ex: ExcessReplica) -> Decision:
    """The next step for one replica above ``spec.replicas``."""
    pod = ex.pod
    if pod is not None and not _terminating(pod):
        return _live_pod(ex)
    if pod is not None:  # terminating: wait until it is gone before touching the claim
        if claim_released(ex.claim_obj):
            return Decision(ex.ordinal, ex.claim)
        return Decision(
            ex.ordinal, ex.claim, ReplicaState.RETAINED,
            "pod terminating before its journal was confirmed empty; a draining pod follows",
            retained=_kept(ex, None, "its pod went before the journal was confirmed empty"))
    if ex.claim_obj is None or _terminating(ex.claim_obj):
        return Decision(ex.ordinal, ex.claim)
    if claim_released(ex.claim_obj):
        return Decision(ex.ordinal, ex.claim, delete_claim=ex.delete_claim_when_empty)
    known = str(_annotations(ex.claim_obj).get(RETAINED_ANNOTATION) or "")
    records = int(known) if known.isdigit() else None
    return Decision(
        ex.ordinal, ex.claim, ReplicaState.RETAINED,
        "claim kept without a pod; starting a draining pod so its journal answers lookups",
        create_pod=True,
        retained=_kept(ex, records, "its journal was never confirmed empty"))


def needs_undrain(health: Health | None) -> bool:
    """A replica at an ordinal below ``spec.replicas`` must serve: switch draining off."""
    return health is not None and health.draining is True


def retention_interval(retention_seconds: int) -> float:
    """How often the retention is applied: a quarter of the window, within [5 s, 5 min]."""
    return min(RETENTION_MAX_INTERVAL, max(RETENTION_MIN_INTERVAL, retention_seconds / 4))


def retention_due(retention_seconds: int | None, last_applied: float | None, now: float) -> bool:
    """Whether ``journal.retention`` should be applied (bulk archive) on this pass."""
    if retention_seconds is None:
        return False
    if last_applied is None:
        return True
    return now - last_applied >= retention_interval(retention_seconds)
