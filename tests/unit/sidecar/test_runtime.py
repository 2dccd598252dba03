"""Runtime semantics with a tiny in-test executor (crewai is exercised in tests/component)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from crewfence_sidecar.contract import (
    ContractError,
    Operation,
    StartRequest,
    Status,
    ToolSetupError,
)
from crewfence_sidecar.journal import Journal
from crewfence_sidecar.metrics import SidecarMetrics
from crewfence_sidecar.runtime import (
    Gone,
    JobContext,
    JournalUnavailable,
    Runtime,
    RuntimeSettings,
)
from crewfence_sidecar.workers.outcomes import RemoteExecutionError


class Crews:
    def __contains__(self, crew_id: object) -> bool:
        return crew_id == "crew"

    def crew_ids(self) -> list[str]:
        return ["crew"]


class CountingExecutor:
    """Async work that emits chunks and can block until released; thread work for replay."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.thread_release = threading.Event()

    async def __call__(self, ctx: JobContext) -> Any:
        self.calls += 1
        if ctx.operation == "replay":
            await asyncio.to_thread(self.thread_release.wait, 30)
            return {"replayed": True}
        ctx.emit_chunk({"content": "a"})
        if ctx.input.get("block"):
            await self.release.wait()
        if ctx.input.get("fail"):
            raise RuntimeError("secret detail")
        if ctx.input.get("no_tool"):
            raise ToolSetupError("MCP server 'tickets' does not offer tool(s) nope")
        if ctx.input.get("remote_no_tool"):
            raise RemoteExecutionError("MCPToolError",
                                       tool_setup="MCP server 'tickets': tools/list failed")
        ctx.emit_chunk({"content": "b"})
        return {"echo": ctx.input}


@pytest.fixture
def executor() -> CountingExecutor:
    return CountingExecutor()


@pytest.fixture
def runtime(journal: Journal, executor: CountingExecutor) -> Runtime:
    ops = frozenset({Operation.RUN, Operation.REPLAY})
    return Runtime(journal, Crews(), RuntimeSettings(allowed_operations=ops), executor,
                   SidecarMetrics())


def _req(action_id: str = "a", **input_: Any) -> StartRequest:
    return StartRequest("crew", action_id, Operation.RUN, dict(input_))


async def test_fifty_concurrent_identical_admissions_execute_once(
        runtime: Runtime, executor: CountingExecutor) -> None:
    results = await asyncio.gather(*(runtime.admit(_req(), "k") for _ in range(50)))
    assert sum(r.created for r in results) == 1
    assert len({r.record.request_hash for r in results}) == 1
    assert await runtime.wait_terminal("a", 10)
    assert executor.calls == 1
    events = runtime.events("a", 0, 100)
    assert [e.sequence for e in events] == list(range(len(events)))
    assert [e.event for e in events] == ["started", "chunk", "chunk", "completed"]


async def test_changed_request_is_409_and_schedules_nothing(
        runtime: Runtime, executor: CountingExecutor) -> None:
    await runtime.admit(_req(x=1), "k")
    await runtime.wait_terminal("a", 10)
    for req, key in ((_req(x=2), "k"), (_req(x=1), "other")):
        with pytest.raises(ContractError) as err:
            await runtime.admit(req, key)
        assert err.value.status == 409
    assert executor.calls == 1


async def test_archived_action_answers_410_and_never_runs_again(
        runtime: Runtime, executor: CountingExecutor) -> None:
    await runtime.admit(_req(), "k")
    await runtime.wait_terminal("a", 10)
    runtime.archive("a")
    with pytest.raises(Gone):
        await runtime.admit(_req(), "k")
    assert executor.calls == 1


async def test_full_journal_is_507_with_nothing_left(
        runtime: Runtime, executor: CountingExecutor) -> None:
    for i in range(5):
        await runtime.admit(_req(f"a{i}"), "k")
    with pytest.raises(JournalUnavailable):
        await runtime.admit(_req("extra"), "k")
    assert runtime.journal.get("extra") is None
    for i in range(5):
        await runtime.wait_terminal(f"a{i}", 10)
    assert executor.calls == 5


async def test_cancel_running_async_job(runtime: Runtime, executor: CountingExecutor) -> None:
    await runtime.admit(_req(block=True), "k")
    while runtime.journal.get("a").event_count < 2:  # type: ignore[union-attr]
        await runtime.wait_change("a", 5)
    rec = await runtime.cancel("crew", "a", "stop")
    assert rec.status is Status.CANCELLED and rec.uncertain_outcome  # run is thread-backed
    assert runtime.events("a", 0, 10)[-1].event == "cancelled"
    again = await runtime.cancel("crew", "a", None)  # terminal: unchanged
    assert again.updated_at == rec.updated_at and again.event_count == rec.event_count


async def test_cancel_thread_backed_job_is_uncertain(
        runtime: Runtime, executor: CountingExecutor) -> None:
    req = StartRequest("crew", "r", Operation.REPLAY, {"task_id": "t"})
    await runtime.admit(req, "k")
    while executor.calls == 0:
        await asyncio.sleep(0.01)
    rec = await runtime.cancel("crew", "r", None)
    assert rec.status is Status.CANCELLED and rec.uncertain_outcome
    last = runtime.events("r", 0, 10)[-1]
    assert last.event == "cancelled" and last.data["uncertain_outcome"] is True
    executor.thread_release.set()


async def test_timeout_of_async_and_thread_backed(
        runtime: Runtime, executor: CountingExecutor) -> None:
    await runtime.admit(StartRequest("crew", "t1", Operation.RUN, {"block": True}, 50), "k")
    await runtime.admit(StartRequest("crew", "t2", Operation.REPLAY, {"task_id": "x"}, 50), "k")
    assert await runtime.wait_terminal("t1", 10) and await runtime.wait_terminal("t2", 10)
    t1, t2 = runtime.journal.get("t1"), runtime.journal.get("t2")
    assert t1 is not None and t2 is not None
    assert t1.status is Status.FAILED and t1.error["code"] == "timeout"  # type: ignore[index]
    assert t1.uncertain_outcome
    assert t2.status is Status.FAILED and t2.uncertain_outcome
    executor.thread_release.set()


class TaskRecordingExecutor(CountingExecutor):
    """Notes the task each job's execution ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[asyncio.Task[Any] | None] = []

    async def __call__(self, ctx: JobContext) -> Any:
        self.tasks.append(asyncio.current_task())
        return await super().__call__(ctx)


async def test_a_job_executes_in_its_own_task_under_its_timeout(journal: Journal) -> None:
    """No task per job but the job's: the execution runs in the job's task under
    ``asyncio.timeout`` (``wait_for`` put it in a task of its own, a loop turn more at its
    start and at its end of every run), and the timeout still ends it as ``timeout``."""
    executor = TaskRecordingExecutor()
    rt = Runtime(journal, Crews(), RuntimeSettings(allowed_operations=frozenset({Operation.RUN})),
                 executor, SidecarMetrics())
    await rt.admit(_req("quick"), "k")
    job_task = rt._jobs["quick"].task
    assert await rt.wait_terminal("quick", 10)
    assert executor.tasks == [job_task]
    await rt.admit(StartRequest("crew", "slow", Operation.RUN, {"block": True}, 50), "k")
    assert await rt.wait_terminal("slow", 10)
    slow = rt.journal.get("slow")
    assert slow is not None and slow.error is not None and slow.error["code"] == "timeout"


async def test_a_woken_waiter_resumes_in_the_next_loop_turn(runtime: Runtime) -> None:
    """A blocking answer waits on the record's change; once the change is announced, the
    waiting route runs in the very next turn of the loop (wait_for needed two)."""
    waiter = asyncio.ensure_future(runtime.wait_change("w", 30))
    await asyncio.sleep(0)  # the waiter registers
    runtime._notify("w")
    await asyncio.sleep(0)  # one turn
    assert waiter.done()


async def test_a_waiter_that_is_never_woken_returns_at_its_timeout(runtime: Runtime) -> None:
    await asyncio.wait_for(runtime.wait_change("never", 0.01), 5)
    assert not runtime._watches


async def test_execution_error_records_only_the_class(runtime: Runtime) -> None:
    await runtime.admit(_req(fail=True), "k")
    await runtime.wait_terminal("a", 10)
    rec = runtime.journal.get("a")
    assert rec is not None and rec.status is Status.FAILED
    assert rec.error == {"code": "execution_error", "exception": "RuntimeError",
                         "message": "the operation raised RuntimeError"}
    assert "secret detail" not in str(runtime.events("a", 0, 10))


@pytest.mark.parametrize(("flag", "exception", "message"), [
    ("no_tool", "ToolSetupError", "MCP server 'tickets' does not offer tool(s) nope"),
    ("remote_no_tool", "MCPToolError", "MCP server 'tickets': tools/list failed"),
])
async def test_a_crew_whose_tools_cannot_be_built_fails_certain_naming_them(
        runtime: Runtime, flag: str, exception: str, message: str) -> None:
    await runtime.admit(_req(**{flag: True}), "k")
    await runtime.wait_terminal("a", 10)
    rec = runtime.journal.get("a")
    assert rec is not None and rec.status is Status.FAILED and not rec.uncertain_outcome
    assert rec.error == {"code": "tool_unavailable", "exception": exception, "message": message}


@pytest.mark.parametrize("req, status", [
    (StartRequest("nope", "a", Operation.RUN, {}), 404),
    (StartRequest("crew", "a", Operation.TRAIN, {"n_iterations": 1, "artifact_name": "x"}), 403),
    (StartRequest("crew", "a", Operation.REPLAY, {}), 422),
])
async def test_refusals(runtime: Runtime, req: StartRequest, status: int) -> None:
    with pytest.raises(ContractError) as err:
        await runtime.admit(req, "k")
    assert err.value.status == status
    assert runtime.journal.get("a") is None


async def test_close_marks_running_jobs_failed_and_uncertain(runtime: Runtime) -> None:
    await runtime.admit(_req(block=True), "k")
    await runtime.close()
    rec = runtime.journal.get("a")
    assert rec is not None and rec.status is Status.FAILED and rec.uncertain_outcome


async def test_answers_written_waits_for_every_blocking_answer_of_the_action(
        runtime: Runtime) -> None:
    """Invariant (a worker's after-job work never competes with the answer): answers_written
    returns only once every ``answering`` holder of the action has let go; at once when
    nobody is answering; other actions do not hold it."""
    await asyncio.wait_for(runtime.answers_written("a"), 1)  # nobody answering: at once
    with runtime.answering("a"), runtime.answering("b"):
        with runtime.answering("a"):
            waiter = asyncio.ensure_future(runtime.answers_written("a", timeout=30))
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not waiter.done()  # one blocking answer of "a" is still being written
    await asyncio.wait_for(waiter, 1)


async def test_answers_written_is_bounded(runtime: Runtime) -> None:
    with runtime.answering("slow"):
        await asyncio.wait_for(runtime.answers_written("slow", timeout=0.05), 5)


async def test_journal_gauges_are_read_when_scraped(runtime: Runtime) -> None:
    text = runtime.metrics.render().decode()
    assert "crewfence_sidecar_journal_records 0.0" in text
    await runtime.admit(_req("gauge"), "k-gauge")
    text = runtime.metrics.render().decode()
    assert "crewfence_sidecar_journal_records 1.0" in text
    size = [line for line in text.splitlines()
            if line.startswith("crewfence_sidecar_journal_bytes ")]
    assert size and float(size[0].split()[1]) > 0


@pytest.mark.parametrize("started", [True, False])
async def test_a_dead_worker_is_uncertain_only_when_its_job_had_started(
        journal: Journal, started: bool) -> None:
    from crewfence_sidecar.workers.outcomes import StopReport, WorkerDied
    from crewfence_sidecar.workers.protocol import ExitStatus

    async def dies(ctx: JobContext) -> Any:
        gone = ExitStatus(signal=9)
        raise WorkerDied(gone, StopReport(stopped_at="2026-12-01T00:00:00.000Z", exit=gone,
                                          escalated=False), job_started=started)

    rt = Runtime(journal, Crews(), RuntimeSettings(allowed_operations=frozenset({Operation.RUN})),
                 dies, SidecarMetrics())
    await rt.admit(_req("died"), "k-died")
    assert await rt.wait_terminal("died", 5)
    record = journal.get("died")
    assert record is not None and record.status is Status.FAILED
    assert record.uncertain_outcome is started
    assert record.error is not None and record.error["job_started"] is started
    assert record.error["code"] == "worker_died"
