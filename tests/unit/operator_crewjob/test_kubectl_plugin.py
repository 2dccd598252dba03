"""The kubectl plugin's pure parts: the uncertain list, successor naming and spec, the
evidence text, and kubectl's flag conventions (the e2e test runs it through kubectl)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from crewfence_operator import kubectl_plugin as kp

NOW = datetime(2026, 11, 30, 22, 20, tzinfo=UTC).timestamp()


def job(name: str, status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns",
                         "creationTimestamp": "2026-11-30T20:00:00Z"},
            "spec": {"crewRef": {"name": "research"}, "operation": "run",
                     "input": {"topic": "t"}, **spec},
            "status": status}


def uncertain(since: str, **extra: Any) -> dict[str, Any]:
    return {"phase": "Failed", "reason": "Timeout", "uncertainOutcome": True,
            "assignment": {"ordinal": 1, "pod": "research-1"},
            "conditions": [{"type": "OutcomeUncertain", "status": "True", "reason": "Timeout",
                            "lastTransitionTime": since}], **extra}


def test_uncertain_lists_only_unresolved_uncertain_jobs_oldest_first() -> None:
    items = [
        job("newer", uncertain("2026-11-30T22:00:00Z")),
        job("older", uncertain("2026-11-30T21:00:00Z")),
        job("resolved", uncertain("2026-11-30T20:30:00Z",
                                  resolution={"outcome": "Happened"})),
        job("fine", {"phase": "Succeeded", "uncertainOutcome": False}),
    ]
    rows = kp.uncertain_rows(items, NOW)
    assert [r["name"] for r in rows] == ["older", "newer"]
    assert rows[0]["age"] == "1h" and rows[1]["age"] == "20m"
    assert rows[0]["reason"] == "Timeout" and rows[0]["replica"] == "research-1"


def test_successor_names_are_deterministic() -> None:
    assert kp.successor_name("report") == "report-rerun"
    assert kp.successor_name("report-rerun") == "report-rerun-2"
    assert kp.successor_name("report-rerun-2") == "report-rerun-3"


def test_successor_copies_the_spec_but_not_the_identity() -> None:
    pred = job("report", {}, timeoutMs=5000, actionId="custom", idempotencyKey="k",
               cancel=True, deletionPolicy="Orphan",
               resolution={"outcome": "NotHappened", "note": "n"})
    body = kp.successor_body(pred, "report-rerun")
    assert body["metadata"]["name"] == "report-rerun"
    assert body["spec"] == {"crewRef": {"name": "research"}, "operation": "run",
                            "input": {"topic": "t"}, "timeoutMs": 5000,
                            "deletionPolicy": "Orphan", "supersedes": "report"}


def test_explain_says_what_is_known_in_words() -> None:
    obj = job("report", uncertain("2026-11-30T21:00:00Z", recovery="Reconcile first.",
                                  cancellation={"requested": True, "dispatched": True}))
    text = kp.explain_text(kp.evidence(
        obj, {"status": "failed", "uncertain_outcome": True, "error": {"code": "timeout"},
              "event_count": 2},
        [{"sequence": 0, "event": "started", "data": {}},
         {"sequence": 1, "event": "failed", "data": {"status": "failed"}}], "from x"))
    assert "UNCERTAIN (Timeout)" in text
    assert "replica 1 (pod research-1" in text
    assert "#1 failed status=failed" in text
    assert "never proof that the provider stopped" in text
    assert "Recovery advice: Reconcile first." in text
    assert "kubectl crewfence resolve report" in text


def test_kubectl_flags_work_before_and_after_the_subcommand() -> None:
    parser = kp.build_parser()
    args = parser.parse_args(["-n", "a", "uncertain"])
    assert args.namespace == "a"
    args = parser.parse_args(["-n", "a", "uncertain", "-n", "b", "-o", "yaml"])
    assert (args.namespace, args.output) == ("b", "yaml")
    args = parser.parse_args(["resolve", "j", "--not-happened", "--note", "x",
                              "--evidence", "l1", "--evidence", "l2", "--context", "c"])
    assert (args.not_happened, args.evidence, args.context) == (True, ["l1", "l2"], "c")
