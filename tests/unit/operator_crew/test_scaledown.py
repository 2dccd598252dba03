"""Scale-down never deletes a claim unless its own sidecar said the journal is empty."""

from __future__ import annotations

from typing import Any

from crewfence_operator.crew.scaledown import (
    RELEASED_ANNOTATION,
    RETAINED_ANNOTATION,
    ExcessReplica,
    decide,
)
from crewfence_operator.crew.status import Health

POD: dict[str, Any] = {"metadata": {"name": "r-2", "uid": "u"}}
CLAIM: dict[str, Any] = {"metadata": {"name": "r-state-2"}}


def _ex(pod: Any = POD, claim: Any = CLAIM, health: Health | None = None,
        announced: bool = True) -> ExcessReplica:
    return ExcessReplica(ordinal=2, claim="r-state-2", claim_obj=claim, pod=pod, health=health,
                         drain_announced=announced)


def _health(retained: int | None, active: int = 0) -> Health:
    return Health(status="ready", journal_id="j", retained_runs=retained, active_runs=active)


def test_first_pass_only_announces() -> None:
    d = decide(_ex(health=_health(0), announced=False))
    assert d.draining and not d.delete_pod and not d.delete_claim and not d.annotate


def test_waits_for_active_runs() -> None:
    d = decide(_ex(health=_health(1, active=1)))
    assert not d.delete_pod and d.draining and "1 active" in d.draining


def test_empty_journal_released_then_deleted() -> None:
    d = decide(_ex(health=_health(0)))
    assert d.delete_pod and not d.delete_claim and d.annotate == {RELEASED_ANNOTATION: "j"}
    released = {"metadata": {"name": "r-state-2", "annotations": {RELEASED_ANNOTATION: "j"}}}
    assert decide(_ex(pod=None, claim=released)).delete_claim
    terminating = {**POD, "metadata": {**POD["metadata"], "deletionTimestamp": "now"}}
    assert not decide(_ex(pod=terminating, claim=released)).delete_claim


def test_records_keep_the_claim() -> None:
    d = decide(_ex(health=_health(5)))
    assert d.delete_pod and not d.delete_claim
    assert d.retained is not None and d.retained.retained_runs == 5
    assert "5 unarchived" in d.retained.reason
    kept = {"metadata": {"name": "r-state-2", "annotations": {RETAINED_ANNOTATION: "5"}}}
    later = decide(_ex(pod=None, claim=kept))
    assert not later.delete_claim and later.retained and later.retained.retained_runs == 5


def test_no_answer_keeps_the_claim() -> None:
    d = decide(_ex(health=None))
    assert d.delete_pod and not d.delete_claim and d.retained is not None
    assert d.retained.retained_runs is None
    later = decide(_ex(pod=None, claim=CLAIM))
    assert not later.delete_claim and later.retained is not None


def test_nothing_left() -> None:
    d = decide(_ex(pod=None, claim=None))
    assert not (d.delete_pod or d.delete_claim or d.retained or d.draining)
