"""The rendered chart validated by the real kube-apiserver: a server-side dry run applies every
object through defaulting, OpenAPI schema validation and admission of the control plane's own
release, without persisting anything.

Objects of kinds whose CRDs a real cluster gets from other projects (cert-manager's Certificate
and Issuer, prometheus-operator's ServiceMonitor, PodMonitor and PrometheusRule) cannot be
validated here and are only checked structurally in tests/chart/test_render.py (the rule also
by promtool in tests/chart/test_prometheus_rule.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml
from chart_support import render_chart
from harness.handles import Cluster

EXTERNAL_KINDS = {"Certificate", "Issuer", "ServiceMonitor", "PodMonitor", "PrometheusRule"}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "peering": {"replicaCount": 3},
    "namespaced": {
        "rbac.namespaced": True,
        "operator.watchNamespaces": ["@a", "@b"],
        "replicaCount": 2,
    },
    "everything": {
        "webhook.certManager.enabled": True,
        "metrics.serviceMonitor.enabled": True,
        "metrics.podMonitor.enabled": True,
        "metrics.prometheusRule.enabled": True,
        "argocd.installHealthChecks": True,
        "argocd.namespace": "@argocd",
    },
    "minimal": {
        "webhook.enabled": False,
        "networkPolicy.enabled": False,
        "grafana.dashboards.enabled": False,
        "rbac.create": False,
        "serviceAccount.create": False,
    },
}


def helm_template(cluster: Cluster, release: str, namespace: str, values: dict[str, Any]) -> str:
    sets = [a for k, v in values.items() for a in ("--set-json", f"{k}={json.dumps(v)}")]
    return render_chart(cluster, release, namespace, "--include-crds", *sets, timeout=120)


def suffixed(values: dict[str, Any], suffix: str) -> dict[str, Any]:
    """Namespace names written "@x" become unique per test run."""

    def fix(v: Any) -> Any:
        if isinstance(v, str) and v.startswith("@"):
            return f"{v[1:]}-{suffix}"
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return {k: fix(v) for k, v in values.items()}


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_rendered_chart_passes_server_side_dry_run(cluster: Cluster, case: str) -> None:
    suffix = uuid.uuid4().hex[:6]
    release, namespace = f"v{suffix}", f"chart-{case}-{suffix}"
    values = suffixed(VALUE_SETS[case], suffix)
    docs = [d for d in yaml.safe_load_all(helm_template(cluster, release, namespace, values)) if d]
    assert docs
    namespaces = {namespace} | {
        d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")
    }
    peering_crds = [
        d
        for d in docs
        if d["kind"] == "CustomResourceDefinition" and d["spec"]["group"] == "kopf.dev"
    ]
    created: list[tuple[str, ...]] = [("namespace", n) for n in sorted(namespaces)]
    try:
        for ns in sorted(namespaces):
            cluster.kubectl("create", "namespace", ns, check=True)
        # kopf's peering CRDs must exist for their objects to be validated: create them for real.
        for crd in peering_crds:
            if cluster.get_json("crd", crd["metadata"]["name"]) is None:
                cluster.apply(crd)
                created.append(("crd", crd["metadata"]["name"]))
            cluster.kubectl(
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                f"crd/{crd['metadata']['name']}",
                check=True,
            )
        checked = [d for d in docs if d["kind"] not in EXTERNAL_KINDS]
        result = cluster.kubectl(
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "-",
            input="\n---\n".join(yaml.safe_dump(d) for d in checked),
        )
        assert result.returncode == 0, result.stderr
        lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
        assert len(lines) == len(checked), result.stdout
        assert all("(server dry run)" in ln for ln in lines), result.stdout
    finally:
        for kind, name in reversed(created):
            if kind == "crd":
                cluster.kubectl("delete", "crd", name, "--wait=false")
            else:
                cluster.kubectl("delete", "namespace", name, "--wait=false")


def test_dry_run_rejects_what_the_schema_forbids(cluster: Cluster) -> None:
    # The dry run is a real check: a Deployment with an invalid field is refused.
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "broken", "namespace": "default"},
        "spec": {
            "replicas": "one",
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }
    result = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=json.dumps(manifest)
    )
    assert result.returncode != 0
    assert "replicas" in result.stderr


def test_operator_pod_meets_the_restricted_pod_security_standard(cluster: Cluster) -> None:
    # PodSecurity admission enforces on Pods (a Deployment only warns), so dry-run a Pod made
    # from the rendered pod template in a namespace that enforces "restricted".
    suffix = uuid.uuid4().hex[:6]
    namespace = f"chart-pss-{suffix}"
    docs = [d for d in yaml.safe_load_all(helm_template(cluster, f"p{suffix}", namespace, {})) if d]
    template = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "operator-pss",
            "namespace": namespace,
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    }
    cluster.kubectl("create", "namespace", namespace, check=True)
    try:
        cluster.kubectl(
            "label",
            "namespace",
            namespace,
            "pod-security.kubernetes.io/enforce=restricted",
            check=True,
        )
        # The ServiceAccount admission plugin needs the pod's ServiceAccount to exist.
        cluster.apply(next(d for d in docs if d["kind"] == "ServiceAccount"))
        ok = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod))
        assert ok.returncode == 0, ok.stderr
        # The same check refuses a pod that drops the chart's settings.
        weakened = json.loads(json.dumps(pod))
        del weakened["spec"]["containers"][0]["securityContext"]["capabilities"]
        bad = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(weakened))
        assert bad.returncode != 0
        assert "restricted" in bad.stderr
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
