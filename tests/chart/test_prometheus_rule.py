"""The optional PrometheusRule: off by default, and its expression, evaluated over a scrape of
the operator's own registry, fires exactly while an uncertain outcome waits longer than the
threshold and stops once it is resolved (the e2e test repeats this over live scrapes of the
operator running against the real control plane)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from chart_helpers import Helm, find, one
from crewfence_operator import metrics
from prometheus_client import generate_latest


def evaluate(expr: str, text: str) -> dict[str, float]:
    """``max by (namespace) (METRIC) > N`` over one scrape: the series that fire."""
    m = re.fullmatch(r"\s*max by \(namespace\) \((\w+)\) > (\d+)\s*", expr)
    assert m, f"the rule changed shape; update this evaluator: {expr}"
    metric, threshold = m.group(1), float(m.group(2))
    per_ns: dict[str, float] = {}
    for line in text.splitlines():
        sample = re.match(rf"^{metric}\{{(.*)\}}\s+(\S+)$", line)
        if sample:
            ns = re.search(r'namespace="([^"]*)"', sample.group(1))
            key = ns.group(1) if ns else ""
            per_ns[key] = max(float(sample.group(2)), per_ns.get(key, float("-inf")))
    return {ns: v for ns, v in per_ns.items() if v > threshold}


def test_rule_is_optional_and_fires_only_for_old_unresolved_outcomes(helm: Helm) -> None:
    assert not find(helm.render(), "PrometheusRule")
    docs = helm.render({"metrics.prometheusRule.enabled": True,
                        "metrics.prometheusRule.unresolvedAfterSeconds": 600,
                        "metrics.prometheusRule.labels": {"release": "prom"}})
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    (alert,) = rule["spec"]["groups"][0]["rules"]
    assert alert["alert"] == "CrewJobOutcomeUnresolved"
    assert alert["labels"]["severity"] == "warning"
    assert "kubectl crewfence resolve" in alert["annotations"]["description"]
    expr = alert["expr"]

    now = time.time()
    metrics.observe_unresolved_uncertain("old-ns", "a", ("research", "Timeout", now - 900))
    metrics.observe_unresolved_uncertain("new-ns", "b", ("research", "Timeout", now - 60))
    try:
        fired = evaluate(expr, generate_latest(metrics.REGISTRY).decode())
        assert set(fired) == {"old-ns"}
        metrics.observe_unresolved_uncertain("old-ns", "a", None)  # resolved
        assert evaluate(expr, generate_latest(metrics.REGISTRY).decode()) == {}
    finally:
        metrics.observe_unresolved_uncertain("old-ns", "a", None)
        metrics.observe_unresolved_uncertain("new-ns", "b", None)


def test_promtool_checks_and_unit_tests_the_rule(helm: Helm, tmp_path: Path) -> None:
    """With promtool on the PATH (Debian's `prometheus` package ships it): the rendered rule
    is valid, and promtool's own evaluator fires it only past the threshold and stops it once
    the series goes (the outcome was resolved). Annotations are checked by `check rules` only."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus); the expression "
                    "is evaluated over scrapes above and in tests/e2e/test_crewjob_resolution.py")
    docs = helm.render({"metrics.prometheusRule.enabled": True,
                        "metrics.prometheusRule.unresolvedAfterSeconds": 600})
    spec = one(docs, "PrometheusRule")["spec"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(spec))
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    for group in spec["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(spec))
    metric = "crewfence_operator_oldest_unresolved_uncertain_seconds"
    cases = {
        "rule_files": [str(bare)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f'{metric}{{namespace="old"}}', "values": "500+60x3 stale"},
                {"series": f'{metric}{{namespace="young"}}', "values": "10+60x5"},
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "CrewJobOutcomeUnresolved", "exp_alerts": []},
                {"eval_time": "3m", "alertname": "CrewJobOutcomeUnresolved", "exp_alerts": [
                    {"exp_labels": {"namespace": "old", "severity": "warning"}}]},
                {"eval_time": "5m", "alertname": "CrewJobOutcomeUnresolved", "exp_alerts": []},
            ],
        }],
    }
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump(cases))
    run = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
