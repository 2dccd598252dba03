"""The pure resolution decisions and patches (crewjob/resolution.py) and the supersedes gate
(crewjob/supersede.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from crewfence_operator.crewjob import resolution as res
from crewfence_operator.crewjob import supersede
from crewfence_operator.handlers.resolution import unresolved_entry

NOW = "2026-11-30T21:00:00Z"
RESOLUTION = {"outcome": "NotHappened", "note": "no provider request in the logs",
              "evidence": ["https://tickets/7"]}
PROTECTED = ("phase", "reason", "failure", "output", "uncertainOutcome", "recovery", "message")


def uncertain_status(**extra: Any) -> dict[str, Any]:
    return {"phase": "Failed", "reason": "SidecarRestarted", "uncertainOutcome": True,
            "observedGeneration": 1, "recovery": "reconcile first",
            "assignment": {"ordinal": 0, "pod": "research-0", "claim": "research-state-0"},
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "SidecarRestarted"},
                {"type": "Failed", "status": "True", "reason": "SidecarRestarted"},
                {"type": "OutcomeUncertain", "status": "True", "reason": "SidecarRestarted",
                 "lastTransitionTime": "2026-11-30T20:00:00Z"}],
            **extra}


def conditions(patch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in patch["conditions"]}


def test_resolution_on_an_uncertain_job_is_accepted_without_rewriting_history() -> None:
    status = uncertain_status()
    decision = res.decide({"resolution": RESOLUTION}, status, generation=2)
    assert decision.step is res.Step.CONFIRM  # an assigned replica: the journal first
    assert decision.resolution is not None
    patch = res.accepted_patch(status, decision.resolution, resolved_by="kubectl-patch",
                               generation=2, now=NOW, journal_possible=True)
    assert not set(PROTECTED) & set(patch)  # a finding, not a rewrite of history
    assert patch["resolution"]["outcome"] == "NotHappened"
    assert patch["resolution"]["resolvedBy"] == "kubectl-patch"
    assert patch["resolution"]["previousReason"] == "SidecarRestarted"
    assert patch["resolution"]["journal"] == {"state": "Pending"}
    conds = conditions(patch)
    assert conds["OutcomeUncertain"]["status"] == "False"
    assert conds["OutcomeUncertain"]["reason"] == "Resolved"
    assert conds["Resolved"]["status"] == "True"
    assert all(c["observedGeneration"] == 2 for c in patch["conditions"])
    assert conds["Failed"]["reason"] == "SidecarRestarted"  # other conditions kept
    # settled for kstatus: Ready, never Stalled (crewjob/status.py health)
    assert (conds["Ready"]["status"], conds["Stalled"]["status"]) == ("True", "False")
    assert patch["observedGeneration"] == 2


def test_after_acceptance_the_journal_write_and_then_nothing() -> None:
    status = uncertain_status()
    decision = res.decide({"resolution": RESOLUTION}, status, 2)
    assert decision.resolution is not None
    patch = res.accepted_patch(status, decision.resolution, resolved_by="m", generation=2,
                               now=NOW, journal_possible=True)
    accepted = {**status, **patch}
    assert res.decide({"resolution": RESOLUTION}, accepted, 2).step is res.Step.JOURNAL
    journaled = {**accepted, "resolution": {**patch["resolution"],
                                            "journal": {"state": "Journaled", "sequence": 3}}}
    assert res.decide({"resolution": RESOLUTION}, journaled, 2).step is res.Step.NOTHING
    # A concurrent write that put OutcomeUncertain=True back is repaired (level-triggered),
    # keeping who and when from the first acceptance.
    clobbered = {**journaled, "conditions": status["conditions"]}
    again = res.decide({"resolution": RESOLUTION}, clobbered, 2)
    assert again.step is res.Step.REFRESH and again.resolution is not None
    repaired = res.accepted_patch(clobbered, again.resolution, resolved_by="other",
                                  generation=2, now="later", journal_possible=True)
    assert repaired["resolution"]["resolvedBy"] == "m"
    assert repaired["resolution"]["journal"]["state"] == "Journaled"


@pytest.mark.parametrize("phase", ["Succeeded", "Failed", "Cancelled"])
def test_resolution_on_a_known_outcome_is_ignored_with_a_reason(phase: str) -> None:
    status = {"phase": phase, "reason": "Completed", "uncertainOutcome": False,
              "observedGeneration": 1, "conditions": []}
    decision = res.decide({"resolution": RESOLUTION}, status, 2)
    assert decision.step is res.Step.IGNORE
    assert "known" in decision.message
    patch = res.ignored_patch(status, decision.message, generation=2, now=NOW)
    assert "resolution" not in patch
    assert conditions(patch)["Resolved"]["reason"] == "ResolutionIgnored"
    # once said, it is not said again
    assert res.decide({"resolution": RESOLUTION}, {**status, **patch}, 2).step is \
        res.Step.NOTHING


def test_resolution_waits_while_the_job_runs_and_nothing_without_one() -> None:
    running = {"phase": "Running", "uncertainOutcome": True}
    assert res.decide({"resolution": RESOLUTION}, running, 2).step is res.Step.WAIT
    assert res.decide({}, uncertain_status(), 1).step is res.Step.NOTHING


def test_without_an_assignment_there_is_no_journal_to_write() -> None:
    status = uncertain_status()
    decision = res.decide({"resolution": RESOLUTION}, status, 2)
    assert decision.resolution is not None
    patch = res.accepted_patch(status, decision.resolution, resolved_by="m", generation=2,
                               now=NOW, journal_possible=False)
    assert patch["resolution"]["journal"]["state"] == "NotApplicable"
    assert res.decide({"resolution": RESOLUTION}, {**status, **patch}, 2).step is \
        res.Step.NOTHING


def test_resolver_is_the_manager_owning_spec_resolution() -> None:
    managed = [
        {"manager": "kubectl-client-side-apply", "time": "2026-11-30T20:00:00Z",
         "fieldsV1": {"f:spec": {"f:crewRef": {}}}},
        {"manager": "kubectl-crewfence", "time": "2026-11-30T20:05:00Z",
         "fieldsV1": {"f:spec": {"f:resolution": {"f:note": {}}}}},
        {"manager": "crewfence-operator", "time": "2026-11-30T20:06:00Z",
         "fieldsV1": {"f:status": {}}},
    ]
    assert res.resolver(managed) == "kubectl-crewfence"
    assert res.resolver([]) == "unknown"


def test_gauge_entry_only_for_unresolved_uncertain_jobs() -> None:
    obj = {"metadata": {"creationTimestamp": "2026-11-30T19:00:00Z"},
           "spec": {"crewRef": {"name": "research"}}, "status": uncertain_status()}
    crew, reason, since = unresolved_entry(obj) or ("", "", 0.0)
    assert (crew, reason) == ("research", "SidecarRestarted")
    # since the condition's lastTransitionTime, not the creation time
    assert since == datetime(2026, 11, 30, 20, 0, tzinfo=UTC).timestamp()
    resolved = {**obj, "status": {**obj["status"], "resolution": {"outcome": "Happened"}}}
    assert unresolved_entry(resolved) is None
    assert unresolved_entry({**obj, "status": {"phase": "Failed"}}) is None


# --- supersedes --------------------------------------------------------------------------------
def predecessor(status: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "old", "namespace": "ns",
                                        "resourceVersion": "42"},
                           "spec": {"crewRef": {"name": "research"}, **spec}}
    if status is not None:
        obj["status"] = status
    return obj


def gate(pred: dict[str, Any] | None, name: str = "new",
         action_id: str = "ns/new") -> supersede.GateDecision:
    return supersede.decide(successor_name=name, successor_action_id=action_id,
                            predecessor=pred, predecessor_name="old")


def test_successor_waits_for_an_unresolved_or_unfinished_predecessor() -> None:
    assert gate(None).gate is supersede.Gate.WAIT
    assert gate(predecessor({"phase": "Running"})).gate is supersede.Gate.WAIT
    unresolved = gate(predecessor(uncertain_status()))
    assert unresolved.gate is supersede.Gate.WAIT
    assert "resolve it first" in unresolved.message


@pytest.mark.parametrize("outcome", ["NotHappened", "Compensated"])
def test_successor_proceeds_after_not_happened_or_compensated(outcome: str) -> None:
    pred = predecessor(uncertain_status(resolution={"outcome": outcome, "note": "n"}))
    assert gate(pred).proceed
    assert supersede.supersedes_status(pred, "old") == {
        "name": "old", "actionId": "ns/old", "outcome": outcome}
    claim = supersede.claim_patch(pred, successor_name="new", successor_action_id="ns/new")
    assert claim["metadata"]["resourceVersion"] == "42"  # a racing claim gets 409
    assert claim["status"]["supersededBy"] == {"name": "new", "actionId": "ns/new"}


def test_successor_refused_for_happened_known_taken_or_same_action() -> None:
    happened = predecessor(uncertain_status(resolution={"outcome": "Happened", "note": "n"}))
    assert gate(happened).gate is supersede.Gate.REFUSE
    known = predecessor({"phase": "Failed", "uncertainOutcome": False})
    assert gate(known).code == "predecessor_not_uncertain"
    taken = predecessor(uncertain_status(resolution={"outcome": "NotHappened", "note": "n"},
                                         supersededBy={"name": "other"}))
    assert gate(taken).code == "already_superseded"
    assert gate(taken, name="other", action_id="ns/other").proceed  # its own claim
    same = predecessor(uncertain_status(resolution={"outcome": "NotHappened", "note": "n"}),
                       actionId="shared")
    assert gate(same, action_id="shared").code == "supersedes_same_action"
    assert gate(predecessor(None), name="old").code == "supersedes_self"
