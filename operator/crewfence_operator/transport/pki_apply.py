"""Carry out ``pki.py``'s and ``ca_rotation.py``'s decisions against the API server:
the Crew CA Secret (and its rotation), each replica's TLS Secret, and the operator's client
TLS per Crew (cached in memory, dropped whenever this process rewrites the CA Secret).

Blocking Kubernetes calls: call the sync functions from a thread (``asyncio.to_thread``), as
``children.ensure`` already runs. Invariants (named in ``pki.py``): one CA per Crew kept in a
Secret the Crew owns; certificates re-issued before expiry or when their names change; keys are
never logged; the CA rotation's invariants are named in ``ca_rotation.py``.

Where certificates come from is behind ``ensure_ca_state`` (the CA and trust bundle) and
``ensure_replica_secrets`` (the replicas' certificates).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from kubernetes.client.exceptions import ApiException

from crewfence_operator import config, kube
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.sidecar_client import Endpoint, SidecarClient, SidecarFailure, Timeouts
from crewfence_operator.transport import ca_rotation, certs, pki

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


@dataclass(frozen=True)
class Lifetimes:
    ca: dt.timedelta
    leaf: dt.timedelta

    @classmethod
    def current(cls) -> Lifetimes:
        cfg = config.current()
        return cls(ca=dt.timedelta(seconds=cfg.ca_lifetime_seconds),
                   leaf=dt.timedelta(seconds=cfg.leaf_lifetime_seconds))


def ensure_ca_state(crew: CrewRef) -> ca_rotation.CaState:
    """The Crew's CA Secret as a rotation state: read, created when absent. A racing creator
    wins and its CA is used (the create answers 409; the Secret is read back)."""
    name = pki.ca_secret_name(crew.name)
    state = ca_rotation.CaState.from_secret(_read_secret(crew.namespace, name))
    if state is not None:
        return state
    fresh = pki.new_crew_ca(crew, Lifetimes.current().ca)
    if kube.create_if_absent(pki.ca_secret(crew, fresh)):
        log.info("created the CA of Crew %s/%s", crew.namespace, crew.name)
        return ca_rotation.CaState(signing=fresh)
    again = ca_rotation.CaState.from_secret(_read_secret(crew.namespace, name))
    if again is None:
        raise RuntimeError(f"Secret {crew.namespace}/{name} holds no usable CA; delete it to "
                           "let the operator issue a new one")
    return again


def ensure_ca(crew: CrewRef) -> certs.Issued:
    """The Crew's signing CA (see ``ensure_ca_state``)."""
    return ensure_ca_state(crew).signing


def pod_ip(pod: Mapping[str, Any] | None) -> str | None:
    if not pod:
        return None
    ip = (pod.get("status") or {}).get("podIP")
    return str(ip) if ip else None


def ensure_replica_secrets(crew: CrewRef, ordinals: Iterable[int],
                           pods: Mapping[int, Mapping[str, Any]],
                           state: ca_rotation.CaState | None = None) -> list[str]:
    """Create or re-issue each replica's TLS Secret, and the Crew's client-certificate Secret
    (``pki.desired_client_secret``); returns ``"<ordinal>:<reason>"`` for each replica
    Secret written and ``"client:<reason>"`` for the client one (nothing is written while it
    is good). A certificate is issued by the signing CA; ``ca.crt`` is the trust bundle of
    the CA Secret's state (``state``, read when not given); a Secret whose certificate is good
    but whose bundle is not current keeps its certificate and key and gets the bundle only
    (reason ``trust``)."""
    state = state if state is not None else ensure_ca_state(crew)
    ca, trust = state.signing, state.trust
    lifetimes = Lifetimes.current()
    now = dt.datetime.now(dt.UTC)
    written: list[str] = []
    for ordinal in ordinals:
        name = pki.replica_tls_secret_name(crew.name, ordinal)
        existing = _read_secret(crew.namespace, name)
        hosts = pki.replica_hosts(crew, ordinal, pod_ip(pods.get(ordinal)))
        wanted = pki.desired_replica_secret(crew, ordinal, existing, pki.ReplicaIssue(
            ca=ca, trust=tuple(trust), hosts=tuple(hosts), now=now, lifetime=lifetimes.leaf))
        if wanted is not None and _write_secret(crew, existing, wanted[1]):
            written.append(f"{ordinal}:{wanted[0]}")
    name = pki.operator_client_secret_name(crew.name)
    existing = _read_secret(crew.namespace, name)
    wanted = pki.desired_client_secret(crew, existing, pki.ReplicaIssue(
        ca=ca, trust=tuple(trust), hosts=(), now=now, lifetime=lifetimes.leaf))
    if wanted is not None and _write_secret(crew, existing, wanted[1]):
        written.append(f"client:{wanted[0]}")
    if written:
        log.info("issued certificates for Crew %s/%s: %s", crew.namespace, crew.name,
                 ", ".join(written))
    return written


def _write_secret(crew: CrewRef, existing: Mapping[str, Any] | None,
                  body: dict[str, Any]) -> bool:
    """Create ``body`` or replace ``existing`` with it; False when another pass changed it
    meanwhile (then it is judged again on the next pass)."""
    if existing is None:
        return kube.create_if_absent(body)
    body["metadata"] = {**body["metadata"],
                        "resourceVersion": existing["metadata"]["resourceVersion"]}
    try:
        kube.core().replace_namespaced_secret(body["metadata"]["name"], crew.namespace, body)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


# --- the operator's side of the connection --------------------------------------------------------
_clients: dict[tuple[str, str], tuple[float, pki.CrewClientTLS]] = {}


def _client_tls(namespace: str, crew: str) -> pki.CrewClientTLS | None:
    key = (namespace, crew)
    now = time.monotonic()
    cached = _clients.get(key)
    if cached is not None and cached[0] > now:
        return cached[1]
    state = ca_rotation.CaState.from_secret(
        _read_secret(namespace, pki.ca_secret_name(crew)))
    if state is None:
        return None
    material = cached[1] if cached is not None else None
    if material is None or not material.still_good(state.signing, dt.datetime.now(dt.UTC),
                                                   state.trust):
        material = pki.CrewClientTLS.for_ca(state.signing, state.trust,
                                                 Lifetimes.current().leaf)
    _clients[key] = (now + CLIENT_CACHE_SECONDS, material)
    return material


def forget_client_tls(namespace: str, crew: str) -> None:
    """Drop the cached material: the next call reads the CA Secret again (after this process
    wrote it, so that no call presents or verifies by what the Secret no longer says)."""
    cached = _clients.get((namespace, crew))
    if cached is not None:
        _clients[(namespace, crew)] = (0.0, cached[1])


async def client_tls(namespace: str, crew: str) -> pki.CrewClientTLS | None:
    """The SSL context that trusts this Crew's CA and presents the operator's client
    certificate of it; None while the Crew has no CA yet (then nothing is sent)."""
    key = (namespace, crew)
    cached = _clients.get(key)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    return await asyncio.to_thread(_client_tls, namespace, crew)


def endpoint_tls(material: pki.CrewClientTLS | None, namespace: str, crew: str,
                 ordinal: int) -> dict[str, Any]:
    """Keyword arguments for ``sidecar_client.Endpoint``: the context and the replica name
    to verify (empty when TLS is off)."""
    if material is None:
        return {}
    return {"ssl_context": material.context,
            "server_name": pki.replica_dns_name(CrewRef(crew, namespace, ""), ordinal)}


# --- renewing the CA (ca_rotation.py decides) ----------------------------------------------------
PROBE_ACTION_ID: Final = "crewfence-ca-probe"
PROBE_TIMEOUTS: Final = Timeouts(connect=3.0, read=5.0)
"""A replica that hangs holds the rotation (it has not proved anything), not the pass."""
_probe_material: dict[tuple[str, str], pki.CrewClientTLS] = {}
"""Per (CA fingerprint, bundle fingerprints): the probe's client certificate and context."""


def probe_tls(plan: ca_rotation.ProbePlan) -> pki.CrewClientTLS:
    key = (pki.fingerprint(plan.client_ca.cert),
           ",".join(sorted(pki.fingerprints(plan.verify))))
    material = _probe_material.get(key)
    if material is None:
        if len(_probe_material) > 64:
            _probe_material.clear()
        material = pki.CrewClientTLS.for_ca(plan.client_ca, plan.verify)
        _probe_material[key] = material
    return material


async def probe_replica(session: aiohttp.ClientSession, address: str | None,
                        token: str | None, material: pki.CrewClientTLS,
                        server_name: str) -> bool:
    """A request over a fresh handshake with the probe's material: answered (a 404 for the
    probe's action id counts) means the replica took the handshake both ways."""
    if address is None or not token:
        return False
    client = SidecarClient(session, Endpoint(address, token, ssl_context=material.context,
                                             server_name=server_name), PROBE_TIMEOUTS)
    try:
        await client.get_job(PROBE_ACTION_ID)
    except SidecarFailure:
        return False
    return True


def _observe_replicas(crew: CrewRef, state: ca_rotation.CaState,
                      ordinals: Iterable[int]) -> dict[int, tuple[frozenset[str], str | None]]:
    cas = state.trust
    seen: dict[int, tuple[frozenset[str], str | None]] = {}
    for ordinal in ordinals:
        secret = _read_secret(crew.namespace, pki.replica_tls_secret_name(crew.name,
                                                                                ordinal))
        seen[ordinal] = (pki.fingerprints(pki.trust_from_secret(secret)),
                         pki.issuer_among(pki.cert_from_secret(secret), cas))
    return seen


def _write_ca_state(crew: CrewRef, secret: Mapping[str, Any],
                    step: ca_rotation.CaStep) -> bool:
    meta = secret["metadata"]
    body = {"apiVersion": "v1", "kind": "Secret",
            "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}),
                                                  **step.annotations}},
            "type": secret.get("type") or "Opaque", "data": step.state.data()}
    try:
        kube.core().replace_namespaced_secret(meta["name"], crew.namespace, body)
    except ApiException as exc:
        if exc.status == 409:
            return False  # changed meanwhile: decided again on the next pass
        raise
    return True


_waiting: dict[tuple[str, str], str] = {}
"""Per Crew: what the rotation waited for at the last pass (logged when it changes)."""
_settled: dict[tuple[str, str], tuple[str | None, str]] = {}
"""Per Crew: (rotation id, signing CA fingerprint) of the stable CA Secret last read."""


def _quiet(crew: CrewRef, requested: str | None, now: dt.datetime) -> bool:
    """True when nothing can be due, judged without reading the CA Secret: it was stable at
    the last read, no new request, and the operator's material (re-read from the Secret at
    least every ``CLIENT_CACHE_SECONDS``) still shows that CA alone, not expiring. Spares a
    Secret read per daemon pass; the decision itself always reads the Secret."""
    key = (crew.namespace, crew.name)
    hint, cached = _settled.get(key), _clients.get(key)
    if hint is None or cached is None:
        return False
    rotation_id, signing = hint
    material = cached[1]
    if material.client_issuer != signing or material.trusted != {signing}:
        return False
    if requested and requested != rotation_id:
        return False
    return pki.ca_renewal_reason(material.ca, now) is None


@dataclass(frozen=True)
class RotationContext:
    """What one pass of the Crew daemon hands the CA rotation."""

    crew: CrewRef
    crew_annotations: Mapping[str, str]
    ordinals: tuple[int, ...]
    pods: Mapping[int, Mapping[str, Any]]
    addresses: Mapping[int, str | None]
    token: str | None


async def advance_ca_rotation(session: aiohttp.ClientSession,
                              ctx: RotationContext) -> ca_rotation.CaStep | None:
    """One step of a CA rotation, if one is due or under way; the step written, else None.

    Before deciding, the replicas' Secrets are brought to the CA Secret's current state (so a
    step never waits for the daemon's next full pass)."""
    crew = ctx.crew
    now = dt.datetime.now(dt.UTC)
    requested = ctx.crew_annotations.get(ca_rotation.ROTATE_ANNOTATION)
    if _quiet(crew, requested, now):
        return None
    name = pki.ca_secret_name(crew.name)
    secret = await asyncio.to_thread(_read_secret, crew.namespace, name)
    state = ca_rotation.CaState.from_secret(secret)
    if secret is None or state is None:
        return None
    key = (crew.namespace, crew.name)
    _settled.pop(key, None)
    if state.phase == "stable" and ca_rotation.rotation_due(state, requested, now) is None:
        _settled[key] = (state.rotation_id, pki.fingerprint(state.signing.cert))
        return None
    await asyncio.to_thread(ensure_replica_secrets, crew, ctx.ordinals, ctx.pods, state)
    views = await asyncio.to_thread(_observe_replicas, crew, state, ctx.ordinals)
    plan = ca_rotation.probe_plan(state)
    probes: dict[int, bool | None] = {o: None for o in ctx.ordinals}
    if plan is not None:
        material = await asyncio.to_thread(probe_tls, plan)
        live = [o for o, pod in ctx.pods.items()
                if not (pod.get("metadata") or {}).get("deletionTimestamp")]
        answers = await asyncio.gather(*(
            probe_replica(session, ctx.addresses.get(o), ctx.token, material,
                          pki.replica_dns_name(crew, o)) for o in live))
        probes.update(zip(live, answers, strict=True))
    own = await client_tls(crew.namespace, crew.name)
    obs = ca_rotation.CaObservation(
        ca=state,
        replicas={o: ca_rotation.ReplicaView(trust=trust, leaf_issuer=issuer,
                                             probe=probes.get(o))
                  for o, (trust, issuer) in views.items()},
        operator=(ca_rotation.OperatorView(client_issuer=own.client_issuer,
                                           trusted=own.trusted) if own else None),
        requested=requested, now=now)
    lifetime = Lifetimes.current().ca
    step = ca_rotation.decide(obs, lambda: pki.new_crew_ca(crew, lifetime))
    if step is None:
        waiting = "; ".join(ca_rotation.blockers(obs))
        if waiting and _waiting.get(key) != waiting:  # said once per change, not every pass
            log.info("CA rotation of Crew %s/%s (phase %s) waits: %s", crew.namespace,
                     crew.name, state.phase, waiting)
        _waiting[key] = waiting
        return None
    _waiting.pop(key, None)
    if not await asyncio.to_thread(_write_ca_state, crew, secret, step):
        return None
    forget_client_tls(crew.namespace, crew.name)
    await asyncio.to_thread(ensure_replica_secrets, crew, ctx.ordinals, ctx.pods, step.state)
    log.info("CA rotation of Crew %s/%s: phase %s (%s)", crew.namespace, crew.name,
             step.phase, step.reason)
    return step
