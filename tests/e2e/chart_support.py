"""Helpers shared by the chart e2e tests (test_chart_*.py): helm, the chart's RBAC, and one small
Crew + CrewJob run by an operator that holds only the chart's ServiceAccount.

tests/e2e/conftest.py puts this folder on sys.path, as for crewjob_support.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from harness.handles import Cluster, wait_until

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "crewfence"
TERMINAL_PHASES = {"Succeeded", "Failed", "Cancelled"}


def helm(
    cluster: Cluster, *args: str, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the cached helm against the test cluster; with `check`, a failure fails the test."""
    result = subprocess.run(
        [str(cluster.kube_bin / "helm"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cluster.env(),
        check=False,
    )
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result


def server_version(cluster: Cluster) -> str:
    """The API server's gitVersion, for `helm template --kube-version`."""
    version = json.loads(cluster.kubectl("get", "--raw", "/version", check=True).stdout)
    return str(version["gitVersion"])


def install_chart(cluster: Cluster, release: str, namespace: str, *flags: str) -> None:
    """`helm install` into a new namespace, not waiting for workloads that never run here."""
    helm(
        cluster,
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "--create-namespace",
        "--wait=false",
        *flags,
    )


def render_chart(
    cluster: Cluster, release: str, namespace: str, *flags: str, timeout: float = 300
) -> str:
    """`helm template` for the test API server's Kubernetes version."""
    return helm(
        cluster,
        "template",
        release,
        str(CHART),
        "-n",
        namespace,
        "--kube-version",
        server_version(cluster),
        *flags,
        timeout=timeout,
    ).stdout


def wait_for_rbac(cluster: Cluster, service_account: str, namespace: str | None = None) -> None:
    """The authorizer caches RBAC objects: wait until it knows the chart's fresh bindings."""
    scope = ["-n", namespace] if namespace else ["-A"]

    def allowed() -> bool:
        result = cluster.kubectl(
            "auth", "can-i", "list", "crewjobs.crewfence.dev", *scope, as_sa=service_account
        )
        return result.stdout.strip() == "yes"

    wait_until(allowed, timeout=30, what=f"RBAC for {service_account}")


def crew_manifest(name: str, namespace: str) -> dict[str, Any]:
    """A one-replica Crew on the offline model with a single research task."""
    return {
        "apiVersion": "crewfence.dev/v1alpha1",
        "kind": "Crew",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "operations": ["run"],
            "llm": {"model": "crewfence/offline"},
            "process": "sequential",
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


def crewjob_manifest(name: str, namespace: str, crew: str, topic: str) -> dict[str, Any]:
    return {
        "apiVersion": "crewfence.dev/v1alpha1",
        "kind": "CrewJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"crewRef": {"name": crew}, "operation": "run", "input": {"topic": topic}},
    }


def wait_crewjob_finished(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    """The CrewJob once it reached a terminal phase (whichever)."""

    def finished() -> dict[str, Any] | None:
        job = cluster.get_json("crewjob", name, "-n", namespace)
        phase = ((job or {}).get("status") or {}).get("phase")
        return job if phase in TERMINAL_PHASES else None

    job: dict[str, Any] = wait_until(finished, timeout=240, what="the CrewJob to finish")
    return job


def forbidden_lines(log_text: str, namespace: str) -> list[str]:
    """403s an operator logged about this test's namespace or about cluster-scoped calls
    (the API server's message lines, which name the object and the verb).

    A cluster-wide operator may also pick up objects that earlier tests left in namespaces
    being deleted; writes there are refused with 403 too, which says nothing about RBAC."""
    # The API server's own words ("... is forbidden: User ... cannot ...") name the object;
    # a traceback's "Reason: Forbidden" lines around them do not, so they are not counted
    # (they would blame this test for another namespace's leftover objects).
    return [
        ln
        for ln in log_text.splitlines()
        if "is forbidden" in ln.lower() and (namespace in ln or "e2e-" not in ln)
    ]


def delete_crew_and_job(cluster: Cluster, crew: str, job: str, namespace: str) -> None:
    """Delete the CrewJob, then its Crew, waiting for the operator's finalizers."""
    cluster.kubectl("delete", "crewjob", job, "-n", namespace, "--timeout=60s", check=True)
    cluster.kubectl("delete", "crew", crew, "-n", namespace, "--timeout=120s", check=True)
