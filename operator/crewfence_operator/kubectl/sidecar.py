"""The assigned replica's own record for ``explain``, asked the way the operator asks it, with
the user's own kube credentials reading what the operator itself uses: the Crew's token
Secret and, with mutual TLS (the default), the Crew's client-certificate Secret (a client
certificate of the Crew's CA and the trust bundle, never the CA's key), falling back to the
CA Secret for an operator that does not write that Secret yet.

Invariants: the replica's certificate is verified against the Crew's CA **and** the
replica's DNS name (never plain HTTP to a Crew that has TLS material); a Secret the user may
not read (403) is said in one line and the status-side evidence is shown without the
sidecar's record; no token or key is ever printed (``SidecarAccess`` does not repr them).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crewjob import supersede
from crewfence_operator.crewjob.replicas import parse_replicas
from crewfence_operator.kubectl.client import Kube
from crewfence_operator.sidecar_client import Endpoint, SidecarClient
from crewfence_operator.transport import cert_manager_apply, pki
from crewfence_operator.transport.ca_rotation import CaState
from crewfence_operator.transport.token_roll import sending_token


class EvidenceUnavailable(Exception):
    """Why the sidecar was not asked: one line, shown as the sidecar's record note."""


@dataclass(frozen=True)
class SidecarAccess:
    """How to reach one replica the way the operator does. Never printed (keys, token)."""

    address: str
    token: str = field(repr=False)
    context: ssl.SSLContext | None = field(default=None, repr=False)
    """Trusts the Crew's CA(s) and presents a client certificate of it; None: plain HTTP."""
    server_name: str | None = None
    """The replica's DNS name its certificate must carry (checked on the connection)."""
    source: str = "plain HTTP (the Crew has no CA)"
    """Where the client certificate came from, in words."""


def secret_refused_note(namespace: str, secret: str, holds: str) -> str:
    """The one line ``explain`` shows when the user's RBAC does not allow reading a Secret."""
    return (f"not asked: you may not read Secret {namespace}/{secret} (403 Forbidden), which "
            f"holds {holds}; showing the CrewJob's own status only")


def _read_secret(kube: Kube, name: str, holds: str) -> dict[str, Any] | None:
    """The Secret's data as ``{"data": {key: base64}}``; None when it does not exist."""
    try:
        secret = kube.core.read_namespaced_secret(name, kube.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        if exc.status == 403:
            raise EvidenceUnavailable(secret_refused_note(kube.namespace, name, holds)) \
                from None
        raise EvidenceUnavailable(f"cannot read Secret {kube.namespace}/{name} "
                                  f"({exc.status})") from None
    return {"data": dict(secret.data or {})}


def client_tls(kube: Kube, crew: str) -> tuple[ssl.SSLContext | None, str]:
    """The client side of mutual TLS with the Crew's sidecars, from the operator's Secrets:
    the Crew's client-certificate Secret (``<crew>-crewfence-operator-client``: a client
    certificate of the Crew's CA and the trust bundle, no CA key; written by the operator or
    by cert-manager), else, from an operator that does not write it yet, the CA Secret
    (``<crew>-crewfence-ca``, from which a client certificate is made here); (None, ...) when
    the Crew has neither (plain HTTP, an operator run with ``CREWFENCE_OPERATOR_SIDECAR_TLS=0``).
    A Secret the user may not read is skipped while the other one can be used; when neither
    can, the first refusal is what ``EvidenceUnavailable`` says."""
    client_name = pki.operator_client_secret_name(crew)
    refused: list[EvidenceUnavailable] = []
    try:
        client_secret = _read_secret(kube, client_name,
                                     "the client certificate for the Crew's sidecars")
    except EvidenceUnavailable as exc:
        client_secret, refused = None, [exc]
    if client_secret is not None:
        issued = cert_manager_apply.client_tls_from_secret(client_secret)
        if issued is None:
            raise EvidenceUnavailable(f"not asked: Secret {kube.namespace}/{client_name} is "
                                      "not completely issued yet")
        return issued.context, "the Crew's client certificate"
    ca_name = pki.ca_secret_name(crew)
    try:
        ca_secret = _read_secret(kube, ca_name, "the Crew's CA (mutual TLS)")
    except EvidenceUnavailable as exc:
        raise (refused[0] if refused else exc) from None
    if ca_secret is not None:
        state = CaState.from_secret(ca_secret)
        if state is None:
            raise EvidenceUnavailable(f"not asked: Secret {kube.namespace}/{ca_name} holds no "
                                      "usable CA")
        material = pki.CrewClientTLS.for_ca(state.signing, state.trust)
        return material.context, "a client certificate of the Crew's CA"
    if refused:
        raise refused[0]
    return None, "plain HTTP (the Crew has no CA)"


def sidecar_access(kube: Kube, crew: Mapping[str, Any], ordinal: int) -> SidecarAccess:
    """The replica's address, the token the operator sends and, when the Crew has TLS
    material, the client context and the name to verify; raises ``EvidenceUnavailable``."""
    name = str(crew["metadata"]["name"])
    token_secret = _read_secret(kube, c.token_secret_name(name), "the Crew's bearer token")
    raw = ((token_secret or {}).get("data") or {}).get(c.TOKEN_SECRET_KEY)
    token = sending_token(base64.b64decode(raw).decode() if raw else None)
    if token is None:
        raise EvidenceUnavailable(f"not asked: Secret {kube.namespace}/"
                                  f"{c.token_secret_name(name)} holds no token")
    context, source = client_tls(kube, name)
    replica = next((r for r in parse_replicas(crew) if r.ordinal == ordinal), None)
    if replica is None or not replica.address:
        raise EvidenceUnavailable(f"replica {ordinal} has no address now")
    server_name = pki.replica_dns_name(CrewRef(name, kube.namespace, ""), ordinal) \
        if context is not None else None
    return SidecarAccess(replica.address, token, context, server_name, source)


def job_access(kube: Kube, obj: Mapping[str, Any]) -> SidecarAccess:
    """How to reach the replica a CrewJob is assigned to; raises ``EvidenceUnavailable``."""
    status = obj.get("status") or {}
    assignment = status.get("assignment") or {}
    if assignment.get("ordinal") is None:
        raise EvidenceUnavailable("no replica was assigned")
    crew_name = str(((obj.get("spec") or {}).get("crewRef") or {}).get("name") or "")
    try:
        crew = kube.api.get_namespaced_custom_object(c.GROUP, c.VERSION, kube.namespace,
                                                     c.CREW_PLURAL, crew_name)
    except ApiException as exc:
        raise EvidenceUnavailable(f"cannot read Crew {crew_name} ({exc.status})") from None
    return sidecar_access(kube, crew, int(assignment["ordinal"]))


def sidecar_client(session: aiohttp.ClientSession, access: SidecarAccess) -> SidecarClient:
    return SidecarClient(session, Endpoint(access.address, access.token,
                                           ssl_context=access.context,
                                           server_name=access.server_name))


def sidecar_evidence(kube: Kube, obj: Mapping[str, Any]) -> tuple[Any, Any, str]:
    try:
        access = job_access(kube, obj)
    except EvidenceUnavailable as exc:
        return None, None, str(exc)
    try:
        return asyncio.run(_fetch(access, supersede.effective_action_id(obj)))
    except Exception as exc:  # transport, TLS verification, a malformed answer: say which
        return None, None, f"the sidecar at {access.address} could not be asked: " \
                           f"{type(exc).__name__}"


async def _fetch(access: SidecarAccess, action_id: str) -> tuple[Any, Any, str]:
    async with aiohttp.ClientSession() as session:
        sidecar = sidecar_client(session, access)
        lookup = await sidecar.get_job(action_id)
        if lookup.record is None:
            return None, None, ("archived (tombstone)" if lookup.tombstone
                                else "the sidecar does not know the action")
        page = await sidecar.events_page(action_id, 0)
        how = (f"over mutual TLS with {access.source}, verified as {access.server_name}"
               if access.context is not None else f"over {access.source}")
        return (lookup.record.to_wire(), [e.to_wire() for e in page.events],
                f"from {access.address} {how}")
