"""Status computation: conditions, readiness, transitions, no nulls (merge patch)."""

from __future__ import annotations

from typing import Any

from crewfence_operator.crew.status import (
    CrewObservation,
    Health,
    ReplicaObservation,
    crew_status,
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
    assert entry == {"ordinal": 0, "pod": "r-0", "claim": "r-state-0",
                     "address": "127.0.2.1:8090", "journalId": "jid", "ready": True,
                     "fenced": False, "retainedRuns": 0, "activeRuns": 0}
    assert status["readyReplicas"] == 1 and status["observedGeneration"] == 7
    assert _cond(status, "Ready")["status"] == "True"
    assert _cond(status, "StateVolumeShared")["status"] == "False"


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
                           serving=False),
    ]))
    assert [r["ready"] for r in status["replicas"]] == [True, False]
    assert status["replicas"][1]["message"] == "scaling down"
    assert status["readyReplicas"] == 1


def test_error_is_reported() -> None:
    obs = CrewObservation(generation=1, desired_replicas=1, replicas=[], retained_claims=[],
                          previous_conditions=[], error='claim "x" does not exist')
    assert _cond(crew_status(obs), "Ready")["message"] == 'claim "x" does not exist'
