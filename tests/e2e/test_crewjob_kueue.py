"""CrewJobs admitted by a real Kueue (built from the Go module proxy, harness/kueue.py).

A ClusterQueue with quota for 2 CrewJobs (``crewfence.dev/crewjobs: 2``):
- 5 labelled CrewJobs: never more than 2 run at once, all 5 succeed, and when the queue opens
  the two of highest priority are admitted first;
- a running CrewJob whose Workload is evicted (``spec.active: false``) is cancelled on the
  sidecar, says so, and is never admitted again; a CrewJob without the label is untouched;
- the operator restarted while Workloads are pending: they are admitted later, each once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from crewfence_operator.crewjob import kueue as kq
from crewjob_support import (
    apply_obj,
    condition,
    crewjob_manifest,
    crewjob_namespace,
    get_job,
    research_crew,
    sidecar_record,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness import controlplane, kueue
from harness.handles import Cluster, Operator

pytestmark = pytest.mark.slow
QUOTA = 2


@pytest.fixture(scope="module")
def kueue_running(cluster: Cluster) -> Iterator[kueue.Kueue]:
    try:
        root = kueue.ensure_built()
    except kueue.BuildError as exc:
        pytest.fail(f"Kueue could not be built: {exc}")
    controlplane.install_crds(cluster.info, kueue.crd_files(root))
    running = kueue.Kueue(cluster.state_dir)
    running.start(root, cluster.kubeconfig)
    try:
        def ready() -> bool:
            assert running.alive(), f"Kueue exited: {running.logs()[-3000:]}"
            return running.ready()

        wait_for(ready, timeout=120, what="Kueue ready")
        yield running
    finally:
        running.stop()


def _apply(cluster: Cluster, obj: dict[str, Any]) -> None:
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def queue_ns(cluster: Cluster, kueue_running: kueue.Kueue) -> Iterator[str]:
    with crewjob_namespace(cluster, "e2e-kueue") as ns:
        api = f"{kq.GROUP}/{kq.VERSION}"
        _apply(cluster, {"apiVersion": api, "kind": "ResourceFlavor",
                         "metadata": {"name": "crewfence-default"}})
        _apply(cluster, {"apiVersion": api, "kind": "ClusterQueue",
                         "metadata": {"name": ns},
                         "spec": {"namespaceSelector": {}, "stopPolicy": "Hold",
                                  "resourceGroups": [{
                                      "coveredResources": [kq.RESOURCE],
                                      "flavors": [{"name": "crewfence-default", "resources": [
                                          {"name": kq.RESOURCE, "nominalQuota": QUOTA}]}]}]}})
        _apply(cluster, {"apiVersion": api, "kind": "LocalQueue",
                         "metadata": {"name": "team", "namespace": ns},
                         "spec": {"clusterQueue": ns}})
        for name, value in (("crewfence-high", 1000), ("crewfence-low", 10)):
            _apply(cluster, {"apiVersion": api, "kind": "WorkloadPriorityClass",
                             "metadata": {"name": name}, "value": value})
        yield ns
        cluster.kubectl("delete", "clusterqueue", ns, "--wait=false")


@pytest.fixture
def ns(cluster: Cluster, operator_factory: Callable[..., Operator], queue_ns: str) -> str:
    operator_factory()  # started after Kueue's CRDs exist
    assert apply_obj(cluster, research_crew(2), queue_ns).returncode == 0
    wait_crew_ready(cluster, queue_ns, "research", 2)
    return queue_ns


def _queued(name: str, topic: str, priority: str | None = None) -> dict[str, Any]:
    job = crewjob_manifest(name, "run", {"topic": topic})
    labels = {kq.QUEUE_LABEL: "team"}
    if priority:
        labels[kq.PRIORITY_CLASS_LABEL] = priority
    job["metadata"]["labels"] = labels
    return job


def _workloads(cluster: Cluster, ns: str) -> dict[str, dict[str, Any]]:
    items = cluster.get_json("workloads.kueue.x-k8s.io", "-n", ns)["items"]
    return {w["metadata"]["ownerReferences"][0]["name"]: w for w in items}


def _true(obj: dict[str, Any], ctype: str) -> bool:
    cond = condition(obj, ctype)
    return cond is not None and cond["status"] == "True"


def _set_stop_policy(cluster: Cluster, ns: str, policy: str) -> None:
    cluster.kubectl("patch", "clusterqueue", ns, "--type=merge",
                    "-p", json.dumps({"spec": {"stopPolicy": policy}}), check=True)


def test_quota_caps_running_crewjobs_and_priority_orders_admission(cluster: Cluster,
                                                                   ns: str) -> None:
    _set_stop_policy(cluster, ns, "Hold")
    plan = [("q-low-1", "crewfence-low"), ("q-low-2", "crewfence-low"),
            ("q-high-1", "crewfence-high"), ("q-low-3", "crewfence-low"),
            ("q-high-2", "crewfence-high")]
    for name, priority in plan:
        assert apply_obj(cluster, _queued(name, f"[[sleep:4]] {name}", priority),
                         ns).returncode == 0
    names = [n for n, _ in plan]
    wait_for(lambda: set(names) <= set(_workloads(cluster, ns)), timeout=60,
             what="a Workload for each queued CrewJob")
    for name in names:  # held: nothing admitted while the queue is stopped
        obj = get_job(cluster, ns, name)
        assert obj is not None and obj["status"]["phase"] == "Pending"
        assert _true(obj, "Suspended")
    assert {w["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]
            ["requests"][kq.RESOURCE] for w in _workloads(cluster, ns).values()} == {"1"}
    _set_stop_policy(cluster, ns, "None")
    first: list[str] = []
    most = 0
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        jobs = {n: (get_job(cluster, ns, n) or {}).get("status") or {} for n in names}
        running = [n for n, s in jobs.items() if s.get("assignment")
                   and s.get("phase") not in ("Succeeded", "Failed", "Cancelled")]
        most = max(most, len(running))
        if not first and running:
            admitted = [n for n, w in _workloads(cluster, ns).items() if _true(w, "Admitted")]
            first = sorted(admitted)
        if all(s.get("phase") in ("Succeeded", "Failed", "Cancelled") for s in jobs.values()):
            break
        time.sleep(0.3)
    assert most <= QUOTA, f"{most} CrewJobs ran at once with quota for {QUOTA}"
    assert most == QUOTA  # the quota, not something else, was the limit
    assert first == ["q-high-1", "q-high-2"]
    for name in names:
        status = (get_job(cluster, ns, name) or {})["status"]
        assert status["phase"] == "Succeeded", json.dumps(status)
        suspended = condition(get_job(cluster, ns, name) or {}, "Suspended")
        assert suspended is not None and suspended["status"] == "False"
    wait_for(lambda: all(_true(w, "Finished") for n, w in _workloads(cluster, ns).items()
                         if n in names), timeout=60, what="every Workload Finished")


def test_eviction_cancels_a_running_crewjob_and_unlabelled_jobs_are_untouched(
        cluster: Cluster, ns: str) -> None:
    _set_stop_policy(cluster, ns, "None")
    assert apply_obj(cluster, crewjob_manifest("plain", "run", {"topic": "plain"}),
                     ns).returncode == 0
    assert apply_obj(cluster, _queued("evicted", "[[sleep:300]] evicted"), ns).returncode == 0
    running = wait_phase(cluster, ns, "evicted", ("Running",), timeout=120)
    ordinal = running["status"]["assignment"]["ordinal"]
    wait_for(lambda: sidecar_record(cluster, ns, "research", ordinal, f"{ns}/evicted")[1]
             is not None, timeout=60, what="the sidecar record of the evicted job")
    workload = _workloads(cluster, ns)["evicted"]["metadata"]["name"]
    cluster.kubectl("patch", "workloads.kueue.x-k8s.io", workload, "-n", ns, "--type=merge",
                    "-p", '{"spec":{"active":false}}', check=True)
    obj = wait_phase(cluster, ns, "evicted", timeout=120)
    status = obj["status"]
    assert status["phase"] == "Cancelled", json.dumps(status)
    assert status["cancellation"]["requested"] is True
    assert "evicted" in status["cancellation"]["message"]
    code, record = sidecar_record(cluster, ns, "research", ordinal, f"{ns}/evicted")
    assert code == 200 and record is not None and record["status"] == "cancelled"
    assert _true(obj, "Stalled")  # a cancel nobody asked for in the spec (kstatus: Failed)
    wait_for(lambda: _true(_workloads(cluster, ns)["evicted"], "Finished"), timeout=60,
             what="the evicted Workload Finished (never admitted again)")
    # Re-activating the finished Workload does not admit the job again.
    cluster.kubectl("patch", "workloads.kueue.x-k8s.io", workload, "-n", ns, "--type=merge",
                    "-p", '{"spec":{"active":true}}', check=True)
    time.sleep(3)  # a bounded look for something that must not happen
    assert (get_job(cluster, ns, "evicted") or {})["status"]["phase"] == "Cancelled"
    plain = wait_phase(cluster, ns, "plain", timeout=120)
    assert plain["status"]["phase"] == "Succeeded"
    assert condition(plain, "Suspended") is None
    assert "plain" not in _workloads(cluster, ns)


def test_operator_restart_while_workloads_are_pending(cluster: Cluster, ns: str,
                                                      operator_process: Operator) -> None:
    _set_stop_policy(cluster, ns, "Hold")
    for name in ("r-1", "r-2"):
        assert apply_obj(cluster, _queued(name, name), ns).returncode == 0
    wait_for(lambda: {"r-1", "r-2"} <= set(_workloads(cluster, ns)), timeout=60,
             what="Workloads of the pending jobs")
    operator_process.stop()
    _set_stop_policy(cluster, ns, "None")
    wait_for(lambda: all(_true(_workloads(cluster, ns)[n], "Admitted") for n in ("r-1", "r-2")),
             timeout=60, what="Kueue admits the Workloads while the operator is down")
    operator_process.start()
    for name in ("r-1", "r-2"):
        status = wait_phase(cluster, ns, name, timeout=180)["status"]
        assert status["phase"] == "Succeeded", json.dumps(status)
    workloads = _workloads(cluster, ns)
    assert sum(1 for w in workloads.values()
               if w["metadata"]["ownerReferences"][0]["name"] in ("r-1", "r-2")) == 2
