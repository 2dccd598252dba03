"""Mutual TLS between the operator and a Crew's sidecars: the per-Crew CA and what it issues.

Pure functions over observed Secrets and certificates; the Crew handler only carries out what
they decide (create or replace a Secret). Invariants kept here:

* **One CA per Crew.** A Crew's sidecars trust client certificates of their own Crew's CA only
  (``<crew>-crewfence-ca``, owned by the Crew, so it goes with it): a certificate issued for
  another Crew opens nothing here.
* **The name is checked, not just the CA.** Each replica's serving certificate names the
  pod's DNS name under the Crew's headless Service (and its IP once known); the operator
  verifies that name on every call (``server_name``), so a replica cannot answer for another.
* **Renewed before expiry.** A certificate is re-issued when a third of its lifetime is left,
  when its names changed (a new pod IP) or when it was not issued by the current CA
  (``renewal_reason``); the sidecar picks the new files up without a restart.
* **Keys never leave Secrets and memory.** Nothing here logs, reprs or returns a key in a
  message; ``Issued.__repr__`` shows the subject only.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from crewfence_operator import certs
from crewfence_operator import constants as c
from crewfence_operator.crew.identity import CrewRef, crew_labels, object_meta, replica_labels

CA_CERT_KEY: Final = "ca.crt"
CA_KEY_KEY: Final = "ca.key"
TLS_CERT_KEY: Final = "tls.crt"
TLS_KEY_KEY: Final = "tls.key"
CA_LIFETIME: Final = dt.timedelta(days=3650)
LEAF_LIFETIME: Final = dt.timedelta(days=90)
RENEW_WHEN_LEFT: Final = 1 / 3
"""Re-issue once less than this fraction of a certificate's lifetime is left."""
OPERATOR_CLIENT_NAME: Final = "crewfence-operator"


def ca_secret_name(crew: str) -> str:
    return f"{crew}-crewfence-ca"


def replica_tls_secret_name(crew: str, ordinal: int) -> str:
    return f"{c.pod_name(crew, ordinal)}-crewfence-tls"


def replica_dns_name(crew: CrewRef, ordinal: int) -> str:
    """``<pod>.<headless service>.<namespace>.svc``: what the operator verifies."""
    return f"{c.pod_name(crew.name, ordinal)}.{c.service_name(crew.name)}.{crew.namespace}.svc"


def replica_hosts(crew: CrewRef, ordinal: int, pod_ip: str | None) -> list[str]:
    hosts = [replica_dns_name(crew, ordinal)]
    if pod_ip:
        hosts.append(pod_ip)
    return hosts


# --- reading Secrets -------------------------------------------------------------------------
def _secret_bytes(secret: Mapping[str, Any] | None, key: str) -> bytes | None:
    if not secret:
        return None
    raw = (secret.get("data") or {}).get(key)
    if raw is None:
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        return None


def ca_from_secret(secret: Mapping[str, Any] | None) -> certs.Issued | None:
    """The Crew CA kept in its Secret; None when absent or unreadable (then a new one)."""
    cert_pem, key_pem = _secret_bytes(secret, CA_CERT_KEY), _secret_bytes(secret, CA_KEY_KEY)
    if cert_pem is None or key_pem is None:
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError:
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    return certs.Issued(cert, key)


def cert_from_secret(secret: Mapping[str, Any] | None) -> x509.Certificate | None:
    pem = _secret_bytes(secret, TLS_CERT_KEY)
    if pem is None:
        return None
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None


# --- decisions -------------------------------------------------------------------------------
def _hosts_of(cert: x509.Certificate) -> frozenset[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    names = set(san.get_values_for_type(x509.DNSName))
    names.update(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    return frozenset(names)


def renewal_reason(cert: x509.Certificate | None, ca: certs.Issued, hosts: Sequence[str],
                   now: dt.datetime) -> str | None:
    """Why ``cert`` must be re-issued now, or None while it is good.

    Reasons: ``missing``; ``issuer`` (not signed by the current CA); ``hosts`` (other names);
    ``expiring`` (less than a third of its lifetime left, or expired).
    """
    if cert is None:
        return "missing"
    if cert.issuer != ca.cert.subject:
        return "issuer"
    try:
        cert.verify_directly_issued_by(ca.cert)
    except (InvalidSignature, ValueError, TypeError):
        return "issuer"
    if _hosts_of(cert) != frozenset(hosts):
        return "hosts"
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    if cert.not_valid_after_utc - now < lifetime * RENEW_WHEN_LEFT:
        return "expiring"
    return None


def ca_renewal_reason(ca: certs.Issued | None, now: dt.datetime) -> str | None:
    if ca is None:
        return "missing"
    lifetime = ca.cert.not_valid_after_utc - ca.cert.not_valid_before_utc
    if ca.cert.not_valid_after_utc - now < lifetime * RENEW_WHEN_LEFT:
        return "expiring"
    return None


# --- issuing and manifests ---------------------------------------------------------------------
def new_crew_ca(crew: CrewRef) -> certs.Issued:
    return certs.new_ca(f"crewfence {crew.namespace}/{crew.name}",
                        days=CA_LIFETIME.days)


def issue_serving(ca: certs.Issued, hosts: Sequence[str]) -> certs.Issued:
    return certs.issue(ca, hosts[0], hosts=hosts, server=True, lifetime=LEAF_LIFETIME)


def issue_operator_client(ca: certs.Issued) -> certs.Issued:
    return certs.issue(ca, OPERATOR_CLIENT_NAME, server=False, client=True,
                       lifetime=LEAF_LIFETIME)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def ca_secret(crew: CrewRef, ca: certs.Issued) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(crew, ca_secret_name(crew.name), crew_labels(crew)),
        "type": "Opaque",
        "data": {CA_CERT_KEY: _b64(ca.cert_pem), CA_KEY_KEY: _b64(ca.key_pem)},
    }


def replica_tls_secret(crew: CrewRef, ordinal: int, ca: certs.Issued,
                       leaf: certs.Issued) -> dict[str, Any]:
    """``kubernetes.io/tls`` Secret the replica mounts: its certificate, key and the CA that
    signs the operator's client certificate (the same Crew CA)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(crew, replica_tls_secret_name(crew.name, ordinal),
                                replica_labels(crew, ordinal)),
        "type": "kubernetes.io/tls",
        "data": {TLS_CERT_KEY: _b64(leaf.cert_pem), TLS_KEY_KEY: _b64(leaf.key_pem),
                 CA_CERT_KEY: _b64(ca.cert_pem)},
    }


# --- the operator's client side ------------------------------------------------------------------
def client_ssl_context(ca: certs.Issued, client: certs.Issued) -> ssl.SSLContext:
    """Verify replicas against the Crew CA (name checked per call via ``server_hostname``)
    and present the operator's client certificate of that CA."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.load_verify_locations(cadata=ca.cert_pem.decode("ascii"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files only: a private directory that lives for this call.
    with tempfile.TemporaryDirectory(prefix="crewfence-client-") as tmp:
        cert_path, key_path = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        with open(cert_path, "wb") as handle:
            handle.write(client.cert_pem)
        certs.write_private(Path(key_path), client.key_pem)
        ctx.load_cert_chain(cert_path, key_path)
    return ctx


def is_client_certificate(cert: x509.Certificate) -> bool:
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return ExtendedKeyUsageOID.CLIENT_AUTH in eku


@dataclass
class CrewClientTLS:
    """The operator's TLS material for one Crew: cached per CA, renewed before expiry."""

    ca: certs.Issued
    client: certs.Issued
    context: ssl.SSLContext

    @classmethod
    def for_ca(cls, ca: certs.Issued) -> CrewClientTLS:
        client = issue_operator_client(ca)
        return cls(ca=ca, client=client, context=client_ssl_context(ca, client))

    def still_good(self, ca: certs.Issued, now: dt.datetime) -> bool:
        return (self.ca.cert == ca.cert
                and renewal_reason(self.client.cert, ca, [], now) is None)
