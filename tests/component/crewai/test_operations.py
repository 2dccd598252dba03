"""The seven operations on real crewai with the offline LLM (execute(), as the runtime calls it)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from crewai.memory.storage.kickoff_task_outputs_storage import (
    KickoffTaskOutputsSQLiteStorage,
)
from crewfence_sidecar.contract import Operation
from crewfence_sidecar.offline_llm import OfflineLLMFailure, call_count
from crewfence_sidecar.operations import (
    _TRAIN_LOCK,
    CancelledBeforeStart,
    ExecutionError,
    TrainingPathError,
    _acquire_train_lock,
    artifact_path,
    execute,
)

MakeCtx = Callable[..., Any]


async def _until(condition: Callable[[], bool], deadline_s: float = 20.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.01)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


# --- run -----------------------------------------------------------------------------------------
async def test_run_returns_tasks_with_ids_and_streams_chunks(
    sample_catalog: Any, make_ctx: MakeCtx, chunks: Any
) -> None:
    before = call_count()
    output = await execute(sample_catalog, make_ctx("research", Operation.RUN, {"topic": "bees"}))
    assert _jsonable(output) == output
    assert call_count() == before + 2  # one LLM call per task
    # crewai's CrewOutput in JSON mode (the AIP run output), task ids added inside
    assert {"raw", "pydantic", "json_dict", "tasks_output", "token_usage"} <= set(output)
    assert output["pydantic"] is None and output["json_dict"] is None
    assert {"description", "expected_output", "raw", "agent", "output_format"} <= set(
        output["tasks_output"][0])
    assert [t["name"] for t in output["tasks_output"]] == ["research", "write"]
    assert all(uuid.UUID(t["id"]) for t in output["tasks_output"])
    assert output["raw"] == output["tasks_output"][-1]["raw"]
    assert "bees" in output["raw"]
    assert output["token_usage"]["total_tokens"] > 0
    streamed = "".join(c["content"] for c in chunks.items)
    assert output["tasks_output"][0]["raw"] in streamed and output["raw"] in streamed
    assert {c["agent_role"] for c in chunks.items} == {"Researcher", "Writer"}


async def test_run_is_deterministic_per_input(sample_catalog: Any, make_ctx: MakeCtx) -> None:
    first = await execute(sample_catalog, make_ctx("single", "run", {"topic": "ants"}))
    again = await execute(sample_catalog, make_ctx("single", "run", {"topic": "ants"}))
    other = await execute(sample_catalog, make_ctx("single", "run", {"topic": "wasps"}))
    assert first["raw"] == again["raw"]
    # a fresh crew every time
    assert first["tasks_output"][0]["id"] != again["tasks_output"][0]["id"]
    assert other["raw"] != first["raw"]


async def test_run_fail_marker_fails_the_job(sample_catalog: Any, make_ctx: MakeCtx) -> None:
    before = call_count()
    with pytest.raises(OfflineLLMFailure):
        await execute(sample_catalog, make_ctx("single", "run", {"topic": "x [[fail]]"}))
    assert call_count() == before + 1  # the sample agents do not retry


async def test_run_with_sleep_marker_is_cancellable(
    sample_catalog: Any, make_ctx: MakeCtx, chunks: Any
) -> None:
    from crewai.events.event_bus import crewai_event_bus
    from crewai.events.types.llm_events import LLMCallFailedEvent

    # crewai runs the LLM call in a worker thread; the offline LLM sees the job's cancel
    # event, wakes from its sleep and fails instead of finishing the cancelled job's work.
    stopped = threading.Event()

    def on_failed(source: Any, event: Any) -> None:
        if "the job was cancelled" in str(getattr(event, "error", "")):
            stopped.set()

    crewai_event_bus.register_handler(LLMCallFailedEvent, on_failed)
    try:
        before = call_count()
        job = asyncio.create_task(
            execute(sample_catalog, make_ctx("single", "run", {"topic": "slow [[sleep:60]]"}))
        )
        await _until(lambda: call_count() > before)  # the LLM call has begun its sleep
        assert not job.done()
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        await _until(stopped.is_set)
        assert chunks.items == []
    finally:
        crewai_event_bus.off(LLMCallFailedEvent, on_failed)


async def test_concurrent_runs_stream_only_their_own_chunks(sample_catalog: Any) -> None:
    from crewfence_sidecar.operations import ExecutionContext

    sinks: dict[str, list[str]] = {}

    def ctx(topic: str) -> ExecutionContext:
        sinks[topic] = []

        def emit(data: dict[str, Any]) -> None:
            sinks[topic].append(data["content"])

        return ExecutionContext(crew_id="research", action_id=topic, operation="run",
                                input={"topic": topic}, training_dir=None, emit_chunk=emit)

    topics = ["otters", "badgers", "herons"]
    outputs = await asyncio.gather(*(execute(sample_catalog, ctx(t)) for t in topics))
    for topic, output in zip(topics, outputs, strict=True):
        streamed = "".join(sinks[topic])
        assert streamed == output["tasks_output"][0]["raw"] + output["raw"]
        assert all(other not in streamed for other in topics if other != topic)


async def test_run_of_a_declarative_hierarchical_crew(file_catalog: Any,
                                                      make_ctx: MakeCtx) -> None:
    output = await execute(file_catalog, make_ctx("manager", "run", {"topic": "risk"}))
    assert [t["name"] for t in output["tasks_output"]] == ["analyse"]
    assert "risk" in output["raw"]


async def test_unknown_crew(sample_catalog: Any, make_ctx: MakeCtx) -> None:
    with pytest.raises(ExecutionError, match="unknown crew 'nope'"):
        await execute(sample_catalog, make_ctx("nope", "run", {}))


# --- batch_run -----------------------------------------------------------------------------------
async def test_batch_run(sample_catalog: Any, make_ctx: MakeCtx) -> None:
    inputs = [{"topic": "alpha"}, {"topic": "beta"}, {"topic": "gamma"}]
    output = await execute(sample_catalog, make_ctx("single", "batch_run", {"inputs": inputs}))
    assert _jsonable(output) == output
    assert len(output["results"]) == 3
    for item, result in zip(inputs, output["results"], strict=True):
        assert item["topic"] in result["raw"]
        assert result["tasks_output"][0]["name"] == "answer"
    assert output["token_usage"]["successful_requests"] == 3
    assert not KickoffTaskOutputsSQLiteStorage().load()  # batch outputs are not replayable


async def test_batch_run_fails_with_the_failing_input_s_error(sample_catalog: Any,
                                                             make_ctx: MakeCtx) -> None:
    inputs = [{"topic": "fine"}, {"topic": "broken [[fail]]"}]
    with pytest.raises(OfflineLLMFailure):
        await execute(sample_catalog, make_ctx("single", "batch_run", {"inputs": inputs}))


# --- replay --------------------------------------------------------------------------------------
async def test_replay_a_task_of_an_earlier_run_on_a_fresh_crew(
    sample_catalog: Any, make_ctx: MakeCtx
) -> None:
    run = await execute(sample_catalog, make_ctx("research", "run", {"topic": "owls"}))
    stored = KickoffTaskOutputsSQLiteStorage().load()
    assert [row["task_id"] for row in stored] == [t["id"] for t in run["tasks_output"]]
    write_id = run["tasks_output"][1]["id"]
    before = call_count()
    replay = await execute(sample_catalog, make_ctx("research", "replay", {"task_id": write_id}))
    assert call_count() == before + 1  # only the replayed task ran again
    assert replay["replayed_task_id"] == write_id
    assert replay["raw"] == run["raw"]  # same stored inputs and context -> same answer
    assert [t["raw"] for t in replay["tasks_output"]] == \
        [t["raw"] for t in run["tasks_output"]]

    # A replayed task gets a new id; the replay's output names it for the next replay.
    new_id = replay["tasks_output"][1]["id"]
    assert new_id != write_id
    other = await execute(sample_catalog, make_ctx(
        "research", "replay", {"task_id": new_id, "inputs": {"topic": "larks"}}))
    assert "larks" in other["raw"]


async def test_replay_of_an_unknown_task_fails(sample_catalog: Any, make_ctx: MakeCtx) -> None:
    await execute(sample_catalog, make_ctx("single", "run", {"topic": "x"}))
    with pytest.raises(ValueError, match="not found"):
        await execute(sample_catalog, make_ctx("single", "replay", {"task_id": str(uuid.uuid4())}))


# --- train ---------------------------------------------------------------------------------------
async def test_train_writes_its_artifact_inside_the_training_dir(
    sample_catalog: Any, make_ctx: MakeCtx, training_dir: Path
) -> None:
    cwd = os.getcwd()
    output = await execute(sample_catalog, make_ctx("research", "train", {
        "n_iterations": 1, "artifact_name": "research-v1", "feedback": ["Cite a source."],
        "inputs": {"topic": "bees"},
    }))
    assert _jsonable(output) == output
    artifact = training_dir / "research-v1.pkl"
    assert output["artifact"] == "research-v1.pkl"
    assert artifact.is_file() and artifact.stat().st_size == output["bytes"] > 0
    assert (training_dir / "training_data.pkl").is_file()
    assert sorted(p.name for p in training_dir.iterdir()) == ["research-v1.pkl",
                                                              "training_data.pkl"]
    assert output["agents"] == ["Researcher", "Writer"]
    assert output["feedback_prompts"] == 2  # one per task; never stdin
    assert os.getcwd() == cwd


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "", "x" * 129, "training_data"])
def test_artifact_names_that_could_escape_are_rejected(training_dir: Path, name: str) -> None:
    with pytest.raises(TrainingPathError):
        artifact_path(training_dir, name)


def test_artifact_symlink_out_of_the_training_dir_is_rejected(training_dir: Path,
                                                              tmp_path: Path) -> None:
    outside = tmp_path / "outside.pkl"
    outside.write_bytes(b"")
    (training_dir / "model.pkl").symlink_to(outside)
    with pytest.raises(TrainingPathError, match="not a regular file"):
        artifact_path(training_dir, "model")


def test_symlinked_training_dir_resolves_to_its_target(tmp_path: Path,
                                                       training_dir: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(training_dir)
    assert artifact_path(link, "m.pkl") == training_dir.resolve() / "m.pkl"


async def test_train_without_training_dir_or_with_bad_name_fails_before_crewai(
    sample_catalog: Any, make_ctx: MakeCtx, training_dir: Path
) -> None:
    before = call_count()
    with pytest.raises(TrainingPathError, match="training directory"):
        await execute(sample_catalog, make_ctx(
            "single", "train", {"n_iterations": 1, "artifact_name": "a"}, training=None))
    with pytest.raises(TrainingPathError):
        await execute(sample_catalog, make_ctx(
            "single", "train", {"n_iterations": 1, "artifact_name": "../../etc/x"}))
    assert call_count() == before
    assert list(training_dir.iterdir()) == []


def test_a_train_cancelled_while_waiting_for_the_lock_never_starts() -> None:
    cancelled = threading.Event()
    cancelled.set()
    with _TRAIN_LOCK:
        with pytest.raises(CancelledBeforeStart):
            _acquire_train_lock(cancelled)


# --- test ----------------------------------------------------------------------------------------
async def test_test_takes_scores_from_the_event_bus(sample_catalog: Any,
                                                    make_ctx: MakeCtx) -> None:
    output = await execute(sample_catalog, make_ctx("research", "test", {
        "n_iterations": 2, "eval_llm": "crewfence/offline", "inputs": {"topic": "bees"},
    }))
    assert _jsonable(output) == output
    assert output["eval_llm"] == "crewfence/offline"
    assert len(output["scores"]) == 4  # 2 iterations x 2 tasks
    assert all(1.0 <= s["quality"] <= 10.0 for s in output["scores"])
    assert all(s["model"] == "crewfence/offline" for s in output["scores"])
    mean = sum(s["quality"] for s in output["scores"]) / 4
    assert output["average_quality"] == pytest.approx(mean, abs=1e-3)


# --- knowledge_query -----------------------------------------------------------------------------
async def test_knowledge_query_returns_text_sources(file_catalog: Any, make_ctx: MakeCtx) -> None:
    output = await execute(file_catalog, make_ctx("research", "knowledge_query", {
        "query": ["where do honey bees live"], "results_limit": 5,
    }))
    assert _jsonable(output) == output
    contents = [r["content"] for r in output["results"]]
    assert contents[0].startswith("Honey bees live in hives")
    strict = await execute(file_catalog, make_ctx("research", "knowledge_query", {
        "query": ["where do honey bees live"], "score_threshold": 0.6,
    }))
    assert [r["content"] for r in strict["results"]] == [contents[0]]


async def test_knowledge_query_without_knowledge(sample_catalog: Any, make_ctx: MakeCtx) -> None:
    with pytest.raises(ExecutionError, match="no knowledge sources"):
        await execute(sample_catalog, make_ctx("single", "knowledge_query", {"query": ["x"]}))


# --- memory_reset --------------------------------------------------------------------------------
async def test_memory_reset_kickoff_outputs(sample_catalog: Any, make_ctx: MakeCtx) -> None:
    await execute(sample_catalog, make_ctx("single", "run", {"topic": "reset me"}))
    assert KickoffTaskOutputsSQLiteStorage().load()
    output = await execute(sample_catalog, make_ctx("single", "memory_reset",
                                                    {"command_type": "kickoff_outputs"}))
    assert output == {"status": "completed", "command_type": "kickoff_outputs"}
    assert not KickoffTaskOutputsSQLiteStorage().load()


async def test_memory_reset_knowledge(file_catalog: Any, make_ctx: MakeCtx) -> None:
    output = await execute(file_catalog, make_ctx("research", "memory_reset",
                                                  {"command_type": "knowledge"}))
    assert output["status"] == "completed"
    # The next fresh crew re-embeds its sources, so queries keep working.
    again = await execute(file_catalog, make_ctx("research", "knowledge_query",
                                                 {"query": ["pods nodes"]}))
    assert again["results"][0]["content"].startswith("Kubernetes")


async def test_memory_reset_all(file_catalog: Any, make_ctx: MakeCtx) -> None:
    await execute(file_catalog, make_ctx("research", "run", {"topic": "all"}))
    output = await execute(file_catalog, make_ctx("research", "memory_reset",
                                                  {"command_type": "all"}))
    assert output["status"] == "completed"
    assert not KickoffTaskOutputsSQLiteStorage().load()


async def test_memory_reset_of_a_missing_memory_fails(sample_catalog: Any,
                                                      make_ctx: MakeCtx) -> None:
    with pytest.raises(RuntimeError, match="not initialized"):
        await execute(sample_catalog, make_ctx("single", "memory_reset",
                                               {"command_type": "memory"}))
