"""The Crew daemon's pass carrying out scale-down against kmock and a REAL sidecar.

The sidecar is the real crewfence sidecar in-process on a loopback socket (real crewai with the
offline LLM, real SQLite journal); kmock stands in for the API server (the same flow runs on a
real kube-apiserver in tests/e2e/test_crew_scaledown.py). Each pass reads pods from an index
rebuilt from kmock's objects, as the operator's watch-fed kopf index would hold them.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
from crewfence_operator import kube
from crewfence_operator.config import OperatorConfig
from crewfence_operator.crew import children
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.scaledown import HANDED_OVER_ANNOTATION, RELEASED_ANNOTATION
from crewfence_operator.handlers.crew import DaemonState, reconcile_once

TOKEN = "handler-test-token-0123456789"
CREWS_YAML = """\
crews:
  research:
    agents:
      researcher: {role: Researcher, goal: "Research {topic}", backstory: "Curious."}
    tasks:
      - {name: research, agent: researcher, description: "Research {topic}",
         expected_output: "A summary"}
"""
SPEC: dict[str, Any] = {
    "replicas": 1, "operations": ["run"],
    "agents": {"researcher": {"role": "Researcher", "goal": "Research {topic}",
                              "backstory": "Curious."}},
    "tasks": [{"name": "research", "agent": "researcher", "description": "Research {topic}",
               "expected_output": "A summary"}],
}
LOG = logging.getLogger("test.scaledown")


@pytest.fixture
async def sidecars(tmp_path: Path) -> AsyncIterator[Any]:
    """start(host, port=None) -> a real sidecar (its own journal) on ``host``; ``.port``,
    ``.url``, ``.journal``. Every pod of a Crew listens on the same port, so a second sidecar
    takes the first one's port on another loopback address."""
    from aiohttp.test_utils import TestServer
    from crewfence_sidecar.config import load_config
    from crewfence_sidecar.crews import CrewCatalog
    from crewfence_sidecar.server import build_sidecar, crewai_executor, open_journal

    crews = tmp_path / "crews.yaml"
    crews.write_text(CREWS_YAML)
    catalog = CrewCatalog.load(None, crews)
    started: list[tuple[Any, Any]] = []

    async def start(host: str, port: int | None = None) -> Any:
        state = tmp_path / f"state-{host}"
        state.mkdir(mode=0o700)
        config = load_config([], {"CREWFENCE_CREWS_FILE": str(crews),
                                  "CREWFENCE_STATE_FILE": str(state / "journal.db"),
                                  "CREWFENCE_TOKEN": TOKEN, "CREWFENCE_HOST": "127.0.0.1"})
        built = build_sidecar(config, catalog, crewai_executor(catalog), open_journal(config))
        server = TestServer(built.app, host=host, **({"port": port} if port else {}))
        await server.start_server()
        server.url = f"http://{host}:{server.port}"  # type: ignore[attr-defined]
        server.journal = built.runtime.journal  # type: ignore[attr-defined]
        started.append((built, server))
        return server

    yield start
    for built, server in started:
        await built.runtime.close()
        await server.close()
        built.opened.close()


@pytest.fixture
async def sidecar(sidecars: Any) -> Any:
    """A real sidecar on 127.0.0.1; ``.port``, ``.url``."""
    return await sidecars("127.0.0.1")


def _pod(ordinal: int, ip: str | None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running"}
    if ip:
        status |= {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"research-{ordinal}", "namespace": "team-a",
                         "labels": {"app.kubernetes.io/managed-by": "crewfence",
                                    "crewfence.dev/crew": "research",
                                    "crewfence.dev/replica": str(ordinal)},
                         "ownerReferences": [{"apiVersion": "crewfence.dev/v1alpha1",
                                              "kind": "Crew", "name": "research",
                                              "uid": "1111-2222", "controller": True}]},
            "spec": {"containers": [{"name": "sidecar", "image": "x"}],
                     "volumes": [{"name": "state", "persistentVolumeClaim": {
                         "claimName": f"research-state-{ordinal}"}}]},
            "status": status}


def _claim(ordinal: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"research-state-{ordinal}", "namespace": "team-a",
                         "labels": {"app.kubernetes.io/managed-by": "crewfence",
                                    "crewfence.dev/crew": "research",
                                    "crewfence.dev/replica": str(ordinal),
                                    "crewfence.dev/role": "state"}},
            "spec": {"accessModes": ["ReadWriteOncePod"],
                     "resources": {"requests": {"storage": "1Gi"}}}}


def _live(api: kmock.KubernetesEmulator, plural: str, name: str) -> dict[str, Any] | None:
    for res, ns, obj_name in list(api.objects):
        if res.plural == plural and ns == "team-a" and obj_name == name:
            obj = api.objects[res, ns, obj_name]
            if obj is not None and not obj.deleted:
                return dict(obj.raw)
    return None


def _serve_pod(api: kmock.KubernetesEmulator, ordinal: int, ip: str) -> None:
    """The kubelet's part: the pod got an address and is ready."""
    for key in list(api.objects):
        res, ns, name = key
        if res.plural == "pods" and ns == "team-a" and name == f"research-{ordinal}":
            api.objects[key]["status"] = _pod(ordinal, ip)["status"]
            return
    raise AssertionError(f"no pod research-{ordinal}")


def _index(api: kmock.KubernetesEmulator) -> dict[str, list[dict[str, Any]]]:
    pods = []
    for name in ("research-0", "research-1"):
        pod = _live(api, "pods", name)
        entry = children.pod_index_entry(pod) if pod else None
        if entry:
            pods.append(entry["team-a"])
    return {"team-a": pods}


def _seed(api: kmock.KubernetesEmulator, crew_ref: CrewRef, spec: dict[str, Any]) -> None:
    """A Crew, its token Secret, claims 0 and 1, pod 0 (no address) and pod 1 (the sidecar)."""
    api.resources["crewfence.dev/v1alpha1/crews"].namespaced = True
    kube.custom().create_namespaced_custom_object(
        "crewfence.dev", "v1alpha1", "team-a", "crews",
        {"apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew",
         "metadata": {"name": "research", "namespace": "team-a", "uid": crew_ref.uid,
                      "generation": 1},
         "spec": spec})
    kube.create_if_absent({"apiVersion": "v1", "kind": "Secret", "metadata": {
        "name": "research-crewfence-token", "namespace": "team-a"},
        "data": {"token": base64.b64encode(TOKEN.encode()).decode()}})
    for ordinal in (0, 1):
        kube.create_if_absent(_claim(ordinal))
    kube.create_if_absent(_pod(0, None))
    kube.create_if_absent(_pod(1, "127.0.0.1"))


async def _replicas() -> dict[int, dict[str, Any]]:
    crew = await asyncio.to_thread(kube.get_crew, "team-a", "research") or {}
    return {r["ordinal"]: r for r in (crew.get("status") or {}).get("replicas") or []}


async def _post(session: aiohttp.ClientSession, url: str, path: str, body: Any,
                headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with session.post(f"{url}{path}", json=body, headers={
            "Authorization": f"Bearer {TOKEN}", **(headers or {})}) as resp:
        return resp.status, await resp.json()


async def test_scale_down_drains_keeps_the_journal_then_retires_it(
    api: kmock.KubernetesEmulator, crew_ref: CrewRef, sidecar: Any, sidecars: Any,
) -> None:
    # replica 1 is above spec.replicas
    await asyncio.to_thread(_seed, api, crew_ref, {**SPEC, "storage": {"whenScaled": "Delete"}})
    # A plain-HTTP sidecar on loopback: plaintext is asked for explicitly (TLS is the default).
    cfg = OperatorConfig(sidecar_port=sidecar.port, health_timeout=5.0, sidecar_tls=False)
    state = DaemonState()

    async with aiohttp.ClientSession() as session:
        status, record = await _post(session, sidecar.url, "/jobs", {
            "crew_id": "research", "action_id": "kept-1", "operation": "run",
            "input": {"topic": "bees"}}, {"Idempotency-Key": "kept-1"})
        assert status == 200, record

        async def one_pass() -> dict[str, Any]:
            await reconcile_once(session, state, cfg, "team-a", "research", LOG,
                                 _index(api))  # type: ignore[arg-type]
            return await _replicas()

        async def health() -> dict[str, Any]:
            async with session.get(f"{sidecar.url}/health",
                                   headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                return dict(await resp.json())

        listed = await one_pass()
        assert (await health())["draining"] is True, "the operator switched the sidecar"
        assert listed[1]["state"] == "Draining" and listed[1]["ready"] is False
        assert listed[1]["unarchivedRecords"] == 1
        assert listed[0]["state"] == "Active"
        for _ in range(2):  # the journal holds a record: nothing is removed, however often
            listed = await one_pass()
            assert _live(api, "pods", "research-1") is not None
            assert _live(api, "persistentvolumeclaims", "research-state-1") is not None
        assert "1 unarchived" in listed[1]["message"]

        # Draining: lookups answer, admissions are refused.
        async with session.get(f"{sidecar.url}/jobs/kept-1",
                               headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200
        refused, _ = await _post(session, sidecar.url, "/jobs", {
            "crew_id": "research", "action_id": "new-1", "operation": "run",
            "input": {"topic": "x"}}, {"Idempotency-Key": "new-1"})
        assert refused == 503

        archived, body = await _post(session, sidecar.url, "/admin/archive",
                                     {"older_than_seconds": 0},
                                     {"X-AIP-Archive-Confirmation": "older-than:0"})
        assert archived == 200 and body["archived"] == ["kept-1"], body

        # Drained and empty, but its journal holds a tombstone and no replica serves to take
        # it over (pod 0 has no address): the replica stays, however often.
        for _ in range(2):
            listed = await one_pass()
            assert _live(api, "pods", "research-1") is not None
        assert "tombstone" in listed[1]["message"] and "no serving replica" in listed[1]["message"]

        # Replica 0 serves (its own journal): the tombstone moves there, the claim says so,
        # then the pod goes; replica 0 now answers 410 for the archived action.
        survivor = await sidecars("127.0.0.2", sidecar.port)
        _serve_pod(api, 0, "127.0.0.2")
        await one_pass()
        assert survivor.journal.tombstone("kept-1") is not None
        claim = _live(api, "persistentvolumeclaims", "research-state-1")
        assert claim is not None and HANDED_OVER_ANNOTATION in claim["metadata"]["annotations"]
        await one_pass()  # handed over: released on the claim, then the pod goes
        assert _live(api, "pods", "research-1") is None
        claim = _live(api, "persistentvolumeclaims", "research-state-1")
        assert claim is not None and RELEASED_ANNOTATION in claim["metadata"]["annotations"]

        listed = await one_pass()  # pod gone: the released claim follows whenScaled: Delete
        assert _live(api, "persistentvolumeclaims", "research-state-1") is None
        assert sorted(listed) == [0]
        assert _live(api, "persistentvolumeclaims", "research-state-0") is not None


async def test_scaling_back_up_undrains(
    api: kmock.KubernetesEmulator, crew_ref: CrewRef, sidecar: Any,
) -> None:
    await asyncio.to_thread(_seed, api, crew_ref, {**SPEC, "replicas": 2})
    # A plain-HTTP sidecar on loopback: plaintext is asked for explicitly (TLS is the default).
    cfg = OperatorConfig(sidecar_port=sidecar.port, health_timeout=5.0, sidecar_tls=False)
    async with aiohttp.ClientSession() as session:
        status, _ = await _post(session, sidecar.url, "/admin/drain", {"draining": True})
        assert status == 200
        await reconcile_once(session, DaemonState(), cfg, "team-a", "research", LOG,
                             _index(api))  # type: ignore[arg-type]
        async with session.get(f"{sidecar.url}/health",
                               headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert (await resp.json())["draining"] is False
        entry = (await _replicas())[1]
        assert entry["state"] == "Active" and entry["draining"] is False
