"""`replicaCount > 1`: two operators peer through the chart's ClusterKopfPeering with distinct
priorities, using only the chart's RBAC (real tokens of the chart's ServiceAccount), and the
active one completes a CrewJob.

No StatefulSet controller runs here, so the two "pods" are local `crewfence-operator` processes
given the environment the chart's StatefulSet gives its pods 0 and 1 (standalone off, the
chart's peering name, the ordinal as priority).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import (
    crew_manifest,
    crewjob_manifest,
    delete_crew_and_job,
    forbidden_lines,
    helm,
    install_chart,
    render_chart,
    wait_crewjob_finished,
    wait_for_rbac,
)
from harness.handles import Cluster, Operator, wait_until
from harness.operator_launch import OperatorLaunch, operator_command, operator_env


def statefulset_env(cluster: Cluster, release: str, namespace: str, ordinal: int) -> dict[str, str]:
    """The operator settings the chart's StatefulSet gives pod <ordinal>."""
    docs = yaml.safe_load_all(render_chart(cluster, release, namespace, "--set", "replicaCount=2"))
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
    install_chart(
        cluster,
        release,
        namespace,
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

        cluster.apply(crew_manifest("peered", namespace))
        cluster.apply(crewjob_manifest("peered-run", namespace, crew="peered", topic="peering"))
        job = wait_crewjob_finished(cluster, "peered-run", namespace)
        assert job["status"]["phase"] == "Succeeded", job["status"]
        standby_log = (tmp_path / "peer0.log").read_text()
        assert "peered-run" not in standby_log, "the paused peer must not handle the CrewJob"
        for text in (active.logs(), standby_log):
            assert not forbidden_lines(text, namespace)
        delete_crew_and_job(cluster, "peered", "peered-run", namespace)
    finally:
        os.killpg(standby.pid, signal.SIGTERM)
        try:
            standby.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(standby.pid, signal.SIGKILL)
            standby.wait()
        log.close()
        active.stop()
