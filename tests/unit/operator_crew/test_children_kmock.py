"""children.ensure against kmock (the kopf author's API emulator): which objects get created,
and that a pod object already using a replica's name is never overwritten or adopted.
The real API server runs the same code in tests/e2e/test_crew_*.py."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
from crewfence_operator import kube
from crewfence_operator.crew import children
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.pod import PodSettings
from crewfence_operator.crew.spec import parse_spec

SPEC = parse_spec({"replicas": 2, "operations": ["run", "train"],
                   "agents": {"a": {"role": "r", "goal": "g", "backstory": "b"}},
                   "tasks": [{"name": "t", "agent": "a", "description": "d",
                              "expected_output": "o"}]})


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

    before = len(list(api))
    again = await asyncio.to_thread(children.ensure, crew_ref, SPEC, PodSettings())
    assert again.created_pods == []
    assert _names(api, "pods") == ["research-0", "research-1"]
    # Steady state costs reads only: no create (even one answered 409), patch or delete.
    methods = [str(r.method.value).upper() for r in list(api)[before:]]
    assert methods and set(methods) == {"GET"}, methods


async def test_foreign_pod_with_the_replica_name_is_left_alone(
    api: Any, crew_ref: CrewRef
) -> None:
    squatter = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "research-0", "namespace": "team-a", "uid": "theirs"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    await asyncio.to_thread(kube.create_if_absent, squatter)
    snap = await asyncio.to_thread(children.ensure, crew_ref, SPEC, PodSettings())
    assert sorted(snap.pods) == [1], "a pod the operator did not make is never taken as a replica"
    stored = api.objects["v1/pods", "team-a", "research-0"]
    assert stored["metadata"]["uid"] == "theirs" and "labels" not in stored["metadata"]
