"""crewai's cross-process file locks, waited for without portalocker's 0.25 s polling.

crewai guards its SQLite files in the storage directory (the kickoff task outputs written
after every task, ``crewai_core.lock_store.lock``) with ``portalocker.Lock``, which, when
the lock is held, retries a non-blocking ``flock`` every 0.25 s. In one process kickoffs
rarely collide; a sidecar's workers are separate processes that start a burst's jobs
together and finish their tasks at the same moment, so one writes while the others sleep a
quarter of a second each (measured: 4 jobs at once in 4 warm workers finished 200-250 ms
apart, ~110 ms of CPU for the round).

Invariant (the same mutual exclusion as crewai's default): :func:`flock_lock` takes an
exclusive ``flock`` on the very file portalocker would (``<tmp>/crewai:<md5(name)>.lock``),
so workers still exclude each other and any crewai process using the default backend; only
the wait differs (retries from 0.5 ms, doubling up to :data:`MAX_RETRY_SECONDS`), and the
timeout is kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from hashlib import md5

MAX_RETRY_SECONDS = 0.01
FIRST_RETRY_SECONDS = 0.0005


def lock_path(name: str) -> str:
    """The lock file crewai's default backend uses for ``name`` (same directory and name)."""
    channel = f"crewai:{md5(name.encode(), usedforsecurity=False).hexdigest()}"
    return os.path.join(tempfile.gettempdir(), f"{channel}.lock")


@contextlib.contextmanager
def flock_lock(name: str, *, timeout: float = 120.0,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[None]:
    """Hold crewai's lock ``name`` (a lock backend for ``set_lock_backend``)."""
    import portalocker.exceptions

    fd = os.open(lock_path(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + timeout
        delay = FIRST_RETRY_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise portalocker.exceptions.LockException(
                        f"Failed to acquire lock {name!r} (timeout={timeout}s)") from None
                sleep(delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def install() -> bool:
    """Make :func:`flock_lock` crewai's lock backend in this process (and the processes it
    forks); False when this crewai has no pluggable lock store (nothing changed)."""
    try:
        from crewai_core import lock_store
    except ImportError:
        return False
    setter = getattr(lock_store, "set_lock_backend", None)
    if setter is None:
        return False
    setter(flock_lock)
    return True
