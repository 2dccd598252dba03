"""Argo CD health checks for CrewJob and Crew, evaluated by real Lua over status fixtures."""

from __future__ import annotations

from typing import Any

import pytest
from status_objects import crewjob

CREWJOB = "crewjob-health.lua"
CREW = "crew-health.lua"


def observed(phase: str | None, **extra: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"observedGeneration": 1, "uncertainOutcome": False, **extra}
    if phase is not None:
        status["phase"] = phase
    return status


UNCERTAIN = observed(
    "Failed",
    uncertainOutcome=True,
    recovery="Reconcile external effects before retry or compensation",
    failure={"category": "Execution", "code": "uncertain_outcome", "message": "sidecar restarted"},
    conditions=[
        {"type": "Ready", "status": "True", "reason": "Finished"},
        {
            "type": "OutcomeUncertain",
            "status": "True",
            "reason": "SidecarRestarted",
            "message": "the sidecar restarted while the job was running",
        },
    ],
)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(crewjob(None), "Progressing", id="not-observed"),
        pytest.param(crewjob({}), "Progressing", id="empty-status"),
        pytest.param(crewjob(observed(None)), "Progressing", id="no-phase"),
        pytest.param(crewjob(observed("Pending")), "Progressing", id="pending"),
        pytest.param(crewjob(observed("Running")), "Progressing", id="running"),
        pytest.param(crewjob(observed("Succeeded")), "Healthy", id="succeeded"),
        pytest.param(crewjob(observed("Failed")), "Degraded", id="failed"),
        pytest.param(
            crewjob(observed("Succeeded"), generation=2), "Progressing", id="stale-succeeded"
        ),
        pytest.param(crewjob(observed("Failed"), generation=3), "Progressing", id="stale-failed"),
        pytest.param(crewjob({"phase": "Succeeded"}), "Progressing", id="no-observed-generation"),
        pytest.param(
            crewjob(observed("Cancelled"), cancel=True), "Suspended", id="cancel-requested"
        ),
        pytest.param(crewjob(observed("Cancelled")), "Degraded", id="cancelled-unrequested"),
        pytest.param(crewjob(observed("Exploded")), "Unknown", id="unknown-phase"),
    ],
)
def test_crewjob_health(run_health, obj: dict[str, Any], expected: str) -> None:
    assert run_health(CREWJOB, obj).status == expected


@pytest.mark.parametrize("generation", [1, 2], ids=["current", "stale"])
def test_crewjob_uncertain_outcome_is_degraded_and_says_so(run_health, generation: int) -> None:
    # An uncertain outcome never turns Healthy, so even a stale status must not hide it.
    health = run_health(CREWJOB, crewjob(UNCERTAIN, generation=generation))
    assert health.status == "Degraded"
    assert "uncertain" in health.message.lower()
    assert "SidecarRestarted" in health.message
    assert "Reconcile external effects" in health.message


def resolved(outcome: str, **extra: Any) -> dict[str, Any]:
    """An uncertain outcome after the operator accepted a resolution (OutcomeUncertain False)."""
    conditions = [c if c["type"] != "OutcomeUncertain" else
                  {**c, "status": "False", "reason": "Resolved"} for c in UNCERTAIN["conditions"]]
    return {**UNCERTAIN, "conditions": conditions, "observedGeneration": 2,
            "resolution": {"outcome": outcome, "note": "checked the provider",
                           "resolvedBy": "kubectl-crewfence"}, **extra}


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [("Happened", "Healthy"), ("NotHappened", "Suspended"), ("Compensated", "Suspended")],
)
def test_crewjob_resolved_uncertain_outcome_is_settled(
    run_health, outcome: str, expected: str
) -> None:
    health = run_health(CREWJOB, crewjob(resolved(outcome), generation=2))
    assert health.status == expected
    assert f"resolved {outcome}" in health.message
    assert "kubectl-crewfence" in health.message


def test_crewjob_resolution_not_yet_accepted_stays_degraded(run_health) -> None:
    # spec.resolution set (generation 2) but the operator has not accepted it yet.
    health = run_health(CREWJOB, crewjob(UNCERTAIN, generation=2))
    assert health.status == "Degraded"


def test_crewjob_resolved_names_its_successor(run_health) -> None:
    status = resolved("NotHappened", supersededBy={"name": "j-rerun", "actionId": "team-a/j-rerun"})
    health = run_health(CREWJOB, crewjob(status, generation=2))
    assert health.status == "Suspended"
    assert "j-rerun" in health.message


def test_crewjob_uncertain_without_condition_still_says_uncertain(run_health) -> None:
    health = run_health(CREWJOB, crewjob(observed("Running", uncertainOutcome=True)))
    assert health.status == "Degraded"
    assert "uncertain" in health.message.lower()


def test_crewjob_failure_message_names_category(run_health) -> None:
    status = observed("Failed", failure={"category": "Auth", "code": "401", "message": "bad token"})
    health = run_health(CREWJOB, crewjob(status))
    assert health.status == "Degraded"
    assert "Auth" in health.message and "bad token" in health.message


def crew(status: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "crewfence.dev/v1alpha1",
        "kind": "Crew",
        "metadata": {"name": "research", "namespace": "team-a", "generation": generation},
        "spec": {"replicas": 2},
    }
    if status is not None:
        obj["status"] = status
    return obj


def ready(value: str, **extra: Any) -> dict[str, Any]:
    return {
        "observedGeneration": 1,
        "conditions": [{"type": "Ready", "status": value, "reason": "R", "message": "m"}],
        **extra,
    }


def replica(ordinal: int, fenced: bool) -> dict[str, Any]:
    return {
        "ordinal": ordinal,
        "pod": f"research-{ordinal}",
        "claim": f"research-state-{ordinal}",
        "ready": not fenced,
        "fenced": fenced,
        "fenceReason": "claim mounted by pod intruder" if fenced else None,
    }


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(crew(None), "Progressing", id="not-observed"),
        pytest.param(crew({"observedGeneration": 1}), "Progressing", id="no-ready-condition"),
        pytest.param(crew(ready("False")), "Progressing", id="not-ready"),
        pytest.param(crew(ready("True")), "Healthy", id="ready"),
        pytest.param(crew(ready("True"), generation=2), "Progressing", id="stale"),
        pytest.param(
            crew(ready("True", replicas=[replica(0, False), replica(1, False)])),
            "Healthy",
            id="ready-replicas",
        ),
        pytest.param(
            crew(
                {
                    "observedGeneration": 1,
                    "conditions": [
                        {"type": "Ready", "status": "False"},
                        {"type": "Stalled", "status": "True", "message": "invalid crew definition"},
                    ],
                }
            ),
            "Degraded",
            id="stalled",
        ),
    ],
)
def test_crew_health(run_health, obj: dict[str, Any], expected: str) -> None:
    assert run_health(CREW, obj).status == expected


@pytest.mark.parametrize("ready_status", ["True", "False"])
def test_crew_fenced_replica_is_degraded(run_health, ready_status: str) -> None:
    # The operator also sets Ready=False (ReplicaFenced); fencing must still win.
    obj = crew(ready(ready_status, replicas=[replica(0, False), replica(1, True)]))
    health = run_health(CREW, obj)
    assert health.status == "Degraded"
    assert "research-1" in health.message and "fenced" in health.message


@pytest.mark.parametrize(
    ("kind", "bad", "good", "reason", "message", "shown"),
    [
        pytest.param("StateVolumeShared", "True", "False", "ForeignMount",
                     "claim research-state-0 is mounted by pod intruder", "research-state-0",
                     id="shared-state-volume"),
        pytest.param("ModelCredentials", "False", "True", "MissingModelCredentials",
                     "model openai/gpt-4o-mini is hosted but llm.apiKeySecretRef is not set",
                     "apiKeySecretRef", id="model-credentials-missing"),
    ],
)
def test_crew_condition_degrades_a_ready_crew(run_health, kind: str, bad: str, good: str,
                                              reason: str, message: str, shown: str) -> None:
    status = ready("True")
    status["conditions"].append(
        {"type": kind, "status": bad, "reason": reason, "message": message})
    health = run_health(CREW, crew(status))
    assert health.status == "Degraded"
    assert shown in health.message
    status["conditions"][-1]["status"] = good
    assert run_health(CREW, crew(status)).status == "Healthy"
