from __future__ import annotations

from crewfence_operator.crewjob import outcome
from crewfence_operator.crewjob.outcome import Phase, Reason
from crewfence_operator.crewjob.output import bound_output
from crewfence_operator.crewjob.status import (
    StatusContext,
    build_conditions,
    terminal_patch,
    working_patch,
)
from crewfence_sidecar.contract import JobRecord, Status


def conds(patch: dict) -> dict[str, dict]:
    return {c["type"]: c for c in patch["conditions"]}


def test_running_is_reconciling_not_ready() -> None:
    p = working_patch(StatusContext(3, "ns/j"), Phase.RUNNING, "Admitted", "admitted",
                      now="T1")
    c = conds(p)
    assert p["observedGeneration"] == 3 and p["phase"] == "Running"
    assert c["Reconciling"]["status"] == "True"
    assert c["Ready"]["status"] == c["Stalled"]["status"] == "False"
    assert c["OutcomeUncertain"]["status"] == "False"
    assert "uncertainOutcome" not in p


def test_succeeded_is_ready_and_current() -> None:
    rec = JobRecord("ns/j", "c", "run", "h", Status.COMPLETED, 3, "T0", "T9", output="x")
    v = outcome.verdict_from_record(rec, thread_backed=False, cancel_requested=False)
    p = terminal_patch(StatusContext(1, "ns/j"), v, now="T10", record=rec,
                       output=bound_output(rec.output), configmap="j-output")
    c = conds(p)
    assert c["Ready"]["status"] == "True" and c["Succeeded"]["status"] == "True"
    assert c["Reconciling"]["status"] == "False" and c["Stalled"]["status"] == "False"
    assert (p["startedAt"], p["finishedAt"]) == ("T0", "T9")  # from the sidecar record
    assert p["output"]["value"] == "x" and p["output"]["configMap"]["name"] == "j-output"
    assert p["uncertainOutcome"] is False and p["failure"] is None


def test_uncertain_failure_is_stalled_with_reason() -> None:
    v = outcome.uncertain(Reason.TRANSPORT_FAILURE, outcome.FailureCategory.TRANSPORT,
                          "transport_error", "lost")
    p = terminal_patch(StatusContext(1, "ns/j"), v, now="T1")
    c = conds(p)
    assert p["phase"] == "Failed" and p["uncertainOutcome"] is True
    assert c["OutcomeUncertain"] == {**c["OutcomeUncertain"], "status": "True",
                                     "reason": "TransportFailure"}
    assert c["Stalled"]["status"] == "True" and c["Failed"]["status"] == "True"
    assert p["failure"]["retryable"] is False
    assert p["recovery"] == outcome.RECOVERY[Reason.TRANSPORT_FAILURE]


def test_transition_time_kept_while_status_unchanged() -> None:
    first = build_conditions(Phase.PENDING, "WaitingForReplicas", "m", uncertain_reason=None,
                             generation=1, previous=None, now="T1")
    second = build_conditions(Phase.RUNNING, "Admitted", "m", uncertain_reason=None,
                              generation=1, previous=first, now="T2")
    by = {c["type"]: c for c in second}
    assert by["Reconciling"]["lastTransitionTime"] == "T1"  # True -> True
    third = build_conditions(Phase.SUCCEEDED, "Completed", "m", uncertain_reason=None,
                             generation=1, previous=second, now="T3")
    by3 = {c["type"]: c for c in third}
    assert by3["Reconciling"]["lastTransitionTime"] == "T3"
    assert by3["Ready"]["lastTransitionTime"] == "T3"
