"""No verdict before the probe, on the real control plane (issue 19, machine I6).

A CrewJob's status can be new while its action is not (GitOps prune and re-apply), so a
terminal verdict is written only once the probe said where the action lives:

- a running job deleted with ``deletionPolicy: Orphan`` (its record runs on) and re-applied
  with ``cancel: true`` cancels the record on the sidecar and ends with the record's verdict;
  before, it was finished ``Cancelled``, "nothing was dispatched", certain, without asking
  any replica, while the record ran on;
- a successor re-applied after it ran and its predecessor was deleted finds its own record
  (``Succeeded``, the same run, nothing admitted); before, it waited
  ``PredecessorUnresolved`` forever.
"""

from __future__ import annotations

import json

import pytest
from crewjob_support import (
    apply_obj,
    crewjob_manifest,
    delete_job,
    research_crew,
    sidecar_record,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness.handles import Cluster, Operator
from test_crewjob_resolution import UNSURE_INPUT, admissions, patch_resolution, wait_status

pytestmark = pytest.mark.slow


@pytest.fixture
def ns(cluster: Cluster, operator_process: Operator, namespace: str) -> str:
    assert apply_obj(cluster, research_crew(1), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "research", 1)
    return namespace


def test_a_reapplied_cancel_cancels_the_running_record_on_the_sidecar(
        cluster: Cluster, ns: str) -> None:
    name = "orphan-cancel"
    job = crewjob_manifest(name, "run", {"topic": "[[sleep:300]] orphan cancel"},
                           deletionPolicy="Orphan")
    assert apply_obj(cluster, job, ns).returncode == 0
    first = wait_phase(cluster, ns, name, ("Running",), timeout=180)["status"]
    delete_job(cluster, ns, name)
    code, record = sidecar_record(cluster, ns, "research", 0, f"{ns}/{name}")
    assert code == 200 and record is not None and record["status"] == "running", record
    before = admissions(cluster, ns)

    job["spec"]["cancel"] = True
    assert apply_obj(cluster, job, ns).returncode == 0  # the GitOps resync, now cancelling
    status = wait_phase(cluster, ns, name, timeout=180)["status"]
    assert status["phase"] == "Cancelled", json.dumps(status)
    assert "nothing was dispatched" not in json.dumps(status), json.dumps(status)
    assert status["assignment"]["ordinal"] == 0, json.dumps(status)
    if first.get("startedAt"):
        assert status["startedAt"] == first["startedAt"], "the original record's verdict"

    def cancelled() -> dict[str, object] | None:
        _, rec = sidecar_record(cluster, ns, "research", 0, f"{ns}/{name}")
        return rec if rec is not None and rec["status"] != "running" else None

    rec = wait_for(cancelled, timeout=60, what="the record to stop running")
    assert rec["status"] == "cancelled", rec
    assert admissions(cluster, ns) == before, "the re-applied object admitted nothing"


def test_a_reapplied_successor_whose_predecessor_is_gone_finds_its_own_record(
        cluster: Cluster, ns: str) -> None:
    """The predecessor ran under its own ``spec.actionId``: once its CrewJob is deleted, a
    re-applied successor (a new, empty status) cannot tell the gate where the predecessor's
    record is, so only the probe of its own action id can end it."""
    unsure = crewjob_manifest("flaky", "run", UNSURE_INPUT, timeoutMs=600000,
                              actionId="custom-flaky-action")
    assert apply_obj(cluster, unsure, ns).returncode == 0
    pod = wait_phase(cluster, ns, "flaky", ("Running",), timeout=180)["status"]["assignment"]["pod"]
    cluster.kubectl("delete", "pod", pod, "-n", ns, "--force", "--grace-period=0", check=True)
    assert wait_phase(cluster, ns, "flaky", timeout=300)["status"]["uncertainOutcome"] is True
    wait_crew_ready(cluster, ns, "research", 1)
    assert patch_resolution(cluster, ns, "flaky", "NotHappened", "nothing in the ledger") \
        .returncode == 0
    wait_status(cluster, ns, "flaky",
                lambda s: (s.get("resolution") or {}).get("journal", {}).get("state")
                == "Journaled", "the resolution to be journaled")
    successor = crewjob_manifest("flaky-next", "run", {"topic": "again"}, supersedes="flaky")
    assert apply_obj(cluster, successor, ns).returncode == 0
    ran = wait_phase(cluster, ns, "flaky-next")["status"]
    assert ran["phase"] == "Succeeded", json.dumps(ran)
    before = admissions(cluster, ns)

    # GitOps prune of both, then the successor's manifest alone comes back.
    delete_job(cluster, ns, "flaky-next")
    delete_job(cluster, ns, "flaky")
    assert apply_obj(cluster, successor, ns).returncode == 0
    again = wait_phase(cluster, ns, "flaky-next", timeout=180)["status"]
    assert again["phase"] == "Succeeded", json.dumps(again)
    assert again["startedAt"] == ran["startedAt"], "the successor's own record, not a new run"
    assert again["output"]["sha256"] == ran["output"]["sha256"]
    assert admissions(cluster, ns) == before, "nothing was admitted again"
