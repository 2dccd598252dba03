"""CrewJob objects as Argo CD and Flux see them, shared by the health-check tests."""

from __future__ import annotations

from typing import Any


def crewjob(
    status: dict[str, Any] | None, generation: int = 1, cancel: bool = False
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "crewfence.dev/v1alpha1",
        "kind": "CrewJob",
        "metadata": {"name": "j", "namespace": "team-a", "generation": generation},
        "spec": {"crewRef": {"name": "research"}, "operation": "run", "cancel": cancel},
    }
    if status is not None:
        obj["status"] = status
    return obj
