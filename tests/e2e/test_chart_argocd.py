"""`argocd.installHealthChecks`: the chart's hook merges the Lua health checks into argocd-cm.

No Job controller runs here, so the chart is installed with `--no-hooks` and the hook Job's own
script (taken from the rendered Job) runs as a local process with a real token of the hook's
ServiceAccount: the Role the chart grants must be enough, and the merge must keep every other
key of argocd-cm.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml
from chart_support import CHART, helm, install_chart, render_chart
from harness.handles import Cluster

ARGO_FILES = CHART / "files" / "argocd"
KEYS = {
    "resource.customizations.health.crewfence.dev_CrewJob": "crewjob-health.lua",
    "resource.customizations.health.crewfence.dev_Crew": "crew-health.lua",
    "resource.customizations.health.crewfence.dev_CrewCronJob": "crewcronjob-health.lua",
}


def test_hook_merges_health_checks_into_argocd_cm(cluster: Cluster, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:6]
    release, namespace, argo_ns = f"argo{suffix}", f"crewfence-{suffix}", f"argocd-{suffix}"
    values = ["--set", "argocd.installHealthChecks=true", "--set", f"argocd.namespace={argo_ns}"]
    cluster.kubectl("create", "namespace", argo_ns, check=True)
    existing = {
        "url": "https://argocd.example",
        "resource.customizations.health.example.com_Thing": "hs = {status = 'Healthy'}\nreturn hs",
    }
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "argocd-cm", "namespace": argo_ns},
            "data": existing,
        }
    )
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "other", "namespace": argo_ns},
            "data": {},
        }
    )
    try:
        install_chart(
            cluster,
            release,
            namespace,
            "--no-hooks",
            "--set",
            "webhook.failurePolicy=Ignore",
            *values,
        )
        template = render_chart(cluster, release, namespace, *values)
        rendered = [d for d in yaml.safe_load_all(template) if d]
        job = next(d for d in rendered if d["kind"] == "Job")
        source = next(
            d
            for d in rendered
            if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-argocd-health")
        )
        # The hook's volume is that ConfigMap: lay its keys out as the kubelet would.
        folder = tmp_path / "health"
        folder.mkdir()
        for key, value in source["data"].items():
            (folder / key).write_text(value)

        pod = job["spec"]["template"]["spec"]
        sa = pod["serviceAccountName"]
        container = pod["containers"][0]
        assert container["command"][:2] == ["python", "-c"]
        kubeconfig = cluster.service_account_kubeconfig(namespace, sa, tmp_path / "hook.kubeconfig")
        assert (
            cluster.kubectl(
                "auth",
                "can-i",
                "patch",
                "configmap/other",
                "-n",
                argo_ns,
                as_sa=f"{namespace}:{sa}",
            ).stdout.strip()
            == "no"
        )
        env = {
            **cluster.env(),
            "KUBECONFIG": str(kubeconfig),
            "HEALTH_DIR": str(folder),
            **{e["name"]: e["value"] for e in container["env"]},
        }
        result = subprocess.run(
            [sys.executable, "-c", container["command"][2]],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr

        merged: dict[str, Any] = cluster.get_json("configmap", "argocd-cm", "-n", argo_ns)["data"]
        for key, filename in KEYS.items():
            assert merged[key].rstrip("\n") == (ARGO_FILES / filename).read_text().rstrip("\n")
        for key, value in existing.items():
            assert merged[key] == value, f"the merge changed {key}"
        assert set(merged) == set(existing) | set(KEYS), json.dumps(sorted(merged))
    finally:
        helm(
            cluster,
            "uninstall",
            release,
            "-n",
            namespace,
            "--no-hooks",
            "--wait=false",
            check=False,
            timeout=120,
        )
        cluster.kubectl("delete", "namespace", namespace, argo_ns, "--wait=false")
