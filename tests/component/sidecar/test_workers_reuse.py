"""Worker reuse (``CREWFENCE_WORKER_MAX_JOBS``): a worker whose job ended on its own with
nothing left running takes the next job; a worker whose job left a thread or a process
running, was cancelled, or died is never given another job.

Which worker ran a job is read from the effects log: the ``tagged`` crew's model logs the
pid of the process that runs it (``worker_crews.effect``).
"""

from __future__ import annotations

from typing import Any

import pytest
from crewfence_sidecar.contract import job_path
from sidecar_helpers import AUTH, headers, start_body
from worker_support import Template, alive, children_of, until

pytestmark = pytest.mark.timeout(180)


async def _run(c: Any, action_id: str, crew_id: str = "tagged",
               expect: int = 200) -> dict[str, Any]:
    r = await c.post("/jobs", json=start_body(action_id, crew_id=crew_id,
                                              topic=f"TAG-{action_id}"),
                     headers=headers(action_id))
    assert r.status == expect, await r.text()
    record = await (await c.get(job_path(action_id), headers=AUTH)).json()
    return dict(record)


def _pid(template: Template, action_id: str) -> int:
    pid = template.pid_of(f"TAG-{action_id}")
    assert pid is not None, f"no model call logged for {action_id}"
    return pid


async def _nothing_left(c: Any, template: Template) -> None:
    """Every child of the template is an idle pooled worker (reaps are awaited)."""
    supervisor = template.supervisor

    def settled() -> bool:
        idle = set(c.executor.spare_pids)
        return (all(pid in idle for pid, _ in children_of(supervisor.template_pid))
                and supervisor.live_workers == len(idle))

    await until(settled, "only idle workers to remain")


async def _idle_again(c: Any, pid: int) -> None:
    """A result is recorded (and answered) before its worker's reuse checks end: wait until
    the worker is back in the pool, so the next job is offered to it."""
    await until(lambda: pid in c.executor.spare_pids or c.executor.stats.not_reused,
                 f"worker {pid} to be idle again")


def _assert_completed(record: dict[str, Any], action_id: str) -> None:
    assert record["status"] == "completed", record
    assert record["action_id"] == action_id
    assert record["uncertain_outcome"] is False
    assert record["error"] is None


async def test_sequential_jobs_run_in_the_same_worker(
        make_worker_client: Any, worker_template: Template) -> None:
    from crewfence_sidecar.workers.counters import offline_llm_calls

    c = await make_worker_client()
    calls = offline_llm_calls()
    first = await _run(c, "reuse-1")
    await _idle_again(c, _pid(worker_template, "reuse-1"))
    first_calls, calls = offline_llm_calls() - calls, offline_llm_calls()
    second = await _run(c, "reuse-2")
    await _idle_again(c, _pid(worker_template, "reuse-2"))
    # each job's model calls are reported once, by the job that made them
    assert offline_llm_calls() - calls == first_calls >= 1
    _assert_completed(first, "reuse-1")
    _assert_completed(second, "reuse-2")
    assert "TAG-reuse-1" in str(first["output"])  # each record carries its own output
    assert "TAG-reuse-2" in str(second["output"]) and "TAG-reuse-1" not in str(second["output"])
    assert _pid(worker_template, "reuse-1") == _pid(worker_template, "reuse-2"), \
        c.executor.stats.not_reused
    assert c.executor.stats.reused_jobs == 1, c.executor.stats.not_reused
    assert _pid(worker_template, "reuse-2") in c.executor.spare_pids  # idle again, pooled
    assert c.executor.stats.not_reused == []


async def test_max_jobs_one_gives_every_job_a_fresh_worker(
        make_worker_client: Any, worker_template: Template) -> None:
    c = await make_worker_client(CREWFENCE_WORKER_MAX_JOBS="1")
    _assert_completed(await _run(c, "once-1"), "once-1")
    _assert_completed(await _run(c, "once-2"), "once-2")
    first = _pid(worker_template, "once-1")
    assert first != _pid(worker_template, "once-2")
    assert c.executor.stats.reused_jobs == 0
    await until(lambda: not alive(first), "the one-job worker to be reaped")


@pytest.mark.parametrize("crew_id", ["leak_thread", "leak_process"])
async def test_a_job_that_leaves_something_running_is_not_reused(
        make_worker_client: Any, worker_template: Template, crew_id: str) -> None:
    c = await make_worker_client()
    leaky = f"leaky-{crew_id}"
    _assert_completed(await _run(c, leaky, crew_id=crew_id), leaky)
    leaker = _pid(worker_template, leaky)
    await _idle_again(c, leaker)  # its verdict is in: idle, or a reason to exit
    assert leaker not in c.executor.spare_pids
    left = "threads left running" if crew_id == "leak_thread" else "processes left"
    assert len(c.executor.stats.not_reused) == 1
    assert c.executor.stats.not_reused[0].startswith(left), c.executor.stats.not_reused
    after = f"after-{crew_id}"
    _assert_completed(await _run(c, after), after)
    assert _pid(worker_template, after) != leaker
    await until(lambda: not alive(leaker), "the leaking worker to be reaped")
    if crew_id == "leak_process":
        children = [int(tag) for kind, pid, tag in worker_template.effect_lines()
                    if kind == "child" and pid == leaker]
        assert children and not any(alive(child) for child in children)
    await _nothing_left(c, worker_template)


async def test_a_cancelled_jobs_worker_is_never_reused(
        make_worker_client: Any, worker_template: Template) -> None:
    c = await make_worker_client()
    r = await c.post("/jobs", json=start_body("cancel-me", crew_id="stuck",
                                              topic="TAG-cancel-me"),
                     headers=headers("cancel-me", async_=True))
    assert r.status == 202
    victim = await until(lambda: worker_template.pid_of("TAG-cancel-me"), "the job to run")
    r = await c.post(job_path("cancel-me", "/cancel"),
                     json={"crew_id": "stuck", "action_id": "cancel-me"}, headers=AUTH)
    assert r.status in (200, 202)
    await until(lambda: c.sidecar.runtime.journal.get("cancel-me").terminal, "the cancel")
    assert not alive(victim)
    assert victim not in c.executor.spare_pids
    _assert_completed(await _run(c, "after-cancel"), "after-cancel")
    assert _pid(worker_template, "after-cancel") != victim


async def test_a_dead_workers_next_job_runs_elsewhere(
        make_worker_client: Any, worker_template: Template) -> None:
    c = await make_worker_client()
    _assert_completed(await _run(c, "before-segv"), "before-segv")
    reused = _pid(worker_template, "before-segv")
    await _idle_again(c, reused)
    record = await _run(c, "segv-reuse", crew_id="segfault", expect=502)
    assert record["error"]["code"] == "worker_died"
    assert _pid(worker_template, "segv-reuse") == reused  # the idle worker took it, and died
    assert not alive(reused)
    _assert_completed(await _run(c, "after-segv"), "after-segv")
    assert _pid(worker_template, "after-segv") != reused
    await _nothing_left(c, worker_template)


async def test_a_reusable_worker_waits_for_recorded_before_its_after_job_work(
        worker_template: Template) -> None:
    """Invariant (after-job work never competes with recording the outcome): a worker that
    may take another job sends nothing after its outcome (no reuse checks, no ``idle``)
    until the sidecar says ``recorded``; then it reports ``idle``."""
    import asyncio

    supervisor = worker_template.supervisor
    supervisor.attach()
    handle = supervisor.request_fork()
    try:
        await handle.forked
        await handle.open({"crew_id": "tagged", "action_id": "ack-1", "operation": "run",
                           "input": {"topic": "TAG-ack-1"}, "max_jobs": 2})
        kinds = []
        while not kinds or kinds[-1] not in ("result", "error"):
            message = await handle.next_message()
            assert message is not None, f"the channel ended after {kinds}"
            kinds.append(message["type"])
        assert kinds[-1] == "result", kinds
        waiting = asyncio.ensure_future(handle.next_message())
        done, _ = await asyncio.wait({waiting}, timeout=1.0)
        assert not done, f"the worker went on without 'recorded': {waiting.result()}"
        handle.send({"type": "recorded"})
        idle = await asyncio.wait_for(waiting, 30)
        assert idle is not None and idle["type"] == "idle", idle
    finally:
        handle.close()
        await until(lambda: handle.exited.done(), "the worker to be reaped")
        await supervisor.detach()


def _tagged_job(action_id: str, outputs: list[Any], answered: Any = None) -> Any:
    """A ``tagged`` job for the executor itself: its output is appended to ``outputs``, and
    ``answered`` (when given) holds its worker until it returns."""
    from crewfence_sidecar.runtime import JobContext

    def no_chunks(data: dict[str, Any]) -> None:
        return None

    return JobContext(crew_id="tagged", action_id=action_id, operation="run",
                      input={"topic": f"TAG-{action_id}"}, training_dir=None,
                      emit_chunk=no_chunks, on_output=outputs.append, answered=answered)


async def test_recorded_is_sent_only_after_the_blocking_answers_were_written(
        worker_template: Template) -> None:
    """The executor lets a reused worker start its after-job work only after
    ``JobContext.answered`` returned (the job's blocking answers were written)."""
    import asyncio

    from crewfence_sidecar.workers.executor import WorkerExecutor

    supervisor = worker_template.supervisor
    supervisor.attach()
    executor = WorkerExecutor(supervisor, max_live=2, spares=0, max_jobs=3)
    answer_written = asyncio.Event()
    outputs: list[Any] = []
    ctx = _tagged_job("answered-1", outputs, answer_written.wait)
    try:
        job = asyncio.ensure_future(executor(ctx))
        await until(lambda: outputs, "the result to be handed over")
        await asyncio.sleep(0.5)  # a worker told too early would report idle meanwhile
        assert not job.done() and executor.spare_pids == []
        answer_written.set()
        await asyncio.wait_for(job, 30)
        assert len(executor.spare_pids) == 1  # told `recorded`, it checked and went idle
    finally:
        await executor.close()
        await supervisor.detach()


async def test_the_blocking_route_holds_its_job_until_its_answer_is_written(
        make_worker_client: Any) -> None:
    """``answers_written`` of a job answered by the blocking route returns only after that
    answer was written (so the reused worker's after-job work waits for it)."""
    import asyncio

    c = await make_worker_client()
    runtime = c.sidecar.runtime
    post = asyncio.ensure_future(c.post("/jobs", json=start_body("held", topic="[[sleep:1]] x"),
                                        headers=headers("held")))
    await until(lambda: runtime.journal.get("held") is not None, "the admission")
    pending = asyncio.ensure_future(runtime.answers_written("held", timeout=30))
    done, _ = await asyncio.wait({pending}, timeout=0.3)
    assert not done, "answers_written returned while the blocking answer was pending"
    response = await post
    assert response.status == 200, await response.text()
    await asyncio.wait_for(pending, 5)
    await asyncio.wait_for(runtime.answers_written("held", timeout=30), 1)  # nothing held


async def test_a_job_whose_worker_died_before_it_started_runs_on_another_worker(
        make_worker_client: Any, worker_template: Template) -> None:
    """Invariant (no uncertain verdict for work that never started): a pooled worker that
    dies after it was given a job but before its ``started`` frame ran nothing of it; the job
    goes to another worker and completes, certain."""
    import asyncio
    import os
    import signal

    c = await make_worker_client(CREWFENCE_WORKER_SPARES="1")
    [victim] = await until(lambda: c.executor.spare_pids, "a spare worker")
    os.kill(victim, signal.SIGSTOP)  # alive, so the pool gives it the job; it cannot read it
    try:
        post = asyncio.ensure_future(_run(c, "handed-on"))
        await until(lambda: victim not in c.executor.spare_pids, "the job to reach the spare")
    finally:
        os.kill(victim, signal.SIGKILL)
    record = await post
    _assert_completed(record, "handed-on")
    assert _pid(worker_template, "handed-on") != victim
    await until(lambda: not alive(victim), "the killed spare to be reaped")


async def test_a_daemon_that_left_the_process_group_still_refuses_reuse(
        make_worker_client: Any, worker_template: Template) -> None:
    """Invariant (nothing of an earlier job runs beside the next): a tool's daemon that left
    the worker's process group (``setsid``) and lost its parent (double fork) is re-parented
    to the worker (subreaper), so the worker is not reused while it runs."""
    import os
    import signal

    c = await make_worker_client()
    _assert_completed(await _run(c, "daemon-1", crew_id="leak_daemon"), "daemon-1")
    leaker = _pid(worker_template, "daemon-1")
    daemons = [int(tag) for kind, pid, tag in worker_template.effect_lines()
               if kind == "daemon" and pid == leaker]
    try:
        assert daemons and all(alive(d) for d in daemons)
        assert all(os.getpgid(d) != leaker for d in daemons)  # outside the worker's group
        await _idle_again(c, leaker)
        assert leaker not in c.executor.spare_pids
        assert [r for r in c.executor.stats.not_reused if r.startswith("processes left")], \
            c.executor.stats.not_reused
    finally:
        for daemon in daemons:
            try:
                os.kill(daemon, signal.SIGKILL)
            except ProcessLookupError:
                pass


async def test_a_cancel_stops_a_daemon_that_left_the_process_group(
        make_worker_client: Any, worker_template: Template) -> None:
    """Invariant (work_stopped is the truth): a record that says its work stopped has no
    descendant of the job left running, not even one outside the worker's process group."""
    import os

    c = await make_worker_client()
    r = await c.post("/jobs", json=start_body("daemon-cancel", crew_id="daemon_then_block",
                                              topic="TAG-daemon-cancel"),
                     headers=headers("daemon-cancel", async_=True))
    assert r.status == 202
    worker = await until(lambda: worker_template.pid_of("TAG-daemon-cancel"), "the job to run")
    daemon = await until(lambda: next((int(tag) for kind, pid, tag
                                       in worker_template.effect_lines()
                                       if kind == "daemon" and pid == worker), None),
                         "the tool to start its daemon")
    try:
        assert alive(daemon) and os.getpgid(daemon) != os.getpgid(os.getpid())
        r = await c.post(job_path("daemon-cancel", "/cancel"),
                         json={"crew_id": "daemon_then_block", "action_id": "daemon-cancel"},
                         headers=AUTH)
        assert r.status == 200
        record = await until(lambda: (rec := c.sidecar.runtime.journal.get("daemon-cancel"))
                             and rec.terminal and rec, "the cancel")
        assert record.status.value == "cancelled" and record.work_stopped, record
        assert not alive(daemon), "the record says work_stopped while the daemon still runs"
    finally:
        if alive(daemon):
            os.kill(daemon, 9)


async def test_a_worker_over_the_resident_set_bound_is_not_reused(
        make_worker_client: Any, worker_template: Template) -> None:
    """``CREWFENCE_WORKER_MAX_RSS_MB`` bounds reuse: a worker at or over it after its job
    exits (every worker with crewai loaded is over 1 MiB)."""
    c = await make_worker_client(CREWFENCE_WORKER_MAX_RSS_MB="1")
    _assert_completed(await _run(c, "heavy-1"), "heavy-1")
    heavy = _pid(worker_template, "heavy-1")
    await _idle_again(c, heavy)
    assert heavy not in c.executor.spare_pids
    assert [r for r in c.executor.stats.not_reused if r.startswith("resident set")], \
        c.executor.stats.not_reused
    _assert_completed(await _run(c, "heavy-2"), "heavy-2")
    assert _pid(worker_template, "heavy-2") != heavy


async def _burst(c: Any, tag: str, n: int = 4) -> list[dict[str, Any]]:
    """``n`` jobs at once, each inside its model call long enough for all to overlap."""
    import asyncio

    async def one(k: int) -> dict[str, Any]:
        action_id = f"{tag}-{k}"
        r = await c.post("/jobs", json=start_body(action_id, crew_id="tagged",
                                                  topic=f"[[sleep:0.5]] TAG-{action_id}"),
                         headers=headers(action_id))
        assert r.status == 200, await r.text()
        return dict(await (await c.get(job_path(action_id), headers=AUTH)).json())

    return list(await asyncio.gather(*(one(k) for k in range(n))))


async def test_a_burst_leaves_its_workers_warm_for_the_next_burst(
        make_worker_client: Any, worker_template: Template) -> None:
    """Invariant (a burst's workers stay warm): after 4 jobs at once (maxConcurrency 4, 2
    spares) all four workers are idle in the pool, and the next burst runs in them: no
    worker is forked for it (before, two of the four exited and the next burst forked)."""
    c = await make_worker_client(CREWFENCE_WORKER_SPARES="2")
    for record in await _burst(c, "first"):
        assert record["status"] == "completed", record
    first = {_pid(worker_template, f"first-{k}") for k in range(4)}
    assert len(first) == 4
    await until(lambda: set(c.executor.spare_pids) == first, "all four workers to be idle")
    for record in await _burst(c, "second"):
        assert record["status"] == "completed", record
    second = {_pid(worker_template, f"second-{k}") for k in range(4)}
    assert second == first, c.executor.stats.not_reused
    assert c.executor.stats.reused_jobs >= 4


async def test_a_job_sent_while_a_worker_is_on_its_way_back_forks_no_spare(
        worker_template: Template) -> None:
    """Back to back, the next job often comes while the last job's worker is still on its way
    back to the pool (its answer written, its checks not yet done): that job takes the spare,
    and no new spare is forked beside it (its fork and warm-up kickoff would compete with the
    job for the CPU) while the returning worker is about to refill the pool."""
    import asyncio

    from crewfence_sidecar.workers.executor import WorkerExecutor

    supervisor = worker_template.supervisor
    supervisor.attach()
    executor = WorkerExecutor(supervisor, max_live=4, spares=1, max_jobs=5)
    first_answered = asyncio.Event()
    outputs: list[Any] = []

    try:
        executor.prime()
        await until(lambda: executor.spare_pids, "the first spare")
        first = asyncio.ensure_future(executor(_tagged_job("back-1", outputs,
                                                            first_answered.wait)))
        # the first job took the spare and ran the pool dry: one spare is forked for a burst
        await until(lambda: len(outputs) == 1, "the first job's result")
        await until(lambda: executor.spare_pids, "the spare forked when the pool ran dry")
        assert supervisor.live_workers == 2
        # the first job's worker is on its way back (its answer is not written yet)
        await asyncio.wait_for(executor(_tagged_job("back-2", outputs)), 60)
        assert supervisor.live_workers == 2  # no third worker was forked beside the job
        first_answered.set()
        await asyncio.wait_for(first, 30)
        assert len(executor.spare_pids) == 2  # both workers idle in the pool
        assert supervisor.live_workers == 2
    finally:
        first_answered.set()
        await executor.close()
        await supervisor.detach()
