"""Per-job limits on the worker (``CREWFENCE_WORKER_CPU_SECONDS``): a job that burns its CPU
time dies with SIGXCPU and only that job fails (``worker_died``); the sidecar keeps serving."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crewfence_sidecar.contract import job_path
from sidecar_helpers import AUTH, headers, start_body
from worker_support import HERE, Template

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def worker_template(tmp_path_factory: pytest.TempPathFactory, crews_file: Path,
                    crewai_storage: Path) -> Iterator[Template]:
    """Overrides the session template: this one limits each worker to 2 s of CPU time."""
    from crewfence_sidecar.workers.settings import TemplateSettings
    from crewfence_sidecar.workers.supervisor import Supervisor

    root = tmp_path_factory.mktemp("limits")
    training = root / "training"
    training.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    env["CREWFENCE_TEST_EFFECTS_LOG"] = str(root / "effects.log")
    supervisor = Supervisor.spawn_template(
        TemplateSettings(registry="worker_crews:CREWS", crews_file=str(crews_file),
                         training_dir=str(training), cpu_seconds=2), env=env)
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
