"""Test PKI for the mutual-TLS component tests: a Crew CA, another CA, certificates as files.

The certificates come from the operator's own issuing code
(``crewfence_operator.transport.certs``), so these tests also exercise what the operator writes
into a Crew's Secret.
"""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from crewfence_operator.transport import certs
from cryptography import x509


@dataclass(frozen=True)
class ClientFiles:
    cert: Path
    key: Path


def write_pem(path: Path, data: bytes, private: bool = False) -> Path:
    if private:
        certs.write_private(path, data)
    else:
        path.write_bytes(data)
    return path


def client_files(directory: Path, ca: certs.Issued, name: str) -> ClientFiles:
    leaf = certs.issue(ca, name, server=False, client=True)
    directory.mkdir(parents=True, exist_ok=True)
    return ClientFiles(cert=write_pem(directory / f"{name}.crt", leaf.cert_pem),
                       key=write_pem(directory / f"{name}.key", leaf.key_pem, private=True))


class ProjectedDir:
    """A folder written the way the kubelet writes a Secret volume: ``name -> ..data/name``,
    ``..data`` a symlink swapped atomically to a fresh timestamped folder on every update."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def write(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        stamp = self.root / f"..gen{self.generation}"
        stamp.mkdir(mode=0o700)
        for name, data in files.items():
            certs.write_private(stamp / name, data)
        link = self.root / "..data_tmp"
        link.symlink_to(stamp.name)
        os.replace(link, self.root / "..data")
        for name in files:
            visible = self.root / name
            if not visible.is_symlink():
                visible.symlink_to(f"..data/{name}")

    def path(self, name: str) -> Path:
        return self.root / name


def serving_files(ca: certs.Issued, hosts: list[str]) -> dict[str, bytes]:
    leaf = certs.issue(ca, hosts[0], hosts=hosts, server=True)
    return {"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem, "ca.crt": ca.cert_pem}


def client_context(ca_file: Path, client: ClientFiles | None) -> ssl.SSLContext:
    """What the operator uses: verify the server against the Crew CA (and its name)."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if client is not None:
        ctx.load_cert_chain(client.cert, client.key)
    return ctx


def served_certificate(port: int, ctx: ssl.SSLContext, host: str = "127.0.0.1") -> x509.Certificate:
    """The certificate the server presents on a fresh handshake."""
    with socket.create_connection((host, port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)
