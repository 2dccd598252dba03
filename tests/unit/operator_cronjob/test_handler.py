"""The handler carries out the decisions in order against a cluster double: create-if-absent,
status after the create, a lost status write, refused templates, the metric."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from crewfence_operator import metrics
from crewfence_operator.cronjob import children as ch
from crewfence_operator.cronjob.schedule import to_rfc3339
from crewfence_operator.handlers import crewcronjob as h
from kubernetes.client.exceptions import ApiException

C = 1_800_000_000


def merge(status: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(status)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


class Cluster:
    def __init__(self) -> None:
        self.cronjob: dict[str, Any] = {
            "apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewCronJob",
            "metadata": {"name": "r", "namespace": "n", "uid": "u", "generation": 1,
                         "resourceVersion": "1",
                         "creationTimestamp": to_rfc3339(C)},
            "spec": {"interval": "60s", "jobTemplate": {"spec": {
                "crewRef": {"name": "research"}, "operation": "run"}}}}
        self.crewjobs: dict[str, dict[str, Any]] = {}
        self.creates: list[str] = []
        self.refuse: int | None = None
        self.refuse_dry_run = False
        self.fail_status_writes = 0
        self.warnings: list[str] = []

    def create_child(self, body: dict[str, Any], dry_run: bool = False) -> bool:
        if dry_run:
            if self.refuse_dry_run:
                raise ApiException(status=422, reason="Unprocessable")
            return True
        if self.refuse:
            raise ApiException(status=self.refuse, reason="Invalid")
        name = body["metadata"]["name"]
        if name in self.crewjobs:
            return False
        self.crewjobs[name] = copy.deepcopy(body)
        self.creates.append(name)
        return True

    def patch_status(self, namespace: str, name: str, patch: Any,
                     resource_version: str | None = None) -> tuple[dict[str, Any], str]:
        meta = self.cronjob["metadata"]
        if resource_version is not None and resource_version != meta["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        if self.fail_status_writes:
            self.fail_status_writes -= 1
            raise ApiException(status=500, reason="lost")
        self.cronjob["status"] = merge(self.cronjob.get("status") or {}, dict(patch))
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return dict(self.cronjob["status"]), meta["resourceVersion"]


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    fake = Cluster()
    monkeypatch.setattr(h, "list_children", lambda ns, name: list(fake.crewjobs.values()))
    monkeypatch.setattr(h, "create_child", fake.create_child)
    monkeypatch.setattr(h, "patch_status", fake.patch_status)
    monkeypatch.setattr(h, "delete_child", lambda ns, name: fake.crewjobs.pop(name, None))
    monkeypatch.setattr(h, "cancel_child", lambda ns, name: None)
    monkeypatch.setattr(h, "_warn", lambda obj, reason, message: fake.warnings.append(reason))
    return fake


def ran() -> float:
    return metrics.REGISTRY.get_sample_value(
        "crewfence_operator_crewcronjob_ticks_total",
        {"outcome": "run", "reason": "Scheduled"}) or 0.0


async def test_a_tick_creates_its_child_then_records_it(cluster: Cluster) -> None:
    before = ran()
    due = await h.reconcile(copy.deepcopy(cluster.cronjob), C + 61)
    assert cluster.creates == [ch.child_name("r", C + 60)] and due == C + 120
    status = cluster.cronjob["status"]
    assert status["lastScheduleTime"] == to_rfc3339(C + 60)
    assert status["active"][0]["actionId"] == f"n/r/{to_rfc3339(C + 60)}"
    assert status["nextScheduleTime"] == to_rfc3339(C + 120)
    assert ran() == before + 1
    # deleted by hand: not created again
    cluster.crewjobs.clear()
    await h.reconcile(copy.deepcopy(cluster.cronjob), C + 90)
    assert cluster.creates == [ch.child_name("r", C + 60)]


async def test_a_lost_status_write_does_not_create_the_tick_twice(cluster: Cluster) -> None:
    cluster.fail_status_writes = 1
    with pytest.raises(ApiException):
        await h.reconcile(copy.deepcopy(cluster.cronjob), C + 61)
    assert "status" not in cluster.cronjob and len(cluster.creates) == 1
    await h.reconcile(copy.deepcopy(cluster.cronjob), C + 62)
    assert cluster.creates == [ch.child_name("r", C + 60)]
    assert cluster.cronjob["status"]["lastScheduleTime"] == to_rfc3339(C + 60)


async def test_a_refused_template_is_a_condition(cluster: Cluster) -> None:
    cluster.refuse_dry_run = True
    assert await h.reconcile(copy.deepcopy(cluster.cronjob), C + 61) is None
    assert cluster.creates == []
    ready = {c["type"]: c for c in cluster.cronjob["status"]["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidJobTemplate")
    assert cluster.warnings == ["InvalidJobTemplate"]
    # the create itself refused (the dry run passed): the tick is not recorded as run
    cluster.refuse_dry_run, cluster.refuse = False, 422
    cluster.cronjob["status"]["observedGeneration"] = 0
    await h.reconcile(copy.deepcopy(cluster.cronjob), C + 61)
    assert cluster.creates == [] and "lastScheduleTime" not in cluster.cronjob["status"]


async def test_an_invalid_schedule_is_a_condition(cluster: Cluster) -> None:
    cluster.cronjob["spec"] = {"schedule": "61 * * * *", "jobTemplate": {}}
    assert await h.reconcile(copy.deepcopy(cluster.cronjob), C + 61) is None
    ready = {c["type"]: c for c in cluster.cronjob["status"]["conditions"]}["Ready"]
    assert ready["reason"] == "InvalidSchedule" and "61 * * * *" in ready["message"]


async def test_a_round_decided_from_an_older_status_writes_nothing(cluster: Cluster) -> None:
    stale = copy.deepcopy(cluster.cronjob)  # what a second replica read
    await h.reconcile(copy.deepcopy(cluster.cronjob), C + 61)
    cluster.crewjobs.clear()  # and the child was deleted by hand
    written = copy.deepcopy(cluster.cronjob["status"])
    again = await h.reconcile(stale, C + 62)
    # the stale replica re-creates the tick's child (same name and action id: an exact
    # repeat), but its status write is refused: lastScheduleTime never moves back
    assert again == C + 62.5
    assert cluster.cronjob["status"] == written
