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
* **Trust is a bundle.** What a sidecar trusts (its ``ca.crt``) and what the operator verifies
  against is a list of CA certificates (``trust``): one CA normally, the old and the new one
  while the CA is renewed (``transport/ca_rotation.py`` names that rotation's invariants).
* **Keys never leave Secrets and memory.** Nothing here logs, reprs or returns a key in a
  message; ``Issued.__repr__`` shows the subject only.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
import secrets
import ssl
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from crewfence_operator import constants as c
from crewfence_operator.crew.identity import CrewRef, crew_labels, object_meta, replica_labels
from crewfence_operator.transport import certs

CA_CERT_KEY: Final = "ca.crt"
CA_KEY_KEY: Final = "ca.key"
TLS_CERT_KEY: Final = "tls.crt"
TLS_KEY_KEY: Final = "tls.key"
CA_LIFETIME: Final = dt.timedelta(days=3650)
LEAF_LIFETIME: Final = dt.timedelta(days=90)
"""Defaults; the operator settings ``CA_LIFETIME_SECONDS``/``LEAF_LIFETIME_SECONDS`` (config.py)
override them (short lifetimes let a test force a renewal)."""
RENEW_WHEN_LEFT: Final = 1 / 3
"""Re-issue once less than this fraction of a certificate's lifetime is left."""
OPERATOR_CLIENT_NAME: Final = "crewfence-operator"


def ca_secret_name(crew: str) -> str:
    return f"{crew}-crewfence-ca"


def replica_tls_secret_name(crew: str, ordinal: int) -> str:
    return f"{c.pod_name(crew, ordinal)}-crewfence-tls"


def operator_client_secret_name(crew: str) -> str:
    """The Secret with a client certificate for the Crew's sidecars and the trust bundle
    (never the CA's key): written by the operator, or by cert-manager's client Certificate."""
    return f"{crew}-crewfence-operator-client"


def replica_dns_name(crew: CrewRef, ordinal: int) -> str:
    """``<pod>.<headless service>.<namespace>.svc``: what the operator verifies."""
    return f"{c.pod_name(crew.name, ordinal)}.{c.service_name(crew.name)}.{crew.namespace}.svc"


def replica_hosts(crew: CrewRef, ordinal: int, pod_ip: str | None) -> list[str]:
    hosts = [replica_dns_name(crew, ordinal)]
    if pod_ip:
        hosts.append(pod_ip)
    return hosts


# --- reading Secrets -------------------------------------------------------------------------
def secret_bytes(secret: Mapping[str, Any] | None, key: str) -> bytes | None:
    """The decoded value of ``key`` in a Secret's ``data``; None when absent or not base64."""
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
    return issued_from_pem(secret_bytes(secret, CA_CERT_KEY), secret_bytes(secret, CA_KEY_KEY))


def issued_from_pem(cert_pem: bytes | None, key_pem: bytes | None) -> certs.Issued | None:
    """A certificate and its EC key from PEM; None when either is absent or unreadable."""
    if cert_pem is None or key_pem is None:
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError:
        return None
    return certs.Issued(cert, key) if isinstance(key, ec.EllipticCurvePrivateKey) else None


def trust_from_secret(secret: Mapping[str, Any] | None) -> list[x509.Certificate]:
    """The CA certificates a replica's TLS Secret carries in ``ca.crt`` (its trust bundle)."""
    pem = secret_bytes(secret, CA_CERT_KEY)
    if pem is None:
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the certificate (DER), hex: public, safe to log and compare."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def fingerprints(certificates: Sequence[x509.Certificate]) -> frozenset[str]:
    return frozenset(fingerprint(cert) for cert in certificates)


def bundle_pem(certificates: Sequence[x509.Certificate]) -> bytes:
    """The certificates as one PEM file, duplicates dropped, order kept."""
    seen: dict[str, bytes] = {}
    for cert in certificates:
        seen.setdefault(fingerprint(cert), cert.public_bytes(serialization.Encoding.PEM))
    return b"".join(seen.values())


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    if cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def issuer_among(cert: x509.Certificate | None,
                 cas: Sequence[x509.Certificate]) -> str | None:
    """Fingerprint of the CA in ``cas`` that signed ``cert``; None when none did."""
    if cert is None:
        return None
    for ca in cas:
        if signed_by(cert, ca):
            return fingerprint(ca)
    return None


def cert_from_secret(secret: Mapping[str, Any] | None) -> x509.Certificate | None:
    pem = secret_bytes(secret, TLS_CERT_KEY)
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
    if not signed_by(cert, ca.cert):
        return "issuer"
    if _hosts_of(cert) != frozenset(hosts):
        return "hosts"
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    if cert.not_valid_after_utc - now < lifetime * RENEW_WHEN_LEFT:
        return "expiring"
    return None


def replica_secret_reason(secret: Mapping[str, Any] | None, ca: certs.Issued,
                          trust: Sequence[x509.Certificate], hosts: Sequence[str],
                          now: dt.datetime) -> str | None:
    """Why a replica's TLS Secret must be written now: a ``renewal_reason`` of its certificate
    (then re-issued by ``ca``, the signing CA), else ``trust`` when its ``ca.crt`` is not the
    current trust bundle (then only ``ca.crt`` is rewritten); None while it is good."""
    reason = renewal_reason(cert_from_secret(secret), ca, hosts, now)
    if reason is not None:
        return reason
    if fingerprints(trust_from_secret(secret)) != fingerprints(list(trust) or [ca.cert]):
        return "trust"
    return None


def ca_renewal_reason(ca: certs.Issued | None, now: dt.datetime) -> str | None:
    if ca is None:
        return "missing"
    lifetime = ca.cert.not_valid_after_utc - ca.cert.not_valid_before_utc
    if ca.cert.not_valid_after_utc - now < lifetime * RENEW_WHEN_LEFT:
        return "expiring"
    return None


# --- issuing and manifests ---------------------------------------------------------------------
def new_crew_ca(crew: CrewRef, lifetime: dt.timedelta = CA_LIFETIME) -> certs.Issued:
    """A new CA for the Crew. Its name starts with a random tag, so the old and the new CA of
    a rotation never share a subject inside one trust bundle; cut to the 64 characters a
    common name may have (long namespace and Crew names)."""
    name = f"crewfence {secrets.token_hex(4)} {crew.namespace}/{crew.name}"
    return certs.new_ca(name[:64], lifetime=lifetime)


def issue_serving(ca: certs.Issued, hosts: Sequence[str],
                  lifetime: dt.timedelta = LEAF_LIFETIME) -> certs.Issued:
    # The names live in the SANs (what is verified); the common name is a label that X.509
    # caps at 64 characters, which a pod's DNS name under a long namespace exceeds.
    return certs.issue(ca, hosts[0][:64], hosts=hosts, server=True, lifetime=lifetime)


def issue_operator_client(ca: certs.Issued,
                          lifetime: dt.timedelta = LEAF_LIFETIME) -> certs.Issued:
    return certs.issue(ca, OPERATOR_CLIENT_NAME, server=False, client=True,
                       lifetime=lifetime)


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


def client_tls_secret(crew: CrewRef, client: certs.Issued,
                      trust: Sequence[x509.Certificate]) -> dict[str, Any]:
    """``kubernetes.io/tls`` Secret: a client certificate and key of the Crew's CA and, as
    ``ca.crt``, the bundle that verifies the replicas (the keys cert-manager writes too)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(crew, operator_client_secret_name(crew.name), crew_labels(crew)),
        "type": "kubernetes.io/tls",
        "data": {TLS_CERT_KEY: _b64(client.cert_pem), TLS_KEY_KEY: _b64(client.key_pem),
                 CA_CERT_KEY: _b64(bundle_pem(list(trust)))},
    }


def replica_tls_secret(crew: CrewRef, ordinal: int, ca: certs.Issued,
                       leaf: certs.Issued,
                       trust: Sequence[x509.Certificate] = ()) -> dict[str, Any]:
    """``kubernetes.io/tls`` Secret the replica mounts: its certificate, key and, as
    ``ca.crt``, the CAs whose client certificates it accepts (``trust``; default: ``ca``)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(crew, replica_tls_secret_name(crew.name, ordinal),
                                replica_labels(crew, ordinal)),
        "type": "kubernetes.io/tls",
        "data": {TLS_CERT_KEY: _b64(leaf.cert_pem), TLS_KEY_KEY: _b64(leaf.key_pem),
                 CA_CERT_KEY: _b64(bundle_pem(list(trust) or [ca.cert]))},
    }


@dataclass(frozen=True)
class ReplicaIssue:
    """How a replica's Secret should look now: certificates by ``ca`` for ``hosts``, valid
    for ``lifetime``, and ``trust`` as its ``ca.crt``."""

    ca: certs.Issued
    trust: tuple[x509.Certificate, ...]
    hosts: tuple[str, ...]
    now: dt.datetime
    lifetime: dt.timedelta = LEAF_LIFETIME


def desired_replica_secret(crew: CrewRef, ordinal: int, existing: Mapping[str, Any] | None,
                           want: ReplicaIssue) -> tuple[str, dict[str, Any]] | None:
    """The replica's TLS Secret to write and why (``replica_secret_reason``), or None while
    ``existing`` is good. Only the bundle changed (``trust``): the certificate and key stay."""
    return _desired_tls_secret(existing, want, lambda: replica_tls_secret(
        crew, ordinal, want.ca, issue_serving(want.ca, want.hosts, want.lifetime), want.trust))


def desired_client_secret(crew: CrewRef, existing: Mapping[str, Any] | None,
                          want: ReplicaIssue) -> tuple[str, dict[str, Any]] | None:
    """The Crew's client-certificate Secret (``operator_client_secret_name``) to write and
    why, or None while ``existing`` is good: a client certificate of the signing CA (no host
    names: ``want.hosts`` is empty) and the trust bundle, as for a replica.

    Invariant (least exposure): what ``kubectl crewfence explain`` needs to talk to the
    replicas is readable without the CA's key, so a person who may inspect sidecars is not
    also able to issue serving certificates that the operator would trust.
    """
    return _desired_tls_secret(existing, want, lambda: client_tls_secret(
        crew, issue_operator_client(want.ca, want.lifetime), want.trust or (want.ca.cert,)))


def _desired_tls_secret(existing: Mapping[str, Any] | None, want: ReplicaIssue,
                        fresh: Callable[[], dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    reason = replica_secret_reason(existing, want.ca, want.trust, want.hosts, want.now)
    if reason is None:
        return None
    if reason == "trust" and existing is not None:
        body = {**existing, "metadata": dict(existing.get("metadata") or {}),
                "data": {**(existing.get("data") or {}),
                         CA_CERT_KEY: _b64(bundle_pem(want.trust or (want.ca.cert,)))}}
        return reason, body
    return reason, fresh()


# --- the operator's client side ------------------------------------------------------------------
def client_ssl_context(ca: certs.Issued, client: certs.Issued,
                       trust: Sequence[x509.Certificate] = ()) -> ssl.SSLContext:
    """Verify replicas against the Crew's trust bundle (``trust``, default the CA itself; the
    name is checked per call via ``server_hostname``) and present ``client``."""
    return client_context_from_pem(bundle_pem(list(trust) or [ca.cert]), client.cert_pem,
                                   client.key_pem)


def client_context_from_pem(trust_pem: bytes, cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """The operator's client context: presents ``cert_pem``/``key_pem`` and trusts ONLY the
    certificates in ``trust_pem``.

    Invariant (only the Crew's CA): no system trust store is loaded, so a certificate that a
    public CA issued for ``<pod>.<crew>.<ns>.svc`` opens no replica; hostnames are checked.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED + check_hostname, no CAs
    ctx.load_verify_locations(cadata=trust_pem.decode("ascii"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files only: a private directory that lives for this call.
    with tempfile.TemporaryDirectory(prefix="crewfence-client-") as tmp:
        cert_path, key_path = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        Path(cert_path).write_bytes(cert_pem)
        certs.write_private(Path(key_path), key_pem)
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
    """The operator's TLS material for one Crew: a client certificate of the signing CA
    (``ca``) and verification against the trust bundle; cached per CA and bundle, renewed
    before expiry."""

    ca: certs.Issued
    client: certs.Issued
    context: ssl.SSLContext
    trust: tuple[x509.Certificate, ...] = ()

    @classmethod
    def for_ca(cls, ca: certs.Issued, trust: Sequence[x509.Certificate] = (),
               lifetime: dt.timedelta = LEAF_LIFETIME) -> CrewClientTLS:
        bundle = tuple(trust) or (ca.cert,)
        client = issue_operator_client(ca, lifetime)
        return cls(ca=ca, client=client, context=client_ssl_context(ca, client, bundle),
                   trust=bundle)

    def still_good(self, ca: certs.Issued, now: dt.datetime,
                   trust: Sequence[x509.Certificate] = ()) -> bool:
        return (self.ca.cert == ca.cert
                and fingerprints(self.trust) == fingerprints(list(trust) or [ca.cert])
                and renewal_reason(self.client.cert, ca, [], now) is None)

    @property
    def client_issuer(self) -> str:
        """Fingerprint of the CA that signed the client certificate this material presents."""
        return fingerprint(self.ca.cert)

    @property
    def trusted(self) -> frozenset[str]:
        """Fingerprints of the CAs whose serving certificates this material accepts."""
        return fingerprints(self.trust)
