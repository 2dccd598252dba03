"""Whether a worker whose job ended on its own may take another job (worker reuse).

Like a prefork pool's ``max_tasks_per_child``: a worker that sent its job's result or error
(never one that was cancelled, timed out, stopped or died: those are signalled and reaped)
may wait for another job instead of exiting, but only when nothing of the job it ran can
still be running. :func:`refusal` is checked in the worker after the outcome was sent.

Invariant (nothing of an earlier job runs beside the next one): a worker is reused only
when, after its job,

- no thread is alive but those it had before the job, crewai's event-bus loop thread and
  the threads of the known thread pools (the loop's default executor, the event bus's
  handler pool), and every pool thread is idle (waiting for work, none queued);
- crewai's event handlers have all completed (``flush``);
- no asyncio task is pending on its event loop;
- no process of the job is left: as the subreaper of its descendants (``become_subreaper``)
  it has no child at all, a daemon a tool started with ``setsid`` and a double fork
  included (any child, even a zombie, refuses); where it is not a subreaper, no process but
  itself is in its process group;
- its resident set is below the bound (``CREWFENCE_WORKER_MAX_RSS_MB``, default 1 GiB);
- it has run fewer than ``max_jobs`` jobs;
- no CPU-time limit is set: ``RLIMIT_CPU`` counts the whole life of a process, so a reused
  worker's later jobs would get less than their allowance (``CREWFENCE_WORKER_CPU_SECONDS``
  set = one job per worker, as before).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_REUSE_RSS_BYTES = 1024 ** 3
"""The default bound (``CREWFENCE_WORKER_MAX_RSS_MB``): a worker whose resident set reached
it after a job exits instead of taking another."""
BUS_FLUSH_SECONDS = 2.0
POOL_SETTLE_SECONDS = 0.1
"""A pool thread that has just delivered the job's last result may not be back at its queue
yet when the loop thread checks; it gets this long (polled) before it counts as busy."""


@dataclass(frozen=True)
class JobBaseline:
    """What the worker had before its job began."""

    threads: frozenset[int]

    @classmethod
    def take(cls) -> JobBaseline:
        return cls(frozenset(t.ident for t in threading.enumerate() if t.ident is not None))


def _pools(loop: asyncio.AbstractEventLoop) -> list[ThreadPoolExecutor]:
    pools: list[ThreadPoolExecutor] = []
    default = getattr(loop, "_default_executor", None)
    if isinstance(default, ThreadPoolExecutor):
        pools.append(default)
    bus = _event_bus()
    if bus is not None and getattr(bus, "_executor_initialized", False):
        sync = getattr(bus, "_sync_executor", None)
        if isinstance(sync, ThreadPoolExecutor):
            pools.append(sync)
    return pools


def _event_bus() -> Any:
    module = sys.modules.get("crewai.events.event_bus")
    return getattr(module, "crewai_event_bus", None) if module is not None else None


def _idle_pool_thread(ident: int, frames: dict[int, Any]) -> bool:
    """True when the pool thread runs no work item: its innermost Python frame is the pool's
    ``_worker`` loop (blocked in the queue's ``get`` or between two items)."""
    frame = frames.get(ident)
    if frame is None:
        return True  # already finished
    code = frame.f_code
    return code.co_name == "_worker" and code.co_filename.endswith(
        os.path.join("concurrent", "futures", "thread.py"))


_POOL_BUSY = "a pool thread is still running:"


def _threads_settled(loop: asyncio.AbstractEventLoop, baseline: JobBaseline) -> str | None:
    deadline = time.monotonic() + POOL_SETTLE_SECONDS
    while True:
        reason = _thread_refusal(loop, baseline)
        if reason is None or not reason.startswith(_POOL_BUSY) or time.monotonic() > deadline:
            return reason
        time.sleep(0.001)  # let the pool thread take the GIL and return to its queue


def _thread_refusal(loop: asyncio.AbstractEventLoop, baseline: JobBaseline) -> str | None:
    allowed = set(baseline.threads)
    bus = _event_bus()
    loop_thread = getattr(bus, "_loop_thread", None) if bus is not None else None
    if isinstance(loop_thread, threading.Thread) and loop_thread.ident is not None:
        allowed.add(loop_thread.ident)
    frames = sys._current_frames()
    for pool in _pools(loop):
        if not pool._work_queue.empty():
            return "a thread pool has queued work"
        for thread in list(pool._threads):
            if thread.ident is None:
                continue
            if not _idle_pool_thread(thread.ident, frames):
                return f"{_POOL_BUSY} {thread.name}"
            allowed.add(thread.ident)
    extra = [t.name for t in threading.enumerate()
             if t.ident is not None and t.ident not in allowed]
    if extra:
        return f"threads left running: {', '.join(sorted(extra))}"
    return None


def group_members(pgid: int, exclude: int) -> list[int] | None:
    """Pids in process group ``pgid`` but ``exclude``; None when /proc cannot tell."""
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def live_children() -> list[int] | None:
    """Pids of this process's children (zombies included), from
    ``/proc/self/task/*/children``; None when the kernel does not offer those files."""
    children: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children", "rb") as f:
                children += [int(pid) for pid in f.read().split()]
    except FileNotFoundError:
        return None
    return children


def resident_bytes() -> int | None:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def refusal(loop: asyncio.AbstractEventLoop, baseline: JobBaseline, *, jobs_done: int,
            max_jobs: int, cpu_limited: bool, subreaper: bool = False,
            max_rss_bytes: int = MAX_REUSE_RSS_BYTES) -> str | None:
    """Why this worker must exit after its job; None when it may take another."""
    if jobs_done >= max_jobs:
        return f"ran {jobs_done} of at most {max_jobs} jobs"
    if cpu_limited:
        return "a CPU-time limit is set (RLIMIT_CPU is per process, not per job)"
    bus = _event_bus()
    if bus is not None and getattr(bus, "_executor_initialized", False) \
            and not bus.flush(timeout=BUS_FLUSH_SECONDS):
        return "event handlers still running"
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if pending:
        return f"{len(pending)} asyncio tasks pending"
    reason = _threads_settled(loop, baseline)
    if reason is not None:
        return reason
    left = live_children() if subreaper else None
    if left is None:
        left = group_members(os.getpgrp(), exclude=os.getpid())
    if left is None:
        return "cannot list the process group"
    if left:
        return f"processes left: {left}"
    rss = resident_bytes()
    if rss is None:
        return "resident set unknown"
    if rss >= max_rss_bytes:
        return f"resident set {rss >> 20} MiB reached the bound of {max_rss_bytes >> 20} MiB"
    return None
