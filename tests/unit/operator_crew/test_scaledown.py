"""Scale-down keeps every journal that may hold an unarchived record reachable, and retires a
replica only on its own sidecar's word (draining, idle, zero unarchived records)."""

from __future__ import annotations

from typing import Any

import pytest
from crewfence_operator.crew.scaledown import (
    HANDED_OVER_ANNOTATION,
    RELEASED_ANNOTATION,
    RETAINED_ANNOTATION,
    ExcessReplica,
    decide,
    handed_over_mark,
    needs_undrain,
    retention_due,
    retention_interval,
)
from crewfence_operator.crew.spec import SpecError, parse_duration, parse_spec
from crewfence_operator.crew.status import Health, ReplicaState

POD: dict[str, Any] = {"metadata": {"name": "r-2", "uid": "u"}}
CLAIM: dict[str, Any] = {"metadata": {"name": "r-state-2"}}
RELEASED: dict[str, Any] = {"metadata": {"name": "r-state-2",
                                         "annotations": {RELEASED_ANNOTATION: "j"}}}
TERMINATING_POD: dict[str, Any] = {"metadata": {**POD["metadata"], "deletionTimestamp": "now"}}


def _ex(pod: Any = POD, claim: Any = CLAIM, health: Health | None = None,
        delete: bool = False, survivors: tuple[int, ...] = (0, 1)) -> ExcessReplica:
    return ExcessReplica(ordinal=2, claim="r-state-2", claim_obj=claim, pod=pod, health=health,
                         delete_claim_when_empty=delete, survivors=survivors)


def _health(unarchived: int | None, *, draining: bool | None = True, active: int = 0,
            journal: str | None = "j", tombstones: int | None = 0) -> Health:
    return Health(status="ready", journal_id=journal, retained_runs=unarchived,
                  active_runs=active, draining=draining, unarchived_records=unarchived,
                  tombstones=tombstones)


def _removes(d: Any) -> bool:
    return bool(d.delete_pod or d.delete_claim)


def test_a_serving_sidecar_above_replicas_is_switched_to_draining_first() -> None:
    d = decide(_ex(health=_health(0, draining=False)))
    assert d.drain and d.state is ReplicaState.DRAINING
    assert not _removes(d), "never removed before the sidecar itself says it drains"


def test_running_jobs_finish_where_they_are() -> None:
    d = decide(_ex(health=_health(1, active=1)))
    assert d.state is ReplicaState.DRAINING and not _removes(d) and not d.drain
    assert d.message and "1 running" in d.message


@pytest.mark.parametrize("unarchived", [1, 7])
def test_unarchived_records_keep_the_pod(unarchived: int) -> None:
    d = decide(_ex(health=_health(unarchived)))
    assert d.state is ReplicaState.DRAINING and not _removes(d)
    assert d.retained is not None and d.retained.retained_runs == unarchived
    assert f"{unarchived} unarchived" in d.retained.reason


@pytest.mark.parametrize("health", [
    None,                                   # no answer
    _health(None),                          # count unknown
    _health(0, draining=None),              # a sidecar without draining mode
    _health(0, journal=None),               # no journal id to record
    _health(0, tombstones=None),            # a sidecar that cannot report its tombstones
])
def test_any_doubt_keeps_the_pod(health: Health | None) -> None:
    d = decide(_ex(health=health))
    assert d.state is ReplicaState.DRAINING and not _removes(d)
    assert not (d.annotate or {}).get(RELEASED_ANNOTATION)


def test_drained_empty_journal_is_released_then_the_pod_goes() -> None:
    d = decide(_ex(health=_health(0)))
    assert d.delete_pod and not d.delete_claim
    assert d.annotate == {RELEASED_ANNOTATION: "j"}, "the release is written before the pod goes"
    assert decide(_ex(pod=TERMINATING_POD, claim=RELEASED)).state is None


def test_tombstones_are_handed_over_before_the_pod_goes() -> None:
    """Invariant "a tombstone outlives its replica": with tombstones and no hand-over mark for
    exactly this journal and count, the pod stays and the tombstones move first."""
    d = decide(_ex(health=_health(0, tombstones=3)))
    assert d.hand_over_to == (0, 1) and not _removes(d)
    assert d.state is ReplicaState.DRAINING and d.message and "3 tombstone" in d.message


@pytest.mark.parametrize("mark", [handed_over_mark("other", 3), handed_over_mark("j", 2)])
def test_a_mark_for_another_journal_or_count_is_no_hand_over(mark: str) -> None:
    claim = {"metadata": {"name": "r-state-2", "annotations": {HANDED_OVER_ANNOTATION: mark}}}
    d = decide(_ex(claim=claim, health=_health(0, tombstones=3)))
    assert d.hand_over_to and not _removes(d)


def test_handed_over_tombstones_let_the_pod_go() -> None:
    claim = {"metadata": {"name": "r-state-2",
                          "annotations": {HANDED_OVER_ANNOTATION: handed_over_mark("j", 3)}}}
    d = decide(_ex(claim=claim, health=_health(0, tombstones=3)))
    assert d.delete_pod and d.annotate == {RELEASED_ANNOTATION: "j"} and not d.hand_over_to


def test_tombstones_without_a_serving_replica_keep_the_pod() -> None:
    d = decide(_ex(health=_health(0, tombstones=1), survivors=()))
    assert not _removes(d) and not d.hand_over_to and d.state is ReplicaState.DRAINING
    assert d.retained is not None and "tombstone" in d.retained.reason


@pytest.mark.parametrize(("delete", "deleted"), [(False, False), (True, True)])
def test_released_claim_follows_when_scaled(delete: bool, deleted: bool) -> None:
    d = decide(_ex(pod=None, claim=RELEASED, delete=delete))
    assert d.delete_claim is deleted and d.state is None and not d.create_pod
    assert not decide(_ex(pod=TERMINATING_POD, claim=RELEASED, delete=True)).delete_claim


def test_claim_with_records_is_never_deleted_even_with_delete_setting() -> None:
    for claim in (CLAIM, {"metadata": {"name": "r-state-2",
                                        "annotations": {RETAINED_ANNOTATION: "3"}}}):
        d = decide(_ex(pod=None, claim=claim, delete=True))
        assert not d.delete_claim


def test_retained_claim_without_pod_gets_a_draining_pod_and_is_listed() -> None:
    legacy = {"metadata": {"name": "r-state-2", "annotations": {RETAINED_ANNOTATION: "3"}}}
    d = decide(_ex(pod=None, claim=legacy))
    assert d.create_pod and d.state is ReplicaState.RETAINED
    assert d.retained is not None and d.retained.retained_runs == 3
    unknown = decide(_ex(pod=None, claim=CLAIM))
    assert unknown.create_pod and unknown.retained and unknown.retained.retained_runs is None


def test_pod_lost_before_confirmation_stays_listed() -> None:
    d = decide(_ex(pod=TERMINATING_POD, claim=CLAIM))
    assert d.state is ReplicaState.RETAINED and not _removes(d) and not d.create_pod


def test_a_stale_release_mark_is_dropped_when_the_sidecar_contradicts_it() -> None:
    d = decide(_ex(claim=RELEASED, health=_health(2)))
    assert d.annotate == {RELEASED_ANNOTATION: None} and not _removes(d)


def test_nothing_left() -> None:
    d = decide(_ex(pod=None, claim=None))
    assert d.state is None and not (_removes(d) or d.create_pod or d.drain or d.retained)


def test_scaling_back_up_undrains() -> None:
    assert needs_undrain(_health(3, draining=True))
    assert not needs_undrain(_health(3, draining=False))
    assert not needs_undrain(_health(3, draining=None)) and not needs_undrain(None)


def test_retention_schedule() -> None:
    assert not retention_due(None, None, 100.0)
    assert retention_due(3600, None, 100.0), "applied on the first pass"
    assert not retention_due(3600, 100.0, 100.0 + retention_interval(3600) - 1)
    assert retention_due(3600, 100.0, 100.0 + retention_interval(3600))
    assert retention_interval(2) == 5.0 and retention_interval(30 * 86400) == 300.0
    assert retention_interval(400) == 100.0


def test_spec_fields() -> None:
    spec = parse_spec({"journal": {"retention": "1h30m"}, "storage": {"whenScaled": "Delete"}})
    assert spec.journal.retention_seconds == 5400 and spec.storage.when_scaled == "Delete"
    default = parse_spec({})
    assert default.journal.retention_seconds is None and default.storage.when_scaled == "Retain"
    assert parse_duration("7d") == 7 * 86400 and parse_duration("45s") == 45
    for bad in ("1y", "h", "", "10"):
        with pytest.raises(SpecError):
            parse_duration(bad)
    with pytest.raises(SpecError):
        parse_spec({"journal": {"retention": "0s"}})
    with pytest.raises(SpecError):
        parse_spec({"storage": {"whenScaled": "Sometimes"}})
