"""The Flux `healthCheckExprs` printed in docs/gitops-flux.md, evaluated by a real CEL runtime
(cel-expr-python, with the optional-types extension Flux's expressions rely on) the way Flux's
kustomize-controller does: a stale `status.observedGeneration` is InProgress without evaluating
anything; otherwise inProgress, failed, current are tried in that order and the first true wins;
none true is InProgress."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cel_expr_python import cel
from cel_expr_python.ext.ext_optional import ExtOptional
from status_objects import crewjob

DOC = Path(__file__).resolve().parents[2] / "docs" / "gitops-flux.md"


def documented_exprs() -> dict[str, dict[str, str]]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    [kustomization] = [yaml.safe_load(b) for b in blocks if "healthCheckExprs" in b]
    return {e["kind"]: e for e in kustomization["spec"]["healthCheckExprs"]}


def flux_status(kind: str, obj: dict[str, Any]) -> str:
    exprs = documented_exprs()[kind]
    status = obj.get("status") or {}
    generation = obj["metadata"].get("generation")
    if "observedGeneration" in status and status["observedGeneration"] != generation:
        return "InProgress"
    env = cel.NewEnv(
        variables={
            name: cel.Type.DYN for name in ("apiVersion", "kind", "metadata", "spec", "status")
        },
        extensions=[ExtOptional()],
    )
    data = {"status": {}, **obj}
    for key, result in (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current")):
        if key in exprs and env.compile(exprs[key]).eval(data=data).plain_value() is True:
            return result
    return "InProgress"


def observed(phase: str | None, **extra: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"observedGeneration": 1, **extra}
    if phase is not None:
        status["phase"] = phase
    return status


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(crewjob(None), "InProgress", id="not-observed"),
        pytest.param(crewjob(observed("Pending")), "InProgress", id="pending"),
        pytest.param(crewjob(observed("Running")), "InProgress", id="running"),
        pytest.param(
            crewjob(observed("Succeeded", uncertainOutcome=False)), "Current", id="succeeded"
        ),
        pytest.param(crewjob(observed("Failed")), "Failed", id="failed"),
        pytest.param(
            crewjob(observed("Failed", uncertainOutcome=True)), "Failed", id="uncertain-failed"
        ),
        pytest.param(
            crewjob(observed("Cancelled", uncertainOutcome=True), cancel=True),
            "Failed",
            id="uncertain-cancelled",
        ),
        pytest.param(crewjob(observed("Cancelled"), cancel=True), "Current", id="cancel-requested"),
        pytest.param(crewjob(observed("Cancelled")), "Failed", id="cancelled-unrequested"),
        pytest.param(crewjob(observed("Succeeded"), generation=2), "InProgress", id="stale"),
        pytest.param(
            crewjob(observed("Failed", uncertainOutcome=True, resolution={"outcome": "Happened"})),
            "Current",
            id="resolved-happened",
        ),
        pytest.param(
            crewjob(
                observed("Failed", uncertainOutcome=True, resolution={"outcome": "NotHappened"})
            ),
            "Current",
            id="resolved-not-happened",
        ),
        pytest.param(
            crewjob(
                observed("Cancelled", uncertainOutcome=True, resolution={"outcome": "Compensated"})
            ),
            "Current",
            id="resolved-compensated",
        ),
        pytest.param(
            crewjob(observed("Failed", uncertainOutcome=True), generation=2),
            "InProgress",
            id="resolution-not-yet-accepted",
        ),
    ],
)
def test_crewjob_exprs(obj: dict[str, Any], expected: str) -> None:
    assert flux_status("CrewJob", obj) == expected


def crew(status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "crewfence.dev/v1alpha1",
        "kind": "Crew",
        "metadata": {"name": "research", "generation": 1},
        "spec": {},
    }
    if status is not None:
        obj["status"] = status
    return obj


def conditions(**types: str) -> list[dict[str, str]]:
    return [{"type": t, "status": s} for t, s in types.items()]


def observed_crew(**types: str) -> dict[str, Any]:
    return crew({"observedGeneration": 1, "conditions": conditions(**types)})


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(crew(None), "InProgress", id="not-observed"),
        pytest.param(
            observed_crew(Ready="False"),
            "InProgress",
            id="not-ready",
        ),
        pytest.param(
            observed_crew(Ready="True"),
            "Current",
            id="ready",
        ),
        pytest.param(
            observed_crew(Ready="True", StateVolumeShared="True"),
            "Failed",
            id="shared-state",
        ),
        pytest.param(
            crew(
                {
                    "observedGeneration": 1,
                    "conditions": conditions(Ready="True"),
                    "replicas": [{"ordinal": 0, "pod": "r-0", "claim": "c", "fenced": True}],
                }
            ),
            "Failed",
            id="fenced",
        ),
        pytest.param(
            crew(
                {
                    "observedGeneration": 1,
                    "conditions": conditions(Ready="False"),
                    "replicas": [{"ordinal": 0, "pod": "r-0", "claim": "c", "fenced": True}],
                }
            ),
            "Failed",
            id="fenced-not-ready",
        ),
        pytest.param(
            crew({"observedGeneration": 0, "conditions": conditions(Ready="True")}),
            "InProgress",
            id="stale",
        ),
        pytest.param(
            observed_crew(Ready="True", ModelCredentials="False"),
            "Failed",
            id="model-credentials-missing",
        ),
        pytest.param(
            observed_crew(Ready="False", ModelCredentials="False"),
            "Failed",
            id="model-credentials-missing-not-ready",
        ),
        pytest.param(
            observed_crew(Ready="True", ModelCredentials="True"),
            "Current",
            id="model-credentials-present",
        ),
    ],
)
def test_crew_exprs(obj: dict[str, Any], expected: str) -> None:
    assert flux_status("Crew", obj) == expected
