"""`replay` through CrewJobs: it replays a task of the latest kickoff on the SAME sidecar, so the
Crew here has one replica (assignment is per action id; see examples/crewjob-replay.yaml)."""

from __future__ import annotations

import json

import yaml
from crewjob_support import (
    EXAMPLES,
    apply_obj,
    crewjob_manifest,
    full_output,
    get_job,
    wait_crew_ready,
    wait_phase,
)
from harness.handles import Cluster, Operator


def test_replay_a_task_of_a_previous_run(cluster: Cluster, operator_process: Operator,
                                         namespace: str) -> None:
    crew = yaml.safe_load((EXAMPLES / "crew-research.yaml").read_text())
    crew["spec"]["replicas"] = 1
    assert apply_obj(cluster, crew, namespace).returncode == 0
    wait_crew_ready(cluster, namespace, "research", 1)

    assert apply_obj(cluster, crewjob_manifest("first", "run", {"topic": "replays"}),
                     namespace).returncode == 0
    run = wait_phase(cluster, namespace, "first", timeout=300)["status"]
    assert run["phase"] == "Succeeded", json.dumps(run)
    first = get_job(cluster, namespace, "first")
    assert first is not None
    tasks = json.loads(full_output(cluster, namespace, first))["tasks_output"]  # ids added
    task_id = tasks[0]["id"]

    replay = crewjob_manifest("again", "replay", {"task_id": task_id})
    assert apply_obj(cluster, replay, namespace).returncode == 0
    again = wait_phase(cluster, namespace, "again", timeout=300)
    status = again["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)
    output = json.loads(full_output(cluster, namespace, again))
    assert output["replayed_task_id"] == task_id
    assert status["assignment"]["ordinal"] == run["assignment"]["ordinal"] == 0
