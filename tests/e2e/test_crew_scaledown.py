"""Draining scale-down on the real control plane (issue 9).

A replica above ``spec.replicas`` is switched to draining and stays reachable while its journal
holds unarchived records: a re-applied CrewJob finds its Action there instead of running it
again, a slow job finishes where it runs, the draining sidecar answers lookups and refuses
admissions, bulk archive leaves tombstones answering 410, a drained empty replica disappears
(its claim follows ``storage.whenScaled``), and 2 -> 1 -> 2 keeps every record reachable.

Everything goes through kubectl or the sidecar's own HTTP API the way the operator reaches
it (mutual TLS with the Crew's CA, the replica's name verified, and the Crew's token:
``crew_access``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from crewfence_operator.assignment import choose_ordinal
from crewjob_support import (
    SidecarAccess,
    apply_obj,
    crew_access,
    crew_replicas,
    crewjob_manifest,
    get_job,
    llm_calls,
    metric_total,
    research_crew,
    sidecar_get,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness.handles import Cluster, Operator

CREW = "research"


def _http(replica: dict[str, Any], method: str, path: str, access: SidecarAccess,
          body: Any = None,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    data = json.dumps(body).encode() if body is not None else None
    status, got, raw = access.exchange(
        replica, path, method=method, body=data, timeout=30,
        headers={"Content-Type": "application/json", **(headers or {})})
    return status, got, (json.loads(raw) if raw.startswith("{") else raw)


def _admissions(cluster: Cluster, ns: str) -> dict[int, float]:
    """New admissions per listed replica (``crewfence_sidecar_admissions_total``): an exact
    repeat does not count, a second run would. (The offline-LLM call counter is per process and
    jobs may run in worker processes, so it alone cannot prove that nothing ran.)"""
    access = crew_access(cluster, ns, CREW)
    out: dict[int, float] = {}
    for rep in crew_replicas(cluster, ns, CREW):
        if rep.get("address"):
            status, text = sidecar_get(rep, "/metrics", access)
            if status == 200:
                out[int(rep["ordinal"])] = metric_total(text,
                                                        "crewfence_sidecar_admissions_total")
    return out


def _name_on(ns: str, ordinal: int, prefix: str) -> str:
    """A CrewJob name whose default action id `<ns>/<name>` is assigned to `ordinal` of 0..1."""
    for i in range(200):
        name = f"{prefix}-{i}"
        if choose_ordinal(f"{ns}/{name}", [0, 1]) == ordinal:
            return name
    raise AssertionError("no name found")


def _crew(replicas: int, **spec: Any) -> dict[str, Any]:
    crew = research_crew(replicas)
    for key, value in spec.items():
        crew["spec"].setdefault(key, {}).update(value)
    return crew


def _scale(cluster: Cluster, ns: str, replicas: int) -> None:
    cluster.kubectl("patch", "crew", CREW, "-n", ns, "--type=merge",
                    "-p", json.dumps({"spec": {"replicas": replicas}}), check=True)


def _entry(cluster: Cluster, ns: str, ordinal: int) -> dict[str, Any] | None:
    return next((r for r in crew_replicas(cluster, ns, CREW) if r["ordinal"] == ordinal), None)


def _wait_draining(cluster: Cluster, ns: str, ordinal: int, *, idle: bool = True,
                   timeout: float = 120) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        e = _entry(cluster, ns, ordinal)
        ok = (e is not None and e.get("state") == "Draining" and e.get("draining") is True
              and e.get("address") and (not idle or e.get("activeRuns") == 0))
        return e if ok else None

    result: dict[str, Any] = wait_for(check, timeout=timeout,
                                      what=f"replica {ordinal} listed Draining, sidecar draining")
    return result


def _run_on(cluster: Cluster, ns: str, ordinal: int, prefix: str,
            topic: str = "draining") -> tuple[dict[str, Any], dict[str, Any]]:
    name = _name_on(ns, ordinal, prefix)
    job = crewjob_manifest(name, "run", {"topic": topic})
    assert apply_obj(cluster, job, ns).returncode == 0
    status = wait_phase(cluster, ns, name)["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)
    assert status["assignment"]["pod"] == f"{CREW}-{ordinal}", json.dumps(status["assignment"])
    return job, status


def _pods(cluster: Cluster, ns: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.get_json("pods", "-n", ns)["items"]
            if not p["metadata"].get("deletionTimestamp")}


def _claim(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = cluster.get_json("pvc", name, "-n", ns)
    return found


def test_reapplied_crewjob_finds_its_action_on_the_draining_replica(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    assert apply_obj(cluster, research_crew(2), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, CREW, 2)
    job, first = _run_on(cluster, namespace, 1, "again")
    name = job["metadata"]["name"]
    calls_before = llm_calls(cluster, namespace, CREW)
    assert calls_before.get(1, 0) > 0, "the first run's model calls (made in a worker) count"
    admitted_before = _admissions(cluster, namespace)
    assert admitted_before == {0: 0.0, 1: 1.0}, admitted_before

    _scale(cluster, namespace, 1)
    entry = _wait_draining(cluster, namespace, 1)
    assert entry["ready"] is False and entry["unarchivedRecords"] == 1
    assert f"{CREW}-1" in _pods(cluster, namespace), "the pod stays while its journal holds records"
    access = crew_access(cluster, namespace, CREW)

    # The draining sidecar answers lookups and refuses admissions with its own code.
    action = f"{namespace}/{name}"
    code, text = sidecar_get(entry, f"/jobs/{quote(action, safe='')}", access)
    assert code == 200 and json.loads(text)["status"] == "completed"
    status, headers, body = _http(
        entry, "POST", "/jobs", access,
        {"crew_id": CREW, "action_id": "while-draining", "operation": "run",
         "input": {"topic": "nope"}}, {"Idempotency-Key": "while-draining"})
    assert status == 503 and "Retry-After" in headers, (status, body)
    assert body.get("code") == "draining" or (body.get("error") or {}).get("code") == "draining"

    # GitOps prune + resync: the same manifest again is an exact repeat, not a second run.
    cluster.kubectl("delete", "crewjob", name, "-n", namespace, "--wait=true", "--timeout=120s",
                    check=True)
    assert get_job(cluster, namespace, name) is None
    assert apply_obj(cluster, job, namespace).returncode == 0
    second = wait_phase(cluster, namespace, name)["status"]
    assert second["phase"] == "Succeeded", json.dumps(second)
    assert second["startedAt"] == first["startedAt"]
    assert second["finishedAt"] == first["finishedAt"]
    assert second["assignment"]["pod"] == f"{CREW}-1"
    assert llm_calls(cluster, namespace, CREW) == calls_before, "nothing ran again"
    assert _admissions(cluster, namespace) == admitted_before, "nothing was admitted again"


def test_slow_job_on_the_replica_scaled_away_finishes(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    assert apply_obj(cluster, research_crew(2), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, CREW, 2)
    name = _name_on(namespace, 1, "slow")
    assert apply_obj(cluster, crewjob_manifest(name, "run", {"topic": "[[sleep:8]] slow"}),
                     namespace).returncode == 0
    running = wait_phase(cluster, namespace, name, ("Running",), timeout=120)["status"]
    assert running["assignment"]["pod"] == f"{CREW}-1"

    _scale(cluster, namespace, 1)
    busy = _wait_draining(cluster, namespace, 1, idle=False, timeout=60)
    assert busy["ready"] is False
    done = wait_phase(cluster, namespace, name, timeout=180)["status"]
    assert done["phase"] == "Succeeded", json.dumps(done)
    assert done["uncertainOutcome"] is False
    assert done["assignment"]["pod"] == f"{CREW}-1"
    idle = _wait_draining(cluster, namespace, 1)
    assert idle["unarchivedRecords"] == 1 and f"{CREW}-1" in _pods(cluster, namespace)


def test_bulk_archive_tombstones_then_the_drained_replica_goes_and_its_claim_stays(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    assert apply_obj(cluster, research_crew(2), namespace).returncode == 0
    replicas = {r["ordinal"]: r for r in wait_crew_ready(cluster, namespace, CREW, 2)}
    access = crew_access(cluster, namespace, CREW)
    # A record made straight on replica 1, so the test knows the exact request to repeat.
    action = "bulk-archive-1"
    request = {"crew_id": CREW, "action_id": action, "operation": "run",
               "input": {"topic": "tombstones"}}
    made, _, record = _http(replicas[1], "POST", "/jobs", access, request,
                            {"Idempotency-Key": action})
    assert made == 200, record
    _scale(cluster, namespace, 1)
    entry = _wait_draining(cluster, namespace, 1)
    assert entry["unarchivedRecords"] == 1

    refused, _, _ = _http(entry, "POST", "/admin/archive", access,
                          {"older_than_seconds": 0})
    assert refused in (400, 428), "bulk archive needs its confirmation header"
    status, _, body = _http(entry, "POST", "/admin/archive", access,
                            {"older_than_seconds": 0},
                            {"X-AIP-Archive-Confirmation": "older-than:0"})
    assert status == 200 and body["archived"] == [action] and body["count"] == 1, body
    # Tombstones: a lookup and an identical request both answer 410, nothing runs.
    assert sidecar_get(entry, f"/jobs/{quote(action, safe='')}", access)[0] == 410
    gone, _, _ = _http(entry, "POST", "/jobs", access, request,
                       {"Idempotency-Key": action})
    assert gone == 410

    def removed() -> bool:
        listed = [r["ordinal"] for r in crew_replicas(cluster, namespace, CREW)]
        return listed == [0] and f"{CREW}-1" not in _pods(cluster, namespace)

    wait_for(removed, timeout=120, what="the drained, empty replica to disappear")
    claim = _claim(cluster, namespace, f"{CREW}-state-1")
    assert claim is not None and not claim["metadata"].get("deletionTimestamp"), \
        "storage.whenScaled defaults to Retain"
    crew = cluster.get_json("crew", CREW, "-n", namespace)
    assert not crew["status"].get("retainedClaims")


def test_a_removed_replicas_tombstone_still_refuses_a_second_run(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    """Issue 19, invariant "a tombstone outlives its replica": an Action that ran on replica 1
    and was archived there is not run again after replica 1 is scaled away and removed; the
    re-applied manifest ends with the archived outcome, and no replica admits anything."""
    assert apply_obj(cluster, research_crew(2), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, CREW, 2)
    job, _ = _run_on(cluster, namespace, 1, "handover")
    name = job["metadata"]["name"]
    action = f"{namespace}/{name}"
    cluster.kubectl("delete", "crewjob", name, "-n", namespace, "--wait=true", "--timeout=120s",
                    check=True)
    _scale(cluster, namespace, 1)
    entry = _wait_draining(cluster, namespace, 1)
    access = crew_access(cluster, namespace, CREW)
    status, _, body = _http(entry, "POST", "/admin/archive", access, {"older_than_seconds": 0},
                            {"X-AIP-Archive-Confirmation": "older-than:0"})
    assert status == 200 and body["archived"] == [action], body

    def removed() -> bool:
        listed = [r["ordinal"] for r in crew_replicas(cluster, namespace, CREW)]
        return listed == [0] and f"{CREW}-1" not in _pods(cluster, namespace)

    wait_for(removed, timeout=120, what="replica 1 to be removed after its hand-over")
    claim = _claim(cluster, namespace, f"{CREW}-state-1")
    assert claim is not None
    assert claim["metadata"]["annotations"].get("crewfence.dev/tombstones-handed-over", "") \
        .endswith(":1"), claim["metadata"]
    replica0 = _entry(cluster, namespace, 0)
    assert replica0 is not None
    assert sidecar_get(replica0, f"/jobs/{quote(action, safe='')}", access)[0] == 410
    admitted = _admissions(cluster, namespace)

    # GitOps resync of the pruned manifest: the tombstone answers, nothing runs.
    assert apply_obj(cluster, job, namespace).returncode == 0
    again = wait_phase(cluster, namespace, name)["status"]
    assert again["phase"] == "Succeeded", json.dumps(again)
    reasons = {cond["type"]: cond.get("reason") for cond in again.get("conditions") or []}
    assert "Archived" in reasons.values(), json.dumps(again)
    assert not again.get("uncertainOutcome")
    assert _admissions(cluster, namespace) == admitted == {0: 0.0}, "nothing was admitted"


def test_retention_archives_on_schedule_and_delete_setting_removes_the_claim(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    crew = _crew(2, storage={"whenScaled": "Delete"})
    assert apply_obj(cluster, crew, namespace).returncode == 0
    wait_crew_ready(cluster, namespace, CREW, 2)
    job, _ = _run_on(cluster, namespace, 1, "retained")
    action = f"{namespace}/{job['metadata']['name']}"
    _scale(cluster, namespace, 1)
    _wait_draining(cluster, namespace, 1)
    access = crew_access(cluster, namespace, CREW)
    replica0 = _entry(cluster, namespace, 0)
    assert replica0 is not None

    # Retention applies to every replica on a schedule: the record ages out on replica 1, the
    # replica then holds nothing unarchived and goes, and its claim with it (Delete).
    cluster.kubectl("patch", "crew", CREW, "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"journal":{"retention":"2s"}}}', check=True)

    def gone() -> bool:
        claim = _claim(cluster, namespace, f"{CREW}-state-1")
        listed = [r["ordinal"] for r in crew_replicas(cluster, namespace, CREW)]
        return (listed == [0] and f"{CREW}-1" not in _pods(cluster, namespace)
                and (claim is None or bool(claim["metadata"].get("deletionTimestamp"))))

    wait_for(gone, timeout=120, what="replica 1 and its claim to be removed")
    assert _claim(cluster, namespace, f"{CREW}-state-0") is not None
    # Replica 0's journal keeps running too; what it held before also ages out, to tombstones.
    other, _ = _run_on(cluster, namespace, 0, "kept")
    other_action = f"{namespace}/{other['metadata']['name']}"
    wait_for(lambda: sidecar_get(replica0, f"/jobs/{quote(other_action, safe='')}",
                                 access)[0] == 410,
             timeout=60, what="retention to archive replica 0's record")
    assert action != other_action


def test_retention_archives_only_what_the_operator_recorded(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    """Issue 19, "retention never races the operator": a record whose outcome no CrewJob
    recorded (made straight on the sidecar, so nobody marks it) outlives the retention window
    while a newer record, whose CrewJob the operator finished and marked, is archived."""
    assert apply_obj(cluster, research_crew(1), namespace).returncode == 0
    replica = wait_crew_ready(cluster, namespace, CREW, 1)[0]
    access = crew_access(cluster, namespace, CREW)
    raw = {"crew_id": CREW, "action_id": "unrecorded-1", "operation": "run",
           "input": {"topic": "nobody reads this"}}
    made, _, _ = _http(replica, "POST", "/jobs", access, raw, {"Idempotency-Key": "u1"})
    assert made == 200
    job = crewjob_manifest("recorded", "run", {"topic": "recorded"})
    assert apply_obj(cluster, job, namespace).returncode == 0
    status = wait_phase(cluster, namespace, "recorded")["status"]
    assert status["phase"] == "Succeeded" and status["output"]["value"]
    cluster.kubectl("patch", "crew", CREW, "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"journal":{"retention":"1s"}}}', check=True)
    action = f"{namespace}/recorded"
    wait_for(lambda: sidecar_get(replica, f"/jobs/{quote(action, safe='')}", access)[0] == 410,
             timeout=90, what="retention to archive the recorded job")
    assert sidecar_get(replica, "/jobs/unrecorded-1", access)[0] == 200, \
        "an older record nobody recorded was archived by retention"
    again = get_job(cluster, namespace, "recorded")
    assert again is not None and again["status"]["output"]["value"] == status["output"]["value"]


def test_scale_two_one_two_keeps_every_record_reachable(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    assert apply_obj(cluster, research_crew(2), namespace).returncode == 0
    wait_crew_ready(cluster, namespace, CREW, 2)
    job0, _ = _run_on(cluster, namespace, 0, "zero")
    job1, _ = _run_on(cluster, namespace, 1, "one")
    actions = {0: f"{namespace}/{job0['metadata']['name']}",
               1: f"{namespace}/{job1['metadata']['name']}"}
    access = crew_access(cluster, namespace, CREW)

    def reachable() -> None:
        for ordinal, action in actions.items():
            e = _entry(cluster, namespace, ordinal)
            assert e is not None and e.get("address"), (ordinal, e)
            code, text = sidecar_get(e, f"/jobs/{quote(action, safe='')}", access)
            assert code == 200 and json.loads(text)["status"] == "completed", (ordinal, code)

    _scale(cluster, namespace, 1)
    draining = _wait_draining(cluster, namespace, 1)
    reachable()

    # A lost pod of a draining replica comes back, still draining (journaled), still listed.
    old_uid = _pods(cluster, namespace)[f"{CREW}-1"]["metadata"]["uid"]
    cluster.kubectl("delete", "pod", f"{CREW}-1", "-n", namespace, "--wait=false", check=True)

    def back() -> dict[str, Any] | None:
        pod = _pods(cluster, namespace).get(f"{CREW}-1")
        e = _entry(cluster, namespace, 1)
        fresh = pod is not None and pod["metadata"]["uid"] != old_uid
        return e if fresh and e and e.get("state") == "Draining" and e.get("draining") \
            and e.get("address") else None

    again = wait_for(back, timeout=180, what="a new draining pod for replica 1")
    assert again["journalId"] == draining["journalId"], "same claim, same journal"
    reachable()

    _scale(cluster, namespace, 2)

    def serving() -> dict[str, Any] | None:
        e = _entry(cluster, namespace, 1)
        return e if e and e.get("state") == "Active" and e.get("ready") \
            and e.get("draining") is False else None

    active = wait_for(serving, timeout=120, what="replica 1 active again (undrained)")
    assert active["journalId"] == draining["journalId"]
    reachable()
    # And it takes new work again.
    _run_on(cluster, namespace, 1, "after")
