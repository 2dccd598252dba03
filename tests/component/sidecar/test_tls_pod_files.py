"""The replica pod's credentials as the kubelet writes them, read by the real sidecar.

The operator renders the pod (``sidecar_tls``) and its Secrets; the pod runner's kubelet
emulation (``tests/e2e/harness/podspec.py``: projected volume, ``defaultMode``, then the
``fsGroup`` ownership pass that ORs in 0440 for read-only volumes) writes the files; the real
``crewfence-sidecar`` starts from the pod's own environment and serves mutual TLS.
"""

from __future__ import annotations

import asyncio
import base64
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from crewfence_operator import constants as c
from crewfence_operator.crew import credentials as pod_credentials
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.pod import PodSettings, replica_pod
from crewfence_operator.crew.resources import crews_configmap, token_secret
from crewfence_operator.sidecar_client import Endpoint, SidecarClient
from crewfence_operator.transport import pki
from crewfence_sidecar.contract import Operation, StartRequest
from sidecar_helpers import SidecarProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from harness.podspec import (  # the pod runner's kubelet emulation
    Mount,
    PodContext,
    container_env,
    materialise_volume,
    rewrite,
)
from tls_pod import LLM_KEY, SPEC, TOKEN

CREW = CrewRef(name="research", namespace="team-a", uid="uid-1")


class SecretStore:
    """What the pod runner asks the API server for, answered from the operator's manifests."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = {}
        for obj in objects:
            if "stringData" in obj:
                obj = {**obj, "data": {k: base64.b64encode(v.encode()).decode()
                                       for k, v in obj.pop("stringData").items()}}
            plural = "secrets" if obj["kind"] == "Secret" else "configmaps"
            meta = obj["metadata"]
            self.objects[f"/api/v1/namespaces/{meta['namespace']}/{plural}/{meta['name']}"] = obj

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)


@pytest.fixture(scope="module")
def crew_ca() -> pki.certs.Issued:
    return pki.new_crew_ca(CREW)


@pytest.fixture(scope="module")
def pod_files(tmp_path_factory: pytest.TempPathFactory,
              crew_ca: pki.certs.Issued) -> tuple[dict[str, str], Path]:
    root = tmp_path_factory.mktemp("pod")
    pod = replica_pod(CREW, SPEC, 0, PodSettings(sidecar_tls=True))
    pod["metadata"]["uid"] = "pod-uid"
    leaf = pki.issue_serving(crew_ca, pki.replica_hosts(CREW, 0, "127.0.0.1"))
    store = SecretStore([
        token_secret(CREW, TOKEN),
        pki.replica_tls_secret(CREW, 0, crew_ca, leaf),
        crews_configmap(CREW, SPEC),
        {"kind": "Secret", "metadata": {"name": "llm-key", "namespace": "team-a"},
         "data": {"apiKey": base64.b64encode(LLM_KEY.encode()).decode()}},
    ])
    ctx = PodContext(pod=pod, pod_ip="127.0.0.1", host_ip="127.0.0.1", ca_pem=b"")

    async def build() -> dict[str, str]:
        by_volume: dict[str, Path] = {}
        for volume in pod["spec"]["volumes"]:
            target = root / "volumes" / volume["name"]
            if "persistentVolumeClaim" in volume:
                target.mkdir(parents=True)
                target.chmod(0o700)
            else:
                await materialise_volume(store, ctx, volume, target)  # type: ignore[arg-type]
            by_volume[volume["name"]] = target
        container = pod["spec"]["containers"][0]
        mounts = [Mount(m["mountPath"], by_volume[m["name"]], bool(m.get("readOnly")))
                  for m in container["volumeMounts"]]
        env = await container_env(store, ctx, container)  # type: ignore[arg-type]
        return {k: rewrite(v, mounts) for k, v in env.items()}

    env = asyncio.run(build())
    return env, root / "volumes" / pod_credentials.VOLUME


def test_no_secret_in_the_pod_environment(crew_ca: pki.certs.Issued) -> None:
    pod = replica_pod(CREW, SPEC, 0, PodSettings(sidecar_tls=True))
    container = pod["spec"]["containers"][0]
    names = {e["name"] for e in container["env"]}
    assert "CREWFENCE_TOKEN" not in names and "CREWFENCE_LLM_API_KEY" not in names
    assert not any("secretKeyRef" in (e.get("valueFrom") or {}) for e in container["env"])
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == pod_credentials.VOLUME]
    assert volume["projected"]["defaultMode"] == 0o400
    assert "CREWFENCE_INSECURE_PLAINTEXT" not in names
    # Plain HTTP only when the operator was told so; then the sidecar is told too, or it
    # would refuse to listen on the pod IP without TLS.
    plain = replica_pod(CREW, SPEC, 0, PodSettings(sidecar_tls=False))
    assert pod_credentials.VOLUME not in {v["name"] for v in plain["spec"]["volumes"]}
    plain_env = {e["name"]: e.get("value") for e in plain["spec"]["containers"][0]["env"]}
    assert plain_env["CREWFENCE_INSECURE_PLAINTEXT"] == "1"


def test_kubelet_modes_are_owner_only_or_root_group_read(
        pod_files: tuple[dict[str, str], Path]) -> None:
    from crewfence_sidecar.credentials import check_owner_only

    _, volume = pod_files
    names = sorted(p.name for p in volume.iterdir())
    assert names == ["ca.crt", "llm-api-key", "tls.crt", "tls.key", "token"]
    for path in volume.iterdir():
        st = path.stat()
        # defaultMode 0400 | 0440 from the fsGroup pass: no write, nothing for others.
        assert stat.S_IMODE(st.st_mode) == 0o440, path.name
        if os.geteuid() == 0:  # the kubelet runs as root: files root-owned, group fsGroup
            assert st.st_uid == 0 and st.st_gid == c.FS_GROUP
            check_owner_only(path, path.name)
    assert (volume / "llm-api-key").read_text() == LLM_KEY


@pytest.fixture(scope="module")
def pod_sidecar(tmp_path_factory: pytest.TempPathFactory,
                pod_files: tuple[dict[str, str], Path]) -> Iterator[SidecarProcess]:
    if os.geteuid() != 0:
        pytest.skip("the kubelet writes root-owned files; as a non-root user they are ours")
    env, _ = pod_files
    base = {k: v for k, v in os.environ.items() if not k.startswith("CREWFENCE_")}
    proc = SidecarProcess([], {**base, **env, "CREWFENCE_PORT": "0"},
                          tmp_path_factory.mktemp("log") / "sidecar.log").start()
    try:
        proc.wait_listening()
        yield proc
    finally:
        proc.kill()


async def test_sidecar_serves_mutual_tls_from_the_pods_files(
        pod_sidecar: SidecarProcess, crew_ca: pki.certs.Issued,
        pod_files: tuple[dict[str, str], Path]) -> None:
    client_tls = pki.CrewClientTLS.for_ca(crew_ca)
    async with aiohttp.ClientSession() as session:
        client = SidecarClient(session, Endpoint(
            f"127.0.0.1:{pod_sidecar.port}", TOKEN, ssl_context=client_tls.context,
            server_name=pki.replica_dns_name(CREW, 0)))
        admission = await client.start(
            StartRequest(crew_id="research", action_id="team-a/pod-1", operation=Operation.RUN,
                         input={"topic": "bees"}), "key-1")
        assert admission.http_status == 202
    log = pod_sidecar.stderr_text()
    assert TOKEN not in log and LLM_KEY not in log
    env, _ = pod_files
    assert TOKEN not in str(env) and LLM_KEY not in str(env)
