"""Fixtures and helpers for the worker tests (imported by conftest.py).

``worker_template`` is ONE template process for the session, spawned as a fresh interpreter
(this pytest process has threads, so it must not fork one itself). It hosts the declarative
crews of ``sidecar_helpers.CREWS_YAML`` and the registry ``worker_crews:CREWS``.
``make_worker_client`` builds a real in-process sidecar (journal, runtime, HTTP) whose jobs
run in worker processes forked by that template.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from sidecar_helpers import ALL_OPS, TOKEN, close_in_process, serve_in_process

HERE = Path(__file__).parent


@dataclass
class Template:
    supervisor: Any
    effects: Path
    training: Path

    def effect_lines(self) -> list[tuple[str, int, str]]:
        if not self.effects.exists():
            return []
        out = []
        for line in self.effects.read_text().splitlines():
            kind, pid, *tag = line.split(" ")
            out.append((kind, int(pid), " ".join(tag)))
        return out

    def pid_of(self, tag: str) -> int | None:
        for kind, pid, seen in self.effect_lines():
            if kind == "llm" and seen == tag:
                return pid
        return None

    def count(self, kind: str, pid: int) -> int:
        return sum(1 for k, p, _ in self.effect_lines() if k == kind and p == pid)


async def until(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Await ``check()`` becoming truthy (polled every 10 ms); its value. Fails after
    ``timeout`` seconds naming ``what``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if value:
            return value
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every live or zombie child of ``pid``, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            out.append((int(entry), fields[0]))
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


@pytest.fixture(scope="session")
def worker_template(tmp_path_factory: pytest.TempPathFactory, crews_file: Path,
                    crewai_storage: Path) -> Iterator[Template]:
    from crewfence_sidecar.workers.settings import TemplateSettings
    from crewfence_sidecar.workers.supervisor import Supervisor

    root = tmp_path_factory.mktemp("workers")
    effects = root / "effects.log"
    training = root / "training"
    training.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    env["CREWFENCE_TEST_EFFECTS_LOG"] = str(effects)
    supervisor = Supervisor.spawn_template(
        TemplateSettings(registry="worker_crews:CREWS", crews_file=str(crews_file),
                         training_dir=str(training)), env=env)
    supervisor.wait_ready()
    yield Template(supervisor, effects, training)
    supervisor.close_sync()


@pytest.fixture
async def make_worker_client(worker_template: Template, state_dir: Path
                             ) -> AsyncIterator[Callable[..., Any]]:
    """make_worker_client(stop_grace=..., env overrides) -> TestClient of a real sidecar."""
    from aiohttp.test_utils import TestClient
    from crewfence_sidecar.config import load_config
    from crewfence_sidecar.server import build_sidecar, open_journal, worker_executor
    from crewfence_sidecar.workers.executor import WorkerCrews

    supervisor = worker_template.supervisor
    made: list[tuple[Any, Any]] = []
    executors: list[Any] = []
    supervisor.attach()

    async def make(stop_grace: float = 0.5, **env: str) -> TestClient:
        base = {"CREWFENCE_REGISTRY": "worker_crews:CREWS",
                "CREWFENCE_STATE_FILE": str(state_dir / "journal.db"),
                "CREWFENCE_TOKEN": TOKEN, "CREWFENCE_HOST": "127.0.0.1",
                "CREWFENCE_ALLOWED_OPERATIONS": ALL_OPS,
                "CREWFENCE_TRAINING_DIR": str(worker_template.training)}
        base.update(env)
        config = load_config([], {k: v for k, v in base.items() if v != ""})
        opened = open_journal(config)
        executor = worker_executor(replace(config, worker_stop_grace_ms=int(stop_grace * 1000)),
                                   supervisor)
        executor.prime()
        sidecar = build_sidecar(config, WorkerCrews(supervisor.info), executor, opened)
        client = await serve_in_process(sidecar, made)
        client.executor = executor
        executors.append(executor)
        return client

    yield make
    await close_in_process(made)
    for executor in executors:
        await executor.close()
    await supervisor.detach()
