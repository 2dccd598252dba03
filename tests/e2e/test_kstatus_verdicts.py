"""kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status, built from the Go module proxy: Flux
without health expressions, kpt, Config Sync) agrees with the documented health for every
CrewJob phase, uncertainty and resolution, and for Crews.

The objects are built by the operator's own status code (crewjob/status.py, resolution.py,
crew/status.py), so this checks what the operator writes. Expected verdicts are those the Flux
health expressions printed in docs/gitops-flux.md give (evaluated by a real CEL runtime in
tests/gitops/test_flux_health_exprs.py; the same function is used here). Invariant: a terminal
CrewJob is never InProgress for kstatus. No cluster is needed. CrewCronJobs too
(cronjob/status.py): a valid schedule is Current, suspended or not; one paused by an
unresolved uncertain outcome, or an invalid one, is Failed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from crewfence_operator.crew.status import (
    CrewObservation,
    Health,
    ReplicaObservation,
    crew_status,
)
from crewfence_operator.crewjob import outcome
from crewfence_operator.crewjob import resolution as res
from crewfence_operator.crewjob.outcome import Phase, Reason, Verdict
from crewfence_operator.crewjob.status import (
    StatusContext,
    restamped_conditions,
    terminal_patch,
    working_patch,
)
from crewfence_operator.cronjob import status as cron_status
from crewfence_operator.cronjob.ticks import Plan, Record
from crewfence_sidecar.contract import FailureCategory
from harness import kstatus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gitops"))
from test_flux_health_exprs import flux_status

NOW = "2026-12-01T21:00:00Z"


def _job(status: dict[str, Any], *, cancel: bool = False, generation: int = 1,
         ) -> dict[str, Any]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewJob",
            "metadata": {"name": "j", "namespace": "team-a", "generation": generation},
            "spec": {"crewRef": {"name": "research"}, "operation": "run", "cancel": cancel},
            "status": status}


def _terminal(verdict: Verdict, *, cancel: bool = False) -> dict[str, Any]:
    ctx = StatusContext(1, "team-a/j", cancel_requested=cancel)
    return _job(terminal_patch(ctx, verdict, now=NOW), cancel=cancel)


def _working(phase: Phase, reason: str, *, suspended: bool = False) -> dict[str, Any]:
    extra = ({"type": "Suspended", "status": "True", "reason": "Suspended", "message": "m"},) \
        if suspended else ()
    ctx = StatusContext(1, "team-a/j", extra_conditions=extra)
    return _job(working_patch(ctx, phase, reason, "m", now=NOW))


def _resolved(job: dict[str, Any], outcome_name: str) -> dict[str, Any]:
    spec = {"resolution": {"outcome": outcome_name, "note": "checked"}}
    decision = res.decide(spec, job["status"], generation=2)
    assert decision.resolution is not None
    patch = res.accepted_patch(job["status"], decision.resolution, resolved_by="me",
                               generation=2, now=NOW, journal_possible=True)
    status = {**job["status"], **patch}
    return {**job, "metadata": {**job["metadata"], "generation": 2},
            "spec": {**job["spec"], **spec}, "status": status}


def _late_cancel(job: dict[str, Any]) -> dict[str, Any]:
    """A finished job whose spec.cancel was set afterwards, once the operator caught up."""
    status = {**job["status"], "observedGeneration": 2,
              "conditions": restamped_conditions(job["status"], generation=2,
                                                 cancel_requested=True, now=NOW)}
    return {**job, "metadata": {**job["metadata"], "generation": 2},
            "spec": {**job["spec"], "cancel": True}, "status": status}


SUCCEEDED = Verdict(Phase.SUCCEEDED, Reason.COMPLETED, "done", "")
FAILED = Verdict(Phase.FAILED, Reason.EXECUTION_FAILED, "boom", "")
CANCELLED = Verdict(Phase.CANCELLED, Reason.CANCELLED, "cancelled", "")
UNCERTAIN = outcome.uncertain(Reason.SIDECAR_RESTARTED, FailureCategory.CONNECTOR,
                              "sidecar_restarted", "the sidecar restarted")
UNCERTAIN_CANCEL = outcome.uncertain(Reason.CANCEL_UNCONFIRMED, FailureCategory.CONNECTOR,
                                     "cancel_unconfirmed", "may continue",
                                     phase=Phase.CANCELLED)
UNCERTAIN_SUCCESS = outcome.uncertain(Reason.RECORD_UNCERTAIN, FailureCategory.CONNECTOR,
                                      "record_uncertain", "uncertain", phase=Phase.SUCCEEDED)

CREWJOBS = [
    pytest.param(_working(Phase.PENDING, "WaitingForReplicas"), "InProgress", id="pending"),
    pytest.param(_working(Phase.PENDING, "Suspended", suspended=True), "InProgress",
                 id="pending-suspended"),
    pytest.param(_working(Phase.RUNNING, "Admitted"), "InProgress", id="running"),
    pytest.param(_terminal(SUCCEEDED), "Current", id="succeeded"),
    pytest.param(_terminal(outcome.archived_verdict({"status": "completed"})), "Current",
                 id="succeeded-archived"),
    pytest.param(_terminal(FAILED), "Failed", id="failed"),
    pytest.param(_terminal(CANCELLED, cancel=True), "Current", id="cancelled-by-spec"),
    pytest.param(_terminal(outcome.cancelled_before_admission(), cancel=True), "Current",
                 id="cancelled-before-admission"),
    pytest.param(_terminal(CANCELLED), "Failed", id="cancelled-not-by-spec"),
    pytest.param(_late_cancel(_terminal(CANCELLED)), "Current", id="cancelled-then-spec-cancel"),
    pytest.param(_late_cancel(_terminal(SUCCEEDED)), "Current", id="succeeded-then-spec-cancel"),
    pytest.param(_late_cancel(_terminal(FAILED)), "Failed", id="failed-then-spec-cancel"),
    pytest.param(_terminal(UNCERTAIN), "Failed", id="uncertain-failed"),
    pytest.param(_terminal(UNCERTAIN_CANCEL, cancel=True), "Failed", id="uncertain-cancel"),
    pytest.param(_terminal(UNCERTAIN_SUCCESS), "Failed", id="uncertain-succeeded"),
    pytest.param(_resolved(_terminal(UNCERTAIN), "Happened"), "Current", id="resolved-happened"),
    pytest.param(_resolved(_terminal(UNCERTAIN), "NotHappened"), "Current",
                 id="resolved-not-happened"),
    pytest.param(_resolved(_terminal(UNCERTAIN_CANCEL, cancel=True), "Compensated"), "Current",
                 id="resolved-compensated"),
    pytest.param(_job({**_terminal(SUCCEEDED)["status"], "observedGeneration": 1},
                      generation=2), "InProgress", id="stale-generation"),
]


@pytest.mark.parametrize(("obj", "documented"), CREWJOBS)
def test_kstatus_reads_crewjobs_as_documented(obj: dict[str, Any], documented: str) -> None:
    [verdict] = kstatus.verdicts([obj])
    assert verdict.get("error") is None, verdict
    assert flux_status("CrewJob", obj) == documented  # the docs' expressions agree
    assert verdict["status"] == documented, verdict
    if obj["status"].get("phase") in {p.value for p in outcome.TERMINAL_PHASES} \
            and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]:
        assert verdict["status"] != "InProgress"


def _replica(ordinal: int, *, ready: bool = True, fenced: bool = False) -> ReplicaObservation:
    pod = {"metadata": {"name": f"research-{ordinal}"},
           "status": {"podIP": f"10.0.0.{ordinal + 1}",
                      "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    return ReplicaObservation(ordinal=ordinal, pod_name=f"research-{ordinal}",
                              claim=f"state-research-{ordinal}", pod=pod,
                              health=Health("ready", "j1", 0, 0),
                              fence_reason="a foreign pod mounts the state claim"
                              if fenced else None)


def _crew(replicas: list[ReplicaObservation], desired: int) -> dict[str, Any]:
    status = crew_status(CrewObservation(generation=1, desired_replicas=desired,
                                         replicas=replicas, retained_claims=[],
                                         previous_conditions=[]), now=NOW)
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew",
            "metadata": {"name": "research", "namespace": "team-a", "generation": 1},
            "spec": {}, "status": status}


@pytest.mark.parametrize(("obj", "documented"), [
    pytest.param(_crew([_replica(0), _replica(1)], 2), "Current", id="ready"),
    pytest.param(_crew([_replica(0), _replica(1, ready=False)], 2), "InProgress",
                 id="not-ready"),
    pytest.param(_crew([_replica(0), _replica(1, fenced=True)], 2), "Failed", id="fenced"),
])
def test_kstatus_reads_crews_as_documented(obj: dict[str, Any], documented: str) -> None:
    [verdict] = kstatus.verdicts([obj])
    assert flux_status("Crew", obj) == documented
    assert verdict["status"] == documented, verdict


def _cronjob(status: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewCronJob",
            "metadata": {"name": "report", "namespace": "team-a", "generation": 1},
            "spec": {}, "status": status}


def _scheduled(*, paused_by: str | None = None, suspended: bool = False) -> dict[str, Any]:
    plan = Plan(steps=(), next_schedule=1_800_000_060, paused_by=paused_by,
                final=Record(1_800_000_000, None, 0, 0, None))
    return _cronjob(cron_status.final_patch(
        namespace="team-a", cronjob="report", plan=plan, observed=[], previous={},
        generation=1, now=NOW, suspended=suspended))


@pytest.mark.parametrize(("obj", "documented"), [
    pytest.param(_scheduled(), "Current", id="scheduling"),
    pytest.param(_scheduled(suspended=True), "Current", id="suspended"),
    pytest.param(_scheduled(paused_by="report-29000000"), "Failed", id="paused-uncertain"),
    pytest.param(_cronjob(cron_status.invalid_patch("InvalidSchedule", "bad minute", {}, 1,
                                                    NOW)), "Failed", id="invalid"),
])
def test_kstatus_reads_crewcronjobs_as_documented(obj: dict[str, Any], documented: str,
                                                  ) -> None:
    [verdict] = kstatus.verdicts([obj])
    assert verdict.get("error") is None, verdict
    assert flux_status("CrewCronJob", obj) == documented
    assert verdict["status"] == documented, verdict
