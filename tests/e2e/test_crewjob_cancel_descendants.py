"""Cancel and timeout stop a job's descendants too (issue 19), on the real control plane.

The job's tool (``os:system``, a plain callable the crew declares as a Python tool) starts a
daemon with ``setsid -f``: it leaves the worker's process group and its parent exits at
once, so killing the worker's group does not reach it; then the tool blocks. A cancel
(``spec.cancel: true``) or the job's ``timeoutMs`` ends the job. A record (and the CrewJob)
that says ``work_stopped`` must have no descendant of the job left running: the worker
template is the subreaper of its workers' descendants and kills and reaps such leftovers
before it reports the worker gone (workers/template.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from crewjob_support import (
    apply_obj,
    crewjob_manifest,
    sidecar_record,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness.handles import Cluster, Operator

pytestmark = pytest.mark.slow

CREW = "shell"


def _crew() -> dict[str, Any]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew",
            "metadata": {"name": CREW},
            "spec": {"replicas": 1,
                     "tools": {"python": [{"name": "sh", "ref": "os:system"}]},
                     "agents": {"op": {"role": "Operator", "goal": "Run the command",
                                       "backstory": "Careful.", "tools": ["sh"]}},
                     "tasks": [{"name": "run", "agent": "op", "description": "Do: {topic}",
                                "expected_output": "Done."}]}}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running any more
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _daemon_topic(pidfile: Path) -> str:
    command = (f"setsid -f sh -c 'echo $$ > {pidfile}; exec sleep 3600' >/dev/null 2>&1; "
               "sleep 3600")
    return f"[[tool:sh {json.dumps({'command': command})}]] descendants"


def _started_daemon(pidfile: Path) -> int:
    def read() -> int | None:
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        return int(text) if text else None

    pid: int = wait_for(read, timeout=180, what="the tool's daemon to start")
    assert _alive(pid)
    assert os.getpgid(pid) == pid, "the daemon leads its own process group (setsid)"
    return pid


@pytest.mark.parametrize("ending", ["cancel", "timeout"])
def test_a_daemon_that_left_the_process_group_is_stopped_before_work_stopped(
        cluster: Cluster, operator_process: Operator, namespace: str, tmp_path: Path,
        ending: str) -> None:
    ns, name = namespace, f"daemon-{ending}"
    assert apply_obj(cluster, _crew(), ns).returncode == 0
    wait_crew_ready(cluster, ns, CREW, 1)
    pidfile = tmp_path / "daemon.pid"
    extra = {"timeoutMs": 30_000} if ending == "timeout" else {}
    job = crewjob_manifest(name, "run", {"topic": _daemon_topic(pidfile)}, crew=CREW, **extra)
    assert apply_obj(cluster, job, ns).returncode == 0
    daemon = _started_daemon(pidfile)
    try:
        if ending == "cancel":
            cluster.kubectl("patch", "crewjob", name, "-n", ns, "--type=merge",
                            "-p", '{"spec":{"cancel":true}}', check=True)
        status = wait_phase(cluster, ns, name, timeout=240)["status"]
        code, record = sidecar_record(cluster, ns, CREW, 0, f"{ns}/{name}")
        assert code == 200 and record is not None and record["status"] != "running", record
        claimed = bool((record.get("error") or {}).get("work_stopped"))
        assert claimed, f"the worker was killed and reaped: the record says so ({record})"
        assert not _alive(daemon), ("the record says work_stopped while a descendant of the "
                                    f"job still runs ({status})")
        if ending == "cancel":
            assert status["phase"] == "Cancelled", json.dumps(status)
            assert status["cancellation"]["workStopped"] is True, json.dumps(status)
    finally:
        if _alive(daemon):
            os.kill(daemon, 9)
