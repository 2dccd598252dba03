"""Run one coroutine on a private event loop in its own thread, cancellable from the caller.

Some of crewai's async paths make blocking calls on the event loop's thread (crewai 1.15.30
rewrites an agent's knowledge search query with the SYNC ``LLM.call`` inside
``Agent.aexecute_task``). On the sidecar's loop that would stall every other job, ``/health``,
event streams and the cancel route for the whole LLM call. On a private loop only that one
kickoff waits.

Cancelling the caller wakes blocking work (``wake``), cancels the private task and waits up
to :data:`CANCEL_GRACE_SECONDS` for it to finish before the cancellation propagates. Work
stuck in a blocking call on the private thread (a hosted LLM request) may outlive that
grace, like any thread-backed work.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
CANCEL_GRACE_SECONDS = 5.0
THREAD_NAME_PREFIX = "crewfence-private-loop"


def _settle(outcome: asyncio.Future[T], task: asyncio.Task[T]) -> None:
    if outcome.done():
        return
    if task.cancelled():
        outcome.cancel()
        return
    error = task.exception()
    if error is not None:
        outcome.set_exception(error)
    else:
        outcome.set_result(task.result())


def _retrieve(outcome: asyncio.Future[Any]) -> None:
    # Nobody awaits an outcome that arrives after the caller was cancelled.
    if not outcome.cancelled():
        outcome.exception()


def _close(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does on exit: cancel leftovers, shut generators and executor."""
    leftovers = asyncio.all_tasks(loop)
    for leftover in leftovers:
        leftover.cancel()
    if leftovers:
        loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())


def _serve(loop: asyncio.AbstractEventLoop, task: asyncio.Task[T],
           report: Callable[[asyncio.Task[T]], None]) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(asyncio.wait({task}))
        _close(loop)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
        report(task)


async def run_on_private_loop(coro: Coroutine[Any, Any, T], name: str,
                              wake: Callable[[], None] | None = None) -> T:
    """Await ``coro`` run on a new event loop in a new thread named ``<prefix>-<name>``.

    The private task starts with a copy of the caller's context (context variables such as
    the job's cancel event reach it). When the caller is cancelled, ``wake`` is called first:
    it must end blocking work on the private thread (e.g. set the offline LLM's cancel
    event), or the private loop cannot even receive the cancellation.
    """
    main = asyncio.get_running_loop()
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)  # the loop is not running yet: safe from this thread
    outcome: asyncio.Future[T] = main.create_future()

    def report(done: asyncio.Task[T]) -> None:
        with contextlib.suppress(RuntimeError):  # the sidecar's loop has closed: nobody waits
            main.call_soon_threadsafe(_settle, outcome, done)

    threading.Thread(target=_serve, args=(loop, task, report),
                     name=f"{THREAD_NAME_PREFIX}-{name}", daemon=True).start()
    try:
        return await asyncio.shield(outcome)
    except asyncio.CancelledError:
        if wake is not None:
            wake()
        with contextlib.suppress(RuntimeError):  # the private loop closed: the task is done
            loop.call_soon_threadsafe(task.cancel)
        await asyncio.wait({outcome}, timeout=CANCEL_GRACE_SECONDS)
        outcome.add_done_callback(_retrieve)
        raise

