"""`replicaCount > 1`: two operators peer through the chart's ClusterKopfPeering with distinct
priorities, using only the chart's RBAC (real tokens of the chart's ServiceAccount), and the
active one completes a CrewJob.

No StatefulSet controller runs here, so the two "pods" are local `crewfence-operator` processes
given the environment the chart's StatefulSet gives its pods 0 and 1 (standalone off, the
chart's peering name, the ordinal as priority).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.handles import Cluster, Operator, wait_until
from harness.operator_launch import OperatorLaunch, operator_command, operator_env

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "crewfence"


def helm(cluster: Cluster, *args: str) -> str:
    result = subprocess.run(
        [str(cluster.kube_bin / "helm"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=cluster.env(),
        check=False,
    )
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


def statefulset_env(cluster: Cluster, release: str, namespace: str, ordinal: int) -> dict[str, str]:
    """The operator settings the chart's StatefulSet gives pod <ordinal>."""
    version = json.loads(cluster.kubectl("get", "--raw", "/version", check=True).stdout)
    docs = yaml.safe_load_all(
        helm(
            cluster,
            "template",
            release,
            str(CHART),
            "-n",
            namespace,
            "--kube-version",
            version["gitVersion"],
            "--set",
            "replicaCount=2",
        )
    )
    sts = next(d for d in docs if d and d["kind"] == "StatefulSet")
    env: dict[str, str] = {}
    for item in sts["spec"]["template"]["spec"]["containers"][0]["env"]:
        if item["name"] == "CREWFENCE_OPERATOR_PRIORITY":
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == "metadata.labels['apps.kubernetes.io/pod-index']"
            env[item["name"]] = str(ordinal)  # what the downward API gives pod <ordinal>
        elif item["name"] in {"CREWFENCE_OPERATOR_STANDALONE", "CREWFENCE_OPERATOR_PEERING"}:
            env[item["name"]] = item["value"]
    assert env["CREWFENCE_OPERATOR_STANDALONE"] == "false"
    return env


@pytest.fixture
def peered_release(cluster: Cluster) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:6]
    release, namespace = f"peer{suffix}", f"crewfence-{suffix}"
    helm(
        cluster,
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "--create-namespace",
        "--wait=false",
        "--set",
        "replicaCount=2",
        "--set",
        "webhook.failurePolicy=Ignore",
    )
    try:
        yield release, namespace
    finally:
        helm(cluster, "uninstall", release, "-n", namespace, "--wait=false")
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
        # The chart keeps kopf's peering CRDs on uninstall (resource-policy keep) and leaves
        # the hook-made peering object; restore the shared test cluster.
        cluster.kubectl(
            "delete", "crd", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev", "--wait=false"
        )


def wait_for_rbac(cluster: Cluster, service_account: str, namespace: str | None = None) -> None:
    """The authorizer caches RBAC objects: wait until it knows the chart's fresh bindings."""
    scope = ["-n", namespace] if namespace else ["-A"]

    def allowed() -> bool:
        result = cluster.kubectl(
            "auth", "can-i", "list", "crewjobs.crewfence.dev", *scope, as_sa=service_account
        )
        return result.stdout.strip() == "yes"

    wait_until(allowed, timeout=30, what=f"RBAC for {service_account}")


def test_two_operators_peer_with_distinct_priorities(
    cluster: Cluster,
    peered_release: tuple[str, str],
    namespace: str,
    operator_factory: Callable[..., Operator],
    tmp_path: Path,
) -> None:
    release, release_ns = peered_release
    sa = f"{release_ns}:{release}-crewfence-operator"
    peering = cluster.get_json("clusterkopfpeering", "crewfence")
    assert peering is not None, "the chart creates the ClusterKopfPeering"
    wait_for_rbac(cluster, sa)

    active = operator_factory(
        service_account=sa,
        webhook_mode="off",
        extra_env=statefulset_env(cluster, release, release_ns, 1),
    )
    # The second peer: same chart settings, ordinal 0, its own ports and log.
    kubeconfig = cluster.service_account_kubeconfig(
        release_ns, sa.split(":")[1], tmp_path / "peer0.kubeconfig"
    )
    launch = OperatorLaunch.for_cluster(
        str(kubeconfig),
        tmp_path,
        webhook_mode="off",
        extra_env=statefulset_env(cluster, release, release_ns, 0),
    )
    log = (tmp_path / "peer0.log").open("w")
    standby = subprocess.Popen(
        operator_command(launch),
        env=operator_env(launch),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def peers() -> dict[str, Any] | None:
            status = (cluster.get_json("clusterkopfpeering", "crewfence") or {}).get("status")
            return status if status and len(status) >= 2 else None

        status = wait_until(peers, timeout=90, what="both operators in the peering")
        priorities = sorted(p.get("priority") for p in status.values())
        assert priorities == [0, 1], status

        cluster.apply(crew_manifest(namespace))
        cluster.apply(crewjob_manifest(namespace))

        def finished() -> dict[str, Any] | None:
            job = cluster.get_json("crewjob", "peered-run", "-n", namespace)
            phase = ((job or {}).get("status") or {}).get("phase")
            return job if phase in {"Succeeded", "Failed", "Cancelled"} else None

        job = wait_until(finished, timeout=240, what="the CrewJob to finish")
        assert job["status"]["phase"] == "Succeeded", job["status"]
        standby_log = (tmp_path / "peer0.log").read_text()
        assert "peered-run" not in standby_log, "the paused peer must not handle the CrewJob"
        for text in (active.logs(), standby_log):
            assert not [
                ln
                for ln in text.splitlines()
                if "forbidden" in ln.lower() and (namespace in ln or "e2e-" not in ln)
            ]
        cluster.kubectl(
            "delete", "crewjob", "peered-run", "-n", namespace, "--timeout=60s", check=True
        )
        cluster.kubectl("delete", "crew", "peered", "-n", namespace, "--timeout=120s", check=True)
    finally:
        os.killpg(standby.pid, signal.SIGTERM)
        try:
            standby.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(standby.pid, signal.SIGKILL)
            standby.wait()
        log.close()
        active.stop()


def crew_manifest(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "crewfence.dev/v1alpha1",
        "kind": "Crew",
        "metadata": {"name": "peered", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "operations": ["run"],
            "llm": {"model": "crewfence/offline"},
            "agents": {
                "researcher": {
                    "role": "Researcher",
                    "goal": "Research {topic}",
                    "backstory": "Careful.",
                }
            },
            "tasks": [
                {
                    "name": "research",
                    "agent": "researcher",
                    "description": "Research {topic}",
                    "expected_output": "A summary",
                }
            ],
            "storage": {"size": "64Mi"},
        },
    }


def crewjob_manifest(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "crewfence.dev/v1alpha1",
        "kind": "CrewJob",
        "metadata": {"name": "peered-run", "namespace": namespace},
        "spec": {"crewRef": {"name": "peered"}, "operation": "run", "input": {"topic": "peering"}},
    }
