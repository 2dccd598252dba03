"""Shared fixtures for the Crew half of the operator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from crewfence_operator import kube
from crewfence_operator.crew.identity import CrewRef

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def crew_ref() -> CrewRef:
    return CrewRef(name="research", namespace="team-a", uid="1111-2222")


@pytest.fixture
def example_crew() -> dict[str, Any]:
    return yaml.safe_load((REPO / "examples" / "crew-research.yaml").read_text())


@pytest.fixture
def crew_crd() -> dict[str, Any]:
    return yaml.safe_load((REPO / "crds" / "crew.yaml").read_text())


@pytest.fixture
def api(kmock: kmock.KubernetesEmulator) -> Iterator[kmock.KubernetesEmulator]:
    for plural in ("pods", "persistentvolumeclaims", "services", "secrets", "configmaps"):
        kmock.resources[f"v1/{plural}"].namespaced = True
    kube.use_api_server(str(kmock.url).rstrip("/"))
    yield kmock
    kube.reset()
