"""The CrewJob driver's I/O (handlers/crewjob.py) against the fault-injecting sidecar double:
real HTTP servers speaking the wire contract; only the Kubernetes API is an in-memory fake.

Each test names the branch it proves; every one asserts the admission count on the double.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from crewfence_operator.handlers.crewjob import JobDriver, drive_deletion
from crewfence_operator.runtime import Runtime
from crewfence_sidecar.contract import Status
from fake_cluster import FAST_RUNNER, FakeCluster, crew_obj, crewjob_body, replica_entry
from faulty_sidecar import Fault, FaultySidecar

ACTION = "team-a/job-1"


@pytest.fixture
async def sidecars() -> AsyncIterator[list[FaultySidecar]]:
    made = [FaultySidecar(journal_id="journal-0"), FaultySidecar(journal_id="journal-1")]
    for s in made:
        await s.start()
    yield made
    for s in made:
        await s.stop()


def one_replica(sc: FaultySidecar, **kw: Any) -> dict[str, Any]:
    return crew_obj(replica_entry(0, sc.address, sc.journal_id, **kw))


class Harness:
    def __init__(self, cluster: FakeCluster, body: dict[str, Any]) -> None:
        self.cluster = cluster
        self.body = body
        self.rt = Runtime(settings=FAST_RUNNER, io=cluster)
        self.driver = JobDriver(body, self.rt)
        self.task: asyncio.Task[None] | None = None

    @property
    def status(self) -> dict[str, Any]:
        return self.cluster.statuses.get(self.body["metadata"]["name"], {})

    def start(self) -> None:
        self.task = asyncio.create_task(self.driver.run())

    async def until(self, check: Callable[[], Any], timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            if self.task is not None and self.task.done():
                self.task.result()
                value = check()
                if value:
                    return value
                raise AssertionError(f"driver ended; status {self.status}")
            await asyncio.sleep(0.01)
        raise AssertionError(f"condition not met; status {self.status}")

    async def finished(self) -> dict[str, Any]:
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)
        return self.status

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        await self.rt.close()


@pytest.fixture
async def harness_factory() -> AsyncIterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(cluster: FakeCluster, body: dict[str, Any] | None = None) -> Harness:
        h = Harness(cluster, body or crewjob_body())
        made.append(h)
        return h

    yield make
    for h in made:
        await h.close()


async def test_happy_path_writes_assignment_before_the_post_and_finishes(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    cluster = FakeCluster(crew=one_replica(sc))
    h = harness_factory(cluster)
    sc.inject("post", Fault("stall"))
    h.start()
    # The intended assignment is in status while the POST is still unanswered.
    await h.until(lambda: ("POST", "/jobs") in sc.requests)
    assert h.status["assignment"]["ordinal"] == 0
    assert h.status["assignment"]["journalId"] == "journal-0"
    assert h.status["phase"] == "Running" and h.status["reason"] == "Dispatched"
    sc.release()  # the stalled POST answers 503 "stalled": uncertain → AnswerLost, then re-POST
    await h.until(lambda: sc.admissions[ACTION] == 1)
    sc.finish(ACTION, output={"answer": 42})
    status = await h.finished()
    assert (status["phase"], status["uncertainOutcome"]) == ("Succeeded", False)
    assert sc.admissions[ACTION] == 1
    assert [r for r, _ in cluster.warnings] == ["OutcomeUncertainAnswerLost"]
    assert sc.token not in str(cluster.warnings) + str(cluster.patches)  # no secrets


async def test_lost_admission_answer_stays_running_uncertain_until_the_record_decides(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    cluster = FakeCluster(crew=one_replica(sc))
    h = harness_factory(cluster)
    sc.inject("post", Fault("admit_then_drop"))
    sc.inject("get", Fault("status", 503, "unavailable"), times=3)
    h.start()
    await h.until(lambda: h.status.get("reason") == "AnswerLost")
    assert h.status["phase"] == "Running" and h.status["uncertainOutcome"] is True
    assert h.status["recovery"]
    assert any(r == "OutcomeUncertainAnswerLost" for r, _ in cluster.warnings)
    # After the lookups fail the record is found: AnswerLost settles and the job is followed.
    await h.until(lambda: h.status.get("reason") == "Admitted")
    assert h.status["uncertainOutcome"] is False
    sc.finish(ACTION)
    status = await h.finished()
    assert status["phase"] == "Succeeded" and sc.admissions[ACTION] == 1


async def test_5xx_without_a_record_is_reposted_to_the_same_replica_only(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    s0, s1 = sidecars
    cluster = FakeCluster(crew=crew_obj(replica_entry(0, s0.address, s0.journal_id),
                                        replica_entry(1, s1.address, s1.journal_id)))
    h = harness_factory(cluster)
    for s in sidecars:
        s.inject("post", Fault("status", 500, "internal"), times=2)
    h.start()
    await h.until(lambda: sum(s.admissions[ACTION] for s in sidecars) == 1)
    owner = h.status["assignment"]["ordinal"]
    other = sidecars[1 - owner]
    assert ("POST", "/jobs") not in other.requests  # I1: never another replica
    sidecars[owner].finish(ACTION)
    status = await h.finished()
    assert status["phase"] == "Succeeded" and status["assignment"]["ordinal"] == owner


async def test_journal_full_waits_then_admits(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    h = harness_factory(FakeCluster(crew=one_replica(sc)))
    sc.inject("post", Fault("status", 507, "journal_full"), times=2)
    h.start()
    await h.until(lambda: h.status.get("reason") == "JournalFull")
    assert h.status.get("uncertainOutcome") is not True  # 507: nothing was scheduled
    await h.until(lambda: sc.admissions[ACTION] == 1)
    sc.finish(ACTION)
    assert (await h.finished())["phase"] == "Succeeded"


async def test_401_on_admission_finishes_auth_failed_and_certain(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    h = harness_factory(FakeCluster(crew=one_replica(sc)))
    sc.inject("post", Fault("status", 401, "unauthorized"))
    h.start()
    status = await h.finished()
    assert (status["phase"], status["reason"], status["uncertainOutcome"]) == (
        "Failed", "AuthFailed", False)
    assert sc.admissions[ACTION] == 0


async def test_a_replica_refusing_our_token_on_the_probe_blocks_admission(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    h = harness_factory(FakeCluster(crew=one_replica(sc), token="wrong"))
    h.start()
    await h.until(lambda: h.status.get("reason") == "WaitingForReplicas")
    assert "Auth/unauthorized" in h.status["message"]
    assert sc.admissions[ACTION] == 0


async def test_changed_journal_id_ends_journal_lost(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    """The sidecar answers from a new journal: the job waits while the Crew still lists the
    assigned one (an answer at an address is no proof), and ends JournalLost once the Crew's
    entry shows the new journal on the same claim."""
    sc = sidecars[0]
    cluster = FakeCluster(crew=one_replica(sc))
    h = harness_factory(cluster)
    h.start()
    await h.until(lambda: sc.admissions[ACTION] == 1)
    await sc.restart(lose_journal=True, journal_id="journal-0b")
    await h.until(lambda: "not from the assigned journal" in str(h.status.get("message")))
    assert (h.status["phase"], h.status["reason"]) == ("Running", "ReplicaUnavailable")
    cluster.crew = one_replica(sc)
    status = await h.finished()
    assert (status["phase"], status["reason"], status["uncertainOutcome"]) == (
        "Failed", "JournalLost", True)
    assert status["recovery"] and status["failure"]["code"] == "journal_changed"


async def test_416_makes_the_stream_invalid_but_the_record_still_decides(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    cluster = FakeCluster(crew=one_replica(sc))
    h = harness_factory(cluster)
    sc.inject("events", Fault("status", 416, "cursor_out_of_range"))
    h.start()
    await h.until(lambda: h.status.get("reason") == "InvalidStream")
    assert h.status["phase"] == "Running" and h.status["uncertainOutcome"] is True
    sc.finish(ACTION)
    status = await h.finished()
    assert status["phase"] == "Succeeded" and sc.admissions[ACTION] == 1


async def test_out_of_sequence_event_is_an_invalid_stream_not_a_verdict(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    h = harness_factory(FakeCluster(crew=one_replica(sc)))
    sc.inject("events", Fault("garbage"))
    h.start()
    await h.until(lambda: h.status.get("reason") == "InvalidStream")
    assert h.status["phase"] == "Running"
    sc.finish(ACTION, Status.FAILED, error={"code": "execution_error", "message": "boom"})
    status = await h.finished()
    assert (status["phase"], status["reason"]) == ("Failed", "ExecutionFailed")


async def test_dead_sidecar_keeps_the_job_running_and_it_resumes(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    h = harness_factory(FakeCluster(crew=one_replica(sc)))
    h.start()
    await h.until(lambda: sc.admissions[ACTION] == 1)
    await sc.stop()
    await h.until(lambda: h.status.get("reason") == "ReplicaUnavailable")
    assert h.status["phase"] == "Running"
    sc.jobs[ACTION].record.status = Status.RUNNING
    await sc.start()
    await h.until(lambda: h.status.get("reason") == "Admitted")
    sc.finish(ACTION)
    assert (await h.finished())["phase"] == "Succeeded"
    assert sc.admissions[ACTION] == 1


async def test_sidecar_restart_under_a_running_job_is_sidecar_restarted_uncertain(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    h = harness_factory(FakeCluster(crew=one_replica(sc)))
    h.start()
    await h.until(lambda: sc.admissions[ACTION] == 1)
    await sc.restart()
    status = await h.finished()
    assert (status["phase"], status["reason"], status["uncertainOutcome"]) == (
        "Failed", "SidecarRestarted", True)
    assert sc.admissions[ACTION] == 1


async def test_cancel_is_retried_until_the_sidecar_confirms(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    cluster = FakeCluster(crew=one_replica(sc))
    body = crewjob_body()
    h = harness_factory(cluster, body)
    h.start()
    await h.until(lambda: sc.admissions[ACTION] == 1)
    sc.inject("cancel", Fault("status", 503, "unavailable"), times=2)
    body["spec"]["cancel"] = True
    status = await h.finished()
    assert status["phase"] == "Cancelled"
    assert sc.cancels[ACTION] == 1  # the third attempt reached the route
    assert sum(1 for m, p in sc.requests if p.endswith("/cancel")) == 3
    assert status["cancellation"]["remoteStopConfirmed"] is True
    assert status["uncertainOutcome"] is True  # the record says the work may continue


async def test_deletion_during_the_post_probes_the_intended_replica_and_cancels(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    cluster = FakeCluster(crew=one_replica(sc))
    h = harness_factory(cluster)
    sc.inject("post", Fault("admit_then_drop"))
    sc.inject("get", Fault("stall"))
    h.start()
    await h.until(lambda: sc.admissions[ACTION] == 1)
    assert h.task is not None
    h.task.cancel()  # kopf stops the daemon: the CrewJob was deleted
    with pytest.raises(asyncio.CancelledError):
        await h.task
    sc.release()
    await asyncio.wait_for(drive_deletion(h.driver), 10)
    assert sc.cancels[ACTION] == 1
    assert sc.jobs[ACTION].record.status is Status.CANCELLED


async def test_deleted_crew_ends_journal_lost_within_the_bound(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    sc = sidecars[0]
    cluster = FakeCluster(crew=one_replica(sc))
    h = harness_factory(cluster)
    h.start()
    await h.until(lambda: sc.admissions[ACTION] == 1)
    await sc.stop()
    cluster.crew = None
    started = time.monotonic()
    status = await h.finished()
    assert time.monotonic() - started < 5
    assert (status["phase"], status["reason"], status["uncertainOutcome"]) == (
        "Failed", "JournalLost", True)
    assert status["failure"]["code"] == "crew_deleted" and status["recovery"]


async def test_retained_claim_without_a_pod_blocks_the_first_admission(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    s0 = sidecars[0]
    crew = crew_obj(replica_entry(0, s0.address, s0.journal_id), desired=1,
                    retained=[{"ordinal": 1, "claim": "state-research-1", "reason": "kept"}])
    h = harness_factory(FakeCluster(crew=crew))
    h.start()
    await h.until(lambda: h.status.get("reason") == "WaitingForReplicas")
    assert "1 (state-research-1, retained)" in h.status["message"]
    await asyncio.sleep(0.2)
    assert s0.admissions[ACTION] == 0


async def test_a_draining_replica_holding_the_record_is_attached_not_readmitted(
        sidecars: list[FaultySidecar], harness_factory: Callable[..., Harness]) -> None:
    s0, s1 = sidecars
    s1.draining = True
    # The action ran on replica 1 before the Crew was scaled to 1 (delete + re-apply case).
    await _admit_directly(s1)
    crew = crew_obj(replica_entry(0, s0.address, s0.journal_id),
                    replica_entry(1, s1.address, s1.journal_id, ready=False, state="Draining"),
                    desired=1)
    h = harness_factory(FakeCluster(crew=crew))
    h.start()
    await h.until(lambda: h.status.get("reason") == "Admitted")
    assert h.status["assignment"]["ordinal"] == 1
    s1.finish(ACTION)
    assert (await h.finished())["phase"] == "Succeeded"
    assert (s0.admissions[ACTION], s1.admissions[ACTION]) == (0, 1)


async def _admit_directly(sc: FaultySidecar) -> None:
    import aiohttp
    from crewfence_operator.crewjob.spec import JobSpec
    from crewfence_operator.sidecar_client import Endpoint, SidecarClient

    spec = JobSpec.from_resource("team-a", "job-1", crewjob_body()["spec"])
    draining, sc.draining = sc.draining, False
    async with aiohttp.ClientSession() as session:
        await SidecarClient(session, Endpoint(sc.address, sc.token)).start(
            spec.start_request(), spec.idempotency_key)
    sc.draining = draining
