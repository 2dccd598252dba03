"""The pure CrewJob state machine, one step at a time (crewjob/machine.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from crewfence_operator.crewjob import machine as m
from crewfence_operator.crewjob.effects import EffectLog
from crewfence_operator.crewjob.machine import (
    Admit,
    Cancel,
    CrewView,
    Finish,
    Follow,
    Gate,
    Lookup_,
    Memory,
    Observation,
    Probe,
    Release,
    Wait,
)
from crewfence_operator.crewjob.outcome import Phase, Reason
from crewfence_operator.crewjob.output import STATUS_VALUE_MAX_BYTES
from crewfence_operator.crewjob.replicas import Replica, ReplicaState, parse_replicas
from crewfence_operator.crewjob.spec import JobSpec, SpecError
from crewfence_operator.sidecar_client import Admission, Lookup, SidecarFailure
from crewfence_sidecar.contract import FailureCategory, JobRecord, Status

NOW = 1_800_000_000.0
SPEC = JobSpec.from_resource("team-a", "job-1", {"crewRef": {"name": "research"},
                                                 "operation": "run", "input": {"topic": "x"}})


def replica(k: int, *, state: ReplicaState = ReplicaState.ACTIVE, up: bool = True,
            ready: bool = True, journal: str | None = None) -> Replica:
    return Replica(ordinal=k, pod=f"research-{k}", claim=f"state-{k}",
                   address=f"10.0.0.{k}:8090" if up else None,
                   journal_id=journal or f"j{k}", ready=ready and up, fenced=False, state=state)


def record(status: Status = Status.RUNNING, *, uncertain: bool = False,
           error: dict[str, Any] | None = None, spec: JobSpec = SPEC) -> JobRecord:
    return JobRecord(action_id=spec.action_id, crew_id="research", operation="run",
                     request_hash=spec.request_hash(), status=status, event_count=1,
                     created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:01Z",
                     output="out" if status is Status.COMPLETED else None, error=error,
                     uncertain_outcome=uncertain)


def covered(events: int = 1) -> EffectLog:
    """An effect log that followed a record's ``events`` events from 0 (none of them effects)."""
    return EffectLog(next_sequence=events)


def assigned(k: int = 0, journal: str | None = None, at: float = NOW) -> dict[str, Any]:
    return {"phase": "Running", "reason": "Dispatched",
            "assignment": {"ordinal": k, "pod": f"research-{k}", "claim": f"state-{k}",
                           "journalId": journal or f"j{k}", "assignedAt": m.iso(at)}}


def obs(*replicas: Replica, status: dict[str, Any] | None = None, memory: Memory | None = None,
        spec: JobSpec | SpecError = SPEC, crew: bool = True, now: float = NOW,
        deleting: bool = False, gate: Gate = m.OPEN_GATE,
        claim_exists: bool | None = False) -> Observation:
    return Observation(namespace="team-a", name="job-1", generation=1, spec=spec,
                       status=status or {},
                       crew=CrewView(tuple(replicas), True) if crew else None,
                       memory=memory or Memory(), now=now, deleting=deleting, gate=gate,
                       assigned_claim_exists=claim_exists)


TRANSPORT_LOST = SidecarFailure(FailureCategory.TRANSPORT, "transport_error", "reset", None,
                                uncertain=True)
REFUSED = SidecarFailure(FailureCategory.TRANSPORT, "transport_error", "refused", None)


# --- before the first admission ---
def test_probe_asks_every_replica_including_draining_ones() -> None:
    d = m.decide(obs(replica(0), replica(1, state=ReplicaState.DRAINING, ready=False)))
    assert isinstance(d.step, Probe)
    assert [r.ordinal for r in d.step.replicas] == [0, 1]
    assert d.patch is None


def test_a_retained_claim_without_a_pod_means_wait_naming_it() -> None:
    both = (replica(0), replica(1, state=ReplicaState.RETAINED, up=False))
    d = m.decide(obs(*both, memory=Memory(probes={0: Lookup()})))
    assert isinstance(d.step, Wait)
    assert d.patch is not None and d.patch["reason"] == Reason.WAITING_FOR_REPLICAS
    assert "1 (research-1, retained)" in d.patch["message"]


def test_a_probe_failure_means_wait_and_no_admission() -> None:
    d = m.decide(obs(replica(0), replica(1), memory=Memory(probes={0: Lookup(), 1: REFUSED})))
    assert isinstance(d.step, Wait) and "1 (research-1)" in d.patch["message"]  # type: ignore


def test_all_unknown_admits_on_the_rendezvous_choice_with_the_assignment_in_the_patch() -> None:
    d = m.decide(obs(replica(0), replica(1), memory=Memory(probes={0: Lookup(), 1: Lookup()})))
    assert isinstance(d.step, Admit)
    assert d.patch is not None
    a = d.patch["assignment"]
    assert a["ordinal"] == d.step.replica.ordinal
    assert a["journalId"] == f"j{a['ordinal']}" and a["assignedAt"] == m.iso(NOW)
    assert d.patch["phase"] == "Running" and d.patch["reason"] == "Dispatched"
    assert d.step.journal_id == a["journalId"], "the admission names its journal"


def test_a_probe_answered_from_another_journal_than_the_crews_admits_nowhere() -> None:
    """I1/I4: replica 0's address answered from journal jX while the Crew lists j0: that
    journal may not be the one the action lives in, so nothing is admitted anywhere (not even on
    replica 1) and replica 0 is asked again; a found record there is not attached to either."""
    probes = {0: Lookup(journal_id="jX"), 1: Lookup(journal_id="j1")}
    d = m.decide(obs(replica(0), replica(1), memory=Memory(probes=probes)))
    assert isinstance(d.step, Wait) and d.step.reason == Reason.WAITING_FOR_REPLICAS
    assert "answered from journal jX, not the Crew's j0" in d.patch["message"]  # type: ignore
    assert set(d.memory.probes) == {1}, "replica 0 is probed again"
    found = {0: Lookup(record=record(), journal_id="jX"), 1: Lookup(journal_id="j1")}
    d = m.decide(obs(replica(0), replica(1), memory=Memory(probes=found)))
    assert isinstance(d.step, Wait) and not (d.patch or {}).get("assignment")
    again = m.decide(obs(replica(0), replica(1), memory=d.memory))
    assert isinstance(again.step, Probe) and [r.ordinal for r in again.step.replicas] == [0]
    agreed = {0: Lookup(journal_id="j0"), 1: Lookup(journal_id="j1")}
    assert isinstance(m.decide(obs(replica(0), replica(1),
                                   memory=Memory(probes=agreed))).step, Admit)


def test_draining_replicas_are_never_chosen() -> None:
    d = m.decide(obs(replica(0, state=ReplicaState.DRAINING), replica(1, ready=False),
                     memory=Memory(probes={0: Lookup(), 1: Lookup()})))
    assert isinstance(d.step, Wait) and d.step.reason == Reason.NO_ELIGIBLE_REPLICA


def test_a_replica_that_knows_the_action_is_attached_not_readmitted() -> None:
    d = m.decide(obs(replica(0), replica(1, state=ReplicaState.DRAINING),
                     memory=Memory(probes={0: Lookup(), 1: Lookup(record=record())})))
    assert isinstance(d.step, Follow) and d.step.replica.ordinal == 1
    assert d.patch is not None and d.patch["assignment"]["ordinal"] == 1


def test_a_known_terminal_record_finishes_from_the_record() -> None:
    d = m.decide(obs(replica(0), memory=Memory(effects=covered(), probes={0: Lookup(
        record=record(Status.CANCELLED, uncertain=True, error={"code": "cancelled"}))})))
    assert isinstance(d.step, Finish) and d.step.verdict.phase is Phase.CANCELLED


def test_a_different_request_under_the_action_id_is_request_changed() -> None:
    other = JobSpec.from_resource("team-a", "job-1", {"crewRef": {"name": "research"},
                                                      "operation": "run", "input": {"x": 1}})
    d = m.decide(obs(replica(0), memory=Memory(probes={0: Lookup(record=record(spec=other))})))
    assert isinstance(d.step, Finish) and d.step.verdict.reason is Reason.REQUEST_CHANGED


def test_cancel_before_any_assignment_probes_first_then_finishes_without_dispatch() -> None:
    """I6: a re-applied ``cancel: true`` has a new status but maybe an old action."""
    spec = replace(SPEC, cancel=True)
    d = m.decide(obs(replica(0), spec=spec))
    assert isinstance(d.step, Probe), "no verdict before the probe"
    d = m.decide(obs(replica(0), spec=spec, memory=Memory(probes={0: Lookup()})))
    assert isinstance(d.step, Finish)
    assert d.step.verdict.reason is Reason.CANCELLED_BEFORE_ADMISSION


def test_a_reapplied_cancel_finds_the_running_record_and_follows_it() -> None:
    spec = replace(SPEC, cancel=True)
    d = m.decide(obs(replica(0), spec=spec,
                     memory=Memory(probes={0: Lookup(record=record())})))
    assert not isinstance(d.step, Finish), "never 'nothing was dispatched' for a running record"
    assert d.patch is not None and d.patch["assignment"]["ordinal"] == 0


def test_a_cancel_waits_for_a_silent_replica_before_any_verdict() -> None:
    d = m.decide(obs(replica(0), replica(1, up=False), spec=replace(SPEC, cancel=True),
                     memory=Memory(probes={0: Lookup()})))
    assert isinstance(d.step, Wait) and d.step.reason == Reason.WAITING_FOR_REPLICAS


def test_a_closed_gate_is_decided_after_the_probe_and_a_refusal_finishes() -> None:
    closed = Gate(open=False, message="predecessor unresolved")
    assert isinstance(m.decide(obs(replica(0), gate=closed)).step, Probe)
    d = m.decide(obs(replica(0), gate=closed, memory=Memory(probes={0: Lookup()})))
    assert isinstance(d.step, Wait) and d.patch["reason"] == "PredecessorUnresolved"  # type: ignore
    refusal = m.outcome.invalid_spec("predecessor_happened", "no")
    d = m.decide(obs(replica(0), gate=Gate(open=False, refusal=refusal),
                     memory=Memory(probes={0: Lookup()})))
    assert isinstance(d.step, Finish) and d.step.verdict is refusal


def test_a_successor_whose_own_action_is_known_attaches_whatever_the_gate_says() -> None:
    """A re-applied successor whose predecessor was deleted finds its own record."""
    closed = Gate(open=False, message="predecessor not found")
    done = record(Status.COMPLETED)
    d = m.decide(obs(replica(0), gate=closed, memory=Memory(probes={0: Lookup(record=done)})))
    assert isinstance(d.step, m.ReadEffects), "the record is attached to (its effects read)"
    assert d.patch is None or d.patch.get("reason") != "PredecessorUnresolved"


def test_no_crew_waits_pending() -> None:
    d = m.decide(obs(crew=False))
    assert isinstance(d.step, Wait) and d.patch["reason"] == "CrewNotFound"  # type: ignore


def test_invalid_spec_finishes() -> None:
    d = m.decide(obs(replica(0), spec=SpecError("invalid_spec", "bad")))
    assert isinstance(d.step, Finish) and d.step.verdict.reason is Reason.INVALID_SPEC


# --- after the admission ---
def test_lost_answer_is_running_uncertain_answer_lost_with_recovery_and_a_warning() -> None:
    d = m.decide(obs(replica(0), status=assigned(), memory=Memory(admission=TRANSPORT_LOST)))
    assert isinstance(d.step, Wait) and d.step.seconds > 0
    assert d.patch is not None
    assert (d.patch["phase"], d.patch["reason"], d.patch["uncertainOutcome"]) == (
        "Running", "AnswerLost", True)
    assert d.patch["recovery"] and d.warning is not None
    assert d.memory.failures == 1


def test_backoff_is_capped() -> None:
    s = m.MachineSettings()
    assert [s.backoff(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert s.backoff(50) == s.backoff_cap_seconds


def test_after_a_lost_answer_the_assigned_replica_is_asked_and_only_it_is_readmitted() -> None:
    status = {**assigned(), "uncertainOutcome": True, "reason": "AnswerLost"}
    d = m.decide(obs(replica(0), replica(1), status=status))
    assert isinstance(d.step, Lookup_) and d.step.replica.ordinal == 0
    d = m.decide(obs(replica(0), replica(1), status=status, memory=Memory(lookup=Lookup())))
    assert isinstance(d.step, Admit) and d.step.replica.ordinal == 0  # exact repeat, same journal
    assert d.step.journal_id == "j0", "a repeated admission names the assigned journal"


def test_lookup_failures_keep_waiting_while_the_replica_exists() -> None:
    status = {**assigned(), "uncertainOutcome": True, "reason": "AnswerLost"}
    mem = Memory(lookup=REFUSED, failures=30)
    d = m.decide(obs(replica(0), status=status, memory=mem, now=NOW + 10_000))
    assert isinstance(d.step, Wait) and d.step.seconds == m.MachineSettings().backoff_cap_seconds
    assert d.patch is None or d.patch["phase"] == "Running"


def test_a_record_settles_answer_lost() -> None:
    status = {**assigned(), "uncertainOutcome": True, "reason": "AnswerLost"}
    d = m.decide(obs(replica(0), status=status, memory=Memory(lookup=Lookup(record=record()))))
    assert isinstance(d.step, Follow)
    assert d.patch is not None and d.patch["uncertainOutcome"] is False


def test_a_lookup_answered_from_another_journal_waits_while_the_crew_lists_the_assigned_one(
) -> None:
    """I4: the address may reach a replaced pod on a renamed claim (or a reused pod IP): one
    answer proves nothing about the assigned journal. Only the Crew's entry decides."""
    answer = Memory(lookup=Lookup(journal_id="j-new"))
    d = m.decide(obs(replica(0), status=assigned(), memory=answer))
    assert isinstance(d.step, Wait) and d.patch is not None
    assert (d.patch["phase"], d.patch["reason"]) == ("Running", "ReplicaUnavailable")
    assert "not from the assigned journal j0" in d.patch["message"]
    assert d.memory.lookup is None, "the next pass asks again"
    lost = m.decide(obs(replica(0, journal="j-new"), status=assigned(), memory=d.memory))
    assert isinstance(lost.step, Finish) and lost.step.verdict.reason is Reason.JOURNAL_LOST
    elsewhere = Replica(ordinal=0, pod="research-0", claim="team-state", address="10.0.0.9:8090",
                        journal_id="j-new", ready=True, fenced=False, state=ReplicaState.ACTIVE)
    moved = m.decide(obs(elsewhere, status=assigned(), memory=d.memory, claim_exists=True))
    assert isinstance(moved.step, Wait) and moved.patch is not None
    assert "no longer serves the assigned claim state-0" in moved.patch["message"]


def test_an_admission_refused_by_another_journal_waits_and_is_never_sent_elsewhere() -> None:
    """412 journal_mismatch: the address reaches another journal, which admitted nothing."""
    refused = SidecarFailure(FailureCategory.PERMANENT, "journal_mismatch", "other journal", 412)
    d = m.decide(obs(replica(0), replica(1), status=assigned(),
                     memory=Memory(admission=refused)))
    assert isinstance(d.step, Wait) and d.patch is not None
    assert (d.patch["phase"], d.patch["reason"]) == ("Running", "ReplicaUnavailable")
    assert "admitted nothing" in d.patch["message"] and d.patch.get("assignment") is None
    assert not d.patch.get("uncertainOutcome")


def test_admission_answer_with_another_journal_is_journal_lost() -> None:
    adm = Admission(202, record(), "other", 0.01)
    d = m.decide(obs(replica(0), status=assigned(), memory=Memory(admission=adm)))
    assert isinstance(d.step, Finish) and d.step.verdict.reason is Reason.JOURNAL_LOST


@pytest.mark.parametrize(("status", "code", "reason"), [
    (507, "journal_full", Reason.JOURNAL_FULL), (429, "busy", Reason.SIDECAR_BUSY),
    (503, "draining", Reason.REPLICA_DRAINING)])
def test_not_admitted_answers_wait_certain(status: int, code: str, reason: Reason) -> None:
    exc = SidecarFailure(FailureCategory.TEMPORARY, code, "x", status, uncertain=True)
    d = m.decide(obs(replica(0), status=assigned(), memory=Memory(admission=exc)))
    assert isinstance(d.step, Wait) and d.patch is not None
    assert d.patch["reason"] == reason and "uncertainOutcome" not in d.patch


def _full_507() -> SidecarFailure:
    return SidecarFailure(FailureCategory.TEMPORARY, "journal_full", "full", 507, uncertain=True)


def test_a_full_journal_sends_the_job_where_there_is_room() -> None:
    """507 promises nothing was admitted: past the settle window (no earlier POST can land)
    and a lookup that finds nothing, the assignment is cleared, the full journal passed over,
    and the job admitted on a replica with room; Pending meanwhile."""
    spec = next(replace(SPEC, action_id=f"team-a/full-{i}") for i in range(100)
                if m.choose_ordinal(f"team-a/full-{i}", [0, 1]) == 0)
    replicas = (replica(0), replica(1))
    d = m.decide(obs(*replicas, spec=spec, status=assigned(0),
                     memory=Memory(admission=_full_507())))
    assert isinstance(d.step, Wait) and d.patch is not None
    assert (d.patch["phase"], d.patch["reason"]) == ("Pending", "JournalFull")
    status = {**assigned(0), **d.patch}
    # Within the settle window the same replica is asked again (an exact repeat): never moved.
    d = m.decide(obs(*replicas, spec=spec, status=status, memory=Memory(lookup=Lookup()),
                     now=NOW + 5))
    assert isinstance(d.step, Admit) and d.step.replica.ordinal == 0
    d = m.decide(obs(*replicas, spec=spec, status=status, memory=Memory(lookup=Lookup()),
                     now=NOW + 60))
    assert d.patch is not None and d.patch["assignment"] is None
    assert d.patch["journalFull"][0]["ordinal"] == 0 and d.memory.probes == {}
    status = {**status, **d.patch}
    d = m.decide(obs(*replicas, spec=spec, status=status, now=NOW + 61,
                     memory=Memory(probes={0: Lookup(), 1: Lookup()})))
    assert isinstance(d.step, Admit) and d.step.replica.ordinal == 1, "sent where there is room"


def test_every_journal_full_waits_pending_then_tries_again() -> None:
    full = [{"ordinal": 0, "journalId": "j0", "at": m.iso(NOW)}]
    probes = Memory(probes={0: Lookup()})
    d = m.decide(obs(replica(0), status={"journalFull": full}, memory=probes, now=NOW + 1))
    assert isinstance(d.step, Wait) and d.patch is not None
    assert (d.patch["phase"], d.patch["reason"]) == ("Pending", "JournalFull")
    later = NOW + m.MachineSettings().full_retry_seconds + 1
    d = m.decide(obs(replica(0), status={"journalFull": full}, memory=probes, now=later))
    assert isinstance(d.step, Admit), "a full journal may have room again later"
    other = m.decide(obs(replica(0, journal="jNew"), status={"journalFull": full},
                         memory=probes, now=NOW + 1))
    assert isinstance(other.step, Admit), "a different journal is not the full one"


def test_definitive_refusal_finishes_but_not_while_an_earlier_post_may_land() -> None:
    exc = SidecarFailure(FailureCategory.PERMANENT, "invalid_input", "x", 422)
    d = m.decide(obs(replica(0), status=assigned(), memory=Memory(admission=exc)))
    assert isinstance(d.step, Finish) and d.step.verdict.reason is Reason.REJECTED
    lost = {**assigned(), "uncertainOutcome": True, "reason": "AnswerLost"}
    d = m.decide(obs(replica(0), status=lost, memory=Memory(admission=exc)))
    assert isinstance(d.step, Wait)


def test_a_draining_assigned_replica_without_the_action_is_reassigned_after_settling() -> None:
    drain = replica(0, state=ReplicaState.DRAINING, ready=False)
    d = m.decide(obs(drain, replica(1), status=assigned(), memory=Memory(lookup=Lookup()),
                     now=NOW + 1))
    assert isinstance(d.step, Wait) and "assignment" not in (d.patch or {})
    d = m.decide(obs(drain, replica(1), status=assigned(), memory=Memory(lookup=Lookup()),
                     now=NOW + 60))
    assert d.patch is not None and d.patch["assignment"] is None


def test_terminal_record_finishes_with_the_records_verdict() -> None:
    rec = record(Status.COMPLETED, uncertain=True)
    d = m.decide(obs(replica(0), status=assigned(),
                     memory=Memory(effects=covered(), lookup=Lookup(record=rec))))
    assert isinstance(d.step, Finish)
    assert (d.step.verdict.phase, d.step.verdict.uncertain) == (Phase.SUCCEEDED, True)
    assert d.patch is not None and d.patch["output"]["value"] == "out"
    assert d.step.configmap is None and "configMap" not in d.patch["output"], \
        "an output that fits in status needs no ConfigMap"


def test_an_output_larger_than_status_holds_goes_to_this_crewjobs_configmap() -> None:
    big = "x" * (STATUS_VALUE_MAX_BYTES + 1)
    rec = replace(record(Status.COMPLETED), output=big)
    d = m.decide(obs(replica(0), status=assigned(),
                     memory=Memory(effects=covered(), lookup=Lookup(record=rec))))
    assert isinstance(d.step, Finish) and d.step.configmap == m.configmap_name("job-1")
    assert d.step.output is not None and d.step.output.configmap_value == big
    out = (d.patch or {})["output"]
    assert out["truncated"] is True and out["configMap"]["name"] == "job-1-output"
    assert out["size"] == len(big) and len(out["sha256"]) == 64


def test_record_vanishing_after_it_was_seen_is_journal_lost() -> None:
    d = m.decide(obs(replica(0), status=assigned(),
                     memory=Memory(lookup=Lookup(), admitted=True)))
    assert isinstance(d.step, Finish) and d.step.verdict.reason is Reason.JOURNAL_LOST


def test_changed_journal_on_the_crew_is_journal_lost() -> None:
    d = m.decide(obs(replica(0, journal="jX"), status=assigned()))
    assert isinstance(d.step, Finish) and d.step.verdict.uncertain
    assert d.patch is not None and d.patch["failure"]["code"] == "journal_changed"


def test_crew_gone_waits_then_journal_lost_within_the_bound() -> None:
    d = m.decide(obs(status=assigned(), crew=False))
    assert isinstance(d.step, Wait) and d.memory.gone_since == NOW
    grace = m.MachineSettings().gone_grace_seconds
    d = m.decide(obs(status=assigned(), crew=False, memory=d.memory, now=NOW + grace))
    assert isinstance(d.step, Finish)
    assert (d.step.verdict.reason, d.step.verdict.uncertain) == (Reason.JOURNAL_LOST, True)
    assert d.patch is not None and d.patch["failure"]["code"] == "crew_deleted"


@pytest.mark.parametrize("exists", [True, None])
def test_a_deleted_crew_whose_claim_lives_on_waits_and_never_loses_the_journal(
        exists: bool | None) -> None:
    """I4: ``kubectl delete crew --cascade=orphan`` (or a GitOps re-creation) leaves pod and
    claim; an unreadable claim is no evidence either."""
    d = m.decide(obs(status=assigned(), crew=False, claim_exists=exists,
                     memory=Memory(gone_since=NOW - 10_000)))
    assert isinstance(d.step, Wait) and d.patch is not None
    assert d.patch["reason"] == "CrewNotFound" and "state-0" in d.patch["message"]
    assert not d.patch.get("uncertainOutcome")


@pytest.mark.parametrize("exists", [True, None])
def test_a_renamed_or_unlisted_claim_that_exists_is_waited_for(exists: bool | None) -> None:
    renamed = Replica(ordinal=0, pod="research-0", claim="other-claim", address="10.0.0.0:8090",
                      journal_id="j0", ready=True, fenced=False)
    for replicas in ((renamed,), (replica(1),)):
        d = m.decide(obs(*replicas, status=assigned(0), claim_exists=exists,
                         memory=Memory(gone_since=NOW - 10_000)))
        assert isinstance(d.step, Wait) and d.patch is not None
        assert d.patch["reason"] == "ReplicaUnavailable" and "state-0" in d.patch["message"]


def test_claim_gone_is_journal_lost_but_a_retained_claim_is_waited_for() -> None:
    d = m.decide(obs(replica(1), status=assigned(0), memory=Memory(gone_since=NOW - 100)))
    assert isinstance(d.step, Finish) and d.patch["failure"]["code"] == "claim_gone"  # type: ignore
    kept = replica(0, state=ReplicaState.RETAINED, up=False)
    d = m.decide(obs(kept, status=assigned(0), memory=Memory(failures=3), now=NOW + 10_000))
    assert isinstance(d.step, Wait) and d.patch is not None
    assert d.patch["reason"] == "ReplicaUnavailable"


def test_invalid_stream_stays_running_uncertain_and_polls() -> None:
    bad = SidecarFailure(FailureCategory.CONNECTOR, "invalid_stream", "gap", None, True)
    d = m.decide(obs(replica(0), status=assigned(), memory=Memory(stream=bad)))
    assert d.patch is not None and d.patch["reason"] == "InvalidStream"
    assert d.patch["uncertainOutcome"] is True and d.memory.stream_invalid
    d = m.decide(obs(replica(0), status={**assigned(), **d.patch},
                     memory=replace(d.memory, lookup=Lookup(record=record()))))
    assert isinstance(d.step, Wait)  # polls the record, no Follow


# --- cancel ---
def test_cancel_goes_to_the_assigned_replica_and_is_retried() -> None:
    spec = replace(SPEC, cancel=True)
    d = m.decide(obs(replica(0), status=assigned(), spec=spec,
                     memory=Memory(lookup=Lookup(record=record()))))
    assert isinstance(d.step, Cancel) and d.patch is not None
    assert d.patch["cancellation"]["dispatched"] is True
    fail = SidecarFailure(FailureCategory.TEMPORARY, "http_503", "x", 503, True)
    d = m.decide(obs(replica(0), status={**assigned(), **d.patch}, spec=spec,
                     memory=Memory(cancel=fail)))
    assert isinstance(d.step, Wait) and d.memory.cancel_failures == 1
    d = m.decide(obs(replica(0), status=assigned(), spec=spec,
                     memory=replace(d.memory, lookup=Lookup(record=record()))))
    assert isinstance(d.step, Cancel)  # retried after the backoff wait


def test_cancel_with_nothing_admitted_waits_out_the_settle_window() -> None:
    spec = replace(SPEC, cancel=True)
    d = m.decide(obs(replica(0), status=assigned(), spec=spec, memory=Memory(lookup=Lookup()),
                     now=NOW + 1))
    assert isinstance(d.step, Wait)
    d = m.decide(obs(replica(0), status=assigned(), spec=spec, memory=Memory(lookup=Lookup()),
                     now=NOW + 60))
    assert isinstance(d.step, Finish)
    assert d.step.verdict.reason is Reason.CANCELLED_BEFORE_ADMISSION


# --- deletion ---
def test_deletion_without_assignment_releases_at_once() -> None:
    d = m.decide(obs(replica(0), deleting=True))
    assert isinstance(d.step, Release) and d.patch is None


@pytest.mark.parametrize("lookup", [
    Lookup(record=record(Status.FAILED, uncertain=True)),
    Lookup(tombstone={"status": "failed", "uncertain_outcome": True, "archived": True}),
])
def test_an_uncertain_record_found_on_deletion_is_announced(lookup: Lookup) -> None:
    """I5 in every path: the released CrewJob cannot show it in status any more, so the
    Warning Event and the metric (``uncertain_reason``) must."""
    d = m.decide(obs(replica(0), status=assigned(), deleting=True,
                     memory=Memory(lookup=lookup)))
    assert isinstance(d.step, Release) and d.warning is not None
    assert d.warning.uncertain_reason == Reason.RECORD_UNCERTAIN.value
    assert d.warning.reason == "OutcomeUncertainRecordUncertain"


def test_a_certain_record_found_on_deletion_is_released_quietly() -> None:
    d = m.decide(obs(replica(0), status=assigned(), deleting=True,
                     memory=Memory(lookup=Lookup(record=record(Status.COMPLETED)))))
    assert isinstance(d.step, Release) and d.warning is None


def test_deletion_looks_at_the_intended_replica_and_cancels_a_running_record() -> None:
    d = m.decide(obs(replica(0), status=assigned(), deleting=True))
    assert isinstance(d.step, Lookup_)
    d = m.decide(obs(replica(0), status=assigned(), deleting=True,
                     memory=replace(d.memory, lookup=Lookup(record=record()))))
    assert isinstance(d.step, Cancel) and d.patch is None
    d = m.decide(obs(replica(0), status=assigned(), deleting=True,
                     memory=replace(d.memory, cancel=record(Status.CANCELLED, uncertain=True))))
    assert isinstance(d.step, Release) and d.warning is not None


def test_deletion_during_the_post_waits_for_it_to_land() -> None:
    d = m.decide(obs(replica(0), status=assigned(), deleting=True,
                     memory=Memory(lookup=Lookup()), now=NOW + 1))
    assert isinstance(d.step, Wait)


def test_deletion_gives_up_after_the_bound_with_a_warning() -> None:
    mem = Memory(deletion_since=NOW - 100, lookup=REFUSED)
    d = m.decide(obs(replica(0), status=assigned(), deleting=True, memory=mem))
    assert isinstance(d.step, Release) and d.warning is not None


def test_orphan_deletion_releases() -> None:
    spec = replace(SPEC, deletion_policy=m.DeletionPolicy.ORPHAN)
    d = m.decide(obs(replica(0), status=assigned(), deleting=True, spec=spec))
    assert isinstance(d.step, Release)


# --- replicas as the Crew lists them ---
def test_parse_replicas_lists_draining_and_retained() -> None:
    crew = {"spec": {"replicas": 1}, "status": {
        "replicas": [{"ordinal": 0, "pod": "p0", "claim": "c0", "address": "a:1", "ready": True},
                     {"ordinal": 1, "pod": "p1", "claim": "c1", "address": "b:1"},
                     {"ordinal": 3, "pod": "p3", "claim": "c3", "state": "Retained"}],
        "retainedClaims": [{"ordinal": 2, "claim": "c2"}, {"ordinal": 3, "claim": "c3"}]}}
    got = {r.ordinal: r.state for r in parse_replicas(crew)}
    assert got == {0: ReplicaState.ACTIVE, 1: ReplicaState.DRAINING,
                   2: ReplicaState.RETAINED, 3: ReplicaState.RETAINED}


def test_an_unreadable_token_waits_instead_of_calling_the_sidecar() -> None:
    o = obs(replica(0), status=assigned())
    o = replace(o, crew=CrewView(o.crew.replicas, False))  # type: ignore[union-attr]
    d = m.decide(o)
    assert isinstance(d.step, Wait) and d.patch is not None
    assert d.patch["reason"] == "ReplicaUnavailable"
    d = m.decide(replace(o, deleting=True))
    assert isinstance(d.step, Wait)
