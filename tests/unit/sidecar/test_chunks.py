"""A job's chunk events through crewai's scoped stream sink (``crewfence_sidecar.chunks``)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from types import SimpleNamespace
from typing import Any

from crewai.events.stream_context import publish_stream_event
from crewai.events.types.llm_events import LLMStreamChunkEvent
from crewfence_sidecar.chunks import streamed_chunks


def _chunk(text: str) -> LLMStreamChunkEvent:
    return LLMStreamChunkEvent(chunk=text, call_id="call-1", agent_role="Researcher")


def _crew() -> Any:
    return SimpleNamespace(agents=[])


def _in_thread(context: contextvars.Context, texts: list[str]) -> None:
    """Publishes ``texts`` from a thread that runs in ``context``, as crewai's threads do."""

    def publish() -> None:
        for text in texts:
            publish_stream_event(None, _chunk(text))

    worker = threading.Thread(target=context.run, args=(publish,))
    worker.start()
    worker.join()


async def test_chunks_from_the_loop_and_from_threads_arrive_on_the_loop_in_order() -> None:
    loop_thread = threading.get_ident()
    received: list[tuple[str, bool]] = []

    def emit(data: dict[str, Any]) -> None:
        received.append((data["content"], threading.get_ident() == loop_thread))

    with streamed_chunks(_crew(), emit):
        publish_stream_event(None, _chunk("a"))
        await asyncio.to_thread(_in_thread, contextvars.copy_context(), ["b", "c"])
        publish_stream_event(None, object())  # not a chunk: ignored
    assert received == [("a", True), ("b", True), ("c", True)]


async def test_no_chunk_arrives_after_the_block_and_none_outside_its_context() -> None:
    received: list[str] = []
    with streamed_chunks(_crew(), lambda data: received.append(data["content"])):
        inside = contextvars.copy_context()
        publish_stream_event(None, _chunk("in"))
    # A straggler that copied the job's context and publishes after the kickoff returned.
    _in_thread(inside, ["late"])
    await asyncio.sleep(0)  # give a (wrongly) scheduled delivery its turn on the loop
    publish_stream_event(None, _chunk("outside"))
    assert received == ["in"]


async def test_a_chunk_scheduled_before_the_close_is_not_delivered_after_it() -> None:
    received: list[str] = []
    with streamed_chunks(_crew(), lambda data: received.append(data["content"])):
        inside = contextvars.copy_context()
        _in_thread(inside, ["queued"])  # scheduled on the loop, not yet run
    await asyncio.sleep(0)
    assert received == []
