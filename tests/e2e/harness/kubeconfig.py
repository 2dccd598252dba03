"""Kubeconfig files for the local cluster (admin client certificate, or a bearer token)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write(
    path: Path,
    *,
    server: str,
    ca_cert: Path,
    user: dict[str, str],
    user_name: str = "admin",
) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "crewfence-e2e",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [{"name": user_name, "user": user}],
        "contexts": [
            {"name": "crewfence-e2e", "context": {"cluster": "crewfence-e2e", "user": user_name}}
        ],
        "current-context": "crewfence-e2e",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def write_admin(path: Path, *, server: str, ca_cert: Path, cert: Path, key: Path) -> Path:
    user = {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
    return write(path, server=server, ca_cert=ca_cert, user=user)


def write_token(path: Path, *, server: str, ca_cert: Path, token: str, user_name: str) -> Path:
    return write(path, server=server, ca_cert=ca_cert, user={"token": token}, user_name=user_name)
