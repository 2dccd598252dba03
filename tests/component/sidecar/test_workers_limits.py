"""Per-job limits on the worker (``CREWFENCE_WORKER_CPU_SECONDS``,
``CREWFENCE_WORKER_MEMORY_MB``, from the Crew's ``spec.workerLimits``): a job over its limit
fails alone; its neighbour and the next admission run; the sidecar keeps serving. And the
worker's priority (``CREWFENCE_WORKER_NICE``): below the sidecar's.

One template serves these tests: every worker gets RLIMIT_CPU of :data:`CPU_SECONDS`, RLIMIT_AS
of :data:`MEMORY_BYTES` (well above a worker's baseline address space, well below
``limit_crews.HOG_BYTES``, the one allocation of the ``hog`` crew) and :data:`NICE` more nice
levels than the template's.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crewfence_sidecar.contract import job_path
from limit_crews import HOG_BYTES
from sidecar_helpers import AUTH, headers, start_body
from worker_support import HERE, Template, alive

pytestmark = pytest.mark.timeout(180)

CPU_SECONDS = 2
MEMORY_BYTES = 2 * 1024 * 1024 * 1024
"""A worker forked from the template starts near 0.75 GiB of address space."""
assert MEMORY_BYTES < HOG_BYTES
NICE = 3


@pytest.fixture(scope="module")
def worker_template(tmp_path_factory: pytest.TempPathFactory, crews_file: Path,
                    crewai_storage: Path) -> Iterator[Template]:
    """Overrides the session template: this one limits each worker's CPU time and memory."""
    from crewfence_sidecar.workers.settings import TemplateSettings
    from crewfence_sidecar.workers.supervisor import Supervisor

    root = tmp_path_factory.mktemp("limits")
    training = root / "training"
    training.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    env["CREWFENCE_TEST_EFFECTS_LOG"] = str(root / "effects.log")
    supervisor = Supervisor.spawn_template(
        TemplateSettings(registry="limit_crews:CREWS", crews_file=str(crews_file),
                         training_dir=str(training), cpu_seconds=CPU_SECONDS,
                         memory_bytes=MEMORY_BYTES, nice=NICE), env=env)
    supervisor.wait_ready()
    yield Template(supervisor, root / "effects.log", training)
    supervisor.close_sync()


async def test_a_job_over_its_cpu_limit_fails_alone(make_worker_client: Any) -> None:
    c = await make_worker_client(CREWFENCE_WORKER_SPARES="0")
    r = await c.post("/jobs", json=start_body("burn", crew_id="spin", topic="TAG-burn"),
                     headers=headers("burn"))
    assert r.status == 502
    record = await (await c.get(job_path("burn"), headers=AUTH)).json()
    assert record["error"]["code"] == "worker_died"
    assert record["error"]["signal"] in ("SIGXCPU", "SIGKILL")  # soft limit, then hard
    assert record["uncertain_outcome"] is True and record["work_stopped"] is True
    r = await c.post("/jobs", json=start_body("after-burn"), headers=headers("after-burn"))
    assert r.status == 200, await r.text()


def _nice(pid: int) -> int:
    """The nice value of a live process (field 19 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[16])


async def test_a_worker_runs_below_the_sidecar_s_priority(make_worker_client: Any,
                                                          worker_template: Template) -> None:
    c = await make_worker_client(CREWFENCE_WORKER_SPARES="0")
    r = await c.post("/jobs", json=start_body("niced", crew_id="stuck", topic="TAG-niced"),
                     headers=headers("niced", async_=True))
    assert r.status == 202, await r.text()
    pid = await _first_model_call(worker_template, "TAG-niced")
    template_pid = worker_template.supervisor.template_pid
    assert _nice(template_pid) == _nice(os.getpid())  # the template itself is not lowered
    assert _nice(pid) == min(19, _nice(template_pid) + NICE)
    r = await c.post(job_path("niced", "/cancel"),
                     json={"crew_id": "stuck", "action_id": "niced", "reason": "test"},
                     headers=AUTH)
    assert r.status == 200, await r.text()


def _address_space_limit(pid: int) -> str:
    """The soft RLIMIT_AS of a live process, as /proc shows it (bytes or ``unlimited``)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max address space"):
            return line.split()[3]
    raise AssertionError(f"no address-space line in /proc/{pid}/limits")


async def _first_model_call(template: Template, tag: str, within: float = 30.0) -> int:
    """The pid of the worker whose model call carried ``tag``, once it has made one."""
    deadline = time.monotonic() + within
    while (pid := template.pid_of(tag)) is None:
        assert time.monotonic() < deadline, f"no model call tagged {tag}"
        await asyncio.sleep(0.02)
    return pid


async def test_a_job_over_its_memory_limit_fails_alone(make_worker_client: Any,
                                                       worker_template: Template) -> None:
    c = await make_worker_client(CREWFENCE_WORKER_SPARES="0")
    # The neighbour: a three-task job whose model calls each take a second, running in its
    # own worker while the hog fails.
    neighbour = start_body("neighbour", crew_id="stuck", topic="TAG-neighbour")
    r = await c.post("/jobs", json=neighbour, headers=headers("neighbour", async_=True))
    assert r.status == 202, await r.text()
    neighbour_pid = await _first_model_call(worker_template, "TAG-neighbour")
    assert _address_space_limit(neighbour_pid) == str(MEMORY_BYTES)  # the limit is applied

    r = await c.post("/jobs", json=start_body("hog", crew_id="hog", topic="TAG-hog"),
                     headers=headers("hog"))
    assert r.status == 502, await r.text()
    record = await (await c.get(job_path("hog"), headers=AUTH)).json()
    assert record["status"] == "failed"
    error = record["error"]
    if error["code"] == "worker_died":  # the interpreter could not even raise
        assert record["uncertain_outcome"] is True
    else:
        assert error["code"] == "execution_error", error
        assert error["exception"] == "MemoryError", error
    hog_pid = worker_template.pid_of("TAG-hog")
    assert hog_pid is not None and hog_pid != neighbour_pid  # its own worker
    assert not any(kind == "hogged" for kind, _, _ in worker_template.effect_lines())
    assert not alive(hog_pid)

    # The neighbour was not touched: its worker is the same process, and it completes.
    r = await c.post("/jobs", json=neighbour, headers=headers("neighbour"))
    assert r.status == 200, await r.text()
    assert worker_template.count("llm", neighbour_pid) >= 3
    # The next admission runs, under the same limit.
    r = await c.post("/jobs", json=start_body("after-hog"), headers=headers("after-hog"))
    assert r.status == 200, await r.text()


async def test_no_worker_is_reused_under_a_cpu_limit(make_worker_client: Any,
                                                     worker_template: Template) -> None:
    """RLIMIT_CPU counts a process's whole life: a reused worker's next job would get less
    than its allowance, so with a CPU limit every job gets a fresh worker."""
    c = await make_worker_client()
    for action_id in ("cpu-1", "cpu-2"):
        r = await c.post("/jobs", json=start_body(action_id, crew_id="tagged",
                                                  topic=f"TAG-{action_id}"),
                         headers=headers(action_id))
        assert r.status == 200, await r.text()
    first, second = worker_template.pid_of("TAG-cpu-1"), worker_template.pid_of("TAG-cpu-2")
    assert first is not None and second is not None and first != second
    assert c.executor.stats.reused_jobs == 0
    deadline = time.monotonic() + 30
    while not c.executor.stats.not_reused:  # the worker's reason arrives after the record
        assert time.monotonic() < deadline, "no reason for not reusing the worker"
        await asyncio.sleep(0.01)
    assert "CPU" in c.executor.stats.not_reused[0]
