"""A replica pod's credential files as the kubelet's own code writes them, read by the sidecar.

The pod runner has no kubelet; it writes Secret volumes with a Python emulation of the
kubelet's rules (``harness/podspec.py``). This test grounds that emulation: the operator's
TLS pod and its Secrets go to the real API server, and ``kubelet-volume`` (the kubelet's
AtomicWriter and fsGroup ownership pass, compiled from k8s.io/kubernetes at the pinned
version: ``tests/e2e/kubebuild/kubeletvolume``) writes every projected volume as a node would.
Then:

- the credential files come out mode 0440, owner root, group fsGroup (``defaultMode: 0400``
  with the fsGroup pass ORing in 0440): the mode the sidecar must accept, and nothing for
  others;
- the emulation writes the same files with the same modes and owners;
- the real ``crewfence-sidecar`` starts from those files and serves mutual TLS;
- a renewed serving certificate, written by the kubelet's sync (the ``..data`` symlink swap,
  not a file-by-file replace), is served without a restart.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import stat
import subprocess
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
from cryptography import x509
from harness import build
from harness.handles import Cluster
from harness.podspec import Mount, PodContext, container_env, materialise_volume, rewrite

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "component" / "sidecar"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from sidecar_helpers import SidecarProcess
from tls_pod import LLM_KEY, SPEC, TOKEN

pytestmark = pytest.mark.e2e

NO_NODE = "kubelet-volume-test"  # a node no pod runner serves: nobody starts this pod


class _Store:
    """The API objects the emulation asks for, as the API server returned them."""

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = objects

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)


def _apply(cluster: Cluster, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    if "stringData" in obj:
        obj = {**obj, "data": {k: base64.b64encode(v.encode()).decode()
                               for k, v in obj.pop("stringData").items()}}
    out = cluster.kubectl("apply", "-n", namespace, "-o", "json", "-f", "-",
                          input=json.dumps(obj), check=True)
    return dict(json.loads(out.stdout))


def _kubelet_write(cluster: Cluster, tool: Path, namespace: str, pod: str, volume: str,
                   target: Path) -> None:
    result = subprocess.run(
        [str(tool), f"--kubeconfig={cluster.kubeconfig}", f"--namespace={namespace}",
         f"--pod={pod}", f"--volume={volume}", f"--dir={target}"],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def _tree(root: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Visible files (not the kubelet's ``..`` entries) -> (mode, uid, gid, content), links
    followed as a container's reader follows them."""
    out = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".."):
            continue
        st = entry.stat()
        out[entry.name] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, entry.read_bytes())
    return out


@pytest.fixture(scope="module")
def kubelet_tool() -> Path:
    try:
        return build.ensure_tool("kubelet-volume")
    except build.BuildError as exc:
        pytest.fail(f"kubelet-volume could not be built: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def scene(cluster: Cluster, kubelet_tool: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.skip("the kubelet runs as root and chowns to the fsGroup; this user cannot")
    namespace = f"e2e-kubelet-volume-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", namespace, check=True)
    crew = CrewRef(name="research", namespace=namespace, uid="uid-kubelet")
    ca = pki.new_crew_ca(crew)
    objects = [
        token_secret(crew, TOKEN),
        pki.replica_tls_secret(crew, 0, ca, pki.issue_serving(
            ca, pki.replica_hosts(crew, 0, "127.0.0.1"))),
        crews_configmap(crew, SPEC),
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": "llm-key", "namespace": namespace},
         "data": {"apiKey": base64.b64encode(LLM_KEY.encode()).decode()}},
    ]
    stored: dict[str, dict[str, Any]] = {}
    for obj in objects:
        obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items()
                                   if k != "ownerReferences"}}
        live = _apply(cluster, obj, namespace)
        plural = "secrets" if live["kind"] == "Secret" else "configmaps"
        stored[f"/api/v1/namespaces/{namespace}/{plural}/{live['metadata']['name']}"] = live
    manifest = replica_pod(crew, SPEC, 0, PodSettings(sidecar_tls=True))
    manifest["metadata"].pop("ownerReferences", None)
    manifest["spec"]["nodeName"] = NO_NODE
    pod = _apply(cluster, manifest, namespace)
    root = tmp_path_factory.mktemp("kubelet")
    real: dict[str, Path] = {}
    for volume in pod["spec"]["volumes"]:
        target = root / "kubelet" / volume["name"]
        if "persistentVolumeClaim" in volume:
            target.mkdir(parents=True, mode=0o700)
        elif "emptyDir" in volume:
            target.mkdir(parents=True, mode=0o777)
        else:
            _kubelet_write(cluster, kubelet_tool, namespace, pod["metadata"]["name"],
                           volume["name"], target)
        real[volume["name"]] = target
    try:
        yield {"cluster": cluster, "namespace": namespace, "crew": crew, "ca": ca,
               "pod": pod, "real": real, "root": root, "store": _Store(stored),
               "tool": kubelet_tool}
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_kubelet_writes_credentials_0440_root_and_fs_group(scene: dict[str, Any]) -> None:
    volume = scene["real"][pod_credentials.VOLUME]
    assert (volume / "..data").is_symlink(), "not written by the kubelet's AtomicWriter"
    files = _tree(volume)
    assert sorted(files) == ["ca.crt", "llm-api-key", "tls.crt", "tls.key", "token"]
    for name, (mode, uid, gid, _) in files.items():
        assert (mode, uid, gid) == (0o440, 0, c.FS_GROUP), name
    assert files["llm-api-key"][3].decode() == LLM_KEY
    from crewfence_sidecar.credentials import check_owner_only

    for name in files:
        check_owner_only(volume / name, name)  # the sidecar accepts what the kubelet wrote


async def test_the_pod_runner_emulation_writes_what_the_kubelet_writes(
        scene: dict[str, Any]) -> None:
    pod = scene["pod"]
    ctx = PodContext(pod=pod, pod_ip="127.0.0.1", host_ip="127.0.0.1", ca_pem=b"")
    compared = 0
    for volume in pod["spec"]["volumes"]:
        if not any(k in volume for k in ("secret", "configMap", "projected")):
            continue
        emulated = scene["root"] / "emulated" / volume["name"]
        await materialise_volume(scene["store"], ctx, volume, emulated)
        real = _tree(scene["real"][volume["name"]])
        assert _tree(emulated) == real, volume["name"]
        compared += 1
    assert compared >= 2


@pytest.fixture(scope="module")
def kubelet_sidecar(scene: dict[str, Any],
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    pod = scene["pod"]
    container = pod["spec"]["containers"][0]
    mounts = [Mount(m["mountPath"], scene["real"][m["name"]], bool(m.get("readOnly")))
              for m in container["volumeMounts"]]
    ctx = PodContext(pod=pod, pod_ip="127.0.0.1", host_ip="127.0.0.1", ca_pem=b"")
    env = asyncio.run(container_env(scene["store"], ctx, container))
    env = {k: rewrite(v, mounts) for k, v in env.items()}
    base = {k: v for k, v in os.environ.items() if not k.startswith("CREWFENCE_")}
    proc = SidecarProcess([], {**base, **env, "CREWFENCE_PORT": "0"},
                          tmp_path_factory.mktemp("log") / "sidecar.log").start()
    try:
        proc.wait_listening()
        yield proc
    finally:
        proc.kill()


def _served_serial(port: int, ca_pem: bytes, server_name: str) -> int:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=server_name) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


async def test_sidecar_serves_mtls_from_kubelet_files_and_follows_the_sync(
        scene: dict[str, Any], kubelet_sidecar: SidecarProcess) -> None:
    crew, ca = scene["crew"], scene["ca"]
    name = pki.replica_dns_name(crew, 0)
    async with aiohttp.ClientSession() as session:
        client = SidecarClient(session, Endpoint(
            f"127.0.0.1:{kubelet_sidecar.port}", TOKEN,
            ssl_context=pki.CrewClientTLS.for_ca(ca).context, server_name=name))
        admission = await client.start(
            StartRequest(crew_id="research", action_id=f"{crew.namespace}/kubelet-1",
                         operation=Operation.RUN, input={"topic": "bees"}), "key-1")
        assert admission.http_status == 202
    before = _served_serial(kubelet_sidecar.port, ca.cert_pem, name)

    renewed = pki.replica_tls_secret(crew, 0, ca, pki.issue_serving(
        ca, pki.replica_hosts(crew, 0, "127.0.0.1")))
    renewed["metadata"].pop("ownerReferences", None)
    _apply(scene["cluster"], renewed, crew.namespace)
    _kubelet_write(scene["cluster"], scene["tool"], crew.namespace,
                   scene["pod"]["metadata"]["name"], pod_credentials.VOLUME,
                   scene["real"][pod_credentials.VOLUME])  # the kubelet's periodic sync
    wanted = x509.load_pem_x509_certificate(
        (scene["real"][pod_credentials.VOLUME] / "tls.crt").read_bytes()).serial_number
    assert wanted != before
    deadline = asyncio.get_running_loop().time() + 30
    served = before
    while served != wanted and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
        served = _served_serial(kubelet_sidecar.port, ca.cert_pem, name)
    assert served == wanted, "the sidecar did not pick up the kubelet's ..data swap"
    log = kubelet_sidecar.stderr_text()
    assert TOKEN not in log and LLM_KEY not in log
