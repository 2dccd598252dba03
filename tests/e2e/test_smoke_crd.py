"""CRDs from crds/ install into the real API server and document themselves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import controlplane
from harness.handles import Cluster, wait_until

CRD_FILES = sorted((controlplane.REPO / "crds").glob("*.yaml"))


def _served_schema(crd: dict[str, Any]) -> dict[str, Any]:
    version = next(v for v in crd["spec"]["versions"] if v.get("served") and v.get("storage"))
    return version["schema"]["openAPIV3Schema"]


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize("crd_file", CRD_FILES, ids=[p.name for p in CRD_FILES])
def test_crd_installs_and_explain_shows_descriptions(cluster: Cluster, crd_file: Path) -> None:
    installed = controlplane.install_crds(cluster.info, [crd_file])
    crd = yaml.safe_load(crd_file.read_text())
    assert f"customresourcedefinition.apiextensions.k8s.io/{crd['metadata']['name']}" in installed
    plural, group = crd["spec"]["names"]["plural"], crd["spec"]["group"]
    schema = _served_schema(crd)
    spec_props = schema["properties"]["spec"]["properties"]
    described = {k: v["description"] for k, v in spec_props.items() if v.get("description")}
    assert described, f"{crd_file.name}: no spec field carries a description"

    version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))

    def explained() -> str | None:
        # The API server publishes a new CRD's OpenAPI shortly after it is Established.
        result = cluster.kubectl("explain", f"{plural}.spec", f"--api-version={group}/{version}")
        return _words(result.stdout) if result.returncode == 0 else None

    output: str = wait_until(explained, timeout=60, what=f"kubectl explain {plural}.spec")
    for field, description in described.items():
        assert field in output
        # explain re-wraps text; compare the first words of each description.
        assert _words(description)[:60] in output, f"description of spec.{field} missing"
