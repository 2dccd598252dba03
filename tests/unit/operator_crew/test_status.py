"""Status computation: conditions, readiness, transitions, no nulls (merge patch)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from crewfence_operator.crew.children import pod_index_entry
from crewfence_operator.crew.status import (
    CrewObservation,
    Health,
    ReplicaObservation,
    ReplicaState,
    RetainedClaim,
    crew_status,
    health_of_pod,
)

READY_POD: dict[str, Any] = {
    "metadata": {"name": "r-0"},
    "status": {"podIP": "127.0.2.1", "conditions": [{"type": "Ready", "status": "True"}]},
}
HEALTH = Health(status="ready", journal_id="jid", retained_runs=0, active_runs=0)


def _obs(replicas: list[ReplicaObservation], previous: list[Any] | None = None,
         desired: int = 1) -> CrewObservation:
    return CrewObservation(generation=7, desired_replicas=desired, replicas=replicas,
                           retained_claims=[], previous_conditions=previous or [])


def _cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_ready_replica() -> None:
    status = crew_status(_obs([ReplicaObservation(0, "r-0", "r-state-0", READY_POD, HEALTH)]),
                         now="T1")
    (entry,) = status["replicas"]
    assert entry == {"ordinal": 0, "pod": "r-0", "claim": "r-state-0", "state": "Active",
                     "address": "127.0.2.1:8090", "journalId": "jid", "ready": True,
                     "fenced": False, "retainedRuns": 0, "activeRuns": 0}
    assert status["readyReplicas"] == 1 and status["observedGeneration"] == 7
    assert _cond(status, "Ready")["status"] == "True"
    assert _cond(status, "StateVolumeShared")["status"] == "False"


def _mounting(claim: str) -> dict[str, Any]:
    return {**READY_POD, "spec": {"volumes": [
        {"name": "crews", "configMap": {"name": "r-crews"}},
        {"name": "state", "persistentVolumeClaim": {"claimName": claim}}]}}


def test_a_replica_lists_the_claim_its_pod_mounts_next_to_that_pods_journal_id() -> None:
    """storage.existingClaim changed, the pod is not rolled yet: its journal id is the old
    claim's, so the entry names the old claim (a job assigned to the new claim must not read
    "journal changed") and is not ready for new work until the pod is replaced."""
    status = crew_status(_obs([ReplicaObservation(0, "r-0", "team-state",
                                                  _mounting("r-state-0"), HEALTH)]))
    (entry,) = status["replicas"]
    assert (entry["claim"], entry["journalId"], entry["ready"]) == ("r-state-0", "jid", False)
    assert "replaced to mount team-state" in entry["message"]
    current = crew_status(_obs([ReplicaObservation(0, "r-0", "team-state",
                                                   _mounting("team-state"), HEALTH)]))
    assert (current["replicas"][0]["claim"], current["replicas"][0]["ready"]) == \
        ("team-state", True)


def test_a_replica_read_from_the_pod_index_lists_the_claim_its_pod_mounts() -> None:
    """The operator reads pods from its index, not whole: the slim pod must still say which
    claim is the state volume. Renamed volumes made every replica list the claim the spec asks
    for next to the journal id of a pod mounting another one (a job then ended JournalLost)."""
    pod = {**_mounting("r-state-0"), "metadata": {
        "name": "r-0", "namespace": "team-a", "labels": {"app.kubernetes.io/managed-by":
                                                         "crewfence"}}}
    indexed = pod_index_entry(pod)
    assert indexed is not None
    status = crew_status(_obs([ReplicaObservation(0, "r-0", "team-state", indexed["team-a"],
                                                  HEALTH)]))
    (entry,) = status["replicas"]
    assert (entry["claim"], entry["journalId"], entry["ready"]) == ("r-state-0", "jid", False)


def test_a_health_answered_by_another_pod_at_the_address_is_not_the_replicas() -> None:
    """An address can reach a replaced pod before the pod index shows it: that pod's journal
    id must not be listed beside the claim the indexed pod mounts."""
    pod = {**_mounting("r-state-0"), "metadata": {"name": "r-0", "uid": "uid-old"}}
    other = replace(HEALTH, journal_id="jid-new", pod_uid="uid-new")
    assert health_of_pod(pod, other) is None
    same = replace(HEALTH, pod_uid="uid-old")
    assert health_of_pod(pod, same) is same
    assert health_of_pod(pod, HEALTH) is HEALTH, "a sidecar naming no pod is taken as before"
    assert health_of_pod({"metadata": {"name": "r-0"}}, other) is other
    assert health_of_pod(pod, None) is None
    status = crew_status(_obs([ReplicaObservation(0, "r-0", "r-state-0", pod,
                                                  health_of_pod(pod, other))]))
    (entry,) = status["replicas"]
    assert "journalId" not in entry and entry["ready"] is False
    assert Health.from_wire({"status": "ready", "journal_id": "j", "pod_uid": "u"}).pod_uid == "u"


def test_not_ready_without_health_or_pod() -> None:
    status = crew_status(_obs([
        ReplicaObservation(0, "r-0", "r-state-0", READY_POD, None),
        ReplicaObservation(1, "r-1", "r-state-1", None, None),
    ], desired=2))
    assert [r["ready"] for r in status["replicas"]] == [False, False]
    assert "address" not in status["replicas"][1]
    assert _cond(status, "Ready")["reason"] == "ReplicasNotReady"


def test_fenced_replica_is_not_counted_and_named() -> None:
    status = crew_status(_obs([ReplicaObservation(0, "r-0", "r-state-0", READY_POD, HEALTH,
                                                  fence_reason='claim "r-state-0" ... "x"')]))
    assert status["replicas"][0]["fenced"] is True
    assert status["readyReplicas"] == 0 and status["fencedReplicas"] == 1
    assert _cond(status, "StateVolumeShared")["status"] == "True"
    assert '"r-state-0"' in _cond(status, "StateVolumeShared")["message"]
    assert _cond(status, "Ready")["reason"] == "ReplicaFenced"


def test_transition_time_moves_only_on_flip() -> None:
    first = crew_status(_obs([ReplicaObservation(0, "r-0", "r-state-0", READY_POD, HEALTH)]),
                        now="T1")
    same = crew_status(_obs([ReplicaObservation(0, "r-0", "r-state-0", READY_POD, HEALTH)],
                            previous=first["conditions"]), now="T2")
    assert _cond(same, "Ready")["lastTransitionTime"] == "T1"
    assert same == first  # nothing changed: the daemon writes nothing
    flipped = crew_status(_obs([ReplicaObservation(0, "r-0", "r-state-0", READY_POD, None)],
                               previous=first["conditions"]), now="T3")
    assert _cond(flipped, "Ready")["lastTransitionTime"] == "T3"


def test_draining_replica_is_never_ready() -> None:
    status = crew_status(_obs([
        ReplicaObservation(0, "r-0", "r-state-0", READY_POD, HEALTH),
        ReplicaObservation(1, "r-1", "r-state-1", READY_POD, HEALTH, message="scaling down",
                           state=ReplicaState.DRAINING),
        ReplicaObservation(2, "r-2", "r-state-2", None, None, state=ReplicaState.RETAINED),
    ]))
    assert [r["ready"] for r in status["replicas"]] == [True, False, False]
    assert [r["state"] for r in status["replicas"]] == ["Active", "Draining", "Retained"]
    assert status["replicas"][1]["message"] == "scaling down"
    assert status["replicas"][1]["address"] == "127.0.2.1:8090", "lookups still reach it"
    assert status["readyReplicas"] == 1


def test_an_active_replica_whose_sidecar_drains_is_not_ready() -> None:
    draining = Health(status="ready", journal_id="jid", retained_runs=2, active_runs=0,
                      draining=True, unarchived_records=2)
    status = crew_status(_obs([ReplicaObservation(0, "r-0", "r-state-0", READY_POD, draining)]))
    (entry,) = status["replicas"]
    assert entry["ready"] is False and entry["state"] == "Active"
    assert entry["draining"] is True and entry["unarchivedRecords"] == 2


def test_health_from_wire_reads_draining() -> None:
    h = Health.from_wire({"status": "ready", "journal_id": "j", "draining": True,
                          "unarchived_records": 4, "active_runs": 0, "retained_runs": 4})
    assert (h.draining, h.unarchived_records) == (True, 4)
    old = Health.from_wire({"status": "ready", "journal_id": "j"})
    assert (old.draining, old.unarchived_records) == (None, None)


def test_retained_claims_condition_reason() -> None:
    def cond(records: int | None) -> dict[str, Any]:
        obs = CrewObservation(generation=1, desired_replicas=0, replicas=[],
                              retained_claims=[RetainedClaim(1, "r-state-1", records, "why")],
                              previous_conditions=[])
        return _cond(crew_status(obs), "StateClaimsRetained")

    assert cond(3)["reason"] == "UnarchivedRecords" and cond(None)["reason"] == "UnarchivedRecords"
    assert "r-state-1" in cond(3)["message"]


def test_error_is_reported() -> None:
    obs = CrewObservation(generation=1, desired_replicas=1, replicas=[], retained_claims=[],
                          previous_conditions=[], error='claim "x" does not exist')
    assert _cond(crew_status(obs), "Ready")["message"] == 'claim "x" does not exist'


def test_a_journal_over_a_lowered_bound_is_named_in_the_journal_full_condition() -> None:
    """Invariant (crew/journal_room.py): a replica whose journal holds more than a (lowered)
    bound stays ready and the Crew names the field that set the bound."""
    full = Health.from_wire({"status": "ready", "journal_id": "j", "retained_runs": 5,
                             "active_runs": 0, "journal_over_bounds": [
                                 {"bound": "max_retained_runs", "held": 5, "limit": 2}]})
    status = crew_status(_obs([ReplicaObservation(0, "r-0", "r-state-0", READY_POD, full),
                               ReplicaObservation(1, "r-1", "r-state-1", READY_POD, HEALTH)],
                              desired=2), now="T1")
    cond = _cond(status, "JournalFull")
    assert cond["status"] == "True" and cond["reason"] == "JournalFull"
    assert "replica 0 holds 5, spec.journal.maxRetainedRuns is 2" in cond["message"]
    assert "replica 1" not in cond["message"]
    assert status["readyReplicas"] == 2 and _cond(status, "Ready")["status"] == "True"


def test_an_old_record_over_the_events_bound_does_not_refuse_new_jobs() -> None:
    over = Health.from_wire({"status": "ready", "journal_id": "j", "retained_runs": 1,
                             "active_runs": 0, "journal_over_bounds": [
                                 {"bound": "max_events_per_run", "held": 9, "limit": 4}]})
    cond = _cond(crew_status(_obs([ReplicaObservation(0, "r-0", "c", READY_POD, over)])),
                 "JournalFull")
    assert cond["reason"] == "OverBound" and "spec.journal.maxEventsPerRun is 4" in cond["message"]


def test_journals_with_room_say_so() -> None:
    cond = _cond(crew_status(_obs([ReplicaObservation(0, "r-0", "c", READY_POD, HEALTH)])),
                 "JournalFull")
    assert cond["status"] == "False" and cond["reason"] == "Room"
