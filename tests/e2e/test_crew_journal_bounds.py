"""Journal bounds on the real control plane (issue 19).

- Lowered journal bounds never brick a journal: ``spec.journal.maxRetainedRuns`` lowered
  below what replica 0's journal holds rolls the pod, which starts and stays Ready; the Crew's
  ``JournalFull`` condition names the field within one status pass; the records it holds
  still answer (the sidecar's lookup, and a deleted and re-applied CrewJob as an exact
  repeat, nothing run again).
- A full journal (507) admits nothing, so a new CrewJob waits ``Pending/JournalFull`` while
  no replica has room, and goes to a replica with room as soon as there is one.

Without the sidecar's change the rolled pod crash-loops ("holds 2 records, more than
CREWFENCE_MAX_RETAINED_RUNS=1") and the Crew shows only ``ReplicasNotReady``.
"""

from __future__ import annotations

import json
from typing import Any

from crewfence_operator.assignment import choose_ordinal
from crewjob_support import (
    apply_obj,
    condition,
    crew_replicas,
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

CREW = "research"


def _name_on(ns: str, ordinal: int, prefix: str) -> str:
    """A CrewJob name whose default action id is assigned to ``ordinal`` of replicas 0..1."""
    for i in range(200):
        name = f"{prefix}-{i}"
        if choose_ordinal(f"{ns}/{name}", [0, 1]) == ordinal:
            return name
    raise AssertionError("no name found")


def _patch_crew(cluster: Cluster, ns: str, spec: dict[str, Any]) -> None:
    cluster.kubectl("patch", "crew", CREW, "-n", ns, "--type=merge",
                    "-p", json.dumps({"spec": spec}), check=True)


def _crew_condition(cluster: Cluster, ns: str, ctype: str) -> dict[str, Any] | None:
    return condition(cluster.get_json("crew", CREW, "-n", ns) or {}, ctype)


def _run(cluster: Cluster, ns: str, name: str, topic: str) -> dict[str, Any]:
    assert apply_obj(cluster, crewjob_manifest(name, "run", {"topic": topic}),
                     ns).returncode == 0
    status: dict[str, Any] = wait_phase(cluster, ns, name)["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)
    return status


def test_a_lowered_record_bound_keeps_the_journal_serving_and_new_work_waits_or_moves(
        cluster: Cluster, operator_process: Operator, namespace: str) -> None:
    ns = namespace
    assert apply_obj(cluster, research_crew(1), ns).returncode == 0
    wait_crew_ready(cluster, ns, CREW, 1)
    kept = _run(cluster, ns, "kept", "bounds one")
    _run(cluster, ns, "other", "bounds two")
    pod_uid = cluster.get_json("pod", f"{CREW}-0", "-n", ns)["metadata"]["uid"]

    _patch_crew(cluster, ns, {"journal": {"maxRetainedRuns": 1}})

    def named() -> dict[str, Any] | None:
        cond = _crew_condition(cluster, ns, "JournalFull")
        ok = (cond is not None and cond["status"] == "True"
              and "replica 0 holds 2, spec.journal.maxRetainedRuns is 1" in cond["message"])
        return cond if ok else None

    cond = wait_for(named, timeout=240,
                    what="the Crew's JournalFull condition to name spec.journal.maxRetainedRuns")
    assert cond["reason"] == "JournalFull", cond
    pod = cluster.get_json("pod", f"{CREW}-0", "-n", ns)
    assert pod["metadata"]["uid"] != pod_uid, "the pod was rolled to the lowered bound"
    assert all(s.get("restartCount", 0) == 0
               for s in pod["status"].get("containerStatuses") or []), pod["status"]
    (entry,) = wait_crew_ready(cluster, ns, CREW, 1)
    assert entry["ready"] is True and entry["retainedRuns"] == 2, entry

    # Everything it holds still answers: the record, and the exact repeat of its CrewJob.
    status, record = sidecar_record(cluster, ns, CREW, 0, f"{ns}/kept")
    assert status == 200 and record is not None and record["status"] == "completed", record
    calls = llm_calls(cluster, ns, CREW)
    cluster.kubectl("delete", "crewjob", "kept", "-n", ns, "--wait=true", "--timeout=120s",
                    check=True)
    again = _run(cluster, ns, "kept", "bounds one")
    assert again["output"]["sha256"] == kept["output"]["sha256"]
    assert again["startedAt"] == kept["startedAt"]
    assert llm_calls(cluster, ns, CREW) == calls, "nothing ran again"

    # A new job has nowhere to go: Pending/JournalFull, nothing admitted.
    fresh = _name_on(ns, 0, "fresh")
    assert apply_obj(cluster, crewjob_manifest(fresh, "run", {"topic": "bounds three"}),
                     ns).returncode == 0

    def waiting() -> dict[str, Any] | None:
        st = (get_job(cluster, ns, fresh) or {}).get("status") or {}
        return st if (st.get("phase"), st.get("reason")) == ("Pending", "JournalFull") else None

    st = wait_for(waiting, timeout=120, what=f"{fresh} Pending/JournalFull")
    assert "journal_full" in st.get("message", ""), st
    assert sidecar_record(cluster, ns, CREW, 0, f"{ns}/{fresh}")[0] == 404

    # A replica with room appears: the job goes there (its action id prefers replica 0).
    _patch_crew(cluster, ns, {"replicas": 2})
    done = wait_phase(cluster, ns, fresh, timeout=300)["status"]
    assert done["phase"] == "Succeeded", json.dumps(done)
    assert done["assignment"]["pod"] == f"{CREW}-1", done["assignment"]
    assert sidecar_record(cluster, ns, CREW, 0, f"{ns}/{fresh}")[0] == 404
    assert len([r for r in crew_replicas(cluster, ns, CREW) if r.get("ready")]) == 2
