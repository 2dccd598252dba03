"""The Dockerfile (not built here: no container runtime) agrees with the chart and the operator."""

from __future__ import annotations

import re

import yaml
from chart_helpers import CHART, REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()


def final_stage() -> str:
    return re.split(r"^FROM\s", DOCKERFILE, flags=re.MULTILINE)[-1]


def test_runs_as_the_non_root_user_the_chart_and_operator_expect() -> None:
    from crewfence_operator import constants

    users = re.findall(r"^USER\s+(\S+)", final_stage(), flags=re.MULTILINE)
    assert users, "the final stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert int(uid) == values["podSecurityContext"]["runAsUser"] == constants.RUN_AS_USER


def test_installs_this_repository_with_the_sidecar_extra() -> None:
    installs = re.findall(r"pip install\s+'?\.\[([a-z,]+)\]'?", DOCKERFILE)
    assert installs and "sidecar" in installs[0].split(",")
    assert re.search(r"^COPY\s+sidecar/", DOCKERFILE, flags=re.MULTILINE)


def test_crewai_telemetry_is_off() -> None:
    stage = final_stage()
    for setting in ("CREWAI_DISABLE_TELEMETRY=true", "CREWAI_TRACING_ENABLED=false",
                    "OTEL_SDK_DISABLED=true"):
        assert setting in stage, setting


def test_default_command_is_the_sidecar_and_the_chart_runs_the_operator() -> None:
    assert re.search(r'^CMD \["crewfence-sidecar"\]', final_stage(), flags=re.MULTILINE)
    operator = (CHART / "templates" / "_operator_pod.tpl").read_text()
    assert 'command: ["crewfence-operator"]' in operator
