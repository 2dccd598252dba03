"""ttlSecondsAfterFinished on the real API server, with the journal's retention on.

A finished CrewJob is deleted by the operator once the Crew's default TTL passed; the record
ages out to a tombstone; the same manifest re-applied (as a GitOps tool would) is an exact
repeat, answered by the tombstone (Succeeded, reason Archived), never a second run (the
offline LLM's call counters do not move and the sidecar's admissions do not grow).
"""

from __future__ import annotations

import json

from crewjob_support import (
    apply_obj,
    crewjob_manifest,
    get_job,
    llm_calls,
    research_crew,
    sidecar_record,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness.handles import Cluster, Operator


def test_ttl_deleted_crewjob_recreated_is_an_exact_repeat_never_a_second_run(
        cluster: Cluster, operator_process: Operator, namespace: str) -> None:
    crew = research_crew(1)
    crew["spec"]["journal"] = {"retention": "2s"}
    crew["spec"]["crewJobDefaults"] = {"ttlSecondsAfterFinished": 2}
    assert apply_obj(cluster, crew, namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "research", 1)
    job = crewjob_manifest("gitops", "run", {"topic": "ttl then re-applied"})
    assert apply_obj(cluster, job, namespace).returncode == 0
    first = wait_phase(cluster, namespace, "gitops")["status"]
    assert first["phase"] == "Succeeded", json.dumps(first)
    wait_for(lambda: get_job(cluster, namespace, "gitops") is None, timeout=60,
             what="the operator to delete the finished CrewJob (Crew's default TTL)")
    action = f"{namespace}/gitops"
    wait_for(lambda: sidecar_record(cluster, namespace, "research", 0, action)[0] == 410,
             timeout=60, what="retention to archive the record to a tombstone")
    calls = llm_calls(cluster, namespace, "research")
    # the Crew default would delete it again: keep this one to look at it
    cluster.kubectl("patch", "crew", "research", "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"crewJobDefaults": {"ttlSecondsAfterFinished": 3600}}}),
                    check=True)
    assert apply_obj(cluster, job, namespace).returncode == 0
    again = wait_phase(cluster, namespace, "gitops")["status"]
    assert (again["phase"], again["reason"]) == ("Succeeded", "Archived"), json.dumps(again)
    assert again["uncertainOutcome"] is False
    assert llm_calls(cluster, namespace, "research") == calls  # nothing ran again
