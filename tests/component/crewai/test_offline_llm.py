"""The offline LLM: deterministic answers, the documented markers, structured output."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from crewai import BaseLLM
from crewai.utilities.evaluators.crew_evaluator_handler import TaskEvaluationPydanticOutput
from crewai.utilities.evaluators.task_evaluator import TaskEvaluation, TrainingTaskEvaluation
from crewai.utilities.types import LLMMessage
from crewfence_sidecar.offline_llm import (
    MAX_SLEEP_SECONDS,
    MODEL_NAME,
    OfflineLLM,
    OfflineLLMFailure,
    call_count,
    resolve_llm,
    sleep_seconds,
)
from pydantic import BaseModel, Field

TASK_PROMPT: list[LLMMessage] = [
    {"role": "system", "content": "You are Researcher."},
    {"role": "user", "content": "\nCurrent Task: Research honey bees\n\nThis is the expected "
                                "criteria for your final answer: A summary"},
]


async def _until(condition, deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.01)


def test_same_prompt_same_answer_across_instances() -> None:
    first = OfflineLLM().call(TASK_PROMPT)
    second = OfflineLLM().call(TASK_PROMPT)
    assert first == second
    assert "Research honey bees" in first


def test_different_prompts_give_different_answers() -> None:
    other: list[LLMMessage] = [
        TASK_PROMPT[0], {"role": "user", "content": "Current Task: Research ants\n\n"},
    ]
    assert OfflineLLM().call(TASK_PROMPT) != OfflineLLM().call(other)


async def test_acall_answers_like_call() -> None:
    llm = OfflineLLM()
    assert await llm.acall(TASK_PROMPT) == llm.call(TASK_PROMPT)


def test_markers_are_not_echoed_into_the_answer() -> None:
    answer = OfflineLLM().call("Current Task: Research bees [[sleep:0]] [[sleep:x]]\n\n")
    assert "[[" not in answer
    assert "Research bees" in answer


def test_react_format_when_the_prompt_asks_for_a_final_answer() -> None:
    answer = OfflineLLM().call("Use the format\nThought: ...\nFinal Answer: the answer\n")
    assert "\nFinal Answer: Offline answer " in answer


def test_fail_marker_raises_and_is_counted() -> None:
    before = call_count()
    with pytest.raises(OfflineLLMFailure, match=r"\[\[fail\]\]"):
        OfflineLLM().call("please [[fail]] now")
    assert call_count() == before + 1


async def test_fail_marker_raises_in_acall() -> None:
    with pytest.raises(OfflineLLMFailure):
        await OfflineLLM().acall([{"role": "user", "content": "[[fail]]"}])


def test_sleep_marker_parsing() -> None:
    assert sleep_seconds("no marker") == 0.0
    assert sleep_seconds("x [[sleep:2.5]] y [[sleep:9]]") == 2.5
    assert sleep_seconds("[[sleep:999999]]") == MAX_SLEEP_SECONDS
    assert sleep_seconds("[[sleep:-1]] [[sleep:abc]]") == 0.0


def test_sync_sleep_marker_waits_first() -> None:
    started = time.monotonic()
    OfflineLLM().call("wait [[sleep:0.2]]")
    assert time.monotonic() - started >= 0.2


async def test_async_sleep_marker_waits_and_is_cancellable() -> None:
    before = call_count()
    task = asyncio.create_task(OfflineLLM().acall("wait [[sleep:60]]"))
    await _until(lambda: call_count() > before)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_call_count_is_thread_safe() -> None:
    llm = OfflineLLM()
    before = call_count()

    def work() -> None:
        for _ in range(25):
            llm.call("count me")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert call_count() == before + 200


@pytest.mark.parametrize("model", [TaskEvaluationPydanticOutput, TaskEvaluation,
                                   TrainingTaskEvaluation])
def test_response_model_gets_a_schema_valid_instance(model: type[BaseModel]) -> None:
    result = OfflineLLM().call(TASK_PROMPT, response_model=model)
    assert isinstance(result, model)
    assert 1.0 <= result.quality <= 10.0  # type: ignore[attr-defined]
    assert OfflineLLM().call(TASK_PROMPT, response_model=model) == result


def test_response_model_respects_numeric_bounds() -> None:
    class Bounded(BaseModel):
        probability: float = Field(ge=0.0, le=1.0)
        count: int = Field(gt=100, lt=200)
        tags: list[str]
        optional: str | None = None

    result = OfflineLLM().call("score this", response_model=Bounded)
    assert isinstance(result, Bounded)
    assert 0.0 <= result.probability <= 1.0
    assert 100 < result.count < 200
    assert len(result.tags) == 1
    assert result.optional is None


def test_token_usage_is_tracked() -> None:
    llm = OfflineLLM()
    llm.call(TASK_PROMPT)
    usage = llm.get_token_usage_summary()
    assert usage.successful_requests == 1
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0


def test_resolver_maps_the_offline_model() -> None:
    llm = resolve_llm(MODEL_NAME)
    assert isinstance(llm, OfflineLLM)
    assert llm.model == MODEL_NAME


def test_resolver_builds_a_real_llm_with_the_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CF_TEST_LLM_KEY", "sk-test-not-a-real-key")
    llm = resolve_llm("openai/gpt-4o-mini", "CF_TEST_LLM_KEY")  # built, never called
    assert isinstance(llm, BaseLLM) and not isinstance(llm, OfflineLLM)
    assert llm.api_key == "sk-test-not-a-real-key"


def test_resolver_refuses_a_missing_key_without_leaking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CF_TEST_MISSING_KEY", raising=False)
    with pytest.raises(ValueError, match="CF_TEST_MISSING_KEY"):
        resolve_llm("openai/gpt-4o-mini", "CF_TEST_MISSING_KEY")
