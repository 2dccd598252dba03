"""Fixtures for the chart tests: the helm binary the control plane harness builds.

helm comes from `python tests/e2e/cluster.py bin` (built from the Go module proxy and cached);
without it these tests skip locally and fail in CI, like the e2e tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chart_helpers import REPO, Helm, control_plane_kube_version


@pytest.fixture(scope="session")
def kube_bin() -> Path:
    override = os.environ.get("CREWFENCE_KUBE_BIN")  # a folder holding helm (and kubectl)
    if override:
        return Path(override)
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "e2e" / "cluster.py"), "bin"],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    found = re.search(r"^KUBE_BIN=(.+)$", result.stdout, re.MULTILINE)
    if result.returncode != 0 or not found or not (Path(found.group(1)) / "helm").is_file():
        reason = f"helm is not available: cluster.py bin said {result.stderr.strip()[-500:]!r}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return Path(found.group(1))


@pytest.fixture(scope="session")
def helm(kube_bin: Path) -> Helm:
    return Helm(binary=kube_bin / "helm", kube_version=control_plane_kube_version())
