"""The journal's word, pure: the operator's supersedes gate decides from the predecessor's
journal (never its status), and a re-applied CrewJob's status mirrors the journaled finding
(crewjob/supersede.py ``precheck``/``from_journal``, crewjob/resolution.py ``conflict_patch``
and ``journaled_patch``, handlers/resolution.py ``has_a_step``)."""

from __future__ import annotations

from typing import Any

import pytest
from crewfence_operator.crewjob import resolution as res
from crewfence_operator.crewjob import supersede
from crewfence_operator.crewjob.supersede import Answer, Gate, JournalAnswer
from crewfence_operator.handlers.resolution import has_a_step

NOW = "2026-12-01T21:00:00Z"
JOURNALED = {"crew_id": "research", "outcome": "Happened", "note": "the mail went out",
             "evidence": ["https://tickets/1"], "resolved_by": "kubectl-patch",
             "recorded_at": "2026-12-01T20:00:00.000Z"}


def uncertain_status(**extra: Any) -> dict[str, Any]:
    return {"phase": "Failed", "reason": "SidecarRestarted", "uncertainOutcome": True,
            "observedGeneration": 1,
            "conditions": [{"type": "OutcomeUncertain", "status": "True",
                            "reason": "SidecarRestarted"}], **extra}


def from_journal(*answers: JournalAnswer) -> supersede.GateDecision:
    return supersede.from_journal(list(answers), predecessor_name="old",
                                  predecessor_action_id="ns/old", crew="research")


def precheck(pred: dict[str, Any] | None, *, name: str = "new", action_id: str = "ns/new",
             pred_action: str = "ns/old") -> supersede.GateDecision | None:
    return supersede.precheck(successor_name=name, successor_action_id=action_id,
                              predecessor=pred, predecessor_name="old",
                              predecessor_action_id=pred_action)


# --- the gate ----------------------------------------------------------------------------------
def test_precheck_never_admits_and_ignores_what_a_reapply_can_rewrite() -> None:
    """A re-applied predecessor's status says resolved NotHappened and no successor: the
    precheck still leaves the decision to the journal (None), never PROCEED."""
    rewritten = {"metadata": {"name": "old", "namespace": "ns"},
                 "status": uncertain_status(resolution={"outcome": "NotHappened"})}
    assert precheck(rewritten) is None
    assert precheck(None) is None  # a deleted predecessor: the journal is asked too
    running = precheck({"status": {"phase": "Running"}})
    assert running is not None and running.gate is Gate.WAIT
    self_ = precheck(None, name="old")
    assert self_ is not None and self_.code == "supersedes_self"
    same = precheck(None, action_id="ns/old")
    assert same is not None and same.code == "supersedes_same_action"


def test_only_a_journaled_claim_admits() -> None:
    assert from_journal(JournalAnswer(1, Answer.NOT_FOUND),
                        JournalAnswer(0, Answer.CLAIMED, outcome="Compensated")).proceed
    nowhere = from_journal(JournalAnswer(0, Answer.NOT_FOUND), JournalAnswer(1, Answer.NOT_FOUND))
    assert nowhere.gate is Gate.WAIT and nowhere.code == "predecessor_not_journaled"
    silent = from_journal(JournalAnswer(0, Answer.NOT_FOUND),
                          JournalAnswer(1, Answer.UNREACHABLE, message="refused"))
    assert silent.gate is Gate.WAIT and "replica(s) 1" in silent.message
    archived = from_journal(JournalAnswer(0, Answer.ARCHIVED))
    assert archived.gate is Gate.REFUSE and archived.code == "predecessor_archived"


@pytest.mark.parametrize(("code", "gate", "decided"), [
    ("happened", Gate.REFUSE, "predecessor_happened"),
    ("already_superseded", Gate.REFUSE, "already_superseded"),
    ("not_uncertain", Gate.REFUSE, "predecessor_not_uncertain"),
    ("unresolved", Gate.WAIT, "predecessor_unresolved"),
    ("job_running", Gate.WAIT, "predecessor_not_finished"),
    ("something_new", Gate.WAIT, "predecessor_journal_refused"),
])
def test_the_journals_refusal_decides(code: str, gate: Gate, decided: str) -> None:
    decision = from_journal(JournalAnswer(0, Answer.REFUSED, code=code, message="says no"))
    assert (decision.gate, decision.code) == (gate, decided)
    assert "says no" in decision.message


def test_the_plugins_status_check_sees_a_mirrored_claim_by_action_id() -> None:
    """The journal's claim mirrored into a re-applied predecessor has only the action id."""
    pred = {"metadata": {"name": "old", "namespace": "ns"},
            "status": uncertain_status(resolution={"outcome": "NotHappened", "note": "n"},
                                       supersededBy={"actionId": "ns/first"})}
    refused = supersede.decide(successor_name="new", successor_action_id="ns/new",
                               predecessor=pred, predecessor_name="old")
    assert refused.code == "already_superseded"
    own = supersede.decide(successor_name="first", successor_action_id="ns/first",
                           predecessor=pred, predecessor_name="old")
    assert own.proceed


# --- the predecessor's status mirrors the journal -----------------------------------------------
def test_a_disagreeing_spec_shows_the_conflict_and_the_journals_finding() -> None:
    spec_says = res.Resolution.from_spec({"outcome": "NotHappened", "note": "honest"})
    assert spec_says is not None
    status = uncertain_status()
    accepted = res.accepted_patch(status, spec_says, resolved_by="kubectl-client-side-apply",
                                  generation=1, now=NOW, journal_possible=True)
    status = {**status, **accepted}
    patch = res.conflict_patch(status, JOURNALED, sequence=3, spec_resolution=spec_says,
                               generation=1, now=NOW)
    record = patch["resolution"]
    assert (record["outcome"], record["note"], record["resolvedBy"]) == \
        ("Happened", "the mail went out", "kubectl-patch")
    assert record["journal"] == {"state": "Journaled", "sequence": 3,
                                 "message": "the journal holds this finding; spec.resolution "
                                            "disagrees"}
    assert record["previousReason"] == "SidecarRestarted"
    conds = {c["type"]: c for c in patch["conditions"]}
    assert conds["ResolutionConflict"]["status"] == "True"
    assert "NotHappened" in conds["ResolutionConflict"]["message"]
    assert conds["Resolved"]["reason"] == "Happened"
    assert conds["OutcomeUncertain"]["status"] == "False"
    assert not set(patch) & {"phase", "reason", "failure", "output", "uncertainOutcome"}

    # Level-triggered and settled: nothing more to do, and a refresh keeps the journal's one.
    settled = {**status, **patch}
    assert res.decide({"resolution": {"outcome": "NotHappened", "note": "honest"}}, settled,
                      1).step is res.Step.NOTHING
    clobbered = {**settled, "conditions": [*settled["conditions"][:-3],
                                           {"type": "OutcomeUncertain", "status": "True"},
                                           conds["ResolutionConflict"]]}
    refresh = res.accepted_patch(clobbered, spec_says, resolved_by="x", generation=1, now=NOW,
                                 journal_possible=True)
    assert refresh["resolution"]["outcome"] == "Happened"
    assert {c["type"]: c for c in refresh["conditions"]}["Resolved"]["reason"] == "Happened"


def test_a_reapplied_predecessor_shows_no_resolution_before_the_journal_answers() -> None:
    """Invariant (crewjob/resolution.py, status shows only a confirmed finding): a CrewJob
    with an assigned replica (a re-applied predecessor looks exactly like this) is resolved
    journal-first; until the journal answers, no patch carries ``status.resolution``; its
    answer (the same finding, or a disagreeing one) is what status shows."""
    spec = {"resolution": {"outcome": "NotHappened", "note": "honest"}}
    status = uncertain_status(assignment={"ordinal": 0, "pod": "research-0"})
    decision = res.decide(spec, status, 2)
    assert decision.step is res.Step.CONFIRM and decision.resolution is not None
    waiting = res.unconfirmed_patch(status, decision.resolution, "replica 0 unreachable",
                                    generation=2, now=NOW)
    assert "resolution" not in waiting
    conds = {c["type"]: c for c in waiting["conditions"]}
    assert (conds["Resolved"]["status"], conds["Resolved"]["reason"]) == \
        ("False", "JournalPending")
    assert conds["OutcomeUncertain"]["status"] == "True"  # still unresolved, visibly
    # level-triggered: still a step to take (the retry timer runs it again)
    assert res.decide(spec, {**status, **waiting}, 2).step is res.Step.CONFIRM
    assert has_a_step(spec, {**status, **waiting}, {"generation": 2})

    same = res.confirmed_patch(status, decision.resolution,
                               {**JOURNALED, "outcome": "NotHappened", "note": "honest"},
                               sequence=4, ordinal=0, successor={"successor_action_id": "ns/n"},
                               resolved_by="kubectl-client-side-apply", generation=2, now=NOW)
    assert same["resolution"]["outcome"] == "NotHappened"
    assert same["resolution"]["resolvedBy"] == "kubectl-patch"  # the journal's first writer
    assert same["resolution"]["resolvedAt"] == JOURNALED["recorded_at"]
    assert same["resolution"]["journal"]["state"] == "Journaled"
    assert same["supersededBy"] == {"actionId": "ns/n"}
    assert res.decide(spec, {**status, **same}, 2).step is res.Step.NOTHING

    # no assignment: no journal can hold the record, status records it directly
    assert res.decide(spec, uncertain_status(), 2).step is res.Step.ACCEPT


def test_an_exact_repeat_mirrors_the_first_writer_and_the_claim() -> None:
    patch = res.journaled_patch(JOURNALED, sequence=3, ordinal=0,
                                successor={"successor_action_id": "ns/next"})
    assert patch["resolution"]["journal"]["state"] == "Journaled"
    assert patch["resolution"]["resolvedBy"] == "kubectl-patch"
    assert patch["supersededBy"] == {"actionId": "ns/next"}
    assert "supersededBy" not in res.journaled_patch(JOURNALED, sequence=3, ordinal=0,
                                                     successor=None)


# --- the retry timer's filter --------------------------------------------------------------------
def test_the_retry_timer_runs_only_while_a_step_is_due() -> None:
    meta = {"name": "j", "namespace": "ns", "generation": 2}
    spec = {"resolution": {"outcome": "NotHappened", "note": "n"}}
    assert has_a_step(spec, uncertain_status(), meta)  # accept is due (it may have failed)
    assert not has_a_step({}, uncertain_status(), meta)
    assert not has_a_step(spec, {"phase": "Running"}, meta)  # the job's own event comes
    assert not has_a_step(spec, uncertain_status(), {**meta, "deletionTimestamp": NOW})
    pending = uncertain_status(observedGeneration=2, resolution={
        "outcome": "NotHappened", "note": "n", "journal": {"state": "Pending"}},
        conditions=[{"type": "OutcomeUncertain", "status": "False", "reason": "Resolved"}])
    assert has_a_step(spec, pending, meta)
    done = {**pending, "resolution": {**pending["resolution"],
                                      "journal": {"state": "Journaled"}}}
    assert not has_a_step(spec, done, meta)


def test_only_no_journal_at_all_lets_the_specs_finding_into_status() -> None:
    """Invariant (crewjob/resolution.py, an archived record keeps its finding): a 404 (no
    journal holds the action) records the spec's finding as not journaled; a 410 (a tombstone
    whose sidecar does not answer for its finding) waits: it may contradict the journaled
    one."""
    assert res.when_not_held(404) is res.NotHeld.ACCEPT_UNJOURNALED
    assert res.when_not_held(410) is res.NotHeld.WAIT


def test_an_archived_predecessor_refuses_and_names_the_journals_finding() -> None:
    said = ("this action was archived; it is never run again; its journaled resolution is "
            "NotHappened (journal event 4) and its one successor is action 'ns/next'")
    archived = from_journal(JournalAnswer(0, Answer.ARCHIVED, message=said))
    assert archived.gate is Gate.REFUSE and archived.code == "predecessor_archived"
    assert "NotHappened" in archived.message and "'ns/next'" in archived.message


def test_no_journal_holds_the_action_only_when_every_replica_and_the_assigned_one_said_so(
) -> None:
    """A tombstone handed over on scale-down lives on another replica, a re-used ordinal has
    a fresh journal: the assigned replica's 404 alone is not "held nowhere"."""
    assert not res.held_nowhere(listed={0, 1}, not_held={0})
    assert not res.held_nowhere(listed={0, 1}, not_held={1})  # 0 could not be asked
    assert res.held_nowhere(listed={0, 1}, not_held={0, 1})
    assert not res.held_nowhere(listed=set(), not_held=set())  # no Crew: nobody was asked
