"""CrewCronJob health for Argo CD (the chart's Lua, run by real Lua 5.1 and 5.4) and Flux (the
CEL expressions in docs/gitops-flux.md, run by a real CEL runtime), over the same statuses."""

from __future__ import annotations

from typing import Any

import pytest
from test_flux_health_exprs import flux_status

LUA = "crewcronjob-health.lua"


def ccj(status: dict[str, Any] | None, generation: int = 1,
        suspend: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewCronJob",
        "metadata": {"name": "report", "namespace": "team-a", "generation": generation},
        "spec": {"interval": "60s", "suspend": suspend,
                 "jobTemplate": {"spec": {"crewRef": {"name": "research"},
                                          "operation": "run"}}},
    }
    if status is not None:
        obj["status"] = status
    return obj


def conds(**types: str) -> list[dict[str, str]]:
    return [{"type": t, "status": s, "reason": f"{t}Reason", "message": f"{t} message"}
            for t, s in types.items()]


def observed(**types: str) -> dict[str, Any]:
    return {"observedGeneration": 1, "nextScheduleTime": "2026-12-01T20:11:00Z",
            "missedTicks": 0, "conditions": conds(**types)}


SCHEDULING = dict(Ready="True", Stalled="False", Suspended="False", Paused="False")
CASES = [
    pytest.param(ccj(None), "Progressing", "InProgress", id="not-observed"),
    pytest.param(ccj(observed(**SCHEDULING)), "Healthy", "Current", id="scheduling"),
    pytest.param(ccj(observed(**SCHEDULING), generation=2), "Progressing", "InProgress",
                 id="stale"),
    pytest.param(ccj(observed(Ready="False", Stalled="True")), "Degraded", "Failed",
                 id="invalid-schedule"),
    pytest.param(ccj(observed(**{**SCHEDULING, "Paused": "True"})), "Degraded", "Failed",
                 id="paused-by-uncertain-outcome"),
    pytest.param(ccj(observed(**{**SCHEDULING, "Suspended": "True"}), suspend=True),
                 "Suspended", "Current", id="suspended"),
]


@pytest.mark.parametrize(("obj", "argo", "flux"), CASES)
def test_health(run_health, obj: dict[str, Any], argo: str, flux: str) -> None:
    assert run_health(LUA, obj).status == argo
    assert flux_status("CrewCronJob", obj) == flux


def test_messages_name_the_cause(run_health) -> None:
    paused = run_health(LUA, ccj(observed(**{**SCHEDULING, "Paused": "True"})))
    assert "Paused message" in paused.message
    invalid = run_health(LUA, ccj(observed(Ready="False", Stalled="True")))
    assert "StalledReason" in invalid.message
    status = {**observed(**SCHEDULING), "missedTicks": 4}
    healthy = run_health(LUA, ccj(status))
    assert healthy.status == "Healthy" and "4 tick(s) missed" in healthy.message
    assert "2026-12-01T20:11:00Z" in healthy.message
