"""Each job runs in its own worker process: cancel and timeout really stop it, a dying worker
fails only its own job, and live workers never exceed maxConcurrency.

Real parts throughout: the template process is a real interpreter with crewai imported, each
job a real forked process, the journal real SQLite. Effects (model calls, tool iterations)
are counted in a file the workers append to (``worker_crews.effect``), so the counting does
not depend on the process that is being stopped.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from typing import Any

import pytest
from crewfence_sidecar.contract import job_path
from sidecar_helpers import AUTH, headers, metric_value, start_body
from worker_crews import STUCK_SECONDS
from worker_support import Template, alive, children_of, until

pytestmark = pytest.mark.timeout(180)


async def _admit(c: Any, action_id: str, crew_id: str, topic: str,
                 operation: str = "run", **extra: Any) -> None:
    r = await c.post("/jobs", json=start_body(action_id, topic=topic, crew_id=crew_id,
                                              operation=operation, **extra),
                     headers=headers(action_id, async_=True))
    assert r.status == 202, await r.text()


async def _record(c: Any, action_id: str) -> dict[str, Any]:
    r = await c.get(job_path(action_id), headers=AUTH)
    assert r.status == 200
    return dict(await r.json())


async def _terminal(c: Any, action_id: str, timeout: float = 60) -> dict[str, Any]:
    await until(lambda: c.sidecar.runtime.journal.get(action_id).terminal,
                 f"{action_id} to end", timeout)
    return await _record(c, action_id)


async def _last_event(c: Any, action_id: str) -> dict[str, Any]:
    page = await (await c.get(job_path(action_id, "/events"), headers=AUTH)).json()
    assert [e["sequence"] for e in page["events"]] == list(range(len(page["events"])))
    return dict(page["events"][-1])


def _assert_stopped(record: dict[str, Any]) -> None:
    error = record["error"]
    assert error["work_stopped"] is True
    assert error["stopped_at"] >= record["created_at"]
    assert record["uncertain_outcome"] is True  # effects before the stop stay possible


async def _still(template: Template, kind: str, pid: int, seconds: float) -> None:
    """The count of ``kind`` effects of ``pid`` does not move for ``seconds``."""
    before = template.count(kind, pid)
    await asyncio.sleep(seconds)
    assert template.count(kind, pid) == before, f"{kind} effects continued after the stop"


async def test_cancel_of_a_tight_tool_loop_stops_the_worker(
        make_worker_client: Any, worker_template: Template) -> None:
    c = await make_worker_client()
    await _admit(c, "spin-cancel", "spin", "TAG-spin-cancel")
    pid = await until(lambda: worker_template.pid_of("TAG-spin-cancel"), "the model call")
    await until(lambda: worker_template.count("tool", pid) >= 3, "the tool loop")
    r = await c.post(job_path("spin-cancel", "/cancel"),
                     json={"crew_id": "spin", "action_id": "spin-cancel", "reason": "enough"},
                     headers=AUTH)
    record = await r.json()
    assert r.status == 200 and record["status"] == "cancelled"
    assert not alive(pid), "the cancel route answered while the worker still ran"
    _assert_stopped(record)
    last = await _last_event(c, "spin-cancel")
    assert last["event"] == "cancelled" and last["data"]["work_stopped"] is True
    assert last["data"]["stopped_at"] == record["error"]["stopped_at"]
    await _still(worker_template, "tool", pid, 0.3)  # a live loop logs every few ms


async def test_cancel_of_a_stuck_model_call_prevents_further_calls(
        make_worker_client: Any, worker_template: Template) -> None:
    c = await make_worker_client()
    await _admit(c, "stuck-cancel", "stuck", "TAG-stuck-cancel")
    pid = await until(lambda: worker_template.pid_of("TAG-stuck-cancel"), "the model call")
    r = await c.post(job_path("stuck-cancel", "/cancel"),
                     json={"crew_id": "stuck", "action_id": "stuck-cancel"}, headers=AUTH)
    record = await r.json()
    assert record["status"] == "cancelled"
    assert not alive(pid)
    _assert_stopped(record)
    # The crew has three tasks; a worker that kept going would call the model again after
    # STUCK_SECONDS.
    await _still(worker_template, "llm", pid, STUCK_SECONDS + 0.5)
    assert worker_template.count("llm", pid) == 1


@pytest.mark.parametrize("crew_id, kind", [("spin", "tool"), ("hang", "llm")])
async def test_timeout_stops_the_worker(make_worker_client: Any, worker_template: Template,
                                        crew_id: str, kind: str) -> None:
    c = await make_worker_client()
    tag = f"TAG-timeout-{crew_id}"
    # Neither crew ever finishes; the timeout leaves time to reach the stuck spot even on a
    # loaded machine (the test needs the worker's pid from its first model call).
    await _admit(c, f"timeout-{crew_id}", crew_id, tag, timeout_ms=6000)
    pid = await until(lambda: worker_template.pid_of(tag), "the model call")
    record = await _terminal(c, f"timeout-{crew_id}")
    assert record["status"] == "failed" and record["error"]["code"] == "timeout"
    assert not alive(pid)
    _assert_stopped(record)
    last = await _last_event(c, f"timeout-{crew_id}")
    assert last["event"] == "failed" and last["data"]["work_stopped"] is True
    await _still(worker_template, kind, pid, 0.3)


async def test_a_worker_killed_from_outside_fails_only_its_own_job(
        make_worker_client: Any, worker_template: Template) -> None:
    c = await make_worker_client()
    await _admit(c, "victim", "stuck", "TAG-victim")
    await _admit(c, "bystander", "stuck", "TAG-bystander")
    victim = await until(lambda: worker_template.pid_of("TAG-victim"), "the victim")
    bystander = await until(lambda: worker_template.pid_of("TAG-bystander"), "the bystander")
    assert victim != bystander
    os.kill(victim, signal.SIGKILL)
    record = await _terminal(c, "victim")
    assert record["status"] == "failed" and record["uncertain_outcome"] is True
    assert record["error"]["code"] == "worker_died"
    assert record["error"]["signal"] == "SIGKILL"
    assert record["error"]["work_stopped"] is True
    assert "stopped_by" not in record["error"]  # the sidecar signalled nothing: it died
    assert (await _terminal(c, "bystander"))["status"] == "completed"
    r = await c.post("/jobs", json=start_body("after-kill"), headers=headers("after-kill"))
    assert r.status == 200, await r.text()


async def test_a_native_fault_fails_only_its_own_job(
        make_worker_client: Any, worker_template: Template) -> None:
    c = await make_worker_client()
    r = await c.post("/jobs", json=start_body("segv", crew_id="segfault", topic="TAG-segv"),
                     headers=headers("segv"))
    assert r.status == 502
    record = await _record(c, "segv")
    assert record["error"]["code"] == "worker_died"
    assert record["error"]["signal"] == "SIGSEGV"
    assert record["uncertain_outcome"] is True
    health = await (await c.get("/health", headers=AUTH)).json()
    assert health["active_runs"] == 0
    r = await c.post("/jobs", json=start_body("after-segv"), headers=headers("after-segv"))
    assert r.status == 200


async def test_fifty_jobs_with_random_cancels_and_timeouts_leave_nothing_behind(
        make_worker_client: Any, worker_template: Template) -> None:
    limit = 4
    c = await make_worker_client(stop_grace=0.2, CREWFENCE_MAX_CONCURRENCY=str(limit))
    supervisor = worker_template.supervisor
    rng = random.Random(11)
    seen: list[int] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            seen.append(len([p for p, state in children_of(supervisor.template_pid)]))
            seen.append(supervisor.live_workers)
            await asyncio.sleep(0.002)

    sampler = asyncio.create_task(sample())
    ids = [f"many-{i}" for i in range(50)]
    cancels: list[asyncio.Task[Any]] = []
    for action_id in ids:
        roll = rng.random()
        extra = {"timeout_ms": rng.choice([150, 300])} if roll < 0.3 else {}
        await _admit(c, action_id, "research", f"[[sleep:{rng.choice([0, 0.1, 0.4])}]] x",
                     **extra)
        if 0.3 <= roll < 0.6:
            async def cancel(aid: str = action_id, delay: float = rng.random() * 0.3) -> None:
                await asyncio.sleep(delay)
                await c.post(job_path(aid, "/cancel"),
                             json={"crew_id": "research", "action_id": aid}, headers=AUTH)
            cancels.append(asyncio.create_task(cancel()))
    await asyncio.gather(*cancels)
    records = [await _terminal(c, aid, timeout=120) for aid in ids]
    done.set()
    await sampler
    assert max(seen) <= limit, f"more than {limit} workers were alive at once"
    assert max(seen) >= 2, "the test never ran jobs concurrently"
    # what may remain are the idle spares (forked warm, never given a job); a completion is
    # recorded before its worker is reaped, so the last reaps are awaited, never assumed
    def leftovers() -> list[int]:
        spares = c.executor.spare_pids
        return [pid for pid, _ in children_of(supervisor.template_pid) if pid not in spares]

    def settled() -> bool:
        return not leftovers() and supervisor.live_workers == len(c.executor.spare_pids)

    await until(settled, "the last workers to be reaped", timeout=30)
    assert leftovers() == [], "worker processes or zombies left"
    assert supervisor.live_workers == len(c.executor.spare_pids)
    statuses = {r["status"] for r in records}
    assert statuses <= {"completed", "cancelled", "failed"} and "completed" in statuses
    for record in records:
        if record["status"] != "completed" and record["error"]["code"] in ("cancelled",
                                                                           "timeout"):
            # stopped_at is present exactly when a worker had been forked for the job
            assert record["error"].get("work_stopped", True) is True


def worker_template_training(c: Any) -> Any:
    return c.sidecar.config.training_dir


async def test_all_seven_operations_run_in_workers(make_worker_client: Any) -> None:
    c = await make_worker_client()

    async def run(action_id: str, crew_id: str, operation: str,
                  input_: dict[str, Any]) -> dict[str, Any]:
        r = await c.post("/jobs", json=start_body(action_id, crew_id=crew_id,
                                                  operation=operation, input_=input_),
                         headers=headers(action_id))
        assert r.status == 200, (operation, await r.text())
        record = await _record(c, action_id)
        assert record["status"] == "completed"
        return record

    seed = await run("w-seed", "duo", "run", {"topic": "bees"})
    # (the output's shape is the reference's; older crewfence called the list "tasks")
    task_id = (seed["output"].get("tasks_output") or seed["output"].get("tasks"))[0]["id"]
    replayed = await run("w-replay", "duo", "replay", {"task_id": task_id})
    assert replayed["output"]["replayed_task_id"] == task_id
    await run("w-batch", "research", "batch_run", {"inputs": [{"topic": "a"}, {"topic": "b"}]})
    trained = await run("w-train", "research", "train",
                        {"n_iterations": 1, "artifact_name": "worker-trained",
                         "inputs": {"topic": "bees"}})
    assert (worker_template_training(c) / "worker-trained.pkl").is_file()
    assert trained["output"]
    tested = await run("w-test", "research", "test",
                       {"n_iterations": 1, "eval_llm": "crewfence/offline",
                        "inputs": {"topic": "bees"}})
    assert tested["output"]
    found = await run("w-knowledge", "library", "knowledge_query", {"query": ["honey"]})
    assert "honey" in str(found["output"]).lower()
    await run("w-reset", "research", "memory_reset", {"command_type": "kickoff_outputs"})


async def test_inputs_missing_a_template_variable_are_refused_at_admission(
        make_worker_client: Any) -> None:
    c = await make_worker_client()
    r = await c.post("/jobs", json=start_body("no-topic", input_={"subject": "bees"}),
                     headers=headers("no-topic"))
    assert r.status == 422
    body = await r.json()
    assert body["error"]["code"] == "missing_inputs" and "topic" in body["error"]["message"]
    assert (await c.get(job_path("no-topic"), headers=AUTH)).status == 404  # nothing admitted
    r = await c.post("/jobs", json=start_body("no-topic-batch", operation="batch_run",
                                              input_={"inputs": [{"topic": "a"}, {}]}),
                     headers=headers("no-topic-batch"))
    assert r.status == 422
    assert "inputs[1]" in (await r.json())["error"]["message"]
    health = await (await c.get("/health", headers=AUTH)).json()
    assert health["model_credentials"]["research"] == {
        "model": "crewfence/offline", "hosted": False, "credentials": "not_needed"}
    assert health["model_credentials_missing"] == []


async def test_model_calls_made_in_workers_are_counted_by_the_sidecar(
        make_worker_client: Any) -> None:
    """crewfence_offline_llm_calls_total counts the workers' calls (each reported as it is
    made), and not the spares' warm-up kickoffs."""
    c = await make_worker_client()

    async def calls() -> float:
        text = await (await c.get("/metrics", headers=AUTH)).text()
        return metric_value(text, "crewfence_offline_llm_calls_total")

    before = await calls()
    r = await c.post("/jobs", json=start_body("counted", topic="counted"),
                     headers=headers("counted"))
    assert r.status == 200
    r = await c.post("/jobs", json=start_body("counted-batch", operation="batch_run",
                                              input_={"inputs": [{"topic": "a"}, {"topic": "b"}]}),
                     headers=headers("counted-batch"))
    assert r.status == 200
    assert await calls() - before == 3  # one task per kickoff: 1 + 2
