"""The CrewCronJob CRD: structural, documented, declares every status field the operator
writes (undeclared fields are pruned), and its CEL rules refuse bad input (evaluated with a
real CEL runtime here; the e2e test checks the API server's answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from cel_expr_python import cel
from crewfence_operator.cronjob import children as ch
from crewfence_operator.cronjob import status as st
from crewfence_operator.cronjob.schedule import IntervalSchedule
from crewfence_operator.cronjob.spec import CronSpec
from crewfence_operator.cronjob.ticks import Facts, decide

CRD = yaml.safe_load((Path(__file__).resolve().parents[3] / "crds" / "crewcronjob.yaml")
                     .read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
SPEC = SCHEMA["properties"]["spec"]


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, sub in (node.get("properties") or {}).items():
        found += walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += walk(node["items"], f"{path}[]")
    return found


def test_identity_and_columns() -> None:
    assert CRD["metadata"]["name"] == f"{ch.PLURAL}.crewfence.dev"
    assert CRD["spec"]["names"]["kind"] == ch.KIND
    columns = {c["name"] for c in CRD["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Schedule", "Suspend", "Active", "Last", "Next"} <= columns


def test_every_field_typed_and_described() -> None:
    nodes = [(p, n) for p, n in walk(SCHEMA) if p not in ("", ".metadata")]
    assert [p for p, n in nodes if "type" not in n] == []
    assert [p for p, n in nodes if not n.get("description")] == []


def test_every_status_field_written_is_declared() -> None:
    spec = CronSpec(schedule=IntervalSchedule(60))
    plan = decide(spec, Facts(created=0), [], 600)
    written = st.final_patch(namespace="n", cronjob="r", plan=plan, observed=[], previous={},
                             generation=1, now="2026-01-01T00:00:00Z", suspended=False)
    written |= st.invalid_patch("InvalidSchedule", "m", {}, 1, "2026-01-01T00:00:00Z")
    declared = SCHEMA["properties"]["status"]["properties"]
    assert set(written) <= set(declared)
    ref_fields = set(declared["active"]["items"]["properties"])
    assert all(set(ref) <= ref_fields for ref in written["active"])
    cond_fields = set(declared["conditions"]["items"]["properties"])
    assert all(set(cond) <= cond_fields for cond in written["conditions"])


ENV = cel.NewEnv(variables={"self": cel.Type.DYN})


def rules_at(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node.get("x-kubernetes-validations") or [])


def admitted(node: dict[str, Any], value: Any) -> list[str]:
    """Messages of the rules at ``node`` that refuse ``value`` (an error refuses too)."""
    refused = []
    for rule in rules_at(node):
        try:
            ok = ENV.compile(rule["rule"]).eval(data={"self": value}).plain_value()
        except Exception:
            ok = False
        if ok is not True:
            refused.append(" ".join(rule["message"].split()))
    return refused


@pytest.mark.parametrize(("value", "ok"), [
    ("*/5 * * * *", True), ("0 9 * * MON-FRI", True), ("@hourly", True), ("0 0 L * *", True),
    ("* * * *", False), ("0 * * * * *", False), ("TZ=UTC 0 * * * *", False), ("hourly", False),
])
def test_schedule_shape(value: str, ok: bool) -> None:
    refused = admitted(SPEC["properties"]["schedule"], value)
    assert (refused == []) == ok, refused
    if not ok:
        assert "5-field cron expression" in refused[0]


@pytest.mark.parametrize(("value", "ok"), [
    ("10s", True), ("90s", True), ("1h30m", True), ("9s", False), ("5", False), ("", False),
    ("1d", False), ("9000h", False),
])
def test_interval_bounds(value: str, ok: bool) -> None:
    assert (admitted(SPEC["properties"]["interval"], value) == []) == ok


@pytest.mark.parametrize(("value", "ok"), [
    ("Europe/Berlin", True), ("UTC", True), ("America/Argentina/Buenos_Aires", True),
    ("Etc/GMT+5", True), ("Europe Berlin", False), ("../etc/passwd", False),
])
def test_time_zone_shape(value: str, ok: bool) -> None:
    assert (admitted(SPEC["properties"]["timeZone"], value) == []) == ok


@pytest.mark.parametrize(("spec", "fragment"), [
    ({"jobTemplate": {}}, "exactly one"),
    ({"schedule": "* * * * *", "interval": "60s", "jobTemplate": {}}, "exactly one"),
    ({"interval": "60s", "timeZone": "UTC", "jobTemplate": {}}, "timeZone applies"),
])
def test_spec_rules(spec: dict[str, Any], fragment: str) -> None:
    assert any(fragment in m for m in admitted(SPEC, spec))


@pytest.mark.parametrize(("template", "fragment"), [
    ({"operation": "run"}, "needs crewRef"),
    ({"crewRef": {"name": "r"}, "operation": "run", "actionId": "x"}, "set by the operator"),
    ({"crewRef": {"name": "r"}, "operation": "run", "cancel": True}, "may not set cancel"),
])
def test_job_template_rules(template: dict[str, Any], fragment: str) -> None:
    node = SPEC["properties"]["jobTemplate"]["properties"]["spec"]
    assert any(fragment in m for m in admitted(node, template))
    assert admitted(node, {"crewRef": {"name": "r"}, "operation": "run"}) == []


def test_name_limit() -> None:
    assert admitted(SCHEMA, {"metadata": {"name": "a" * ch.MAX_NAME}}) == []
    assert admitted(SCHEMA, {"metadata": {"name": "a" * (ch.MAX_NAME + 1)}})
