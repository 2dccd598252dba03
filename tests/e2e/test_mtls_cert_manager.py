"""Mutual TLS with certificates from a real cert-manager (operator setting
``CREWFENCE_OPERATOR_CERT_SOURCE=cert-manager``) on the real control plane.

cert-manager here is cert-manager's own controllers (``pkg/controller`` of the pinned
``github.com/cert-manager/cert-manager`` module, see ``harness/certmanager.py``) with its
CRDs; nothing in this file writes a certificate or a TLS Secret: the operator declares
Issuers and Certificates, cert-manager signs and writes the Secrets, the pods mount them.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import socket
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crewfence_operator import rbac
from crewfence_operator.transport import cert_manager as cm
from crewfence_operator.transport import cert_manager_apply
from crewjob_support import (
    SidecarAccess,
    apply_obj,
    crew_token,
    crewjob_manifest,
    crewjob_namespace,
    research_crew,
    service_account_with_rules,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from harness import certmanager, controlplane
from harness.handles import Cluster, Operator, PodRunner
from harness.operator_launch import OperatorLaunch

# The first test also sets up cert-manager: a cold build (in CI, where it is built here) takes
# about 4-5 minutes of two cores on top of the usual per-test budget.
pytestmark = pytest.mark.timeout(1800)

CERT_MANAGER_ENV = {"CREWFENCE_OPERATOR_SIDECAR_TLS": "1",
                    "CREWFENCE_OPERATOR_CERT_SOURCE": "cert-manager"}
CREW = "research"
_LOG_OFFSET: dict[str, int] = {}
"""Where this module's operator starts in the shared operator log."""


def _cert_manager_root() -> Path:
    found = certmanager.cached()
    if found is not None:
        return found
    if not (os.environ.get("CI") or os.environ.get("CREWFENCE_E2E_BUILD")):
        pytest.skip("cert-manager is not built (run `python tests/e2e/cluster.py cert-manager`, "
                    "or set CREWFENCE_E2E_BUILD=1); in CI it is built here")
    try:
        return certmanager.ensure_built()
    except certmanager.BuildError as exc:
        pytest.fail(f"cert-manager could not be built: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def cert_manager(cluster: Cluster) -> Iterator[certmanager.CertManager]:
    root = _cert_manager_root()
    controlplane.install_crds(cluster.info, certmanager.crd_files(root))
    running = certmanager.CertManager(cluster.state_dir)
    running.start(root, cluster.kubeconfig)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def operator_account(cluster: Cluster) -> Iterator[str]:
    """A ServiceAccount with exactly ``rbac.rules(cert_manager=True)`` (what the chart grants
    with ``certManager.enabled``, plus the out-of-cluster webhook rules the harness needs)."""
    rules = rbac.rules(managed_webhook=True, cert_manager=True)
    with service_account_with_rules(cluster, "crewfence-cm", rules) as account:
        yield account


@pytest.fixture(scope="module")
def cm_operator(cluster: Cluster, pod_runner: PodRunner, cert_manager: certmanager.CertManager,
                operator_account: str, _operators: list[Operator]) -> Iterator[Operator]:
    """The operator with cert-manager as its certificate source and its own RBAC (a real
    ServiceAccount token), for this module only."""
    for other in _operators:
        other.stop()
    _operators.clear()
    controlplane.install_crds(cluster.info)
    ns, _, name = operator_account.partition(":")
    kubeconfig = cluster.service_account_kubeconfig(
        ns, name, cluster.state_dir / f"operator-cm-{ns}.kubeconfig")
    op = Operator(cluster, OperatorLaunch.for_cluster(
        str(kubeconfig), cluster.state_dir, extra_env=CERT_MANAGER_ENV), operator_account)
    _LOG_OFFSET["operator"] = op.log_path.stat().st_size if op.log_path.exists() else 0
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture(scope="module")
def crew_ns(cluster: Cluster, cm_operator: Operator) -> Iterator[str]:
    with crewjob_namespace(cluster, "e2e-cm") as ns:
        apply_obj(cluster, research_crew(1), ns)
        wait_crew_ready(cluster, ns, CREW, 1, timeout=420)
        yield ns


def _secret(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.get_json("secret", name, "-n", ns)
    return found


def _pem(secret: dict[str, Any], key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def _certificate(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.get_json("certificates.cert-manager.io", name, "-n", ns)
    return found


def _replica(cluster: Cluster, ns: str) -> dict[str, Any]:
    crew = cluster.get_json("crew", CREW, "-n", ns)
    return dict(next(r for r in crew["status"]["replicas"] if r["ordinal"] == 0))


def _access(cluster: Cluster, ns: str) -> SidecarAccess:
    """The operator's kind of client, from the Secret cert-manager wrote for the operator."""
    material = cert_manager_apply.client_tls_from_secret(
        _secret(cluster, ns, cm.operator_client_name(CREW)))
    assert material is not None
    return SidecarAccess(ns, CREW, crew_token(cluster, ns, CREW), material.context)


def _served_certificate(address: str, access: SidecarAccess) -> x509.Certificate:
    """The serving certificate the replica presents, verified against the Crew CA and name."""
    host, _, port = address.rpartition(":")
    assert access.context is not None
    with socket.create_connection((host, int(port)), timeout=15) as raw, \
            access.context.wrap_socket(raw, server_hostname=access.server_name(0)) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _run_job(cluster: Cluster, ns: str, name: str, sleep: int = 0) -> None:
    """A ``run`` CrewJob; ``sleep`` seconds of model time (the offline LLM's marker), so the
    operator polls it over TLS across a renewal."""
    topic = f"bees {name}" + (f" [[sleep:{sleep}]]" if sleep else "")
    apply_obj(cluster, crewjob_manifest(name, "run", {"topic": topic}), ns)


def test_crew_is_ready_over_mutual_tls_with_cert_manager_certificates(
        cluster: Cluster, crew_ns: str) -> None:
    ns = crew_ns
    # The operator declared the chain and cert-manager made every Certificate Ready.
    for kind, name in (("issuers.cert-manager.io", cm.bootstrap_issuer_name(CREW)),
                       ("issuers.cert-manager.io", cm.ca_name(CREW))):
        obj = cluster.get_json(kind, name, "-n", ns)
        assert obj["metadata"]["ownerReferences"][0]["name"] == CREW
    for name in (cm.ca_name(CREW), cm.operator_client_name(CREW),
                 cm.replica_certificate_name(CREW, 0)):
        wait_for(lambda n=name: cm.certificate_ready(_certificate(cluster, ns, n)) or None,
                 timeout=120, what=f"Certificate {name} Ready")
        assert _certificate(cluster, ns, name)["metadata"]["ownerReferences"][0]["kind"] == "Crew"
    # The operator signed nothing itself: its own CA Secret does not exist.
    missing = cluster.kubectl("get", "secret", f"{CREW}-crewfence-ca", "-n", ns)
    assert missing.returncode != 0 and "NotFound" in missing.stderr

    ca = x509.load_pem_x509_certificate(_pem(_secret(cluster, ns, cm.ca_name(CREW)), "tls.crt"))
    served = _secret(cluster, ns, cm.replica_certificate_name(CREW, 0))
    leaf = x509.load_pem_x509_certificate(_pem(served, "tls.crt"))
    leaf.verify_directly_issued_by(ca)
    assert _pem(served, "ca.crt") == ca.public_bytes(Encoding.PEM)
    assert served["metadata"]["labels"]["crewfence.dev/crew"] == CREW
    replica = _replica(cluster, ns)
    ip = replica["address"].rpartition(":")[0].strip("[]")

    def names_ip() -> x509.Certificate | None:
        cert = x509.load_pem_x509_certificate(_pem(
            _secret(cluster, ns, cm.replica_certificate_name(CREW, 0)), "tls.crt"))
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        ips = {str(a) for a in san.get_values_for_type(x509.IPAddress)}
        return cert if ip in ips else None

    cert = wait_for(names_ip, timeout=120, what="the serving certificate to name the pod IP")
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [f"{CREW}-0.{CREW}.{ns}.svc"]

    # The sidecar serves cert-manager's certificate (the files the pod mounts), and the
    # operator's client certificate from cert-manager opens it.
    access = _access(cluster, ns)
    wait_for(lambda: _served_certificate(replica["address"], access).serial_number
             == cert.serial_number or None, timeout=120,
             what="the sidecar to serve the certificate that names its IP")
    status, _ = access.request(replica, "/jobs/nothing-here")
    assert status == 404
    # The token alone opens nothing.
    status, body = SidecarAccess(ns, CREW, access.token, ssl.create_default_context(
        cadata=ca.public_bytes(Encoding.PEM).decode())).request(replica, "/jobs/nothing-here")
    assert status == 401 and "client_certificate_required" in body


def test_crewjob_succeeds_over_cert_manager_tls(cluster: Cluster, crew_ns: str) -> None:
    name = f"cm-run-{uuid.uuid4().hex[:6]}"
    _run_job(cluster, crew_ns, name)
    status = wait_phase(cluster, crew_ns, name, timeout=300)["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)
    assert status["uncertainOutcome"] is False


def _trigger_renewal(cluster: Cluster, ns: str, name: str) -> None:
    """What ``cmctl renew`` does: set the Certificate's ``Issuing`` condition to True."""
    cert = _certificate(cluster, ns, name)
    conditions = [c for c in (cert.get("status") or {}).get("conditions") or []
                  if c.get("type") != "Issuing"]
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions.append({"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
                       "message": "Certificate re-issuance manually triggered",
                       "lastTransitionTime": now,
                       "observedGeneration": cert["metadata"]["generation"]})
    cluster.kubectl("patch", "certificates.cert-manager.io", name, "-n", ns,
                    "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"conditions": conditions}}), check=True)


def test_cert_manager_renewal_is_picked_up_with_no_failed_admission(
        cluster: Cluster, crew_ns: str) -> None:
    ns = crew_ns
    replica = _replica(cluster, ns)
    before = _served_certificate(replica["address"], _access(cluster, ns))
    client_before = _pem(_secret(cluster, ns, cm.operator_client_name(CREW)), "tls.crt")
    ca_before = x509.load_pem_x509_certificate(
        _pem(_secret(cluster, ns, cm.ca_name(CREW)), "tls.crt"))
    names = [f"cm-renew-{i}-{uuid.uuid4().hex[:4]}" for i in range(6)]
    for name in names[:3]:
        _run_job(cluster, ns, name, sleep=5)  # still running while the certificates change
    wait_for(lambda: all(((cluster.get_json("crewjob", n, "-n", ns) or {}).get("status") or {})
                         .get("phase") == "Running" for n in names[:3]) or None,
             timeout=120, what="the first CrewJobs admitted and running")
    _trigger_renewal(cluster, ns, cm.ca_name(CREW))
    _trigger_renewal(cluster, ns, cm.replica_certificate_name(CREW, 0))
    _trigger_renewal(cluster, ns, cm.operator_client_name(CREW))

    # A renewed CA keeps its key (rotationPolicy Never): what it signed before still verifies.
    def ca_renewed() -> x509.Certificate | None:
        ca = x509.load_pem_x509_certificate(
            _pem(_secret(cluster, ns, cm.ca_name(CREW)), "tls.crt"))
        return ca if ca.serial_number != ca_before.serial_number else None

    ca_after = wait_for(ca_renewed, timeout=120, what="the CA renewal")
    assert ca_after.public_key() == ca_before.public_key()
    before.verify_directly_issued_by(ca_after)

    def renewed() -> x509.Certificate | None:
        cert = _served_certificate(replica["address"], _access(cluster, ns))
        return cert if cert.serial_number != before.serial_number else None

    after = wait_for(renewed, timeout=180, what="the sidecar to serve the renewed certificate")
    assert after.public_key() != before.public_key()  # a new key, not just a new serial
    wait_for(lambda: _pem(_secret(cluster, ns, cm.operator_client_name(CREW)), "tls.crt")
             != client_before or None, timeout=120, what="the client certificate renewal")
    for name in names[3:]:
        _run_job(cluster, ns, name)
    for name in names:
        status = wait_phase(cluster, ns, name, timeout=300)["status"]
        assert status["phase"] == "Succeeded", json.dumps(status)
        assert status["uncertainOutcome"] is False
        assert not status.get("failure"), json.dumps(status)


def test_nothing_the_operator_did_was_forbidden(cluster: Cluster, crew_ns: str,
                                                cm_operator: Operator,
                                                operator_account: str) -> None:
    """The Crew above was reconciled under exactly ``rbac.rules(cert_manager=True)``."""
    ns, _, name = operator_account.partition(":")
    user = f"system:serviceaccount:{ns}:{name}"
    logs = cm_operator.logs()[_LOG_OFFSET.get("operator", 0):]
    assert "cert-manager objects of Crew" in logs  # the lines below are this operator's
    denials = [line for line in logs.splitlines()
               if user in line or "is forbidden" in line or "cannot create" in line
               or "cannot update" in line or "cannot get" in line]
    assert denials == [], denials[:5]
    assert "Not enough RBAC permissions" not in logs
