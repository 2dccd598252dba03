"""The harness builds helm the way helm's release build does (its Makefile's ldflags), so the
harness's helm behaves like the one users have: with no cluster to ask, it assumes the Kubernetes
version of the client-go it was built with, not v1.20, and accepts the chart's kubeVersion."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from harness import build, versions

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "crewfence"


@pytest.fixture(scope="module")
def helm_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cached = build.cached_bin_dir()
    if cached is None:
        reason = "control-plane binaries are not built (python tests/e2e/cluster.py bin)"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return cached / "helm"


def _helm(helm_bin: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HELM_CACHE_HOME=str(tmp / "cache"),
               HELM_CONFIG_HOME=str(tmp / "config"), HELM_DATA_HOME=str(tmp / "data"),
               KUBECONFIG=str(tmp / "no-cluster"))
    return subprocess.run([str(helm_bin), *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_pinned_kube_minor_is_the_client_go_minor_in_helms_go_mod() -> None:
    found = subprocess.run(
        ["go", "mod", "download", "-json", f"helm.sh/helm/v3@{versions.HELM_VERSION}"],
        capture_output=True, text=True, timeout=600, check=False)
    assert found.returncode == 0, found.stderr
    gomod = Path(json.loads(found.stdout)["GoMod"]).read_text()
    match = re.search(r"^\s*k8s\.io/client-go\s+v0\.(\d+)\.\d+", gomod, re.MULTILINE)
    assert match, "helm's go.mod requires no k8s.io/client-go"
    assert (versions.HELM_KUBE_MAJOR, versions.HELM_KUBE_MINOR) == ("1", match.group(1))


def test_helm_assumes_its_client_go_kubernetes_version(helm_bin: Path, tmp_path: Path) -> None:
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n"
        "data: {kube: {{ .Capabilities.KubeVersion.Version | quote }}}\n")
    result = _helm(helm_bin, tmp_path, "template", "probe", str(chart))
    assert result.returncode == 0, result.stderr
    wanted = f"v{versions.HELM_KUBE_MAJOR}.{versions.HELM_KUBE_MINOR}.0"
    assert f'kube: "{wanted}"' in result.stdout


def test_chart_renders_without_kube_version(helm_bin: Path, tmp_path: Path) -> None:
    result = _helm(helm_bin, tmp_path, "template", "cf", str(CHART), "-n", "crewfence-system")
    assert result.returncode == 0, result.stderr
    assert "kind: ValidatingAdmissionPolicy\n" in result.stdout
    lint = _helm(helm_bin, tmp_path, "lint", str(CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr
