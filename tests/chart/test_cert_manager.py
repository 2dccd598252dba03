"""`certManager.enabled`: the operator takes its mutual-TLS certificates from cert-manager,
with exactly the RBAC that needs (``rbac.rules(cert_manager=True)``)."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helpers import CHART, RELEASE, Helm, one
from crewfence_operator import rbac
from crewfence_operator.config import OperatorConfig
from crewfence_operator.transport.cert_manager import CertManagerSettings, IssuerRef
from test_operator_contract import chart_triples, split_peering, triples
from test_render import OPERATOR, env_of


def _operator_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return env_of(one(docs, "Deployment", OPERATOR)["spec"]["template"]["spec"])


def _config(env: dict[str, Any]) -> OperatorConfig:
    return OperatorConfig.from_env({k: v for k, v in env.items() if isinstance(v, str)})


def test_default_is_the_operators_own_ca(helm: Helm) -> None:
    docs = helm.render()
    env = _operator_env(docs)
    assert "CREWFENCE_OPERATOR_CERT_SOURCE" not in env
    assert _config(env).cert_manager_settings() is None
    assert not any(t[0] == "cert-manager.io" for t in chart_triples(docs))


@pytest.mark.parametrize("values", [
    {"certManager.enabled": True},
    {"certManager.enabled": True, "rbac.namespaced": True,
     "operator.watchNamespaces": ["team-a"]},
], ids=["cluster", "namespaced"])
def test_cert_manager_rbac_is_exactly_the_operators(helm: Helm, values: dict[str, Any]) -> None:
    docs = helm.render(values)
    granted, _ = split_peering(chart_triples(docs))
    wanted, _ = split_peering(triples(rbac.rules(cert_manager=True)))
    assert granted == wanted
    assert ("cert-manager.io", "certificates", "update") in granted
    assert ("cert-manager.io", "issuers", "create") in granted
    assert _config(_operator_env(docs)).cert_manager_settings() == CertManagerSettings()


def test_an_existing_issuer_reaches_the_operator(helm: Helm) -> None:
    env = _operator_env(helm.render({
        "certManager.enabled": True,
        "certManager.issuerRef": {"kind": "ClusterIssuer", "name": "corp-ca"}}))
    assert env["CREWFENCE_OPERATOR_CERT_SOURCE"] == "cert-manager"
    assert env["CREWFENCE_OPERATOR_CERT_MANAGER_ISSUER"] == "ClusterIssuer/corp-ca"
    settings = _config(env).cert_manager_settings()
    assert settings is not None and settings.issuer == IssuerRef("corp-ca", "ClusterIssuer")
    env = _operator_env(helm.render({"certManager.enabled": True,
                                     "certManager.issuerRef": {"name": "mine"}}))
    assert env["CREWFENCE_OPERATOR_CERT_MANAGER_ISSUER"] == "Issuer/mine"


@pytest.mark.parametrize(("sets", "message"), [
    (["certManager.enabled=true", "sidecar.tls.enabled=false"], "sidecar.tls.enabled"),
    (["certManager.enabled=true", "certManager.issuerRef.kind=Secret",
      "certManager.issuerRef.name=x"], "issuerRef"),
])
def test_refused_combinations(helm: Helm, sets: list[str], message: str) -> None:
    args = [a for s in sets for a in ("--set", s)]
    result = helm.run("template", RELEASE, str(CHART), "--kube-version", helm.kube_version,
                      *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr
