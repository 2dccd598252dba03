"""children.ensure against kmock (the kopf author's API emulator): which objects get created,
and that an existing pod object for an ordinal (even a terminating one) is never duplicated.
The real API server runs the same code in tests/e2e/test_crew_*.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import kmock
import pytest

from crewfence_operator import kube
from crewfence_operator.crew import children
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.pod import PodSettings
from crewfence_operator.crew.spec import parse_spec

SPEC = parse_spec({"replicas": 2, "operations": ["run", "train"],
                   "agents": {"a": {"role": "r", "goal": "g", "backstory": "b"}},
                   "tasks": [{"name": "t", "agent": "a", "description": "d",
                              "expected_output": "o"}]})


@pytest.fixture
def api(kmock: kmock.KubernetesEmulator) -> Iterator[kmock.KubernetesEmulator]:
    for plural in ("pods", "persistentvolumeclaims", "services", "secrets", "configmaps"):
        kmock.resources[f"v1/{plural}"] = {}
    kube.use_api_server(str(kmock.url).rstrip("/"))
    yield kmock


def _names(api: kmock.KubernetesEmulator, plural: str) -> list[str]:
    return sorted(name for res, _, name in api.objects if res.plural == plural
                  and api.objects[res, "team-a", name] is not None)


async def test_ensure_creates_children_once(api: Any, crew_ref: CrewRef) -> None:
    snap = await asyncio.to_thread(children.ensure, crew_ref, SPEC, PodSettings())
    assert sorted(snap.created_pods) == ["research-0", "research-1"]
    assert _names(api, "pods") == ["research-0", "research-1"]
    assert _names(api, "persistentvolumeclaims") == ["research-state-0", "research-state-1"]
    assert _names(api, "services") == ["research"]
    assert _names(api, "secrets") == ["research-crewfence-token"]
    assert _names(api, "configmaps") == ["research-crewfence-crews"]
    assert sorted(snap.pods) == [0, 1]

    again = await asyncio.to_thread(children.ensure, crew_ref, SPEC, PodSettings())
    assert again.created_pods == []
    assert _names(api, "pods") == ["research-0", "research-1"]


async def test_terminating_pod_is_not_replaced(api: Any, crew_ref: CrewRef) -> None:
    first = children.desired_pod(crew_ref, SPEC, 0, PodSettings())
    first["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    first["metadata"]["uid"] = "old"
    await asyncio.to_thread(kube.create_if_absent, first)
    snap = await asyncio.to_thread(children.ensure, crew_ref, SPEC, PodSettings())
    assert snap.created_pods == ["research-1"]
    assert _names(api, "pods") == ["research-0", "research-1"]
    assert api.objects["v1/pods", "team-a", "research-0"]["metadata"]["uid"] == "old"
