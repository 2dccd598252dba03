"""Certificates made with ``cryptography`` (kopf's helper needs oscrypto, which fails on
OpenSSL 3): the webhook's self-signed CA and serving certificate, and the building blocks of
the per-Crew CA (``new_ca``, ``issue``) for operator <-> sidecar mutual TLS."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path
    ca: Path

    def ca_bytes(self) -> bytes:
        return self.ca.read_bytes()


def _san(names: Iterable[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


@dataclass(frozen=True)
class Issued:
    """A key and its certificate (PEM). ``key_pem`` is a secret: never log or repr it."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())

    def __repr__(self) -> str:
        return f"Issued(subject={self.cert.subject.rfc4514_string()!r})"


def _backdate(lifetime: dt.timedelta) -> dt.timedelta:
    """How far ``not_valid_before`` lies in the past (clock skew between machines): five
    minutes, but at most a tenth of a short lifetime, so "a third of the lifetime left" still
    means what it says for the short lifetimes tests use."""
    return min(dt.timedelta(minutes=5), lifetime / 10)


def new_ca(common_name: str, days: int = 365, *, lifetime: dt.timedelta | None = None) -> Issued:
    """A self-signed CA (EC P-256) that may sign leaf certificates only (path length 0);
    valid for ``lifetime`` when given, else ``days``."""
    now = dt.datetime.now(dt.UTC)
    valid_for = lifetime if lifetime is not None else dt.timedelta(days=days)
    skew = _backdate(valid_for)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - skew)
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def issue(ca: Issued, common_name: str, *, hosts: Iterable[str] = (), server: bool = True,
          client: bool = False, lifetime: dt.timedelta = dt.timedelta(days=365)) -> Issued:
    """A leaf certificate signed by ``ca``: SANs from ``hosts`` (IPs become IP SANs).

    Never valid beyond its CA: ``lifetime`` is cut at the CA's own expiry."""
    now = dt.datetime.now(dt.UTC)
    not_after = min(now + lifetime, ca.cert.not_valid_after_utc)
    skew = _backdate(not_after - now)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + \
        ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - skew)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                       critical=False)
    )
    hosts = list(hosts)
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte (atomic replace)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def generate(directory: Path, hosts: Iterable[str], days: int = 365) -> CertFiles:
    """Write ca.crt, tls.crt and tls.key (mode 0600) for ``hosts`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    hosts = list(hosts)
    ca = new_ca("crewfence webhook CA", days)
    leaf = issue(ca, hosts[0], hosts=hosts, lifetime=dt.timedelta(days=days))
    files = CertFiles(cert=directory / "tls.crt", key=directory / "tls.key",
                      ca=directory / "ca.crt")
    files.ca.write_bytes(ca.cert_pem)
    files.cert.write_bytes(leaf.cert_pem + ca.cert_pem)
    write_private(files.key, leaf.key_pem)
    return files


def existing(directory: Path) -> CertFiles | None:
    """Mounted certificates (e.g. from the chart): tls.crt + tls.key, CA in ca.crt if present."""
    cert, key, ca = directory / "tls.crt", directory / "tls.key", directory / "ca.crt"
    if cert.is_file() and key.is_file():
        return CertFiles(cert=cert, key=key, ca=ca if ca.is_file() else cert)
    return None
