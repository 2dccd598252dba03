"""The campaign checker over synthetic histories: a clean one passes, and each check fires on
a history broken in exactly its way (so no check is vacuous)."""

from __future__ import annotations

from campaign import checker
from campaign.history import EventSample, History, JobSample, OpRecord, RecordSample
from campaign.schedule import Op

UNCERTAIN_COND = (("OutcomeUncertain", "True", "SidecarRestarted"),)
RESOLVED_COND = (("OutcomeUncertain", "False", "Resolved"),)


def job(name: str, t: float = 1.0, **kw: object) -> JobSample:
    base: dict[str, object] = {"t": t, "name": name, "uid": f"uid-{name}",
                               "phase": "Succeeded", "action_id": f"ns/{name}", "ordinal": 0,
                               "started": True}
    base.update(kw)
    return JobSample(**base)  # type: ignore[arg-type]


def clean() -> History:
    """j1 succeeded once; j2 uncertain, resolved NotHappened, rerun once by j2-rerun;
    j3 uncertain and unresolved (condition, Event, gauge all present)."""
    h = History(seed=1, namespace="ns")
    h.tokens = {"j1": "tok-j1", "j2": "tok-j2", "j2-rerun": "tok-j2", "j3": "tok-j3"}
    h.ops = [OpRecord(0.5, Op(0, "apply"), "done", "j1"),
             OpRecord(0.6, Op(1, "sidecar_kill"), "done", "research-0")]
    j2 = dict(phase="Failed", reason="SidecarRestarted", uncertain=True)
    h.jobs = [
        job("j1", 1.0, phase="Running", started=True),
        job("j1", 2.0),
        job("j2", 2.0, **j2),
        job("j2", 3.0, resolution="NotHappened", superseded_by="j2-rerun", **j2),
        job("j2-rerun", 4.0, supersedes="j2", linked="j2"),
        job("j3", 4.0, **j3_fields()),
    ]
    h.records = [RecordSample(1.5, "ns/j1", 0, "running"), RecordSample(2.5, "ns/j1", 0,
                                                                        "completed")]
    h.final_jobs = [job("j1", 9.0),
                    job("j2", 9.0, resolution="NotHappened", conditions=RESOLVED_COND, **j2),
                    job("j2-rerun", 9.0, supersedes="j2", linked="j2"),
                    job("j3", 9.0, conditions=UNCERTAIN_COND, **j3_fields())]
    h.events = [EventSample("uid-j2", "j2", "Warning", "OutcomeUncertain"),
                EventSample("uid-j3", "j3", "Warning", "OutcomeUncertainSidecarRestarted")]
    h.unresolved_gauge = {"SidecarRestarted": 1.0}
    h.ledger = ["Research tok-j1 campaign and list the key facts.",
                "Write a three-sentence summary of the research on tok-j1 campaign.",
                "Research tok-j2 campaign and list the key facts.",
                "Research tok-j2 campaign and list the key facts.",  # the rerun's
                "Research tok-j3 campaign and list the key facts."]
    return h


def j3_fields() -> dict[str, object]:
    return dict(phase="Failed", reason="SidecarRestarted", uncertain=True)


def checks(h: History) -> set[str]:
    return {a.check for a in checker.check(h)}


def test_a_clean_history_has_no_anomaly() -> None:
    assert checker.check(clean()) == []


def test_a_second_execution_is_caught_by_the_ledger() -> None:
    h = clean()
    h.ledger.append("Research tok-j1 campaign and list the key facts.")
    found = checker.check(h)
    assert [a.check for a in found] == ["at_most_once"]
    assert "executed 2 times, at most 1" in found[0].detail


def test_a_ledger_that_misses_a_success_is_caught() -> None:
    h = clean()
    h.ledger = [t for t in h.ledger if "tok-j1" not in t]
    assert [(a.check, a.subject) for a in checker.check(h)] == [("ledger_blind", "j1")]


def test_a_token_that_is_a_prefix_of_another_is_not_confused() -> None:
    h = clean()
    h.tokens["j10"] = "tok-j10"
    h.ledger.append("Research tok-j10 campaign and list the key facts.")
    assert checker.check(h) == []


def test_a_third_execution_of_a_rerun_family_is_caught() -> None:
    h = clean()
    h.ledger.append("Research tok-j2 campaign and list the key facts.")
    assert checks(h) == {"at_most_once"}


def test_two_admitted_successors_are_caught() -> None:
    h = clean()
    h.tokens["j2-alt"] = "tok-j2-alt"
    h.jobs.append(job("j2-alt", 5.0, supersedes="j2", linked="j2"))
    h.ledger.append("Research tok-j2-alt campaign and list the key facts.")
    assert checks(h) == {"one_successor"}


def test_a_refused_successor_is_no_successor() -> None:
    h = clean()
    h.tokens["j2-alt"] = "tok-j2-alt"
    h.jobs.append(job("j2-alt", 5.0, supersedes="j2", phase="Pending",
                      reason="PredecessorUnresolved", ordinal=None, started=False))
    assert checker.check(h) == []


def test_two_successors_of_a_recreated_predecessor_are_an_anomaly() -> None:
    h = clean()
    h.tokens["j2-alt"] = "tok-j2-alt"
    h.jobs.append(job("j2", 5.0, uid="uid-j2-again", phase="Failed", reason="SidecarRestarted",
                      uncertain=True, resolution="NotHappened"))
    h.jobs.append(job("j2-alt", 6.0, supersedes="j2", linked="j2"))
    h.ledger.append("Research tok-j2-alt campaign and list the key facts.")
    found = checker.check(h)
    assert [a.check for a in found] == ["one_successor"]
    assert checker.hard(found) == found and "re-created" in found[0].detail


def test_contradicting_resolutions_of_one_action_are_an_anomaly() -> None:
    h = clean()
    h.jobs.append(job("j2", 5.0, uid="uid-j2-again", phase="Failed", uncertain=True,
                      resolution="Happened"))
    found = checker.check(h)
    assert [a.check for a in found] == ["resolution_consistent"]
    assert "Happened" in found[0].detail and "NotHappened" in found[0].detail
    assert checker.hard(found) == found


def test_the_same_resolution_seen_again_is_consistent() -> None:
    h = clean()
    h.jobs.append(job("j2", 5.0, uid="uid-j2-again", phase="Failed", uncertain=True,
                      resolution="NotHappened"))
    assert checker.check(h) == []


def test_a_successor_of_an_unresolved_or_happened_predecessor_is_caught() -> None:
    for resolution in ("", "Happened"):
        h = clean()
        h.tokens["j3-rerun"] = "tok-j3"
        h.jobs.append(job("j3", 5.0, resolution=resolution, **j3_fields()))
        h.jobs.append(job("j3-rerun", 6.0, supersedes="j3", linked="j3"))
        h.ledger.append("Research tok-j3 campaign and list the key facts.")
        found = checker.check(h)
        assert [a.check for a in found] == ["successor_gate"], found


def test_a_certain_verdict_while_the_record_runs_is_caught() -> None:
    h = clean()
    h.records.append(RecordSample(2.2, "ns/j1", 0, "running"))
    found = checker.check(h)
    assert [a.check for a in found] == ["verdict_while_running"]
    assert found[0].subject == "j1"


def test_a_running_record_on_another_replica_or_before_the_verdict_is_fine() -> None:
    h = clean()
    h.records += [RecordSample(2.2, "ns/j1", 1, "running"), RecordSample(0.9, "ns/j1", 0,
                                                                         "running")]
    assert checker.check(h) == []


def test_an_uncertain_verdict_while_the_record_runs_is_not_this_check() -> None:
    h = clean()
    h.records.append(RecordSample(2.5, "ns/j2", 0, "running"))
    assert checker.check(h) == []


def test_an_uncertain_outcome_without_its_event_is_caught() -> None:
    h = clean()
    h.events = [e for e in h.events if e.uid != "uid-j3"]
    found = checker.check(h)
    assert [(a.check, a.subject) for a in found] == [("uncertain_visible", "j3")]
    assert "Warning Event" in found[0].detail


def test_an_event_of_an_earlier_incarnation_does_not_count() -> None:
    h = clean()
    h.events = [EventSample("uid-old" if e.uid == "uid-j3" else e.uid, e.name, e.type, e.reason)
                for e in h.events]
    assert checks(h) == {"uncertain_visible"}


def test_an_uncertain_outcome_without_its_condition_is_caught() -> None:
    h = clean()
    h.final_jobs[-1] = job("j3", 9.0, **j3_fields())
    found = checker.check(h)
    assert [a.check for a in found] == ["uncertain_visible"] and "condition" in found[0].detail


def test_a_condition_without_the_status_field_is_caught() -> None:
    h = clean()
    h.final_jobs[0] = job("j1", 9.0, conditions=UNCERTAIN_COND)
    assert checks(h) == {"uncertain_visible"}


def test_a_gauge_that_disagrees_with_the_objects_is_caught() -> None:
    for gauge in ({}, {"SidecarRestarted": 2.0}):
        h = clean()
        h.unresolved_gauge = gauge
        found = checker.check(h)
        assert [a.check for a in found] == ["uncertain_visible"] and "gauge" in found[0].detail


def test_the_summary_counts_operations_and_faults() -> None:
    s = clean().summary()
    assert (s["operations"], s["faults_total"], s["faults"]) == (2, 1, {"sidecar_kill": 1})
    assert s["uncertain"] == 2 and s["model_calls"] == 5


def test_a_saved_history_checks_the_same_after_loading() -> None:
    h = clean()
    h.ledger.append("Research tok-j1 campaign and list the key facts.")
    again = History.from_json(h.to_json())
    assert again == h
    assert checker.check(again) == checker.check(h) != []
