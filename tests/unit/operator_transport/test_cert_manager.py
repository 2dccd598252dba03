"""The cert-manager certificate source: which Issuers and Certificates a Crew needs
(``transport/cert_manager.py``), the operator setting, and the client TLS built from the Secret
cert-manager writes (``transport/cert_manager_apply.py``)."""

from __future__ import annotations

import base64
import copy
import ssl
from typing import Any

import pytest
from crewfence_operator.config import OperatorConfig
from crewfence_operator.crew.credentials import credentials_volume
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.spec import parse_spec
from crewfence_operator.transport import cert_manager as cm
from crewfence_operator.transport import cert_manager_apply, certs, pki

CREW = CrewRef(name="research", namespace="team-a", uid="uid-1")
SETTINGS = cm.CertManagerSettings()


def _by_name(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_a_ca_per_crew_bootstrap_ca_then_leaves_all_owned_by_the_crew() -> None:
    objs = cm.desired_objects(CREW, [0, 1], {0: "10.0.0.7"}, SETTINGS)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert kinds == [
        ("Issuer", "research-crewfence-bootstrap"),
        ("Certificate", "research-crewfence-cm-ca"),
        ("Issuer", "research-crewfence-cm-ca"),
        ("Certificate", "research-crewfence-operator-client"),
        ("Certificate", "research-0-crewfence-tls"),
        ("Certificate", "research-1-crewfence-tls"),
    ]
    for obj in objs:
        assert obj["apiVersion"] == "cert-manager.io/v1"
        assert obj["metadata"]["namespace"] == "team-a"
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["kind"] == "Crew" and owner["uid"] == "uid-1"
    named = _by_name(objs)
    assert named["Issuer", "research-crewfence-bootstrap"]["spec"] == {"selfSigned": {}}
    ca = named["Certificate", "research-crewfence-cm-ca"]["spec"]
    assert ca["isCA"] is True
    assert ca["issuerRef"] == {"name": "research-crewfence-bootstrap", "kind": "Issuer",
                               "group": "cert-manager.io"}
    # A renewed CA keeps its key: what it signed before still verifies.
    assert ca["privateKey"]["rotationPolicy"] == "Never"
    assert named["Issuer", "research-crewfence-cm-ca"]["spec"] == {
        "ca": {"secretName": ca["secretName"]}}
    for name in ("research-crewfence-operator-client", "research-0-crewfence-tls"):
        assert named["Certificate", name]["spec"]["issuerRef"]["name"] == "research-crewfence-cm-ca"


def test_replica_certificates_write_the_secret_the_pod_already_mounts() -> None:
    """Same files on disk in either source: the Certificate's Secret is the projected volume's
    source, and cert-manager's CA issuer writes exactly the keys the volume selects."""
    spec = parse_spec({"llm": {"model": "crewfence/offline"}, "agents": {
        "a": {"role": "r", "goal": "g", "backstory": "b"}},
        "tasks": [{"name": "t", "agent": "a", "description": "d", "expected_output": "o"}]})
    for ordinal in (0, 3):
        cert = cm.replica_certificate(CREW, ordinal, None, SETTINGS)
        volume = credentials_volume(CREW, spec, ordinal)
        mounted = {s["secret"]["name"]: {i["key"] for i in s["secret"]["items"]}
                   for s in volume["projected"]["sources"]}
        assert mounted[cert["spec"]["secretName"]] == {"tls.crt", "tls.key", "ca.crt"}


def test_replica_names_are_what_the_operator_verifies_and_the_ip_once_known() -> None:
    without_ip = cm.replica_certificate(CREW, 1, None, SETTINGS)["spec"]
    assert without_ip["dnsNames"] == [pki.replica_dns_name(CREW, 1)]
    assert without_ip["dnsNames"] == ["research-1.research.team-a.svc"]
    assert "ipAddresses" not in without_ip
    assert "server auth" in without_ip["usages"] and "client auth" not in without_ip["usages"]
    with_ip = cm.replica_certificate(CREW, 1, "10.1.2.3", SETTINGS)["spec"]
    assert with_ip["ipAddresses"] == ["10.1.2.3"]
    client = cm.operator_client_certificate(CREW, SETTINGS)["spec"]
    assert client["usages"] == ["digital signature", "client auth"]
    assert client["commonName"] == pki.OPERATOR_CLIENT_NAME


def test_secrets_carry_the_crew_labels() -> None:
    cert = cm.replica_certificate(CREW, 2, None, SETTINGS)
    labels = cert["spec"]["secretTemplate"]["labels"]
    assert labels["crewfence.dev/crew"] == "research"
    assert labels["crewfence.dev/replica"] == "2"
    assert labels["app.kubernetes.io/managed-by"] == "crewfence"


def test_an_existing_issuer_replaces_the_per_crew_ca() -> None:
    settings = cm.CertManagerSettings(issuer=cm.IssuerRef.parse("ClusterIssuer/corp-ca"))
    objs = cm.desired_objects(CREW, [0], {}, settings)
    assert [o["kind"] for o in objs] == ["Certificate", "Certificate"]
    for obj in objs:
        assert obj["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer",
                                            "group": "cert-manager.io"}


@pytest.mark.parametrize(("text", "kind", "name"), [
    ("corp", "Issuer", "corp"), ("Issuer/corp", "Issuer", "corp"),
    ("ClusterIssuer/corp-ca", "ClusterIssuer", "corp-ca")])
def test_issuer_reference_forms(text: str, kind: str, name: str) -> None:
    ref = cm.IssuerRef.parse(text)
    assert (ref.kind, ref.name) == (kind, name)


@pytest.mark.parametrize("text", ["Secret/corp", "ClusterIssuer/", "", "a/b/c"])
def test_malformed_issuer_references_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="issuer reference"):
        cm.IssuerRef.parse(text)


def test_drift_is_judged_on_the_operators_fields_only() -> None:
    desired = cm.replica_certificate(CREW, 0, "10.0.0.7", SETTINGS)
    assert cm.spec_drift(None, desired) == "create"
    existing = copy.deepcopy(desired)
    existing["spec"]["subject"] = {"organizations": ["set by someone else"]}
    existing["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    assert cm.spec_drift(existing, desired) is None
    moved = cm.replica_certificate(CREW, 0, "10.0.0.8", SETTINGS)
    assert cm.spec_drift(existing, moved) == "update"
    merged = cm.merged_spec(existing, moved)
    assert merged["ipAddresses"] == ["10.0.0.8"]
    assert merged["subject"] == {"organizations": ["set by someone else"]}
    # An IP not known right now (pod being replaced) is no reason to re-issue.
    assert cm.spec_drift(existing, cm.replica_certificate(CREW, 0, None, SETTINGS)) is None


def test_certificate_ready_reads_the_ready_condition() -> None:
    assert not cm.certificate_ready(None)
    assert not cm.certificate_ready({"status": {"conditions": [
        {"type": "Ready", "status": "False"}]}})
    assert cm.certificate_ready({"status": {"conditions": [
        {"type": "Issuing", "status": "True"}, {"type": "Ready", "status": "True"}]}})


def test_operator_setting_selects_the_source() -> None:
    assert OperatorConfig().cert_manager_settings() is None
    assert OperatorConfig.from_env({}).cert_manager_settings() is None
    cfg = OperatorConfig.from_env({"CREWFENCE_OPERATOR_CERT_SOURCE": "cert-manager"})
    assert cfg.cert_manager_settings() == cm.CertManagerSettings()
    cfg = OperatorConfig.from_env({"CREWFENCE_OPERATOR_CERT_SOURCE": "cert-manager",
                                   "CREWFENCE_OPERATOR_CERT_MANAGER_ISSUER": "Issuer/mine"})
    settings = cfg.cert_manager_settings()
    assert settings is not None and settings.issuer == cm.IssuerRef("mine", "Issuer")
    with pytest.raises(ValueError):
        OperatorConfig.from_env({"CREWFENCE_OPERATOR_CERT_SOURCE": "vault"})
    with pytest.raises(ValueError, match="issuer reference"):
        OperatorConfig.from_env({"CREWFENCE_OPERATOR_CERT_SOURCE": "cert-manager",
                                 "CREWFENCE_OPERATOR_CERT_MANAGER_ISSUER": "Secret/x"})


def _secret(data: dict[str, bytes], version: str = "7") -> dict[str, Any]:
    return {"metadata": {"resourceVersion": version},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def test_client_tls_from_the_secret_cert_manager_writes() -> None:
    ca = certs.new_ca("crewfence team-a/research")
    client = pki.issue_operator_client(ca)
    full = {"ca.crt": ca.cert_pem, "tls.crt": client.cert_pem, "tls.key": client.key_pem}
    material = cert_manager_apply.client_tls_from_secret(_secret(full))
    assert material is not None and material.resource_version == "7"
    assert material.context.verify_mode == ssl.CERT_REQUIRED
    assert material.context.check_hostname
    assert repr(client.key_pem.decode()) not in repr(material)
    options = cert_manager_apply.endpoint_tls(material, "team-a", "research", 1)
    assert options["server_name"] == "research-1.research.team-a.svc"
    # Not yet (completely) written: nothing to send with.
    assert cert_manager_apply.client_tls_from_secret(None) is None
    for missing in full:
        partial = {k: v for k, v in full.items() if k != missing}
        assert cert_manager_apply.client_tls_from_secret(_secret(partial)) is None
    other = pki.issue_operator_client(certs.new_ca("other"))
    mismatched = {**full, "tls.key": other.key_pem}
    assert cert_manager_apply.client_tls_from_secret(_secret(mismatched)) is None
    assert cert_manager_apply.endpoint_tls(None, "team-a", "research", 1) == {}


class _CustomObjects:
    """An in-memory stand-in for the custom-objects API (the real one: the e2e test)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.version = 0

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                     plural: str, name: str) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        found = self.objects.get((namespace, plural, name))
        if found is None:
            raise ApiException(status=404)
        return copy.deepcopy(found)

    def _store(self, namespace: str, plural: str, body: dict[str, Any], verb: str) -> None:
        self.version += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self.version)
        self.objects[namespace, plural, body["metadata"]["name"]] = body
        self.writes.append((verb, body["metadata"]["name"]))

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                        plural: str, body: dict[str, Any]) -> None:
        self._store(namespace, plural, body, "create")

    def replace_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                         plural: str, name: str, body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        current = self.objects[namespace, plural, name]
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        self._store(namespace, plural, body, "replace")


def test_ensure_writes_only_what_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    from crewfence_operator import kube

    api = _CustomObjects()
    monkeypatch.setattr(kube, "custom", lambda: api)
    pods: dict[int, dict[str, Any]] = {0: {"status": {}}}
    first = cert_manager_apply.ensure(CREW, [0, 1], pods, SETTINGS)
    assert len(first) == 6 and all(w.endswith(":create") for w in first)
    assert cert_manager_apply.ensure(CREW, [0, 1], pods, SETTINGS) == []  # nothing to do
    # cert-manager's own fields survive an update for a new pod IP.
    key = ("team-a", "certificates", "research-0-crewfence-tls")
    api.objects[key]["status"] = {"revision": 3}
    api.objects[key]["spec"]["subject"] = {"organizations": ["kept"]}
    pods[0] = {"status": {"podIP": "10.0.0.9"}}
    assert cert_manager_apply.ensure(CREW, [0, 1], pods, SETTINGS) == [
        "Certificate/research-0-crewfence-tls:update"]
    stored = api.objects[key]
    assert stored["spec"]["ipAddresses"] == ["10.0.0.9"]
    assert stored["spec"]["subject"] == {"organizations": ["kept"]}
    assert stored["status"] == {"revision": 3}
    assert cert_manager_apply.ensure(CREW, [0, 1], pods, SETTINGS) == []


def test_missing_cert_manager_is_a_clear_crew_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without cert-manager's CRDs every create answers 404: the Crew's Ready condition says
    so (``children.ChildError``) instead of a stack trace."""
    from crewfence_operator import kube
    from crewfence_operator.crew import children
    from crewfence_operator.crew.pod import PodSettings
    from kubernetes.client.exceptions import ApiException

    api = _CustomObjects()

    def not_served(*_args: Any) -> None:
        raise ApiException(status=404)

    api.create_namespaced_custom_object = not_served  # type: ignore[method-assign,assignment]
    monkeypatch.setattr(kube, "custom", lambda: api)
    with pytest.raises(cert_manager_apply.CertManagerUnavailable, match="not installed"):
        cert_manager_apply.ensure(CREW, [0], {}, SETTINGS)
    monkeypatch.setattr(children, "observe", lambda *_a: children.Snapshot([], {}, {}))
    monkeypatch.setattr(children, "_ensure_configmap", lambda *_a: None)
    monkeypatch.setattr(kube, "exists", lambda *_a: True)
    spec = parse_spec({"llm": {"model": "crewfence/offline"}, "agents": {
        "a": {"role": "r", "goal": "g", "backstory": "b"}},
        "tasks": [{"name": "t", "agent": "a", "description": "d", "expected_output": "o"}]})
    with pytest.raises(children.ChildError, match="cert-manager is not installed"):
        children.ensure(CREW, spec, PodSettings(sidecar_tls=True, cert_manager=SETTINGS), [])
