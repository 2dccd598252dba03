"""Carry out ``crew/tls.py``'s decisions against the API server: the Crew CA Secret, each
replica's TLS Secret, and the operator's client TLS per Crew (cached in memory).

Blocking Kubernetes calls: call the sync functions from a thread (``asyncio.to_thread``), as
``children.ensure`` already runs. Invariants (named in ``crew/tls.py``): one CA per Crew kept
in a Secret the Crew owns; certificates re-issued before expiry or when their names change;
keys are never logged.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from crewfence_operator import certs, kube
from crewfence_operator.crew import tls as crew_tls
from crewfence_operator.crew.identity import CrewRef

log = logging.getLogger("crewfence.operator.tls")

CLIENT_CACHE_SECONDS: Final = 30.0
"""How long the operator trusts its cached view of a Crew's CA before reading the Secret."""


def _read_secret(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.to_dict(kube.core().read_namespaced_secret(name, namespace))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def ensure_ca(crew: CrewRef) -> certs.Issued:
    """The Crew's CA: read from its Secret, created when absent. A racing creator wins and
    its CA is used (the create answers 409; the Secret is read back)."""
    name = crew_tls.ca_secret_name(crew.name)
    ca = crew_tls.ca_from_secret(_read_secret(crew.namespace, name))
    if ca is not None:
        return ca
    fresh = crew_tls.new_crew_ca(crew)
    if kube.create_if_absent(crew_tls.ca_secret(crew, fresh)):
        log.info("created the CA of Crew %s/%s", crew.namespace, crew.name)
        return fresh
    again = crew_tls.ca_from_secret(_read_secret(crew.namespace, name))
    if again is None:
        raise RuntimeError(f"Secret {crew.namespace}/{name} holds no usable CA; delete it to "
                           "let the operator issue a new one")
    return again


def pod_ip(pod: Mapping[str, Any] | None) -> str | None:
    if not pod:
        return None
    ip = (pod.get("status") or {}).get("podIP")
    return str(ip) if ip else None


def ensure_replica_secrets(crew: CrewRef, ordinals: Iterable[int],
                           pods: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """Create or re-issue each replica's TLS Secret; returns ``"<ordinal>:<reason>"`` for each
    certificate written (nothing is written while a certificate is good)."""
    ca = ensure_ca(crew)
    now = dt.datetime.now(dt.UTC)
    written: list[str] = []
    for ordinal in ordinals:
        name = crew_tls.replica_tls_secret_name(crew.name, ordinal)
        existing = _read_secret(crew.namespace, name)
        hosts = crew_tls.replica_hosts(crew, ordinal, pod_ip(pods.get(ordinal)))
        reason = crew_tls.renewal_reason(crew_tls.cert_from_secret(existing), ca, hosts, now)
        if reason is None:
            continue
        body = crew_tls.replica_tls_secret(crew, ordinal, ca, crew_tls.issue_serving(ca, hosts))
        if existing is None:
            if not kube.create_if_absent(body):
                continue  # another pass created it meanwhile: judged on the next pass
        else:
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            try:
                kube.core().replace_namespaced_secret(name, crew.namespace, body)
            except ApiException as exc:
                if exc.status == 409:
                    continue  # changed meanwhile: judged on the next pass
                raise
        written.append(f"{ordinal}:{reason}")
    if written:
        log.info("issued serving certificates for Crew %s/%s: %s", crew.namespace, crew.name,
                 ", ".join(written))
    return written


# --- the operator's side of the connection --------------------------------------------------------
_clients: dict[tuple[str, str], tuple[float, crew_tls.CrewClientTLS]] = {}


def _client_tls(namespace: str, crew: str) -> crew_tls.CrewClientTLS | None:
    key = (namespace, crew)
    now = time.monotonic()
    cached = _clients.get(key)
    if cached is not None and cached[0] > now:
        return cached[1]
    ca = crew_tls.ca_from_secret(_read_secret(namespace, crew_tls.ca_secret_name(crew)))
    if ca is None:
        return None
    material = cached[1] if cached is not None else None
    if material is None or not material.still_good(ca, dt.datetime.now(dt.UTC)):
        material = crew_tls.CrewClientTLS.for_ca(ca)
    _clients[key] = (now + CLIENT_CACHE_SECONDS, material)
    return material


async def client_tls(namespace: str, crew: str) -> crew_tls.CrewClientTLS | None:
    """The SSL context that trusts this Crew's CA and presents the operator's client
    certificate of it; None while the Crew has no CA yet (then nothing is sent)."""
    key = (namespace, crew)
    cached = _clients.get(key)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    return await asyncio.to_thread(_client_tls, namespace, crew)


def endpoint_tls(material: crew_tls.CrewClientTLS | None, namespace: str, crew: str,
                 ordinal: int) -> dict[str, Any]:
    """Keyword arguments for ``sidecar_client.Endpoint``: the context and the replica name
    to verify (empty when TLS is off)."""
    if material is None:
        return {}
    return {"ssl_context": material.context,
            "server_name": crew_tls.replica_dns_name(CrewRef(crew, namespace, ""), ordinal)}
