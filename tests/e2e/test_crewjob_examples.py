"""Every CrewJob example, applied with kubectl against examples/crew-research.yaml, reaches its
expected phase; together they run each of the seven operations through a CrewJob."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from crewfence_sidecar.contract import OPERATION_TRAITS, Operation
from crewjob_support import (
    EXAMPLES,
    apply_file,
    condition,
    crewjob_namespace,
    full_output,
    get_job,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness.handles import Cluster, Operator

# file -> expected terminal phase (replay names a placeholder task id, see the file)
EXPECTED = {
    "crewjob-run.yaml": "Succeeded",
    "crewjob-batch-run.yaml": "Succeeded",
    "crewjob-knowledge-query.yaml": "Succeeded",
    "crewjob-test.yaml": "Succeeded",
    "crewjob-train.yaml": "Succeeded",
    "crewjob-memory-reset.yaml": "Succeeded",
    "crewjob-replay.yaml": "Failed",
}


@pytest.fixture(scope="module")
def examples_ns(cluster: Cluster) -> Iterator[str]:
    with crewjob_namespace(cluster, "e2e-cj-examples") as name:
        yield name


@pytest.fixture
def research(cluster: Cluster, operator_process: Operator, examples_ns: str) -> str:
    apply_file(cluster, EXAMPLES / "crew-research.yaml", examples_ns)
    wait_crew_ready(cluster, examples_ns, "research", 2)
    return examples_ns


def test_every_example_file_is_covered() -> None:
    files = {p.name for p in EXAMPLES.glob("crewjob-*.yaml")}
    assert set(EXPECTED) | {"crewjob-slow.yaml"} == files


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_example_reaches_its_expected_phase(cluster: Cluster, research: str,
                                            example: str) -> None:
    ns = research
    apply_file(cluster, EXAMPLES / example, ns)
    name = example.removesuffix(".yaml")
    obj = wait_phase(cluster, ns, name, timeout=600)
    status = obj["status"]
    assert status["phase"] == EXPECTED[example], json.dumps(status)
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["actionId"] == f"{ns}/{name}"
    assert status["assignment"]["pod"].startswith("research-")
    assert status["requestHash"] and status["startedAt"] and status["finishedAt"]
    assert status["uncertainOutcome"] is False
    if status["phase"] == "Succeeded":
        ready = condition(obj, "Ready")
        assert ready is not None and ready["status"] == "True"
        full_output(cluster, ns, obj)  # in status, or in this CrewJob's ConfigMap
        # No kopf diff base on CrewJobs (operator persistence.py): one metadata write less.
        annotations = obj["metadata"].get("annotations") or {}
        assert "crewfence.dev/last-handled-configuration" not in annotations, annotations
    else:
        assert status["failure"]["retryable"] is False
        assert status["failure"]["category"] == "Execution"
        stalled = condition(obj, "Stalled")
        assert stalled is not None and stalled["status"] == "True"


def test_slow_example_runs_and_cancels(cluster: Cluster, research: str) -> None:
    ns = research
    apply_file(cluster, EXAMPLES / "crewjob-slow.yaml", ns)
    running = wait_phase(cluster, ns, "crewjob-slow", ("Running",), timeout=240)
    assert condition(running, "Reconciling")["status"] == "True"
    cluster.kubectl("patch", "crewjob", "crewjob-slow", "-n", ns, "--type=merge",
                    "-p", '{"spec":{"cancel":true}}', check=True)
    obj = wait_phase(cluster, ns, "crewjob-slow", timeout=120)
    status = obj["status"]
    assert status["phase"] == "Cancelled", json.dumps(status)
    assert status["cancellation"] == {**status["cancellation"], "requested": True,
                                      "dispatched": True, "remoteStopConfirmed": True}
    # the contract says whether a cancelled `run` can keep working in a thread
    if OPERATION_TRAITS[Operation.RUN].thread_backed:
        assert (status["uncertainOutcome"], status["reason"]) == (True, "CancelUnconfirmed")
        assert condition(obj, "OutcomeUncertain")["status"] == "True"
        # the job ran in its own worker process, which the sidecar killed and reaped first
        stopped_at = status["cancellation"]["stoppedAt"]
        assert status["cancellation"]["workStopped"] is True
        assert f"Work stopped at {stopped_at}: reconcile external effects up to" \
            in status["recovery"]
        assert "may continue" not in status["recovery"]
    else:
        assert status["uncertainOutcome"] is False
        assert "confirm provider and tool state independently" in status["recovery"]
    # cancel may not go back to false (CEL)
    back = cluster.kubectl("patch", "crewjob", "crewjob-slow", "-n", ns, "--type=merge",
                           "-p", '{"spec":{"cancel":false}}')
    assert back.returncode != 0 and "false to true" in back.stderr
    assert wait_for(lambda: get_job(cluster, ns, "crewjob-slow"), timeout=5, what="job")
