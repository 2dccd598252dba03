"""Carry out ``transport/cert_manager.py``'s decisions: declare a Crew's Issuers and Certificates,
and build the operator's client TLS from the Secret cert-manager writes for it.

Blocking Kubernetes calls: run the sync functions in a thread (``children.ensure`` already
runs in one). Invariants (named in ``transport/cert_manager.py``): the same Secret names and files
as the operator's own source; one CA per Crew that keeps its key; objects owned by the Crew;
updated only where the operator's fields differ. Keys are never logged.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from crewfence_operator import kube
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.transport import cert_manager as cm
from crewfence_operator.transport import pki

log = logging.getLogger("crewfence.operator.cert_manager")

class CertManagerUnavailable(RuntimeError):
    """cert-manager's API is not served (its CRDs are not installed): the user must fix it."""


CLIENT_CACHE_SECONDS: Final = 30.0
"""How long the operator uses its client TLS before reading the Secret again (a renewed
client certificate is picked up within this; the old one stays valid until it expires)."""


def _get(namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    try:
        obj = kube.custom().get_namespaced_custom_object(
            cm.GROUP, cm.VERSION, namespace, cm.PLURALS[kind], name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(obj) if isinstance(obj, Mapping) else None


def _apply_one(namespace: str, desired: dict[str, Any]) -> str | None:
    kind, name = desired["kind"], desired["metadata"]["name"]
    existing = _get(namespace, kind, name)
    action = cm.spec_drift(existing, desired)
    if action is None:
        return None
    api, plural = kube.custom(), cm.PLURALS[kind]
    try:
        if existing is None:
            api.create_namespaced_custom_object(cm.GROUP, cm.VERSION, namespace, plural, desired)
        else:
            body = dict(existing)
            body["spec"] = cm.merged_spec(existing, desired)
            api.replace_namespaced_custom_object(cm.GROUP, cm.VERSION, namespace, plural, name,
                                                 body)
    except ApiException as exc:
        if exc.status == 409:
            return None  # created or changed meanwhile: judged on the next pass
        if exc.status == 404 and existing is None:
            raise CertManagerUnavailable(
                f"cert-manager is not installed: the API server does not serve "
                f"{plural}.{cm.GROUP}/{cm.VERSION} (certificate source cert-manager)") from None
        raise
    return f"{kind}/{name}:{action}"


def ensure(crew: CrewRef, ordinals: Iterable[int], pods: Mapping[int, Mapping[str, Any]],
           settings: cm.CertManagerSettings) -> list[str]:
    """Create or update the Crew's cert-manager objects; returns ``Kind/name:action`` for each
    write (nothing is written while everything is as wanted)."""
    ips = {o: _pod_ip(p) for o, p in pods.items()}
    written = [w for obj in cm.desired_objects(crew, ordinals, ips, settings)
               if (w := _apply_one(crew.namespace, obj)) is not None]
    if written:
        log.info("cert-manager objects of Crew %s/%s: %s", crew.namespace, crew.name,
                 ", ".join(written))
    return written


def _pod_ip(pod: Mapping[str, Any] | None) -> str | None:
    ip = ((pod or {}).get("status") or {}).get("podIP")
    return str(ip) if ip else None


# --- the operator's side of the connection --------------------------------------------------------
@dataclass
class ClientTLS:
    """The operator's TLS for one Crew, from the Secret cert-manager keeps current: trust its
    ``ca.crt``, present its ``tls.crt``/``tls.key``."""

    resource_version: str
    context: ssl.SSLContext = field(repr=False)


def client_context(ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    return pki.client_context_from_pem(ca_pem, cert_pem, key_pem)


def client_tls_from_secret(secret: Mapping[str, Any] | None) -> ClientTLS | None:
    """None while cert-manager has not written the Secret (completely) yet."""
    if not secret:
        return None
    keys = (pki.CA_CERT_KEY, pki.TLS_CERT_KEY, pki.TLS_KEY_KEY)
    pems = [pki.secret_bytes(secret, k) or None for k in keys]
    ca_pem, cert_pem, key_pem = pems
    if ca_pem is None or cert_pem is None or key_pem is None:
        return None
    try:
        context = client_context(ca_pem, cert_pem, key_pem)
    except (ssl.SSLError, ValueError):
        return None  # a half-written renewal: the next read sees the whole Secret
    version = str((secret.get("metadata") or {}).get("resourceVersion") or "")
    return ClientTLS(resource_version=version, context=context)


_clients: dict[tuple[str, str], tuple[float, ClientTLS | None]] = {}


def _read_client_tls(namespace: str, crew: str) -> ClientTLS | None:
    key = (namespace, crew)
    try:
        secret = kube.to_dict(kube.core().read_namespaced_secret(
            cm.operator_client_name(crew), namespace))
    except ApiException as exc:
        if exc.status != 404:
            raise
        secret = None
    previous = _clients.get(key)
    version = str(((secret or {}).get("metadata") or {}).get("resourceVersion") or "")
    material = previous[1] if previous is not None else None
    if material is None or material.resource_version != version:
        material = client_tls_from_secret(secret)
    _clients[key] = (time.monotonic() + CLIENT_CACHE_SECONDS, material)
    return material


async def client_tls(namespace: str, crew: str) -> ClientTLS | None:
    """The operator's client TLS for this Crew; None while cert-manager has not issued it
    (then nothing is sent)."""
    cached = _clients.get((namespace, crew))
    if cached is not None and cached[1] is not None and cached[0] > time.monotonic():
        return cached[1]
    return await asyncio.to_thread(_read_client_tls, namespace, crew)


def endpoint_tls(material: ClientTLS | None, namespace: str, crew: str,
                 ordinal: int) -> dict[str, Any]:
    """Keyword arguments for ``sidecar_client.Endpoint``: the context and the replica name
    to verify (empty while there is no client certificate)."""
    if material is None:
        return {}
    return {"ssl_context": material.context,
            "server_name": pki.replica_dns_name(CrewRef(crew, namespace, ""), ordinal)}
