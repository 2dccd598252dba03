"""At most once for the Crew's whole life, on the real control plane: a person's resolution and
the one-successor claim are journal facts on the predecessor's replica, so deleting and
re-applying the predecessor's CrewJob (a new, empty status; a ``spec.resolution`` that CEL
transition rules do not check on create) never admits its work again; an identical re-applied
resolution is an exact repeat; a resolution step that failed on a transient API error is
taken again.

Uncertain outcomes are made as in test_crewjob_resolution.py: the replica's pod is killed
while a ``[[sleep:N]]`` job runs (``SidecarRestarted``; the journal survives on its claim).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from crewfence_operator import rbac
from crewjob_support import (
    apply_obj,
    condition,
    crewjob_manifest,
    get_job,
    research_crew,
    service_account_with_rules,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness.handles import Cluster, Operator
from test_crewjob_resolution import (
    UNSURE_INPUT,
    admissions,
    make_uncertain,
    patch_resolution,
    sidecar_events,
    wait_status,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def ns(cluster: Cluster, operator_process: Operator, namespace: str) -> str:
    assert apply_obj(cluster, research_crew(1), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "research", 1)
    return namespace


def journaled(status: dict[str, Any]) -> bool:
    return bool((status.get("resolution") or {}).get("journal", {}).get("state")
                == "Journaled")


def reapply(cluster: Cluster, ns: str, name: str, outcome: str, note: str) -> None:
    """Delete the CrewJob and apply its manifest again, now carrying ``spec.resolution``
    (written by kubectl apply: another field manager than the first resolution's)."""
    cluster.kubectl("delete", "crewjob", name, "-n", ns, "--wait=true", check=True)
    assert get_job(cluster, ns, name) is None
    manifest = crewjob_manifest(name, "run", UNSURE_INPUT, timeoutMs=600000,
                                resolution={"outcome": outcome, "note": note})
    applied = apply_obj(cluster, manifest, ns)
    assert applied.returncode == 0, applied.stderr


def resolutions_in_journal(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    return [e for e in sidecar_events(cluster, ns, f"{ns}/{name}")
            if e["event"] in ("resolution", "successor")]


def test_reapplied_with_another_resolution_shows_the_conflict_and_admits_nothing(
        cluster: Cluster, ns: str) -> None:
    make_uncertain(cluster, ns, ("sent",))
    assert patch_resolution(cluster, ns, "sent", "Happened", "the mail went out")\
        .returncode == 0
    wait_status(cluster, ns, "sent", journaled, "the Happened resolution to be journaled")

    reapply(cluster, ns, "sent", "NotHappened", "nothing went out, honest")
    obj = wait_status(cluster, ns, "sent",
                      lambda s: any(c.get("type") == "ResolutionConflict"
                                    and c.get("status") == "True"
                                    for c in s.get("conditions") or []),
                      "the re-applied CrewJob to show that it disagrees with the journal",
                      timeout=180)
    conflict = condition(obj, "ResolutionConflict")
    assert conflict is not None and "NotHappened" in conflict["message"] \
        and "Happened" in conflict["message"]
    status = obj["status"]
    assert status["resolution"]["outcome"] == "Happened"  # the journal's finding stands
    assert status["resolution"]["note"] == "the mail went out"
    assert (status["phase"], status["uncertainOutcome"]) == ("Failed", True)
    facts = resolutions_in_journal(cluster, ns, "sent")
    assert [(e["event"], e["data"]["outcome"]) for e in facts] == [("resolution", "Happened")]

    # The successor is refused on the journal's word, and nothing runs.
    before = admissions(cluster, ns)
    assert apply_obj(cluster, crewjob_manifest("sent-again", "run", {"topic": "x"},
                                               supersedes="sent"), ns).returncode == 0
    refused = wait_phase(cluster, ns, "sent-again")
    assert refused["status"]["phase"] == "Failed", json.dumps(refused["status"])
    assert refused["status"]["failure"]["code"] == "predecessor_happened"
    assert admissions(cluster, ns) == before
    # ... and the conflict is not retried: the journal holds one resolution, no successor.
    assert len(resolutions_in_journal(cluster, ns, "sent")) == 1


def test_reapplied_predecessor_whose_successor_ran_admits_no_second_one(
        cluster: Cluster, ns: str) -> None:
    make_uncertain(cluster, ns, ("paid",))
    assert patch_resolution(cluster, ns, "paid", "NotHappened", "no charge in the ledger")\
        .returncode == 0
    wait_status(cluster, ns, "paid", journaled, "the resolution to be journaled")
    before = admissions(cluster, ns)
    assert apply_obj(cluster, crewjob_manifest("paid-next", "run", {"topic": "pay"},
                                               supersedes="paid"), ns).returncode == 0
    assert wait_phase(cluster, ns, "paid-next")["status"]["phase"] == "Succeeded"
    assert admissions(cluster, ns) == before + 1

    # Re-applied (status.supersededBy gone, the same finding in spec.resolution): the
    # journal's claim is mirrored back, and a second successor is refused.
    reapply(cluster, ns, "paid", "NotHappened", "no charge in the ledger")
    obj = wait_status(cluster, ns, "paid",
                      lambda s: journaled(s) and (s.get("supersededBy") or {}).get("actionId"),
                      "the re-applied CrewJob to mirror the journaled claim", timeout=180)
    assert obj["status"]["supersededBy"]["actionId"] == f"{ns}/paid-next"
    assert apply_obj(cluster, crewjob_manifest("paid-twice", "run", {"topic": "pay"},
                                               supersedes="paid"), ns).returncode == 0
    second = wait_phase(cluster, ns, "paid-twice")
    assert second["status"]["phase"] == "Failed", json.dumps(second["status"])
    assert second["status"]["failure"]["code"] == "already_superseded"
    assert f"{ns}/paid-next" in second["status"]["failure"]["message"]
    assert admissions(cluster, ns) == before + 1
    facts = resolutions_in_journal(cluster, ns, "paid")
    assert [e["event"] for e in facts] == ["resolution", "successor"]
    assert facts[1]["data"]["successor_action_id"] == f"{ns}/paid-next"


def test_reapplied_identical_resolution_is_an_exact_repeat(cluster: Cluster, ns: str) -> None:
    make_uncertain(cluster, ns, ("same",))
    assert patch_resolution(cluster, ns, "same", "Compensated", "refunded by OPS-7")\
        .returncode == 0
    first = wait_status(cluster, ns, "same", journaled, "the resolution to be journaled")
    sequence = first["status"]["resolution"]["journal"]["sequence"]

    reapply(cluster, ns, "same", "Compensated", "refunded by OPS-7")
    obj = wait_status(cluster, ns, "same", journaled,
                      "the identical re-applied resolution to be accepted as journaled",
                      timeout=180)
    resolution = obj["status"]["resolution"]
    assert resolution["journal"]["sequence"] == sequence
    assert resolution["resolvedBy"] == "kubectl-patch"  # who wrote it first, from the journal
    assert condition(obj, "ResolutionConflict") is None
    assert len(resolutions_in_journal(cluster, ns, "same")) == 1

    # Settled: the operator stops writing (no retry loop). Watched for two retry-timer
    # periods (handlers/resolution.py TIMER_SECONDS = 10).
    version = obj["metadata"]["resourceVersion"]
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline:
        now = get_job(cluster, ns, "same") or {}
        assert now["metadata"]["resourceVersion"] == version, json.dumps(now.get("status"))
        time.sleep(2)


def _without_crewjob_status(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for rule in rules:
        resources = [r for r in rule.get("resources") or [] if r != "crewjobs/status"]
        if resources:
            out.append({**rule, "resources": resources})
    return out


def test_a_resolution_step_failing_on_a_transient_api_error_is_taken_again(
        cluster: Cluster, operator_factory: Callable[..., Operator], namespace: str) -> None:
    """The operator runs with exactly its RBAC; for a while it may not write CrewJob status
    (the API server answers 403, as it would any transient refusal). The resolution's one
    event is handled while the write fails; once the write is allowed again, the retry timer
    takes the step again: kopf never retries an ``on.event`` handler, and nothing else
    changes the finished CrewJob to send another event."""
    rules = rbac.rules(managed_webhook=True)
    with service_account_with_rules(cluster, "crewfence-retry", rules) as account:
        role = account.partition(":")[0]
        operator = operator_factory(service_account=account)
        assert apply_obj(cluster, research_crew(1), namespace).returncode == 0
        wait_crew_ready(cluster, namespace, "research", 1)
        make_uncertain(cluster, namespace, ("blip",))

        def set_rules(these: list[dict[str, Any]]) -> None:
            cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                           "metadata": {"name": role}, "rules": these})

        def may_write_status() -> str:
            return str(cluster.kubectl("auth", "can-i", "patch", "crewjobs",
                                       "--subresource=status", "-n", namespace,
                                       as_sa=account).stdout.strip())

        set_rules(_without_crewjob_status(rules))
        wait_for(lambda: may_write_status() == "no" or None, timeout=30,
                 what="the status write to be forbidden")
        offset = len(operator.logs())
        assert patch_resolution(cluster, namespace, "blip", "NotHappened", "nothing left")\
            .returncode == 0
        wait_for(lambda: "crewjobs/status" in operator.logs()[offset:] or None, timeout=60,
                 what="the operator's status write to be refused (403)")
        assert (get_job(cluster, namespace, "blip") or {})["status"].get("resolution") is None

        set_rules(rules)
        wait_for(lambda: may_write_status() == "yes" or None, timeout=30,
                 what="the status write to be allowed again")
        obj = wait_status(cluster, namespace, "blip", journaled,
                          "the resolution to be accepted and journaled after the error",
                          timeout=120)
        assert obj["status"]["resolution"]["outcome"] == "NotHappened"
        uncertain = condition(obj, "OutcomeUncertain")
        assert uncertain is not None and uncertain["reason"] == "Resolved"
        operator.stop()
