"""The operator's supersedes gate against a real in-process sidecar (real crewai with the
offline LLM, real SQLite journal): it admits a successor only on the journal's claim, whatever
the predecessor's status says, and of two successors racing exactly one wins. The Kubernetes
API is replaced by a dict of CrewJobs (the e2e test, tests/e2e/
test_crewjob_resolution_journal.py, runs the same path against the real kube-apiserver)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf
import pytest
from crewfence_operator import kube
from crewfence_operator import supersedes_gate as gate
from crewfence_operator.crewjob import supersede
from crewfence_operator.runtime import Runtime
from crewfence_sidecar.contract import job_path
from sidecar_helpers import AUTH, TOKEN, headers, start_body


class CrewIO:
    """The two ClusterIO calls the gate makes: the Crew (one replica) and its TLS options."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def read_crew(self, namespace: str, crew: str) -> tuple[Mapping[str, Any], str]:
        return ({"spec": {"replicas": 1}, "status": {"replicas": [
            {"ordinal": 0, "pod": "research-0", "address": self.address, "ready": True,
             "journalId": "j"}]}}, TOKEN)

    async def endpoint_options(self, namespace: str, crew: str, ordinal: int) -> dict[str, Any]:
        return {}  # plain HTTP on loopback


@pytest.fixture
def jobs(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """CrewJobs by name (namespace ns); status patches merge into them."""
    store: dict[str, dict[str, Any]] = {}

    def patch(namespace: str, name: str, status: dict[str, Any]) -> bool:
        if name not in store:
            return False
        store[name].setdefault("status", {}).update(status)
        return True

    monkeypatch.setattr(kube, "get_crewjob", lambda namespace, name: store.get(name))
    monkeypatch.setattr(kube, "patch_crewjob_status_unless_gone", patch)
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    return store


def crewjob(name: str, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewJob",
            "metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"crewRef": {"name": "research"}, "operation": "run", **spec},
            "status": status or {}}


async def _uncertain_resolved(make_client: Any, outcome: str) -> Any:
    """ns/old ran and was stopped (uncertain); its resolution is journaled."""
    c = await make_client()
    r = await c.post("/jobs", json=start_body("ns/old", topic="[[sleep:30]] slowly"),
                     headers=headers("old", async_=True))
    assert r.status == 202
    await c.sidecar.runtime.close()
    c.sidecar.opened.close()
    c = await make_client()
    r = await c.post(job_path("ns/old", "/resolution"), headers=AUTH,
                     json={"crew_id": "research", "action_id": "ns/old", "outcome": outcome,
                           "note": "found out"})
    assert r.status == 201, await r.text()
    return c


def runtime_for(c: Any) -> Runtime:
    return Runtime(io=CrewIO(f"{c.server.host}:{c.server.port}"))  # type: ignore[arg-type]


# What a re-applied predecessor's status can say: resolved NotHappened, no successor.
REWRITTEN = {"phase": "Failed", "uncertainOutcome": True, "actionId": "ns/old",
             "resolution": {"outcome": "NotHappened", "note": "rewritten"},
             "assignment": {"ordinal": 0}}


async def test_a_status_that_says_not_happened_does_not_admit_after_happened(
        make_client: Any, jobs: dict[str, dict[str, Any]]) -> None:
    c = await _uncertain_resolved(make_client, "Happened")
    rt = runtime_for(c)
    try:
        jobs["old"] = crewjob("old", dict(REWRITTEN))
        jobs["new"] = crewjob("new", supersedes="old")
        decision = await gate.supersedes_gate(jobs["new"], "ns/new", rt)
        assert (decision.gate, decision.code) == (supersede.Gate.REFUSE, "predecessor_happened")
        assert "supersededBy" not in jobs["old"]["status"]
    finally:
        await rt.close()


async def test_two_successors_racing_one_wins_and_a_deleted_predecessor_is_still_found(
        make_client: Any, jobs: dict[str, dict[str, Any]]) -> None:
    c = await _uncertain_resolved(make_client, "NotHappened")
    rt = runtime_for(c)
    try:
        jobs["old"] = crewjob("old", dict(REWRITTEN))
        jobs["a"] = crewjob("a", supersedes="old")
        jobs["b"] = crewjob("b", supersedes="old")
        decisions = await asyncio.gather(gate.supersedes_gate(jobs["a"], "ns/a", rt),
                                         gate.supersedes_gate(jobs["b"], "ns/b", rt))
        assert sorted(d.gate.value for d in decisions) == ["Proceed", "Refuse"]
        winner = "a" if decisions[0].proceed else "b"
        loser = "b" if winner == "a" else "a"
        assert next(d for d in decisions if not d.proceed).code == "already_superseded"
        assert jobs["old"]["status"]["supersededBy"] == {"name": winner,
                                                         "actionId": f"ns/{winner}"}
        assert jobs[winner]["status"]["supersedes"] == {"name": "old", "actionId": "ns/old",
                                                        "outcome": "NotHappened"}

        # The predecessor's CrewJob deleted for good: the winner still proceeds (an exact
        # repeat of its claim), the loser is still refused, both by the journal.
        del jobs["old"]
        again = await gate.supersedes_gate(jobs[winner], f"ns/{winner}", rt)
        assert again.proceed
        refused = await gate.supersedes_gate(jobs[loser], f"ns/{loser}", rt)
        assert refused.code == "already_superseded"

        page = await (await c.get(job_path("ns/old", "/events"), headers=AUTH)).json()
        assert [e["event"] for e in page["events"]].count("successor") == 1
    finally:
        await rt.close()
