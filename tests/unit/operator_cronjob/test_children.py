"""Child names, action ids, the owner reference and the manual trigger."""

from __future__ import annotations

from typing import Any

import pytest
from crewfence_operator.cronjob import children as ch
from crewfence_operator.cronjob.schedule import from_rfc3339
from crewfence_operator.cronjob.trigger import TriggerError, trigger

TICK = from_rfc3339("2026-12-01T20:10:00Z")


def owner(name: str = "nightly-report") -> dict[str, Any]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewCronJob",
            "metadata": {"name": name, "namespace": "team-a", "uid": "u-1"},
            "spec": {"interval": "60s", "jobTemplate": {
                "metadata": {"labels": {"team": "a"}},
                "spec": {"crewRef": {"name": "research"}, "operation": "run",
                         "input": {"topic": "x"}}}}}


def test_a_tick_names_its_child_and_action() -> None:
    body = ch.child_manifest(owner(), tick=TICK)
    meta = body["metadata"]
    assert meta["name"] == f"nightly-report-{TICK}"
    assert body["spec"]["actionId"] == "team-a/nightly-report/2026-12-01T20:10:00Z"
    assert meta["annotations"][ch.ANNOTATION_SCHEDULED] == "2026-12-01T20:10:00Z"
    assert meta["labels"] == {"team": "a", ch.LABEL_CRONJOB: "nightly-report",
                              "app.kubernetes.io/managed-by": "crewfence"}
    [ref] = meta["ownerReferences"]
    assert ref["controller"] is True and ref["uid"] == "u-1" and ref["kind"] == "CrewCronJob"
    # the same tick always gives the same child (what two replicas or a restart compute)
    assert ch.child_manifest(owner(), tick=TICK) == body
    parsed = ch.Child.from_object(body, "u-1")
    assert parsed.tick == TICK and parsed.owned and parsed.active
    assert not ch.Child.from_object(body, "u-2").owned


def test_names_fit_the_limits() -> None:
    name = "a" * ch.MAX_NAME
    body = ch.child_manifest(owner(name), tick=TICK)
    assert len(body["metadata"]["name"]) <= 63  # also a valid label value
    assert len(body["spec"]["actionId"]) <= 256
    manual = ch.child_manifest(owner(name), manual_at=TICK)
    assert len(manual["metadata"]["name"]) <= 253 and "manual-" in manual["spec"]["actionId"]


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {
            ("crewcronjobs", "nightly-report"): owner()}

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                     plural: str, name: str) -> Any:
        if (plural, name) not in self.objects:
            raise ApiError(404)
        return self.objects[(plural, name)]

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                        plural: str, body: Any) -> Any:
        key = (plural, body["metadata"]["name"])
        if key in self.objects:
            raise ApiError(409)
        self.objects[key] = body
        return body


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status
        self.body = '{"message": "refused"}'


def test_trigger_creates_one_manual_run_with_its_own_action_id() -> None:
    api = FakeApi()
    result = trigger(api, "team-a", "nightly-report", now=TICK + 7)
    assert result.created and result.name == f"nightly-report-manual-{TICK + 7}"
    assert result.action_id == "team-a/nightly-report/manual-2026-12-01T20:10:07Z"
    child = api.objects[("crewjobs", result.name)]
    assert ch.ANNOTATION_SCHEDULED not in child["metadata"]["annotations"]
    assert ch.Child.from_object(child).tick is None  # never mistaken for a tick
    again = trigger(api, "team-a", "nightly-report", now=TICK + 7)
    assert not again.created and again.name == result.name
    assert "already existed" in again.message("team-a")
    with pytest.raises(TriggerError, match="not found"):
        trigger(api, "team-a", "missing", now=TICK)
