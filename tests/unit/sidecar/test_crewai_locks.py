"""crewai's file locks in the workers (``workers.crewai_locks``): the same lock file and
``flock`` as crewai's default backend (so workers still exclude each other and any crewai
process), waited for in steps of at most 10 ms instead of portalocker's 0.25 s polls, and
installed by the worker template before it forks."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import portalocker
import portalocker.exceptions
import pytest
from crewfence_sidecar.workers import crewai_locks
from crewfence_sidecar.workers.crewai_locks import MAX_RETRY_SECONDS, flock_lock, lock_path


def _name(tmp_path: Path) -> str:
    return f"sqlite:{tmp_path}/latest_kickoff_task_outputs.db"


def test_it_excludes_a_holder_of_crewais_default_lock(tmp_path: Path) -> None:
    """Held through portalocker (crewai's default backend), the lock is not taken."""
    name = _name(tmp_path)
    holder = portalocker.Lock(lock_path(name), timeout=1)
    holder.acquire()
    try:
        with pytest.raises(portalocker.exceptions.LockException), \
                flock_lock(name, timeout=0.05):
            pass  # pragma: no cover - must not be reached
    finally:
        holder.release()
    with flock_lock(name, timeout=1):  # free again: taken at once
        pass


def test_a_held_lock_is_retried_in_short_steps_until_released(tmp_path: Path) -> None:
    """While another holder keeps it, the waiter retries after at most 10 ms each time
    (portalocker sleeps 0.25 s), and takes the lock once it is released."""
    name = _name(tmp_path)
    fd = os.open(lock_path(name), os.O_WRONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    delays: list[float] = []

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) == 8:  # the holder lets go after the waiter's eighth retry
            fcntl.flock(fd, fcntl.LOCK_UN)

    try:
        with flock_lock(name, timeout=60, sleep=sleep):
            with pytest.raises(BlockingIOError):  # held by the waiter now
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert len(delays) == 8
    assert max(delays) <= MAX_RETRY_SECONDS < portalocker.utils.DEFAULT_CHECK_INTERVAL


def test_install_makes_it_crewais_lock_backend(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from crewai_core import lock_store

    monkeypatch.setattr(lock_store, "_backend", None)
    assert crewai_locks.install()
    assert lock_store._backend is flock_lock
    name = _name(tmp_path)
    holder = portalocker.Lock(lock_path(name), timeout=1)
    holder.acquire()
    try:
        with pytest.raises(portalocker.exceptions.LockException), \
                lock_store.lock(name, timeout=0.05):
            pass  # pragma: no cover
    finally:
        holder.release()


def test_the_worker_template_installs_it_before_it_forks(tmp_path: Path) -> None:
    """What the workers inherit: the template's crewai lock backend after ``load``."""
    crews = tmp_path / "crews.yaml"
    crews.write_text(textwrap.dedent("""\
        crews:
          research:
            agents:
              researcher: {role: Researcher, goal: "Research {topic}", backstory: "Curious."}
            tasks:
              - {name: research, agent: researcher, description: "Research {topic}",
                 expected_output: "A summary"}
        """))
    script = textwrap.dedent(f"""\
        from crewfence_sidecar.crewai_env import apply_offline_env
        apply_offline_env()
        from crewfence_sidecar.workers.settings import TemplateSettings
        from crewfence_sidecar.workers.template import load
        catalog, hello = load(TemplateSettings(crews_file={str(crews)!r}))
        assert hello["type"] == "ready", hello
        from crewai_core import lock_store
        print(getattr(lock_store._backend, "__qualname__", None))
        """)
    env: dict[str, Any] = {**os.environ, "CREWAI_STORAGE_DIR": str(tmp_path / "crewai")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "flock_lock"
