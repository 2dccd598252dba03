"""Nothing per CrewJob that outlives it or grows with the number of CrewJobs (issue 24):
the operator-wide state a CrewJob's events leave behind in the Runtime."""

from __future__ import annotations

from typing import Any

from crewfence_operator.handlers.resolution import crewjob_resolution
from crewfence_operator.runtime import MEMO_KEY, Runtime


def _job(i: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewJob",
            "metadata": {"name": f"job-{i}", "namespace": "ns", "uid": f"u{i}",
                         "generation": 1},
            "spec": {"crewRef": {"name": "research"}, **spec},
            "status": {"phase": "Succeeded"}}


async def test_events_of_crewjobs_without_a_resolution_leave_no_lock_behind() -> None:
    rt = Runtime()
    memo = {MEMO_KEY: rt}
    for i in range(200):
        for kind in ("ADDED", "MODIFIED", "MODIFIED"):
            await crewjob_resolution(event={"type": kind, "object": _job(i)}, memo=memo)
    assert rt.resolution_locks == {}, "one lock per CrewJob ever seen would grow without bound"


async def test_a_deleted_crewjobs_resolution_lock_goes_with_it() -> None:
    rt = Runtime()
    rt.resolution_lock("ns", "job-1")
    await crewjob_resolution(event={"type": "DELETED", "object": _job(1)}, memo={MEMO_KEY: rt})
    assert rt.resolution_locks == {}


def test_the_sidecar_request_metric_has_one_label_per_route_not_per_job() -> None:
    from crewfence_operator.sidecar_client import Endpoint, route_of

    endpoint = Endpoint("10.0.0.1:8090", "t")
    routes = {route_of("GET", endpoint.job_url(f"ns/job-{i}", "/events")) for i in range(50)}
    assert routes == {"GET /jobs/{id}/events"}
    assert route_of("GET", endpoint.job_url("ns/j")) == "GET /jobs/{id}"
    assert route_of("POST", endpoint.url("/jobs")) == "POST /jobs"
