"""`helm lint`, and the CRDs shipped by the chart being exactly the repository's crds/."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import CHART, CRDS, Helm, find, set_args

LINT_VALUES: list[dict[str, Any]] = [
    {},
    {"replicaCount": 3},
    {"rbac.namespaced": True, "operator.watchNamespaces": ["team-a", "team-b"]},
    {
        "webhook.certManager.enabled": True,
        "metrics.serviceMonitor.enabled": True,
        "metrics.podMonitor.enabled": True,
        "argocd.installHealthChecks": True,
    },
    {"webhook.enabled": False, "networkPolicy.enabled": False, "grafana.dashboards.enabled": False},
]


@pytest.mark.parametrize("values", LINT_VALUES, ids=lambda v: ",".join(v) or "defaults")
def test_helm_lint_strict(helm: Helm, values: dict[str, Any]) -> None:
    result = helm.run(
        "lint",
        "--strict",
        str(CHART),
        "--kube-version",
        helm.kube_version,
        *set_args(values),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def crd_files() -> list[Path]:
    files = sorted(p for p in CRDS.iterdir() if p.suffix in {".yaml", ".yml", ".json"})
    assert files, "crds/ holds the CRDs"
    return files


def test_chart_crds_are_the_repository_crds() -> None:
    # One source: the chart's crds/ is a symlink to the top-level crds/, not a copy.
    link = CHART / "crds"
    assert link.is_symlink()
    assert os.readlink(link) == "../../crds"
    assert link.resolve() == CRDS.resolve()


def test_rendered_crds_equal_the_files(helm: Helm) -> None:
    rendered = find(helm.render(include_crds=True), "CustomResourceDefinition")
    expected = [d for p in crd_files() for d in yaml.safe_load_all(p.read_text()) if d]
    by_name = {d["metadata"]["name"]: d for d in rendered}
    assert sorted(by_name) == sorted(d["metadata"]["name"] for d in expected)
    for crd in expected:
        assert by_name[crd["metadata"]["name"]] == crd


def test_packaged_chart_carries_byte_identical_crds(helm: Helm, tmp_path: Path) -> None:
    # What a chart repository or `helm install ./crewfence-x.tgz` gets: Helm follows the symlink.
    helm.run("package", str(CHART), "--destination", str(tmp_path))
    [archive] = list(tmp_path.glob("crewfence-*.tgz"))
    with tarfile.open(archive) as tar:
        packaged = {
            Path(m.name).name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile() and "/crds/" in m.name
        }
    assert packaged == {p.name: p.read_bytes() for p in crd_files()}
