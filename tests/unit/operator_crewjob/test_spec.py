from __future__ import annotations

import pytest
from crewfence_operator.crewjob.spec import (
    DeletionPolicy,
    JobSpec,
    SpecError,
    default_action_id,
    default_idempotency_key,
)
from crewfence_sidecar import contract
from crewfence_sidecar.contract import Operation, StartRequest


def spec(**over: object) -> dict[str, object]:
    base: dict[str, object] = {"crewRef": {"name": "research"}, "operation": "run",
                               "input": {"topic": "bees"}}
    base.update(over)
    return base


def test_defaults_derive_from_namespace_and_name_only() -> None:
    job = JobSpec.from_resource("team-a", "hello", spec())
    assert job.action_id == "team-a/hello" == default_action_id("team-a", "hello")
    assert job.idempotency_key == default_idempotency_key("team-a/hello")
    assert job.idempotency_key == JobSpec.from_resource("team-a", "hello", spec()).idempotency_key
    assert job.idempotency_key != default_idempotency_key("team-a/other")
    assert job.timeout_ms is None
    assert job.cancel is False
    assert job.deletion_policy is DeletionPolicy.CANCEL


def test_default_key_is_a_valid_header_value() -> None:
    key = default_idempotency_key("x" * 256)
    assert contract.validate_idempotency_key(key) == key


def test_explicit_values_are_used_verbatim() -> None:
    job = JobSpec.from_resource("ns", "n", spec(actionId="a-1", idempotencyKey="k-1",
                                                timeoutMs=5000, deletionPolicy="Orphan"))
    assert (job.action_id, job.idempotency_key, job.timeout_ms) == ("a-1", "k-1", 5000)
    assert job.deletion_policy is DeletionPolicy.ORPHAN


def test_request_hash_is_the_contract_hash() -> None:
    job = JobSpec.from_resource("ns", "n", spec(timeoutMs=1000))
    expected = contract.request_hash(
        StartRequest(crew_id="research", action_id="ns/n", operation=Operation.RUN,
                     input={"topic": "bees"}, timeout_ms=1000), job.idempotency_key)
    assert job.request_hash() == expected
    other = JobSpec.from_resource("ns", "n", spec(timeoutMs=1000, input={"topic": "ants"}))
    assert other.request_hash() != expected


@pytest.mark.parametrize("bad", [
    {"operation": "fly"},
    {"operation": "memory_reset", "input": {"command_type": "everything"}},
    {"operation": "train", "input": {"n_iterations": 1, "artifact_name": "../x"}},
    {"idempotencyKey": "bad\nkey"},
    {"idempotencyKey": "k" * 513},
    {"crewRef": {}},
])
def test_invalid_specs_are_refused_before_dispatch(bad: dict[str, object]) -> None:
    with pytest.raises(SpecError):
        JobSpec.from_resource("ns", "n", spec(**bad))


def test_thread_backed_follows_the_contract_traits() -> None:
    replay = JobSpec.from_resource("ns", "n", spec(operation="replay", input={"task_id": "t"}))
    assert replay.thread_backed is contract.OPERATION_TRAITS[Operation.REPLAY].thread_backed
    run = JobSpec.from_resource("ns", "n", spec())
    assert run.thread_backed is contract.OPERATION_TRAITS[Operation.RUN].thread_backed
