"""The per-Crew counters of finished CrewJobs' usage (``metrics.observe_job_effects``).

The real driver (``handlers/crewjob.py``) against the sidecar double (``faulty_sidecar.py``, a
real HTTP server): the record's events reach the machine through the followed stream, the
terminal patch carries ``status.usage`` / ``status.effects``, and the counters of the job's
Crew grow by exactly those numbers, once. Only the Kubernetes API is a fake (``fake_cluster``).

The registry is process-wide (other tests record too): each test uses its own namespace, so
the counters of its labels move only by what it does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from crewfence_operator import metrics
from crewfence_operator.handlers.crewjob import JobDriver, is_live
from crewfence_operator.runtime import RunnerSettings, Runtime
from crewfence_sidecar.contract import EventName, Status
from fake_cluster import FAST_RUNNER, FakeCluster, crew_obj, crewjob_body, replica_entry
from faulty_sidecar import Fault, FaultySidecar

CREW = "research"  # crew_obj's and crewjob_body's Crew
COUNTERS = {  # counter -> the status field it must grow by
    "crewfence_operator_prompt_tokens_total": ("usage", "promptTokens"),
    "crewfence_operator_completion_tokens_total": ("usage", "completionTokens"),
    "crewfence_operator_model_calls_total": ("usage", "modelCalls"),
    "crewfence_operator_tool_calls_total": ("usage", "toolCalls"),
    "crewfence_operator_tool_calls_in_doubt_total": ("effects", "inDoubtCount"),
}
AT = "2026-12-01T20:10:11.123Z"


def counters(namespace: str) -> dict[str, float]:
    labels = {"namespace": namespace, "crew": CREW}
    return {name: metrics.REGISTRY.get_sample_value(name, labels) or 0.0 for name in COUNTERS}


def uncertain_count(reason: str) -> float:
    sample = metrics.REGISTRY.get_sample_value("crewfence_operator_uncertain_outcomes_total",
                                               {"reason": reason})
    return sample or 0.0


def body_in(namespace: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    body = crewjob_body(status=status)
    body["metadata"]["namespace"] = namespace
    return body


def tool(key: str, *, finished: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {"at": AT, "tool": "tickets/create_ticket", "server": "tickets",
                            "task": "file", "task_index": 0, "call_index": 0,
                            "idempotency_key": key}
    if finished:
        data.update(result_sha256="1" * 64, error=None, duration_ms=3.0)
    else:
        data.update(arguments_sha256="0" * 64)
    return data


def model(prompt: int, completion: int) -> dict[str, Any]:
    return {"at": AT, "model": "crewfence/offline", "call_index": 0, "task": "file",
            "prompt_tokens": prompt, "completion_tokens": completion, "duration_ms": 1.0}


KEYS = ["cfk1-" + c * 40 for c in "abc"]
EXPECTED = {"promptTokens": 200, "completionTokens": 42, "modelCalls": 2, "toolCalls": 3}
IN_DOUBT = 2


@pytest.fixture
async def sidecar() -> AsyncIterator[FaultySidecar]:
    sc = FaultySidecar(journal_id="journal-0")
    await sc.start()
    yield sc
    await sc.stop()


async def run_to_the_end(driver: JobDriver, timeout: float = 10.0) -> None:
    try:
        await asyncio.wait_for(driver.run(), timeout)
    finally:
        await driver.rt.close()


async def start_a_job_with_calls_in_doubt(
        namespace: str, sc: FaultySidecar, cluster: FakeCluster,
        settings: RunnerSettings = FAST_RUNNER) -> tuple[JobDriver, asyncio.Task[None]]:
    """Admit, then the record's run: two model calls, three tool calls of which the last two
    never finished; the sidecar restarted under them (failed, uncertain). Returns the driver
    and its task, which goes on to the terminal patch."""
    driver = JobDriver(body_in(namespace), Runtime(settings=settings, io=cluster))
    action = f"{namespace}/job-1"
    task = asyncio.create_task(run_to_the_end(driver))
    for _ in range(1000):
        if action in sc.jobs or task.done():
            break
        await asyncio.sleep(0.01)
    job = sc.jobs[action]
    job.add(EventName.TASK_STARTED.value, {"at": AT, "task": "file", "index": 0, "total": 1,
                                           "agent": "Clerk"})
    job.add(EventName.MODEL_CALL.value, model(120, 30))
    job.add(EventName.TOOL_CALL_STARTED.value, tool(KEYS[0]))
    job.add(EventName.TOOL_CALL_FINISHED.value, tool(KEYS[0], finished=True))
    job.add(EventName.MODEL_CALL.value, model(80, 12))
    job.add(EventName.TOOL_CALL_STARTED.value, tool(KEYS[1]))
    job.add(EventName.TOOL_CALL_STARTED.value, tool(KEYS[2]))
    sc.finish(action, Status.FAILED, uncertain=True, error={
        "code": "sidecar_restarted", "message": "the sidecar restarted while this job ran"})
    return driver, task


async def finish_a_job_with_calls_in_doubt(namespace: str, sc: FaultySidecar,
                                           cluster: FakeCluster) -> JobDriver:
    driver, task = await start_a_job_with_calls_in_doubt(namespace, sc, cluster)
    await task
    action = f"{namespace}/job-1"
    assert sc.admissions[action] == 1 and driver.done
    assert sc.recorded == {action}  # marked after the terminal patch
    return driver


async def test_a_finished_crewjob_adds_its_usage_and_calls_in_doubt_to_its_crews_counters(
        sidecar: FaultySidecar) -> None:
    """Each counter of the job's Crew grows by its status' number (fails without the count in
    ``JobDriver.carry_out``)."""
    namespace = "usage-counted"
    before = counters(namespace)
    uncertain_before = uncertain_count("SidecarRestarted")
    cluster = FakeCluster(crew=crew_obj(replica_entry(0, sidecar.address, "journal-0")))
    await finish_a_job_with_calls_in_doubt(namespace, sidecar, cluster)
    status = cluster.statuses["job-1"]
    assert (status["phase"], status["reason"], status["uncertainOutcome"]) == (
        "Failed", "SidecarRestarted", True)
    assert status["usage"] == EXPECTED
    assert status["effects"]["inDoubtCount"] == IN_DOUBT
    after = counters(namespace)
    for name, (section, field) in COUNTERS.items():
        assert after[name] - before[name] == status[section][field], name
    assert uncertain_count("SidecarRestarted") - uncertain_before == 1
    # another Crew's labels are untouched
    assert metrics.REGISTRY.get_sample_value("crewfence_operator_tool_calls_total",
                                             {"namespace": namespace, "crew": "other"}) is None


async def test_a_finished_crewjob_seen_again_counts_nothing_more(
        sidecar: FaultySidecar) -> None:
    """kopf runs the handlers of a CrewJob again after an operator restart; a job already
    finished gets no daemon (``is_live``), and a driver that does run on it (in the same
    process with the machine's memory of the terminal record, or in a new process) writes
    nothing and counts nothing: the machine releases a terminal status (without that, both
    drivers finish the job again and the counters triple)."""
    namespace = "usage-once"
    cluster = FakeCluster(crew=crew_obj(replica_entry(0, sidecar.address, "journal-0")))
    first = await finish_a_job_with_calls_in_doubt(namespace, sidecar, cluster)
    status = cluster.statuses["job-1"]
    counted = counters(namespace)
    assert counted["crewfence_operator_tool_calls_total"] > 0
    patches = len(cluster.patches)
    assert not is_live(status)  # kopf starts no daemon for it

    # the same process: the runtime still remembers what the first driver learned
    remembered = first.rt.memories[first.uid]
    again = JobDriver(body_in(namespace, status), first.rt)
    assert again.memory is remembered
    await run_to_the_end(again)
    # a new operator process: a fresh runtime, the body as the API server has it now
    await run_to_the_end(JobDriver(body_in(namespace, status),
                                   Runtime(settings=FAST_RUNNER, io=cluster)))

    assert counters(namespace) == counted
    assert len(cluster.patches) == patches  # nothing written either
    assert sidecar.admissions[f"{namespace}/job-1"] == 1


async def test_a_driver_stopped_while_it_marks_the_record_has_counted_already(
        sidecar: FaultySidecar) -> None:
    """The terminal patch makes the CrewJob not live: kopf stops its daemon, which lets the
    driver finish for 10 s and then cancels it (``crewjob_daemon``). The mark that follows the
    patch (``POST /jobs/{id}/recorded``, best effort, read timeout 15 s) may be what it is
    still waiting for on a stalled sidecar: the job is counted with its terminal write, before
    the mark, or never (fails when the count follows the mark)."""
    namespace = "usage-stalled-mark"
    before = counters(namespace)
    cluster = FakeCluster(crew=crew_obj(replica_entry(0, sidecar.address, "journal-0")))
    sidecar.inject("recorded", Fault("stall"))
    patient = replace(FAST_RUNNER, timeouts=replace(FAST_RUNNER.timeouts, read=30.0))
    _, task = await start_a_job_with_calls_in_doubt(namespace, sidecar, cluster, patient)
    for _ in range(1000):
        if task.done() or any(p.endswith("/recorded") for _, p in sidecar.requests):
            break
        await asyncio.sleep(0.01)
    assert not task.done(), "the mark did not stall"
    task.cancel()  # what the daemon does 10 s after the terminal patch
    with contextlib.suppress(asyncio.CancelledError):
        await task
    sidecar.release()
    status = cluster.statuses["job-1"]
    assert status["phase"] == "Failed" and sidecar.recorded == set()
    after = counters(namespace)
    for name, (section, field) in COUNTERS.items():
        assert after[name] - before[name] == status[section][field], name


async def test_a_finished_crewjob_deleted_and_reapplied_counts_nothing_more(
        sidecar: FaultySidecar) -> None:
    """GitOps deletes a finished CrewJob (a prune, ``ttlSecondsAfterFinished``) and applies it
    again: the new object (new uid, empty status) attaches to the same finished record and
    writes the same terminal status, evidence included, but the action's usage was counted
    by the first object: the record carries the first object's mark (``recorded_at``), so
    the counters do not grow again (machine I10; without ``Finish.counts_effects`` they
    double)."""
    namespace = "usage-reapplied"
    cluster = FakeCluster(crew=crew_obj(replica_entry(0, sidecar.address, "journal-0")))
    await finish_a_job_with_calls_in_doubt(namespace, sidecar, cluster)
    first = dict(cluster.statuses["job-1"])
    counted = counters(namespace)
    uncertain = uncertain_count("SidecarRestarted")
    assert counted["crewfence_operator_tool_calls_total"] > 0
    action = f"{namespace}/job-1"
    assert sidecar.jobs[action].record.recorded_at is not None

    reapplied = body_in(namespace)
    reapplied["metadata"]["uid"] = "uid-job-1-reapplied"
    cluster.statuses.pop("job-1", None)  # the deleted object's status went with it
    await run_to_the_end(JobDriver(reapplied, Runtime(settings=FAST_RUNNER, io=cluster)))

    again = cluster.statuses["job-1"]
    assert (again["phase"], again["reason"]) == (first["phase"], first["reason"])
    assert again["usage"] == EXPECTED and again["effects"]["inDoubtCount"] == IN_DOUBT
    assert counters(namespace) == counted
    assert again["uncertainOutcome"] is True
    assert uncertain_count("SidecarRestarted") == uncertain, \
        "the outcome became uncertain once, under the first object"
    assert sidecar.admissions[action] == 1
