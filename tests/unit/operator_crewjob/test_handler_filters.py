"""The pure predicates of the CrewJob kopf glue (which objects get a daemon, which need a
late observedGeneration acknowledgement)."""

from __future__ import annotations

import pytest
from crewfence_operator.handlers.crewjob import is_live, is_terminal_and_behind


@pytest.mark.parametrize(("status", "live"), [
    (None, True), ({}, True), ({"phase": "Pending"}, True), ({"phase": "Running"}, True),
    ({"phase": "Succeeded"}, False), ({"phase": "Failed"}, False),
    ({"phase": "Cancelled"}, False),
])
def test_only_unfinished_jobs_get_a_daemon(status: dict | None, live: bool) -> None:
    assert is_live(status) is live


def obj(phase: str, generation: int, observed: int, deleting: bool = False) -> dict:
    meta: dict = {"name": "j", "namespace": "ns", "generation": generation}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, "observedGeneration": observed}}


def test_finished_job_with_a_newer_spec_is_behind() -> None:
    assert is_terminal_and_behind(obj("Succeeded", 2, 1))
    assert not is_terminal_and_behind(obj("Succeeded", 2, 2))
    assert not is_terminal_and_behind(obj("Running", 2, 1))  # its daemon writes it
    assert not is_terminal_and_behind(obj("Failed", 2, 1, deleting=True))


async def test_one_runtime_per_operator_shared_by_every_objects_memo() -> None:
    """kopf gives each object a shallow copy of the operator-wide memo: the startup handler
    must put the Runtime there so that all objects share it (not one session per job)."""
    import copy

    import kopf
    from crewfence_operator.handlers.crewjob import crewjob_runtime
    from crewfence_operator.runtime import runtime_of

    memo = kopf.Memo()
    await crewjob_runtime(memo=memo)
    per_object = [copy.copy(memo) for _ in range(3)]
    assert len({id(runtime_of(m)) for m in per_object}) == 1
    assert runtime_of(per_object[0]) is runtime_of(memo)
    assert runtime_of(memo).gate is not None  # the supersedes gate is plugged in
