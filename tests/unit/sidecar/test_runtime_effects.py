"""The runtime's effect-ledger path (``JobContext.record_effect``) with an in-test executor
that reports effects the way the ledger's hooks do, from the loop and from other threads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crewfence_sidecar.contract import Operation, StartRequest
from crewfence_sidecar.journal import Journal, JournalLimits
from crewfence_sidecar.metrics import SidecarMetrics
from crewfence_sidecar.runtime import JobContext, Runtime, RuntimeSettings

Work = Callable[[Callable[[str, dict[str, Any], bool], bool]], Any]


class Crews:
    def __contains__(self, crew_id: object) -> bool:
        return crew_id == "crew"

    def crew_ids(self) -> list[str]:
        return ["crew"]


class EffectExecutor:
    """Runs ``work(record_effect)`` in a worker thread (as crewai runs agents) and keeps its
    verdicts."""

    def __init__(self, work: Work) -> None:
        self.work = work
        self.verdicts: Any = None

    async def __call__(self, ctx: JobContext) -> Any:
        assert ctx.record_effect is not None
        self.verdicts = await asyncio.to_thread(self.work, ctx.record_effect)
        return {"ok": True}


@pytest.fixture
def journal_factory(tmp_path: Path) -> Iterator[Callable[[int], Journal]]:
    opened: list[Journal] = []

    def make(max_events: int = 10_000) -> Journal:
        d = tmp_path / f"s{len(opened)}"
        d.mkdir(mode=0o700)
        j = Journal.open(d / "j.db", JournalLimits(max_events_per_run=max_events))
        opened.append(j)
        return j

    yield make
    for j in opened:
        j.close()


async def _run(journal: Journal, work: Work) -> tuple[Runtime, EffectExecutor]:
    executor = EffectExecutor(work)
    runtime = Runtime(journal, Crews(), RuntimeSettings(allowed_operations=frozenset(
        {Operation.RUN})), executor, SidecarMetrics())
    await runtime.admit(StartRequest("crew", "a", Operation.RUN, {}), "k")
    assert await runtime.wait_terminal("a", 10)
    return runtime, executor


async def test_effects_from_a_thread_keep_their_order_and_a_durable_one_waits(
        journal_factory: Callable[[int], Journal]) -> None:
    journal = journal_factory(10_000)
    seen_before_verdict: list[list[str]] = []

    def work(record: Callable[[str, dict[str, Any], bool], bool]) -> list[bool]:
        verdicts = [record("task_started", {"n": 1}, False),
                    record("model_call", {"n": 2}, False),
                    record("tool_call_started", {"n": 3}, True)]
        # the durable start returned: it and everything queued before it are journaled
        seen_before_verdict.append([e.event for e in journal.events("a")])
        verdicts.append(record("tool_call_finished", {"n": 4}, False))
        return verdicts

    _, executor = await _run(journal, work)
    assert executor.verdicts == [True, True, True, True]
    assert seen_before_verdict == [["started", "task_started", "model_call",
                                    "tool_call_started"]]
    names = [e.event for e in journal.events("a")]
    assert names == ["started", "task_started", "model_call", "tool_call_started",
                     "tool_call_finished", "completed"]


async def test_a_durable_effect_the_journal_has_no_room_for_is_refused(
        journal_factory: Callable[[int], Journal]) -> None:
    journal = journal_factory(4)  # started + 2 effects + the terminal event's reserved slot

    def work(record: Callable[[str, dict[str, Any], bool], bool]) -> list[bool]:
        return [record("task_started", {}, False), record("model_call", {}, False),
                record("tool_call_started", {}, True)]

    _, executor = await _run(journal, work)
    assert executor.verdicts[2] is False  # the tool must not run
    assert "tool_call_started" not in [e.event for e in journal.events("a")]


async def test_unknown_names_and_finished_records_take_no_effects(
        journal_factory: Callable[[int], Journal]) -> None:
    journal = journal_factory(10_000)
    recorders: list[Callable[[str, dict[str, Any], bool], bool]] = []

    def work(record: Callable[[str, dict[str, Any], bool], bool]) -> list[bool]:
        recorders.append(record)
        return [record("chunk", {}, True), record("completed", {}, True)]

    runtime, executor = await _run(journal, work)
    assert executor.verdicts == [False, False]  # not effect events
    assert runtime.record_effect("a", "tool_call_started", {}, durable=True) is False
    assert [e.event for e in journal.events("a")] == ["started", "completed"]


def test_a_durable_append_commits_with_a_synced_wal(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    journal = Journal.open(d / "j.db", JournalLimits())
    from crewfence_sidecar.contract import JobRecord, Status
    from crewfence_sidecar.journal import utc_now

    now = utc_now()
    journal.admit(JobRecord("a", "crew", "run", "h", Status.RUNNING, 0, now, now), {})
    syncs: list[bool] = []
    original = journal._tx

    def spy(*, fsync: bool = True) -> Any:
        syncs.append(fsync)
        return original(fsync=fsync)

    monkeypatch.setattr(journal, "_tx", spy)
    journal.append_event("a", "tool_call_started", {}, durable=True)
    journal.append_event("a", "model_call", {})
    assert syncs == [True, False]
    journal.close()


async def test_a_durable_start_and_its_preceding_model_call_are_one_commit(
        journal_factory: Callable[[int], Journal]) -> None:
    """The model call that chose a tool costs no commit of its own on the tool's path: the
    start and its ``preceding`` are one synced transaction (and all or none)."""
    journal = journal_factory(10_000)
    statements: list[str] = []
    journal._conn.set_trace_callback(statements.append)

    def work(record: Any) -> list[bool]:
        statements.clear()
        ok = record("tool_call_started", {"n": 2}, True, [("model_call", {"n": 1})])
        commits = sum(1 for s in statements if s.strip().upper() == "COMMIT")
        return [ok, commits == 1]

    _, executor = await _run(journal, work)
    assert executor.verdicts == [True, True]
    assert [e.event for e in journal.events("a")][1:3] == ["model_call", "tool_call_started"]


async def test_a_start_whose_batch_does_not_fit_journals_none_of_it(
        journal_factory: Callable[[int], Journal]) -> None:
    # room for one event (started takes one slot, the terminal one is reserved)
    journal = journal_factory(3)

    def work(record: Any) -> list[bool]:
        return [record("tool_call_started", {"n": 2}, True, [("model_call", {"n": 1})])]

    _, executor = await _run(journal, work)
    assert executor.verdicts == [False]
    assert [e.event for e in journal.events("a")] == ["started", "completed"]


class ChattyExecutor(EffectExecutor):
    """Streams ``chunks`` chunks (as a hosted model streams a long answer, a token each)
    before ``work`` reports its effects."""

    def __init__(self, work: Work, chunks: int) -> None:
        super().__init__(work)
        self.chunks = chunks

    async def __call__(self, ctx: JobContext) -> Any:
        for n in range(self.chunks):
            ctx.emit_chunk({"content": f"token {n} ", "chunk_type": "text",
                            "agent_role": "Clerk"})
        return await super().__call__(ctx)


async def test_a_long_stream_of_chunks_never_takes_the_room_a_tool_calls_start_needs(
        journal_factory: Callable[[int], Journal]) -> None:
    """Invariant (chunks never starve the ledger): chunks take at most the first half of a
    run's events; a model that streams far more than the whole bound still leaves the tool
    call's durable start (and its finish) room, and the dropped chunks are counted."""
    journal = journal_factory(10)

    def work(record: Callable[[str, dict[str, Any], bool], bool]) -> list[bool]:
        return [record("model_call", {}, False), record("tool_call_started", {}, True),
                record("tool_call_finished", {}, False)]

    executor = ChattyExecutor(work, chunks=50)
    runtime = Runtime(journal, Crews(), RuntimeSettings(allowed_operations=frozenset(
        {Operation.RUN})), executor, SidecarMetrics())
    await runtime.admit(StartRequest("crew", "a", Operation.RUN, {}), "k")
    assert await runtime.wait_terminal("a", 10)
    assert executor.verdicts == [True, True, True]  # the tool ran after a durable start
    events = journal.events("a")
    names = [e.event for e in events]
    assert names.count("chunk") == 5 - 1  # half of 10, `started` included
    assert names[-4:] == ["model_call", "tool_call_started", "tool_call_finished", "completed"]
    assert events[-1].data["dropped_chunks"] == 50 - 4
