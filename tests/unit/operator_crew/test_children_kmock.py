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
from crewfence_operator.crew.pod import PodSettings, pod_claims
from crewfence_operator.crew.spec import parse_spec

SPEC = parse_spec({"replicas": 2, "operations": ["run", "train"],
                   "agents": {"a": {"role": "r", "goal": "g", "backstory": "b"}},
                   "tasks": [{"name": "t", "agent": "a", "description": "d",
                              "expected_output": "o"}]})


def _names(api: kmock.KubernetesEmulator, plural: str) -> list[str]:
    return sorted(name for res, _, name in api.objects if res.plural == plural
                  and api.objects[res, "team-a", name] is not None)


def _indexed_pods(api: kmock.KubernetesEmulator) -> list[dict[str, Any]]:
    """What the operator's pod index would hold for team-a (fed by the watch in production)."""
    pods = []
    for res, ns, name in list(api.objects):
        obj = api.objects[res, ns, name]
        if res.plural == "pods" and obj is not None:
            entry = children.pod_index_entry(obj)
            if entry:
                pods.append(entry["team-a"])
    return pods


async def test_ensure_creates_children_once(api: Any, crew_ref: CrewRef) -> None:
    snap = await asyncio.to_thread(children.ensure, crew_ref, SPEC, PodSettings(), [])
    assert sorted(snap.created_pods) == ["research-0", "research-1"]
    assert _names(api, "pods") == ["research-0", "research-1"]
    assert _names(api, "persistentvolumeclaims") == ["research-state-0", "research-state-1"]
    assert _names(api, "services") == ["research"]
    assert _names(api, "secrets") == ["research-crewfence-token"]
    assert _names(api, "configmaps") == ["research-crewfence-crews"]
    assert sorted(snap.pods) == [0, 1]

    before = len(list(api))
    again = await asyncio.to_thread(children.ensure, crew_ref, SPEC, PodSettings(),
                                    _indexed_pods(api))
    assert again.created_pods == []
    assert _names(api, "pods") == ["research-0", "research-1"]
    # Steady state costs reads only: no create (even one answered 409), patch or delete, and
    # pods are never listed (the watch-fed index serves them).
    requests = list(api)[before:]
    methods = [str(r.method.value).upper() for r in requests]
    assert methods and set(methods) == {"GET"}, methods
    assert not [r for r in requests if "/pods" in str(r.url)], "no pod reads per pass"


async def test_a_lagging_index_never_creates_a_second_pod(api: Any, crew_ref: CrewRef) -> None:
    await asyncio.to_thread(children.ensure, crew_ref, SPEC, PodSettings(), [])
    uids = {name: api.objects["v1/pods", "team-a", name]["metadata"].get("uid")
            for name in ("research-0", "research-1")}
    # The watch has not delivered the new pods yet: the index is still empty.
    again = await asyncio.to_thread(children.ensure, crew_ref, SPEC, PodSettings(), [])
    assert again.created_pods == [] and _names(api, "pods") == ["research-0", "research-1"]
    assert {name: api.objects["v1/pods", "team-a", name]["metadata"].get("uid")
            for name in uids} == uids


def test_pod_index_keeps_replica_pods_and_claim_mounts_only() -> None:
    ours = {"metadata": {"name": "research-0", "namespace": "team-a", "managedFields": [{}],
                         "labels": {"app.kubernetes.io/managed-by": "crewfence"}},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "state", "persistentVolumeClaim": {"claimName": "research-state-0"}},
                {"name": "scratch", "emptyDir": {}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "hostIP": "1.2.3.4"}}
    entry = children.pod_index_entry(ours)
    assert entry is not None
    slim = entry["team-a"]
    assert "managedFields" not in slim["metadata"] and slim["status"] == {
        "phase": "Running", "podIP": "10.0.0.1"}
    assert pod_claims(slim) == ["research-state-0"]
    foreign = {"metadata": {"name": "x", "namespace": "team-a"},
               "spec": {"volumes": [{"name": "v", "persistentVolumeClaim": {
                   "claimName": "research-state-0"}}]}}
    assert children.pod_index_entry(foreign) is not None
    assert children.pod_index_entry({"metadata": {"name": "y", "namespace": "team-a"},
                                     "spec": {"containers": []}}) is None


async def test_foreign_pod_with_the_replica_name_is_left_alone(
    api: Any, crew_ref: CrewRef
) -> None:
    squatter = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "research-0", "namespace": "team-a", "uid": "theirs"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    await asyncio.to_thread(kube.create_if_absent, squatter)
    snap = await asyncio.to_thread(children.ensure, crew_ref, SPEC, PodSettings(),
                                   [*_indexed_pods(api), squatter])
    assert sorted(snap.pods) == [1], "a pod the operator did not make is never taken as a replica"
    stored = api.objects["v1/pods", "team-a", "research-0"]
    assert stored["metadata"]["uid"] == "theirs" and "labels" not in stored["metadata"]
