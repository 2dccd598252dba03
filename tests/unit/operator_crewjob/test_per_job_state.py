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


# --- a waiting CrewJob costs nothing per second (handlers/crewjob.py JobDriver.pause) --------
class _CountingDriver:
    """A JobDriver that counts how often it looks at spec.cancel (each look is a wake-up)."""

    @staticmethod
    def make(body: dict[str, Any], rt: Runtime) -> Any:
        from crewfence_operator.handlers.crewjob import JobDriver

        class Counting(JobDriver):
            looks = 0

            @property
            def cancel_requested(self) -> bool:
                type(self).looks += 1
                return super().cancel_requested

        return Counting(body, rt)


async def test_a_pausing_driver_does_not_poll() -> None:
    """Thousands of live CrewJobs each polling four times a second starved the operator
    (issue 24, the 2,000 and 5,000 bursts): a pause wakes only when told."""
    import asyncio

    from fake_cluster import crewjob_body

    rt = Runtime()
    driver = _CountingDriver.make(crewjob_body(), rt)
    rt.wakers[driver.uid] = driver._wake
    await driver.pause(1.0)
    assert type(driver).looks <= 2, f"{type(driver).looks} looks in one second of pause"

    body = driver.body
    task = asyncio.create_task(driver.pause(30.0))
    await asyncio.sleep(0.05)
    body["spec"]["cancel"] = True
    rt.wake(driver.uid)  # what the CrewJob's watch event does (crewjob_phase_tracker)
    await asyncio.wait_for(task, 1.0)  # returns at once, not after 30 s


async def test_a_watch_event_wakes_the_crewjobs_driver() -> None:
    import asyncio

    from crewfence_operator.handlers.crewjob import crewjob_phase_tracker
    from fake_cluster import crewjob_body

    rt = Runtime()
    body = crewjob_body()
    waker = rt.wakers.setdefault(str(body["metadata"]["uid"]), asyncio.Event())
    await crewjob_phase_tracker(event={"type": "MODIFIED", "object": body},
                                memo={MEMO_KEY: rt})
    assert waker.is_set()
