"""What the template needs to load the crews and what each worker applies to itself."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import os
import resource
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crewfence_sidecar.config import SidecarConfig

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class TemplateSettings:
    registry: str | None = None
    crews_file: str | None = None
    training_dir: str | None = None
    memory_bytes: int = 0
    """RLIMIT_AS of each worker (address space, not RSS); 0 = no limit."""
    cpu_seconds: int = 0
    """RLIMIT_CPU of each worker: SIGXCPU at the limit, SIGKILL a second later; 0 = none.
    When set, no worker is reused (RLIMIT_CPU counts the process's life, not one job's)."""
    nice: int = 0
    """Nice levels each worker adds to its own (``CREWFENCE_WORKER_NICE``); 0 = none."""
    warm_workers: bool = True
    """Each worker runs an internal offline kickoff before it reads its job (spare workers
    then start jobs warm)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str) -> TemplateSettings:
        return cls(**json.loads(raw))

    @property
    def training_path(self) -> Path | None:
        return Path(self.training_dir) if self.training_dir else None


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, loaded once per process: ``find_library`` runs ``ldconfig`` (1.5-2 ms).
    The template loads it (``die_with_parent``) before it forks, so workers inherit it and
    their start pays nothing for it."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def die_with_parent(sig: int, expected_parent: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (PR_SET_PDEATHSIG).

    Invariant (no orphan worker): set right after fork, then the parent is checked once, so a
    parent that died before the call is noticed too. Elsewhere than Linux this is a no-op and
    the template's watch of its control socket is the only guard.
    """
    if not sys.platform.startswith("linux"):
        return
    if libc().prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:  # pragma: no cover - kernel refusal
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER).

    Invariant (every descendant stays visible): a process a job's tool started, even one that
    left the process group (``setsid``) and whose parent exited (a double fork), is then
    re-parented to the worker instead of to init, so it appears among the worker's children.
    False where Linux does not offer it (the reuse check then scans the process group).
    """
    if not sys.platform.startswith("linux"):
        return False
    return bool(libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def apply_limits(settings: TemplateSettings) -> None:
    """The per-job limits, applied by the worker to itself before the job begins (and before
    a spare's warm-up).

    Invariant (the journal's writer is never starved by the crews it serves): a worker runs
    ``settings.nice`` nice levels below the sidecar (at 5, a third of the sidecar's weight).
    On 2 cores a crew's threads and the sidecar's loop often share a CPU; at equal priority
    the loop, woken by a request or a worker's frame, waited for the crew's time slice (1 to
    2 ms each time, seen with ``perf sched``), so admissions, tool-call acknowledgements and
    answers queued behind the crews. The scheduler then lets the sidecar run first; the
    crews lose only the little CPU the sidecar uses. A process may always lower its own
    priority, never raise it back: the worker never needs to.
    """
    if settings.nice > 0:
        os.nice(settings.nice)
    if settings.memory_bytes > 0:
        _lower(resource.RLIMIT_AS, settings.memory_bytes, settings.memory_bytes)
    if settings.cpu_seconds > 0:
        _lower(resource.RLIMIT_CPU, settings.cpu_seconds, settings.cpu_seconds + 1)


def _lower(which: int, soft: int, hard: int) -> None:
    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:
        hard = min(hard, current_hard)
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))


def reset_signals() -> None:
    """A worker starts with default dispositions: SIGTERM ends it, whatever it is doing."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)


def describe(settings: TemplateSettings) -> dict[str, Any]:
    return asdict(settings)


def template_settings(config: SidecarConfig) -> TemplateSettings:
    """The template's settings from the sidecar's validated configuration."""
    return TemplateSettings(
        registry=config.registry,
        crews_file=str(config.crews_file) if config.crews_file is not None else None,
        training_dir=str(config.training_dir) if config.training_dir is not None else None,
        memory_bytes=config.worker_memory_mb * 1024 * 1024,
        cpu_seconds=config.worker_cpu_seconds, nice=config.worker_nice)
