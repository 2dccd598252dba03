"""Action identity on the real API server: exact repeats, changed requests, immutable specs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from crewfence_sidecar.contract import OPERATION_TRAITS, Operation
from crewjob_support import (
    apply_obj,
    condition,
    crewjob_manifest,
    crewjob_namespace,
    delete_job,
    llm_calls,
    operator_metric,
    research_crew,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness.handles import Cluster, Operator


@pytest.fixture(scope="module")
def ident_ns(cluster: Cluster) -> Iterator[str]:
    with crewjob_namespace(cluster, "e2e-cj-ident") as name:
        yield name


@pytest.fixture
def ns(cluster: Cluster, operator_process: Operator, ident_ns: str) -> str:
    assert apply_obj(cluster, research_crew(2), ident_ns).returncode == 0
    wait_crew_ready(cluster, ident_ns, "research", 2)
    return ident_ns


def test_deleted_and_reapplied_crewjob_is_an_exact_repeat(cluster: Cluster, ns: str,
                                                         operator_process: Operator) -> None:
    job = crewjob_manifest("repeat", "run", {"topic": "exact repeats"})
    assert apply_obj(cluster, job, ns).returncode == 0
    first = wait_phase(cluster, ns, "repeat")["status"]
    assert first["phase"] == "Succeeded"
    calls_before = llm_calls(cluster, ns, "research")

    def model_calls() -> float:  # the per-Crew counter of finished CrewJobs' model calls
        return operator_metric(operator_process.metrics_url,
                               "crewfence_operator_model_calls_total", f'namespace="{ns}"')

    assert first["usage"]["modelCalls"] >= 1
    counted = wait_for(lambda: model_calls() >= first["usage"]["modelCalls"] and model_calls(),
                       timeout=30, what="the first finish counted")
    delete_job(cluster, ns, "repeat")
    assert apply_obj(cluster, job, ns).returncode == 0
    second = wait_phase(cluster, ns, "repeat")["status"]
    assert second["phase"] == "Succeeded", json.dumps(second)
    assert second["startedAt"] == first["startedAt"]
    assert second["finishedAt"] == first["finishedAt"]
    assert second["requestHash"] == first["requestHash"]
    # the same replica and journal (assignedAt is when the first object dispatched it)
    first["assignment"].pop("assignedAt", None)
    assert second["assignment"] == first["assignment"]
    assert second["output"]["sha256"] == first["output"]["sha256"]
    assert llm_calls(cluster, ns, "research") == calls_before  # nothing ran again
    # the same evidence, counted once: the record carries the first object's mark (I10)
    assert second["usage"] == first["usage"]
    assert model_calls() == counted


def test_changed_request_under_same_action_id_is_request_changed(cluster: Cluster,
                                                                  ns: str) -> None:
    original = crewjob_manifest("changed", "run", {"topic": "original"})
    assert apply_obj(cluster, original, ns).returncode == 0
    assert wait_phase(cluster, ns, "changed")["status"]["phase"] == "Succeeded"
    calls_before = llm_calls(cluster, ns, "research")
    # a different CrewJob naming the same action id with another input
    impostor = crewjob_manifest("changed-2", "run", {"topic": "different"},
                                actionId=f"{ns}/changed")
    assert apply_obj(cluster, impostor, ns).returncode == 0
    obj = wait_phase(cluster, ns, "changed-2")
    status = obj["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "RequestChanged")
    assert status["failure"]["category"] == "Permanent"
    assert status["failure"]["retryable"] is False
    assert status["uncertainOutcome"] is False
    assert "409 collision is protective" in status["recovery"]
    assert condition(obj, "Stalled")["status"] == "True"
    assert llm_calls(cluster, ns, "research") == calls_before  # nothing was run


def test_spec_edits_are_rejected_by_the_api_server(cluster: Cluster, ns: str) -> None:
    job = crewjob_manifest("immutable", "run", {"topic": "[[sleep:30]] immutable"},
                           deletionPolicy="Orphan")
    assert apply_obj(cluster, job, ns).returncode == 0
    for patch in ({"spec": {"input": {"topic": "edited"}}},
                  {"spec": {"operation": "batch_run"}},
                  {"spec": {"timeoutMs": 5}},
                  {"spec": {"actionId": "other"}},
                  {"spec": {"deletionPolicy": "Cancel"}},
                  {"spec": {"crewRef": {"name": "other"}}}):
        result = cluster.kubectl("patch", "crewjob", "immutable", "-n", ns, "--type=merge",
                                 "-p", json.dumps(patch))
        assert result.returncode != 0, patch
        assert "immutable" in result.stderr, result.stderr
    # the one mutable field, false -> true only
    ok = cluster.kubectl("patch", "crewjob", "immutable", "-n", ns, "--type=merge",
                         "-p", '{"spec":{"cancel":true}}')
    assert ok.returncode == 0, ok.stderr
    assert wait_phase(cluster, ns, "immutable")["status"]["phase"] in ("Cancelled", "Succeeded")


def test_schema_bounds_and_name_limit(cluster: Cluster, ns: str) -> None:
    long_name = "n" * 200
    refused = apply_obj(cluster, crewjob_manifest(long_name, "run", {"topic": "x"}), ns)
    assert refused.returncode != 0 and "192" in refused.stderr
    bad_timeout = apply_obj(cluster, crewjob_manifest("bad-timeout", "run", {},
                                                      timeoutMs=3_600_001), ns)
    assert bad_timeout.returncode != 0
    bad_op = apply_obj(cluster, crewjob_manifest("bad-op", "fly", {}), ns)
    assert bad_op.returncode != 0 and "Unsupported value" in bad_op.stderr
    bad_key = apply_obj(cluster, crewjob_manifest("bad-key", "run", {},
                                                  idempotencyKey="a\u0001b"), ns)
    assert bad_key.returncode != 0
    explained = cluster.kubectl("explain", "crewjobs.spec.deletionPolicy")
    assert explained.returncode == 0 and "Orphan" in explained.stdout
    printed = cluster.kubectl("get", "crewjobs", "-n", ns)
    assert printed.returncode == 0
    for column in ("CREW", "OPERATION", "PHASE", "UNCERTAIN", "AGE"):
        assert column in printed.stdout.splitlines()[0]
    assert wait_for(lambda: cluster.kubectl("get", "cjob", "-n", ns).returncode == 0,
                    timeout=10, what="short name cjob")


def test_timeout_of_thread_backed_work_is_uncertain(cluster: Cluster, ns: str) -> None:
    job = crewjob_manifest("timeout", "run", {"topic": "[[sleep:20]] too slow"}, timeoutMs=2000)
    assert apply_obj(cluster, job, ns).returncode == 0
    obj = wait_phase(cluster, ns, "timeout", timeout=300)
    status = obj["status"]
    assert status["reason"] == "Timeout", json.dumps(status)
    assert status["failure"]["code"] == "timeout" and status["failure"]["retryable"] is False
    thread_backed = OPERATION_TRAITS[Operation.RUN].thread_backed
    assert status["uncertainOutcome"] is thread_backed
    cond = condition(obj, "OutcomeUncertain")
    assert cond is not None and cond["status"] == ("True" if thread_backed else "False")
