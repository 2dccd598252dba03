"""Install the chart with `helm install` on the real control plane, then run the operator with
exactly the chart's RBAC (a real token of the chart's ServiceAccount) and complete a CrewJob.

The chart's Deployment does not run here (no kubelet pulls images); the operator runs as a local
process through the harness's `operator_factory`, authenticated as the ServiceAccount the chart
created, so every API call it makes is authorised by the chart's ClusterRole/Role only.

The chart's ValidatingWebhookConfiguration is installed too, but the API server cannot reach a
Service-backed webhook here (no cluster DNS or proxy), so these installs set its failurePolicy to
Ignore and run the operator with its admission server off.
"""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from chart_support import (
    CHART,
    crew_manifest,
    crewjob_manifest,
    delete_crew_and_job,
    forbidden_lines,
    helm,
    install_chart,
    wait_crewjob_finished,
    wait_for_rbac,
)
from harness.handles import Cluster, Operator
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = CHART / "files" / "dashboards" / "crewfence.json"


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str

    @property
    def service_account(self) -> str:
        return f"{self.namespace}:{self.name}-crewfence-operator"


@pytest.fixture
def install(cluster: Cluster) -> Iterator[Callable[..., Release]]:
    installed: list[Release] = []

    def _install(values: dict[str, Any]) -> Release:
        suffix = uuid.uuid4().hex[:6]
        release = Release(name=f"cf{suffix}", namespace=f"crewfence-{suffix}")
        sets = [a for k, v in values.items() for a in ("--set-json", f"{k}={json.dumps(v)}")]
        install_chart(cluster, release.name, release.namespace, *sets)
        installed.append(release)
        return release

    yield _install
    for release in installed:
        helm(cluster, "uninstall", release.name, "--namespace", release.namespace, "--wait=false")
        cluster.kubectl("delete", "namespace", release.namespace, "--wait=false")


def dashboard_operator_metrics() -> set[str]:
    import re

    exprs = [
        t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", [])
    ]
    return {m for e in exprs for m in re.findall(r"\bcrewfence_operator_[a-z0-9_]+\b", e)}


def scrape(url: str) -> tuple[set[str], set[str]]:
    """(names with samples, names declared by HELP/TYPE) of a live /metrics."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: set[str] = set()
    declared: set[str] = set()
    for family in text_string_to_metric_families(text):
        samples |= {s.name for s in family.samples}
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        declared |= {family.name + s for s in suffixes.get(family.type, [""])}
    return samples, declared | samples


def run_crewjob_as_chart_sa(cluster: Cluster, operator: Operator, namespace: str) -> dict[str, Any]:
    cluster.apply(crew_manifest("charted", namespace))
    cluster.apply(crewjob_manifest("charted-run", namespace, crew="charted", topic="helm charts"))
    job = wait_crewjob_finished(cluster, "charted-run", namespace)
    assert job["status"]["phase"] == "Succeeded", (job["status"], operator.logs()[-4000:])
    assert job["status"]["uncertainOutcome"] is False
    return job


def argo_health(script: str, obj: dict[str, Any]) -> str:
    """The chart's Argo CD health check, run by real Lua 5.1 (as gopher-lua) on a live object."""
    import lupa.lua51 as lupa

    lua = lupa.LuaRuntime()
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute((CHART / "files" / "argocd" / script).read_text())
    return str(hs["status"])


def test_chart_rbac_runs_a_crewjob(
    cluster: Cluster,
    install: Callable[..., Release],
    operator_factory: Callable[..., Operator],
    namespace: str,
) -> None:
    release = install(
        {
            "webhook.failurePolicy": "Ignore",
            "networkPolicy.namespaces": [namespace],
            "sidecar.journal.maxRetainedRuns": 1234,
            "sidecar.journal.maxStateBytes": 64 * 1024 * 1024,
        }
    )
    sa_ns, _, sa_name = release.service_account.partition(":")
    assert cluster.get_json("serviceaccount", sa_name, "-n", sa_ns) is not None
    # The chart's RBAC is what the ServiceAccount gets; the admin can ask the API server.
    wait_for_rbac(cluster, release.service_account)
    can = cluster.kubectl(
        "auth", "can-i", "create", "pods", "-n", namespace, as_sa=release.service_account
    )
    assert can.stdout.strip() == "yes"
    cannot = cluster.kubectl(
        "auth", "can-i", "list", "secrets", "-n", namespace, as_sa=release.service_account
    )
    assert cannot.stdout.strip() == "no"

    # The journal defaults reach the operator as the chart's Deployment passes them.
    deployment = cluster.get_json(
        "deployment", f"{release.name}-crewfence-operator", "-n", release.namespace
    )
    chart_env = {
        e["name"]: e["value"]
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"].startswith("CREWFENCE_OPERATOR_SIDECAR_MAX_")
    }
    assert len(chart_env) == 5
    operator = operator_factory(
        service_account=release.service_account, webhook_mode="off", extra_env=chart_env
    )
    job = run_crewjob_as_chart_sa(cluster, operator, namespace)
    sidecar = cluster.get_json("pod", "charted-0", "-n", namespace)["spec"]["containers"][0]
    sidecar_env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert sidecar_env["CREWFENCE_MAX_RETAINED_RUNS"] == "1234"
    assert sidecar_env["CREWFENCE_MAX_STATE_BYTES"] == str(64 * 1024 * 1024)
    assert job["status"]["assignment"]["pod"] == "charted-0"
    # The Argo CD health checks agree with the status the operator really writes.
    assert argo_health("crewjob-health.lua", job) == "Healthy"
    crew = cluster.get_json("crew", "charted", "-n", namespace)
    assert argo_health("crew-health.lua", crew) == "Healthy", crew.get("status")
    denied = forbidden_lines(operator.logs(), namespace)
    assert not denied, denied[:5]

    # The live operator's endpoint carries every operator metric the dashboard queries.
    samples, declared = scrape(operator.metrics_url)
    wanted = dashboard_operator_metrics()
    assert wanted and wanted <= declared, sorted(wanted - declared)
    assert "crewfence_operator_crewjobs" in samples
    assert "crewfence_operator_admission_seconds_count" in samples

    policy = cluster.get_json(
        "networkpolicy", f"{release.name}-crewfence-sidecars", "-n", namespace
    )
    assert policy is not None
    # It selects the sidecar pod the operator really created, and only on the sidecar's port.
    pod = cluster.get_json("pod", "charted-0", "-n", namespace)
    labels = pod["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]
    assert selector["matchLabels"].items() <= labels.items()
    assert all(e["key"] in labels for e in selector["matchExpressions"])
    sidecar_ports = {
        p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])
    }
    assert {p["port"] for p in policy["spec"]["ingress"][0]["ports"]} <= sidecar_ports
    delete_crew_and_job(cluster, "charted", "charted-run", namespace)


def test_namespaced_chart_rbac_runs_a_crewjob(
    cluster: Cluster,
    install: Callable[..., Release],
    operator_factory: Callable[..., Operator],
    namespace: str,
) -> None:
    release = install(
        {
            "webhook.failurePolicy": "Ignore",
            "rbac.namespaced": True,
            "operator.watchNamespaces": [namespace],
        }
    )
    wait_for_rbac(cluster, release.service_account, namespace)
    other = cluster.kubectl(
        "auth", "can-i", "create", "pods", "-n", "default", as_sa=release.service_account
    )
    assert other.stdout.strip() == "no"
    operator = operator_factory(
        service_account=release.service_account, webhook_mode="off", namespaces=(namespace,)
    )
    run_crewjob_as_chart_sa(cluster, operator, namespace)
    denied = forbidden_lines(operator.logs(), namespace)
    assert not denied, denied[:5]
    delete_crew_and_job(cluster, "charted", "charted-run", namespace)


def test_helm_upgrade_keeps_the_caBundle_the_operator_injected(
    cluster: Cluster, install: Callable[..., Release]
) -> None:
    """The chart renders no caBundle; the one the operator injects survives `helm upgrade`
    (3-way merge leaves fields the chart never set), and the chart ships no certificate."""
    release = install({})
    name = f"{release.name}-crewfence"
    assert cluster.get_json(
        "secret", f"{name}-webhook-tls", "-n", release.namespace) is None
    injected = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nfake\n").decode()
    patch = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": injected}
             for i in range(2)]
    cluster.kubectl("patch", "validatingwebhookconfiguration", name, "--type=json",
                    "-p", json.dumps(patch), check=True)
    helm(cluster, "upgrade", release.name, str(CHART), "-n", release.namespace,
         "--reuse-values", "--wait=false")
    vwc = cluster.get_json("validatingwebhookconfiguration", name)
    assert [w["clientConfig"].get("caBundle") for w in vwc["webhooks"]] == [injected] * 2
