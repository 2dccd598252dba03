"""Validating admission: no shared writable state.

Rejects (1) a Crew asking for ReadWriteMany/ReadOnlyMany state, (2) a Crew naming an existing
claim that another Crew already uses, (3) any Pod other than the operator's own replica pod
that mounts a claim labelled ``crewfence.dev/role: state``. Only ``kopf.AdmissionError`` leaves
these handlers (anything else would answer 500); when a check itself cannot be completed the
request is refused with the reason, never admitted on a guess.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf

from crewfence_operator import certs, config, kube
from crewfence_operator import constants as c
from crewfence_operator.crew.fencing import StateClaimOwner, pod_rejection, state_claim_owner
from crewfence_operator.crew.pod import pod_claims
from crewfence_operator.crew.spec import SHARED_MODES

FORBIDDEN = 403


def _lookup_failed(what: str, exc: BaseException) -> kopf.AdmissionError:
    status = getattr(exc, "status", None)
    detail = f"HTTP {status}" if status else type(exc).__name__
    return kopf.AdmissionError(
        f"crewfence could not verify {what} ({detail}); refusing rather than risk shared "
        f"writable state, retry shortly", code=503)


def crew_access_mode_problem(name: str, spec: Mapping[str, Any]) -> str | None:
    mode = (spec.get("storage") or {}).get("accessMode")
    if mode in SHARED_MODES:
        return (
            f'Crew "{name}": storage.accessMode {mode} is not allowed: each replica\'s journal '
            f"must have exactly one writer, so state claims must be ReadWriteOncePod (default) "
            f"or ReadWriteOnce"
        )
    return None


def existing_claim_problem(
    name: str, claim_name: str, claim: Mapping[str, Any] | None,
    crews: list[Mapping[str, Any]],
) -> str | None:
    for other in crews:
        other_name = (other.get("metadata") or {}).get("name")
        if other_name == name:
            continue
        other_claim = ((other.get("spec") or {}).get("storage") or {}).get("existingClaim")
        if other_claim == claim_name:
            return (
                f'Crew "{name}": storage.existingClaim "{claim_name}" is already used by Crew '
                f'"{other_name}"; two Crews on one claim would write one journal twice'
            )
    owner = state_claim_owner(claim) if claim else None
    if owner is not None and owner.crew and owner.crew != name:
        return (
            f'Crew "{name}": storage.existingClaim "{claim_name}" already holds the state of '
            f'Crew "{owner.crew}" replica {owner.ordinal}; two Crews on one claim would write '
            f"one journal twice"
        )
    return None


async def validate_crew(
    spec: Mapping[str, Any], name: str | None, namespace: str | None, **_: Any
) -> None:
    crew_name = name or ""
    problem = crew_access_mode_problem(crew_name, spec)
    if problem:
        raise kopf.AdmissionError(problem, code=FORBIDDEN)
    claim_name = (spec.get("storage") or {}).get("existingClaim")
    if not claim_name or not namespace:
        return
    try:
        crews, claim = await asyncio.gather(
            asyncio.to_thread(kube.list_crews, namespace),
            asyncio.to_thread(kube.get_claim, namespace, claim_name))
    except Exception as exc:
        raise _lookup_failed(f'who uses claim "{claim_name}"', exc) from None
    problem = existing_claim_problem(crew_name, claim_name, claim, crews)
    if problem:
        raise kopf.AdmissionError(problem, code=FORBIDDEN)


async def validate_pod(body: Mapping[str, Any], namespace: str | None, **_: Any) -> None:
    claims = pod_claims(dict(body))
    if not claims:
        return
    ns = namespace or (body.get("metadata") or {}).get("namespace")
    if not ns:
        raise kopf.AdmissionError("crewfence could not tell the pod's namespace", code=400)
    try:
        objects = await asyncio.gather(
            *(asyncio.to_thread(kube.get_claim, ns, claim) for claim in claims))
    except Exception as exc:
        raise _lookup_failed(f"the claims {claims} of this pod", exc) from None
    owners: list[StateClaimOwner] = [
        owner for obj in objects if obj is not None
        for owner in [state_claim_owner(obj)] if owner is not None
    ]
    problem = pod_rejection(dict(body), owners)
    if problem:
        raise kopf.AdmissionError(problem, code=FORBIDDEN)


def make_server(cfg: config.WebhookConfig) -> kopf.WebhookServer:
    """kopf's own server with our certificates (mounted ones, else freshly generated)."""
    files = certs.existing(Path(cfg.cert_dir)) if cfg.cert_dir else None
    if files is None:
        directory = Path(cfg.cert_dir) if cfg.cert_dir else Path(
            tempfile.mkdtemp(prefix="crewfence-webhook-"))
        hosts = [h for h in (cfg.host, cfg.addr, "127.0.0.1", "localhost") if h]
        files = certs.generate(directory, hosts)
    return kopf.WebhookServer(
        addr=cfg.addr, port=cfg.port, host=cfg.host, certfile=str(files.cert),
        pkeyfile=str(files.key), cadata=files.ca_bytes())


def register(registry: kopf.OperatorRegistry | None = None) -> None:
    """Register the validating handlers (only when a webhook server will run: kopf refuses to
    start with admission handlers and no server)."""
    kopf.on.validate(c.GROUP, c.VERSION, c.CREW_PLURAL, id=c.WEBHOOK_CREW_ID,
                     operations=["CREATE", "UPDATE"], registry=registry)(validate_crew)
    kopf.on.validate("", "v1", "pods", id=c.WEBHOOK_POD_ID, operations=["CREATE"],
                     registry=registry)(validate_pod)


def configure(settings: kopf.OperatorSettings, cfg: config.WebhookConfig) -> None:
    if cfg.mode is config.WebhookMode.OFF:
        return
    settings.admission.server = make_server(cfg)
    if cfg.mode is config.WebhookMode.MANAGED:
        settings.admission.managed = cfg.config_name
