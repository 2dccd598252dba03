"""Helpers shared by the chart tests (the conftest puts this folder on sys.path)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "crewfence"
CRDS = REPO / "crds"
RELEASE = "cf"
NAMESPACE = "crewfence-system"


def control_plane_kube_version() -> str:
    """The Kubernetes release the e2e control plane is built from (its build module pins it)."""
    gomod = (REPO / "tests" / "e2e" / "kubebuild" / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/kubernetes\s+(v\d+\.\d+\.\d+)\s*$", gomod, re.MULTILINE)
    assert match, "tests/e2e/kubebuild/go.mod must pin k8s.io/kubernetes"
    return match.group(1)


@dataclass(frozen=True)
class Helm:
    binary: Path
    kube_version: str

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        scratch = "/tmp/crewfence-helm"
        env = {
            **os.environ,
            "HELM_CACHE_HOME": f"{scratch}/cache",
            "HELM_CONFIG_HOME": f"{scratch}/config",
            "HELM_DATA_HOME": f"{scratch}/data",
        }
        result = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
        return result

    def template_text(
        self,
        values: dict[str, Any] | None = None,
        *,
        include_crds: bool = False,
        release: str = RELEASE,
        namespace: str = NAMESPACE,
    ) -> str:
        args = [
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            self.kube_version,
            *set_args(values),
        ]
        if include_crds:
            args.append("--include-crds")
        return self.run(*args).stdout

    def render(self, values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        return documents(self.template_text(values, **kwargs))


def set_args(values: dict[str, Any] | None) -> list[str]:
    """`--set-json path=value` for each dotted path (keeps booleans and numbers exact)."""
    out: list[str] = []
    for key, value in (values or {}).items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def find(
    docs: Iterable[dict[str, Any]], kind: str, name: str | None = None
) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]
