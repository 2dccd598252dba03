"""A crew with knowledge on real crewai + the offline LLM: a slow run never stalls the loop.

crewai 1.15.30 rewrites each agent's knowledge search query with the SYNC ``LLM.call`` on
the event loop's thread; with ``[[sleep:N]]`` in the prompt that used to freeze the whole
sidecar (cancel, /health, event streams) for N seconds, and the knowledge search itself
failed ("asearch() requires an AsyncClientAPI"), so agents ran without their knowledge.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from crewai.events.event_bus import crewai_event_bus
from crewai.events.types.knowledge_events import KnowledgeRetrievalCompletedEvent
from crewai.events.types.llm_events import LLMCallStartedEvent
from crewfence_sidecar.contract import Operation
from crewfence_sidecar.offline_llm import call_count, prompt_text
from crewfence_sidecar.operations import execute
from crewfence_sidecar.private_loop import THREAD_NAME_PREFIX

MakeCtx = Callable[..., Any]
SLEEP_S = 20.0
PROBE_DEADLINE_S = 5.0  # far below SLEEP_S: a blocked loop cannot pass the probe
CANCEL_DEADLINE_S = 10.0  # cancelling must not wait for the sleep to end
EVENT_FLUSH_S = 30.0


async def _until(condition: Callable[[], bool], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.01)


def _loop_answers_within(loop: asyncio.AbstractEventLoop, seconds: float) -> bool:
    """From ANOTHER thread: does ``loop`` run a callback within ``seconds``?

    A probe on the loop itself proves nothing: its own timeout would wait for the loop too.
    """
    answered = threading.Event()
    loop.call_soon_threadsafe(answered.set)
    return answered.wait(seconds)


def _loop_answers_during_first_llm_call(loop: asyncio.AbstractEventLoop, before: int) -> bool:
    """From ANOTHER thread: once an LLM call has begun (and sleeps), probe ``loop``.

    Waiting for the call on the loop itself would only resume after a blocking call ended.
    """
    deadline = time.monotonic() + 60.0
    while call_count() <= before:
        assert time.monotonic() < deadline, "no LLM call began before the deadline"
        time.sleep(0.01)  # polls a process-wide counter; no event to wait on
    return _loop_answers_within(loop, PROBE_DEADLINE_S)


def _private_loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]


@pytest.fixture
def llm_prompts() -> Iterator[list[str]]:
    """The prompt text of every offline LLM call started while the test runs."""
    prompts: list[str] = []

    def on_started(source: Any, event: Any) -> None:
        prompts.append(prompt_text(event.messages or ""))

    crewai_event_bus.register_handler(LLMCallStartedEvent, on_started)
    try:
        yield prompts
    finally:
        crewai_event_bus.off(LLMCallStartedEvent, on_started)


async def test_slow_run_with_knowledge_keeps_the_loop_responsive_and_cancels(
    file_catalog: Any, make_ctx: MakeCtx, chunks: Any
) -> None:
    loop = asyncio.get_running_loop()
    before = call_count()
    # The first LLM call (the knowledge search query rewrite) sleeps 20 s; meanwhile the
    # loop must answer a probe from another thread.
    probe = asyncio.ensure_future(
        asyncio.to_thread(_loop_answers_during_first_llm_call, loop, before))
    job = asyncio.create_task(execute(file_catalog, make_ctx(
        "research", Operation.RUN, {"topic": f"bees [[sleep:{SLEEP_S:g}]]"})))

    assert await probe
    assert call_count() == before + 1 and not job.done()  # still inside that sleep
    assert len(_private_loop_threads()) == 1

    started = time.monotonic()
    job.cancel()
    done, _ = await asyncio.wait({job}, timeout=CANCEL_DEADLINE_S)
    assert job in done and job.cancelled()
    # The kickoff's thread ends too: the offline LLM woke from its sleep, nothing continues.
    await _until(lambda: not _private_loop_threads(),
                 deadline_s=SLEEP_S - (time.monotonic() - started) - 1.0)
    finished_calls = call_count()
    assert await asyncio.to_thread(_loop_answers_within, loop, PROBE_DEADLINE_S)
    assert call_count() == finished_calls
    assert chunks.items == []


async def test_knowledge_reaches_the_agents_prompt_in_a_run(
    file_catalog: Any, make_ctx: MakeCtx, llm_prompts: list[str]
) -> None:
    retrieved: list[str] = []

    def on_retrieved(source: Any, event: Any) -> None:
        retrieved.append(event.retrieved_knowledge or "")

    crewai_event_bus.register_handler(KnowledgeRetrievalCompletedEvent, on_retrieved)
    try:
        output = await execute(file_catalog, make_ctx("research", Operation.RUN,
                                                      {"topic": "honey bees"}))
        assert crewai_event_bus.flush(timeout=EVENT_FLUSH_S)
    finally:
        crewai_event_bus.off(KnowledgeRetrievalCompletedEvent, on_retrieved)
    assert [t["name"] for t in output["tasks_output"]] == ["research", "write"]
    assert len(retrieved) == 2 and all("turn nectar into honey" in r for r in retrieved)
    # The fixture's knowledge text is in the prompt of each task's own LLM call.
    task_prompts = [p for p in llm_prompts if "Current Task:" in p]
    assert len(task_prompts) == 2
    assert all("Honey bees live in hives and turn nectar into honey." in p for p in task_prompts)


async def test_batch_run_of_a_crew_with_knowledge(
    file_catalog: Any, make_ctx: MakeCtx, llm_prompts: list[str]
) -> None:
    output = await execute(file_catalog, make_ctx("research", Operation.BATCH_RUN, {
        "inputs": [{"topic": "honey"}, {"topic": "hives"}]}))
    assert crewai_event_bus.flush(timeout=EVENT_FLUSH_S)
    assert len(output["results"]) == 2
    assert "honey" in output["results"][0]["raw"] and "hives" in output["results"][1]["raw"]
    task_prompts = [p for p in llm_prompts if "Current Task:" in p]
    assert len(task_prompts) == 4
    assert all("turn nectar into honey" in p for p in task_prompts)
    await _until(lambda: not _private_loop_threads(), deadline_s=10.0)  # none left behind


REGISTRY_MODULE = '''
from crewai import Agent, Crew, Task
from crewai.knowledge.knowledge_config import KnowledgeConfig
from crewai.knowledge.source.string_knowledge_source import StringKnowledgeSource
from crewfence_sidecar.offline_embedder import offline_embedder
from crewfence_sidecar.offline_llm import OfflineLLM


def shelf() -> Crew:
    agent = Agent(role="Librarian", goal="Answer about {topic}", backstory="Exact.",
                  llm=OfflineLLM(), max_retry_limit=0,
                  # the offline LLM's query rewrite is no semantic match: accept weak hits
                  knowledge_config=KnowledgeConfig(score_threshold=0.1),
                  knowledge_sources=[StringKnowledgeSource(
                      content="Otters hold hands while they sleep so they do not drift.")])
    task = Task(name="answer", description="Answer about {topic}",
                expected_output="One sentence", agent=agent)
    return Crew(name="shelf", agents=[agent], tasks=[task], embedder=offline_embedder(),
                knowledge_sources=[StringKnowledgeSource(
                    content="Sea otters float on their backs and sleep holding hands.")])


CREWS = {"shelf": shelf}
'''


async def test_registry_crew_knowledge_reaches_the_agent(
    importable: Callable[[str, str], str], make_ctx: MakeCtx, llm_prompts: list[str]
) -> None:
    # Plain crewai Knowledge (crew- and agent-level, built by crewai itself) works too.
    from crewfence_sidecar.crews import CrewCatalog

    catalog = CrewCatalog.load(f"{importable('knowledge_registry', REGISTRY_MODULE)}:CREWS",
                               None)
    await execute(catalog, make_ctx("shelf", Operation.RUN, {"topic": "otters sleep"}))
    assert crewai_event_bus.flush(timeout=EVENT_FLUSH_S)
    task_prompts = [p for p in llm_prompts if "Current Task:" in p]
    assert len(task_prompts) == 1
    assert "Otters hold hands while they sleep" in task_prompts[0]  # the agent's knowledge
    assert "Sea otters float on their backs" in task_prompts[0]  # the crew's knowledge
