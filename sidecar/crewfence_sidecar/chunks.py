"""The text a job's models stream, as the job's ``chunk`` events.

crewai's own streaming (``crew.stream = True``) wraps each kickoff in a second task, an async
generator and an event-bus handler it registers and removes per run: measured in one process
on the bench's crew, +0.7 ms per run over a plain ``akickoff`` (docs/benchmarks.md). The same
chunks reach us for +0.2 ms through crewai's *scoped stream sink*
(``crewai.events.stream_context``): every event emitted in the job's context (the threads and
private loops crewai and the sidecar start copy it) is handed to the sink, synchronously, in
the thread that emitted it.

Invariant: a job's ``chunk`` events are its own model chunks, in the order the models emitted
them, each handed to ``emit`` on the job's event loop; none arrives after the kickoff
returned. Concurrent jobs never see each other's chunks: the sink lives in the job's context,
not on the process-wide event bus.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from crewai import Crew
from crewai.crews.utils import enable_agent_streaming
from crewai.events.stream_context import add_stream_sink, reset_stream_sinks
from crewai.events.types.llm_events import LLMStreamChunkEvent
from crewai.utilities.string_utils import sanitize_tool_name

ChunkEmitter = Callable[[dict[str, Any]], None]
"""Journals the data of one ``chunk`` event; called on the job's loop, never blocks long."""


def chunk_data(event: LLMStreamChunkEvent) -> dict[str, Any]:
    """The data of a ``chunk`` event: ``content``, ``chunk_type`` (``text`` or
    ``tool_call``), ``agent_role`` and, for a streamed tool call, ``tool_call``
    (``tool_id``, ``tool_name``, ``arguments``, ``index``): the fields crewai's
    ``StreamChunk`` gives the same chunk."""
    data: dict[str, Any] = {
        "content": event.chunk,
        "chunk_type": "tool_call" if event.tool_call is not None else "text",
        "agent_role": event.agent_role or "",
    }
    call = event.tool_call
    if call is not None:
        name = call.function.name
        data["tool_call"] = {"tool_id": call.id,
                             "tool_name": sanitize_tool_name(name) if name else None,
                             "arguments": call.function.arguments, "index": call.index}
    return data


class _Sink:
    """Hands each stream chunk of one job to ``emit`` on ``loop``, in order, until closed."""

    def __init__(self, emit: ChunkEmitter, loop: asyncio.AbstractEventLoop) -> None:
        self._emit = emit
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._open = True

    def __call__(self, _source: Any, event: Any) -> None:
        if not self._open or not isinstance(event, LLMStreamChunkEvent):
            return
        data = chunk_data(event)
        if threading.get_ident() == self._loop_thread:
            self._deliver(data)
        else:  # FIFO with the completion of the thread's work: before the kickoff returns
            self._loop.call_soon_threadsafe(self._deliver, data)

    def _deliver(self, data: dict[str, Any]) -> None:
        if self._open:
            self._emit(data)

    def close(self) -> None:
        self._open = False


@contextmanager
def streamed_chunks(crew: Crew, emit: ChunkEmitter) -> Iterator[None]:
    """Inside: the models of ``crew`` stream, and their chunks go to ``emit`` on the running
    loop (call it on the job's loop, before the kickoff is created or awaited)."""
    enable_agent_streaming(crew.agents)
    sink = _Sink(emit, asyncio.get_running_loop())
    token = add_stream_sink(sink)
    try:
        yield
    finally:
        reset_stream_sinks(token)
        sink.close()
