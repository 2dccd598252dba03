"""The operator's resolution handler against a real in-process sidecar (real crewai with the
offline LLM, real SQLite journal): accept, journal once, and stay level-triggered. The
Kubernetes API is replaced by a recorder of status patches (the e2e test,
tests/e2e/test_crewjob_resolution.py, runs the same path against the real kube-apiserver)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kopf
import pytest
from crewfence_operator.handlers import resolution as handler
from crewfence_operator.runtime import Runtime, runtime_of
from sidecar_helpers import AUTH, TOKEN, headers, start_body


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch (what the status PATCH does)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = value
    return target


@pytest.fixture(autouse=True)
def plain_http(monkeypatch: pytest.MonkeyPatch) -> None:
    """These in-process sidecars speak plain HTTP on loopback: the operator is told so
    explicitly (mutual TLS is its default)."""
    from crewfence_operator import config

    monkeypatch.setattr(config, "_current", config.OperatorConfig(sidecar_tls=False))


@pytest.fixture
async def runtime() -> Any:
    """The per-operator state (kopf memo) whose HTTP session the handler uses."""
    rt = runtime_of({})
    yield rt
    await rt.close()


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """One CrewJob object whose status the handler patches, plus the Events it posts."""
    state: dict[str, Any] = {"events": []}

    state["patches"] = []

    async def patch_status(namespace: str, name: str, status: dict[str, Any]) -> bool:
        state["patches"].append(copy.deepcopy(status))
        merge(state["obj"].setdefault("status", {}), copy.deepcopy(status))
        return True

    def event(_body: Any, *, type: str = "Normal", reason: str, message: str) -> None:
        state["events"].append((type, reason, message))

    monkeypatch.setattr(handler, "_patch_status", patch_status)
    monkeypatch.setattr(kopf, "event", event)
    monkeypatch.setattr(kopf, "warn", lambda body, *, reason, message:
                        state["events"].append(("Warning", reason, message)))
    return state


async def _finished_job(make_client: Any, action_id: str) -> Any:
    """A real in-process sidecar (its TestClient) holding the finished job ``action_id``."""
    c = await make_client()
    r = await c.post("/jobs", json=start_body(action_id, topic="bees"),
                     headers=headers("k", async_=True))
    assert r.status == 202
    assert await c.sidecar.runtime.wait_terminal(action_id, 60)
    return c


def _one_replica_crew(monkeypatch: pytest.MonkeyPatch, address: Callable[[], str | None]
                      ) -> None:
    """The Crew the handler reads: one ready replica at ``address()`` (read on every call)."""

    async def crew_and_token(namespace: str, crew: str) -> tuple[dict[str, Any], str]:
        return ({"spec": {"replicas": 1}, "status": {"replicas": [
            {"ordinal": 0, "pod": "research-0", "address": address(), "ready": True,
             "journalId": "j"}]}}, TOKEN)

    monkeypatch.setattr(handler, "read_crew_and_token", crew_and_token)


async def test_accept_then_journal_once(make_client: Any, api: dict[str, Any],
                                        monkeypatch: pytest.MonkeyPatch,
                                        runtime: Runtime) -> None:
    c = await _finished_job(make_client, "ns/job")
    address = f"{c.server.host}:{c.server.port}"
    _one_replica_crew(monkeypatch, lambda: address)
    api["obj"] = {
        "apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewJob",
        "metadata": {"name": "job", "namespace": "ns", "uid": "u", "generation": 2,
                     "managedFields": [{"manager": "kubectl-patch", "time": "t",
                                        "fieldsV1": {"f:spec": {"f:resolution": {}}}}]},
        "spec": {"crewRef": {"name": "research"}, "operation": "run",
                 "resolution": {"outcome": "Compensated", "note": "refunded"}},
        "status": {"phase": "Failed", "reason": "SidecarRestarted", "uncertainOutcome": True,
                   "observedGeneration": 1, "actionId": "ns/job",
                   "assignment": {"ordinal": 0, "pod": "research-0"},
                   "conditions": [{"type": "OutcomeUncertain", "status": "True",
                                   "reason": "SidecarRestarted"}]},
    }
    await handler.carry_out(api["obj"], runtime)
    status = api["obj"]["status"]
    assert status["resolution"]["journal"]["state"] == "Journaled"
    assert status["resolution"]["resolvedBy"] == "kubectl-patch"
    assert status["phase"] == "Failed" and status["uncertainOutcome"] is True
    assert [e[1] for e in api["events"]] == ["Resolved"]

    page = await (await c.get("/jobs/ns%2Fjob/events", headers=AUTH)).json()
    journaled = [e for e in page["events"] if e["event"] == "resolution"]
    assert len(journaled) == 1
    assert status["resolution"]["journal"]["sequence"] == journaled[0]["sequence"]

    # Level-triggered: looking again changes nothing and journals nothing more.
    await handler.carry_out(api["obj"], runtime)
    page = await (await c.get("/jobs/ns%2Fjob/events", headers=AUTH)).json()
    assert [e["event"] for e in page["events"]].count("resolution") == 1
    assert [e[1] for e in api["events"]] == ["Resolved"]


async def test_unreachable_sidecar_leaves_it_pending_and_a_retry_journals_it(
        make_client: Any, api: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        runtime: Runtime) -> None:
    c = await _finished_job(make_client, "ns/late")
    reachable: dict[str, str | None] = {"address": None}
    _one_replica_crew(monkeypatch, lambda: reachable["address"])
    monkeypatch.setattr(handler, "JOURNAL_BACKOFF_SECONDS", 0.01)
    monkeypatch.setattr(handler, "RETRY_SECONDS", 0.05)
    monkeypatch.setattr(handler, "_get_crewjob_blocking", lambda ns, name: api["obj"])
    api["obj"] = {
        "metadata": {"name": "late", "namespace": "ns", "uid": "u2", "generation": 2},
        "spec": {"crewRef": {"name": "research"}, "operation": "run",
                 "resolution": {"outcome": "Happened", "note": "it went out"}},
        "status": {"phase": "Failed", "uncertainOutcome": True, "observedGeneration": 1,
                   "actionId": "ns/late", "assignment": {"ordinal": 0, "pod": "research-0"},
                   "conditions": []},
    }
    await handler.carry_out(api["obj"], runtime)
    assert "resolution" not in api["obj"]["status"]  # not a finding until journaled
    resolved = next(x for x in api["obj"]["status"]["conditions"] if x["type"] == "Resolved")
    assert resolved["reason"] == "JournalPending" and "not journaled yet" in resolved["message"]

    reachable["address"] = f"{c.server.host}:{c.server.port}"  # the replica is back
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while (api["obj"]["status"].get("resolution") or {}).get("journal", {}).get(
            "state") != "Journaled":
        assert loop.time() < deadline, api["obj"]["status"]
        await asyncio.sleep(0.02)
    assert api["obj"]["status"]["resolution"]["outcome"] == "Happened"
    page = await (await c.get("/jobs/ns%2Flate/events", headers=AUTH)).json()
    assert [e["event"] for e in page["events"]].count("resolution") == 1


async def test_a_reapplied_predecessor_never_shows_a_resolution_its_journal_does_not_hold(
        make_client: Any, api: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        runtime: Runtime) -> None:
    """Invariant (crewjob/resolution.py, status shows only a confirmed finding): the journal
    holds Happened; a re-created CrewJob of that action says NotHappened. No status write
    ever carries NotHappened: the first resolution status shows is the journal's, with
    ResolutionConflict. (Before, status showed the spec's NotHappened until the journal's
    conflict answer replaced it: the campaign's known gap.)"""
    c = await _finished_job(make_client, "ns/pred")
    address = f"{c.server.host}:{c.server.port}"
    _one_replica_crew(monkeypatch, lambda: address)
    monkeypatch.setattr(handler, "_get_crewjob_blocking", lambda ns, name: api["obj"])

    def crewjob(uid: str, outcome: str) -> dict[str, Any]:
        return {
            "metadata": {"name": "pred", "namespace": "ns", "uid": uid, "generation": 1,
                         "managedFields": [{"manager": "kubectl-client-side-apply", "time": "t",
                                            "fieldsV1": {"f:spec": {"f:resolution": {}}}}]},
            "spec": {"crewRef": {"name": "research"}, "operation": "run",
                     "resolution": {"outcome": outcome, "note": outcome}},
            "status": {"phase": "Failed", "reason": "SidecarRestarted", "uncertainOutcome": True,
                       "observedGeneration": 1, "actionId": "ns/pred",
                       "assignment": {"ordinal": 0, "pod": "research-0"},
                       "conditions": [{"type": "OutcomeUncertain", "status": "True",
                                       "reason": "SidecarRestarted"}]}}

    api["obj"] = crewjob("first", "Happened")
    await handler.carry_out(api["obj"], runtime)
    assert api["obj"]["status"]["resolution"]["outcome"] == "Happened"

    api["obj"], api["patches"] = crewjob("again", "NotHappened"), []  # delete + re-apply
    await handler.carry_out(api["obj"], runtime)
    shown = [p["resolution"]["outcome"] for p in api["patches"]
             if (p.get("resolution") or {}).get("outcome")]
    assert shown and set(shown) == {"Happened"}, api["patches"]
    conds = {x["type"]: x for x in api["obj"]["status"]["conditions"]}
    assert conds["ResolutionConflict"]["status"] == "True"
    assert "NotHappened" in conds["ResolutionConflict"]["message"]


async def test_a_reapplied_predecessor_whose_record_was_archived_gets_the_journaled_finding(
        make_client: Any, api: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        runtime: Runtime) -> None:
    """Invariant (crewjob/resolution.py, an archived record keeps its finding): the journal
    holds Happened, then the record is archived; a re-applied CrewJob saying NotHappened gets
    the journaled Happened and ResolutionConflict (before: a 410, and status recorded the
    spec's NotHappened as not journaled); an identical re-apply shows it Journaled."""
    c = await _finished_job(make_client, "ns/arch")
    address = f"{c.server.host}:{c.server.port}"
    _one_replica_crew(monkeypatch, lambda: address)
    monkeypatch.setattr(handler, "_get_crewjob_blocking", lambda ns, name: api["obj"])

    def crewjob(uid: str, outcome: str) -> dict[str, Any]:
        return {
            "metadata": {"name": "arch", "namespace": "ns", "uid": uid, "generation": 1},
            "spec": {"crewRef": {"name": "research"}, "operation": "run",
                     "resolution": {"outcome": outcome, "note": "checked"}},
            "status": {"phase": "Failed", "reason": "SidecarRestarted", "uncertainOutcome": True,
                       "observedGeneration": 1, "actionId": "ns/arch",
                       "assignment": {"ordinal": 0, "pod": "research-0"},
                       "conditions": [{"type": "OutcomeUncertain", "status": "True",
                                       "reason": "SidecarRestarted"}]}}

    api["obj"] = crewjob("first", "Happened")
    await handler.carry_out(api["obj"], runtime)
    first = api["obj"]["status"]["resolution"]
    assert (first["outcome"], first["journal"]["state"]) == ("Happened", "Journaled")
    archived = await c.delete("/jobs/ns%2Farch",
                              headers={**AUTH, "X-AIP-Archive-Confirmation": "ns/arch"})
    assert archived.status == 200

    api["obj"], api["patches"] = crewjob("again", "NotHappened"), []  # delete + re-apply
    await handler.carry_out(api["obj"], runtime)
    shown = [p["resolution"]["outcome"] for p in api["patches"]
             if (p.get("resolution") or {}).get("outcome")]
    assert shown and set(shown) == {"Happened"}, api["patches"]
    status = api["obj"]["status"]
    assert status["resolution"]["journal"]["state"] == "Journaled"
    assert status["resolution"]["journal"]["sequence"] == first["journal"]["sequence"]
    conds = {x["type"]: x for x in status["conditions"]}
    assert conds["ResolutionConflict"]["status"] == "True"

    api["obj"], api["patches"] = crewjob("third", "Happened"), []
    await handler.carry_out(api["obj"], runtime)
    third = api["obj"]["status"]["resolution"]
    assert (third["outcome"], third["journal"]["state"]) == ("Happened", "Journaled")
    assert third["journal"]["sequence"] == first["journal"]["sequence"]


async def test_a_resolution_is_written_where_the_action_lives_not_only_on_the_assigned_replica(
        make_client: Any, api: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        runtime: Runtime, tmp_path: Path) -> None:
    """Invariant (crewjob/resolution.py ``held_nowhere``): the assigned replica's 404 alone
    never records the spec's finding as not journaled. Replica 0 (the assignment: a re-used
    ordinal, its journal fresh) does not hold the action; replica 1 (where its facts went)
    does, so the resolution is journaled there (before: accepted unjournaled on 0's 404)."""
    (tmp_path / "fresh").mkdir()
    fresh = await make_client(CREWFENCE_STATE_FILE=str(tmp_path / "fresh" / "journal.db"))
    holder = await _finished_job(make_client, "ns/moved")
    addresses = {0: f"{fresh.server.host}:{fresh.server.port}",
                 1: f"{holder.server.host}:{holder.server.port}"}

    async def crew_and_token(namespace: str, crew: str) -> tuple[dict[str, Any], str]:
        return ({"spec": {"replicas": 2}, "status": {"replicas": [
            {"ordinal": k, "pod": f"research-{k}", "address": a, "ready": True,
             "journalId": f"j{k}"} for k, a in addresses.items()]}}, TOKEN)

    monkeypatch.setattr(handler, "read_crew_and_token", crew_and_token)
    api["obj"] = {
        "metadata": {"name": "moved", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"crewRef": {"name": "research"}, "operation": "run",
                 "resolution": {"outcome": "NotHappened", "note": "checked"}},
        "status": {"phase": "Failed", "reason": "SidecarRestarted", "uncertainOutcome": True,
                   "observedGeneration": 1, "actionId": "ns/moved",
                   "assignment": {"ordinal": 0, "pod": "research-0"},
                   "conditions": [{"type": "OutcomeUncertain", "status": "True",
                                   "reason": "SidecarRestarted"}]}}
    await handler.carry_out(api["obj"], runtime)
    journal = api["obj"]["status"]["resolution"]["journal"]
    assert journal["state"] == "Journaled", journal
    page = await (await holder.get("/jobs/ns%2Fmoved/events", headers=AUTH)).json()
    assert [e["event"] for e in page["events"]].count("resolution") == 1
