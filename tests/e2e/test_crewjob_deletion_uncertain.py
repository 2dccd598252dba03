"""An uncertain outcome is visible on deletion too (issue 19), on the real control plane.

A CrewJob is deleted while the operator is down; its sidecar is SIGKILLed meanwhile, so the
record it restores is ``failed`` with an uncertain outcome. The restarted operator's deletion
path finds that terminal uncertain record: the CrewJob goes (its status can no longer show
it), so the Warning Event ``OutcomeUncertainRecordUncertain`` on it and the
``crewfence_operator_uncertain_outcomes_total{reason="RecordUncertain"}`` metric must say so
(machine I5, ``_deleting``). Before, such a record was released with neither.
"""

from __future__ import annotations

from typing import Any

import pytest
from crewjob_support import (
    apply_obj,
    crewjob_manifest,
    get_job,
    operator_metric,
    research_crew,
    sidecar_record,
    wait_crew_ready,
    wait_for,
    wait_phase,
    wait_warning,
)
from harness.handles import Cluster, Operator, PodRunner

pytestmark = pytest.mark.slow

CREW = "research"
METRIC = "crewfence_operator_uncertain_outcomes_total"


def test_an_uncertain_record_found_on_deletion_emits_the_event_and_the_metric(
        cluster: Cluster, operator_process: Operator, pod_runner: PodRunner,
        namespace: str) -> None:
    ns, name = namespace, "doubt"
    assert apply_obj(cluster, research_crew(1), ns).returncode == 0
    wait_crew_ready(cluster, ns, CREW, 1)
    assert apply_obj(cluster, crewjob_manifest(name, "run", {"topic": "[[sleep:120]] doubt"}),
                     ns).returncode == 0
    running = wait_phase(cluster, ns, name, ("Running",), timeout=180)
    pod = running["status"]["assignment"]["pod"]

    operator_process.kill()
    assert not operator_process.alive()
    cluster.kubectl("delete", "crewjob", name, "-n", ns, "--wait=false", check=True)
    held = get_job(cluster, ns, name)
    assert held is not None and held["metadata"].get("deletionTimestamp")  # the finalizer holds
    pod_runner.kill(ns, pod)  # the sidecar: its restart makes the record failed + uncertain

    def restored() -> dict[str, Any] | None:
        try:
            code, record = sidecar_record(cluster, ns, CREW, 0, f"{ns}/{name}")
        except OSError:
            return None
        ok = code == 200 and record is not None and record["status"] == "failed"
        return record if ok else None

    record = wait_for(restored, timeout=180, what="the restarted sidecar's uncertain record")
    assert record["uncertain_outcome"] is True

    operator_process.start()
    wait_for(lambda: get_job(cluster, ns, name) is None, timeout=180,
             what="the deleted CrewJob released by the restarted operator")
    event = wait_warning(cluster, ns, name, "OutcomeUncertain")
    assert event["reason"] == "OutcomeUncertainRecordUncertain", event
    assert "CrewJob deleted" in event["message"] and "uncertain" in event["message"]
    assert operator_metric(operator_process.metrics_url, METRIC, "RecordUncertain") == 1
