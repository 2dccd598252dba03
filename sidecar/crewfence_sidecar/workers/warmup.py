"""Warm the template before it forks: one offline kickoff, then crewai back to no threads.

A worker forked from a template that never ran a kickoff pays crewai's first-kickoff costs
(lazy imports, pydantic schema completion, agent executor set-up: about 120 ms here) in every
job. The template pays them once instead, on an internal crew with the offline LLM (no tools,
no knowledge, no network), with crewai's storage in a throw-away directory so the warm-up
leaves no "latest kickoff" for ``replay`` to find.

Invariant (single-threaded fork): crewai's event bus starts a loop thread and a thread pool on
its first event; :func:`quiesce_event_bus` stops both and returns the bus to its lazy state,
so the template forks with one thread and each worker starts its own bus threads.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import tempfile
import threading
from typing import Any

log = logging.getLogger("crewfence.sidecar.workers")
WARM_CREW_ID = "crewfence-warm-up"


def _warm_crew() -> Any:
    from crewai import Agent, Crew, Task

    from crewfence_sidecar.offline_llm import OfflineLLM

    agent = Agent(role="Warm-up", goal="Warm up on {topic}", backstory="Internal.",
                  llm=OfflineLLM())
    return Crew(agents=[agent], tasks=[Task(description="Warm up on {topic}",
                                            expected_output="Anything", agent=agent)])


async def _kickoff() -> None:
    from crewfence_sidecar import operations
    from crewfence_sidecar.crews import CrewCatalog
    from crewfence_sidecar.runtime import JobContext

    def no_chunks(data: dict[str, Any]) -> None:
        return None

    catalog = CrewCatalog({WARM_CREW_ID: _warm_crew})
    await operations.execute(catalog, JobContext(
        crew_id=WARM_CREW_ID, action_id=WARM_CREW_ID, operation="run",
        input={"topic": "nothing"}, training_dir=None, emit_chunk=no_chunks))


def quiesce_event_bus() -> None:
    """Stop the event bus's loop thread and thread pool; it starts them again when needed."""
    from crewai.events.event_bus import crewai_event_bus as bus

    if not getattr(bus, "_executor_initialized", False):
        return
    bus.flush()
    loop = bus._loop
    loop.call_soon_threadsafe(loop.stop)
    bus._loop_thread.join()
    loop.close()
    bus._sync_executor.shutdown(wait=True)
    bus._executor_initialized = False


def warm_up(*, in_worker: bool = False, runner: asyncio.Runner | None = None) -> None:
    """Run the warm-up kickoff; any failure only costs the speed-up (logged).

    In the template, the event bus is quiesced afterwards (single-threaded fork). In a spare
    worker (``in_worker``) the per-process costs are paid while it waits for a job: its own
    threads, the pages it will write to, and crewai's kickoff-outputs database in the real
    storage directory (created if missing; nothing is written to it). Given the ``runner``
    the job will run on, the kickoff runs on that event loop too, so the job finds the loop
    and its default thread pool already made.
    """
    previous = os.environ.get("CREWAI_STORAGE_DIR")
    try:
        with tempfile.TemporaryDirectory(prefix="crewfence-warm-") as scratch:
            os.environ["CREWAI_STORAGE_DIR"] = scratch
            try:
                if runner is not None:
                    runner.run(_kickoff())
                else:
                    asyncio.run(_kickoff())
            finally:
                if previous is None:
                    os.environ.pop("CREWAI_STORAGE_DIR", None)
                else:
                    os.environ["CREWAI_STORAGE_DIR"] = previous
    except Exception as exc:
        log.warning("worker warm-up failed: %s", type(exc).__name__)
    if in_worker:
        try:
            from crewai.memory.storage.kickoff_task_outputs_storage import (
                KickoffTaskOutputsSQLiteStorage,
            )

            KickoffTaskOutputsSQLiteStorage()
        except Exception as exc:
            log.warning("worker warm-up of the kickoff storage failed: %s", type(exc).__name__)
        return
    gc.collect()
    quiesce_event_bus()
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        log.warning("worker template still has threads after warm-up: %s", ", ".join(others))
