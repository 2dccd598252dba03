"""Operator runtime: configuration from env and flags, metrics helpers, RBAC rules."""

from __future__ import annotations

import pytest
from crewfence_operator import constants as c
from crewfence_operator import metrics, rbac
from crewfence_operator.cli import parse_config
from crewfence_operator.config import OperatorConfig, WebhookMode
from prometheus_client import generate_latest


def test_env_then_flags() -> None:
    base = OperatorConfig.from_env({
        "CREWFENCE_OPERATOR_NAMESPACES": "a, b",
        "CREWFENCE_OPERATOR_METRICS_PORT": "9100",
        "CREWFENCE_OPERATOR_WEBHOOK_MODE": "managed",
        "CREWFENCE_OPERATOR_AUDIT_INTERVAL": "2.5",
        "CREWFENCE_OPERATOR_SIDECAR_MAX_RETAINED_RUNS": "77",
    })
    assert base.journal_defaults.max_retained_runs == 77
    assert base.journal_defaults.max_concurrency is None
    assert base.namespaces == ("a", "b") and not base.all_namespaces
    assert base.metrics_port == 9100 and base.webhook.mode is WebhookMode.MANAGED
    assert base.audit_interval == 2.5
    cfg = parse_config(["-n", "x", "-n", "y", "--peering", "ops", "--priority", "10",
                        "--liveness-port", "8181", "--webhook-mode", "service"], base=base)
    assert cfg.namespaces == ("x", "y") and not cfg.all_namespaces
    assert not cfg.standalone and cfg.peering_name == "ops" and cfg.priority == 10
    assert cfg.liveness_port == 8181 and cfg.metrics_port == 9100
    assert cfg.webhook.mode is WebhookMode.SERVICE


def test_defaults() -> None:
    cfg = parse_config([], base=OperatorConfig.from_env({}))
    assert cfg.all_namespaces and cfg.standalone
    assert (cfg.liveness_port, cfg.metrics_port, cfg.sidecar_port) == (8080, 9090, 8090)
    assert cfg.webhook.mode is WebhookMode.OFF
    assert cfg.webhook.config_name == c.WEBHOOK_CONFIG_NAME


def test_sidecar_tls_is_on_unless_explicitly_turned_off() -> None:
    """A bare ``crewfence-operator`` talks mutual TLS; plain HTTP only when asked for by an
    explicit false word; a value that is neither is refused, never read as "off"."""
    assert OperatorConfig().sidecar_tls
    assert OperatorConfig.from_env({}).sidecar_tls
    assert OperatorConfig.from_env({"CREWFENCE_OPERATOR_SIDECAR_TLS": ""}).sidecar_tls
    for on in ("1", "true", "TRUE", "yes", "on"):
        assert OperatorConfig.from_env({"CREWFENCE_OPERATOR_SIDECAR_TLS": on}).sidecar_tls
    for off in ("0", "false", "False", "no", "off"):
        assert not OperatorConfig.from_env({"CREWFENCE_OPERATOR_SIDECAR_TLS": off}).sidecar_tls
    for typo in ("flase", "disabled", "2"):
        with pytest.raises(ValueError, match="SIDECAR_TLS"):
            OperatorConfig.from_env({"CREWFENCE_OPERATOR_SIDECAR_TLS": typo})


def test_a_bad_setting_is_one_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREWFENCE_OPERATOR_SIDECAR_TLS", "flase")
    with pytest.raises(SystemExit) as exited:
        parse_config([])
    assert str(exited.value).startswith("crewfence-operator: CREWFENCE_OPERATOR_SIDECAR_TLS=")


def test_undotted_webhook_config_name_refused() -> None:
    with pytest.raises(SystemExit):
        parse_config(["--webhook-config-name", "nodots"], base=OperatorConfig.from_env({}))


def _value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_metric_names_and_helpers() -> None:
    # The registry is process-wide (other tests may record too): compare deltas.
    running, succeeded = (_value("crewfence_operator_crewjobs", phase=p)
                          for p in ("Running", "Succeeded"))
    uncertain = _value("crewfence_operator_uncertain_outcomes_total", reason="SidecarRestarted")
    admissions = _value("crewfence_operator_admission_seconds_count")
    failures = _value("crewfence_operator_sidecar_failures_total", category="Transport")
    metrics.observe_crewjob_phase_change(None, "Running")
    metrics.observe_crewjob_phase_change("Running", "Succeeded")
    metrics.observe_uncertain_outcome("SidecarRestarted")
    metrics.observe_admission_seconds(0.02)
    metrics.observe_sidecar_failure("Transport")
    assert _value("crewfence_operator_crewjobs", phase="Running") == running
    assert _value("crewfence_operator_crewjobs", phase="Succeeded") == succeeded + 1
    assert _value("crewfence_operator_uncertain_outcomes_total",
                  reason="SidecarRestarted") == uncertain + 1
    assert _value("crewfence_operator_admission_seconds_count") == admissions + 1
    assert _value("crewfence_operator_sidecar_failures_total",
                  category="Transport") == failures + 1
    metrics.observe_crewjobs_by_phase({"Pending": 4})
    assert _value("crewfence_operator_crewjobs", phase="Pending") == 4

    fenced = _value("crewfence_operator_fenced_replicas")
    metrics.observe_fenced_replicas("unit/a", 2)
    metrics.observe_fenced_replicas("unit/b", 1)
    assert _value("crewfence_operator_fenced_replicas") == fenced + 3
    metrics.observe_fenced_replicas("unit/a", 0)
    metrics.observe_fenced_replicas("unit/b", 0)
    assert _value("crewfence_operator_fenced_replicas") == fenced
    assert "crewfence_operator_fenced_replicas" in generate_latest(metrics.REGISTRY).decode()


def test_rbac_rules_are_policy_rules() -> None:
    rules = rbac.rules(managed_webhook=True)
    for rule in rules:
        assert set(rule) == {"apiGroups", "resources", "verbs"}
        assert rule["verbs"] and "*" not in rule["verbs"] and "*" not in rule["resources"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    for needed in [("crewfence.dev", "crews/status", "patch"), ("", "pods", "create"),
                   ("", "persistentvolumeclaims", "delete"), ("", "secrets", "create"),
                   ("", "events", "create"),
                   ("admissionregistration.k8s.io", "validatingwebhookconfigurations",
                    "patch")]:
        assert needed in granted
    assert not any(r["apiGroups"] == ["admissionregistration.k8s.io"] for r in rbac.rules())
    # Secrets are never listed or watched: the operator reads only the Secrets it names.
    assert ("", "secrets", "list") not in granted and ("", "secrets", "watch") not in granted
