"""Validating admission webhook: the part of the state fence that CEL cannot decide.

The API server fences shared writable state by itself (``admission.py``: two
ValidatingAdmissionPolicies with the Crews as params), also while the operator is down. What is
left for this webhook needs a PersistentVolumeClaim's labels: a pod mounting a claim labelled
``crewfence.dev/role: state`` whose Crew is gone or no longer names it, and a Crew naming such a
claim as ``existingClaim``. It also warns (never denies) when an update moves replica 0 off a
claim that served it (``claim_move_warning``). ``webhooks.yaml``'s matchConditions keep every
other request away (a pod without claims never reaches this server; see the admission request
counter).

Invariants kept here:

- *A failed lookup never denies*: when a claim or the Crews cannot be read (throttling, RBAC of
  a namespaced install, an API outage) the request is admitted with a logged warning; the
  policy, the audit, the journal's flock and ReadWriteOncePod still fence. Only a claim that is
  positively tied to a Crew is ever a reason to deny.
- *Nothing but a decision leaves a handler*: any other exception would make kopf answer 500,
  which the API server treats as a denial, so every unexpected error admits too.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf

from crewfence_operator import admission_install, config, kube, metrics
from crewfence_operator import constants as c
from crewfence_operator.crew.fencing import StateClaimOwner, pod_rejection, state_claim_owner
from crewfence_operator.crew.pod import pod_claims
from crewfence_operator.crew.spec import SHARED_MODES
from crewfence_operator.transport import certs

FORBIDDEN = 403
log = logging.getLogger(__name__)


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


def _admit_unverified(what: str, exc: BaseException) -> None:
    status = getattr(exc, "status", None)
    detail = f"HTTP {status}" if status else type(exc).__name__
    log.warning("crewfence admission: could not read %s (%s); admitted, the policy, audit, "
                "flock and ReadWriteOncePod still fence", what, detail)


async def _crew_problem(spec: Mapping[str, Any], name: str, namespace: str | None) -> str | None:
    problem = crew_access_mode_problem(name, spec)
    if problem:
        return problem
    claim_name = (spec.get("storage") or {}).get("existingClaim")
    if not claim_name or not namespace:
        return None
    try:
        crews, claim = await asyncio.gather(
            asyncio.to_thread(kube.list_crews, namespace),
            asyncio.to_thread(kube.get_claim, namespace, claim_name))
    except Exception as exc:
        _admit_unverified(f'who uses claim "{claim_name}"', exc)
        return None
    return existing_claim_problem(name, claim_name, claim, crews)


def replica_zero_claim(name: str, spec: Mapping[str, Any] | None) -> str:
    """The claim replica 0 of Crew ``name`` uses under ``spec``."""
    existing = ((spec or {}).get("storage") or {}).get("existingClaim")
    return str(existing) if existing else c.claim_name(name, 0)


def claim_move_warning(
    name: str, old: Mapping[str, Any] | None, new_spec: Mapping[str, Any]
) -> str | None:
    """A warning for an update that moves replica 0 off a claim that served it, else None.

    Why a warning and not a denial (docs/reliability.md, "Known gap in the fences"): the move
    is what an ``existingClaim`` edit is for, and a CrewJob that holds its assignment waits
    for the old claim however long. But the old claim keeps its journal unserved: a CrewJob
    of an action recorded there that is deleted and re-applied (a GitOps prune and resync, a
    ``ttlSecondsAfterFinished``) probes only the served claim and runs the action again. So
    the person making the move is told, at the moment it is made, with the records the
    Crew's status last counted there (names and counts only).
    """
    if not old:
        return None
    before = replica_zero_claim(name, old.get("spec"))
    after = replica_zero_claim(name, new_spec)
    if before == after:
        return None
    status = old.get("status") or {}
    # a replica entry on the old claim, or (a Crew scaled to 0) the claim retained with its
    # journal, which a scale back up would have served again
    entries = [*(status.get("replicas") or []), *(status.get("retainedClaims") or [])]
    served = next((r for r in entries if isinstance(r, Mapping) and r.get("ordinal") == 0
                   and r.get("claim") == before), None)
    if served is None:
        return None  # the old claim never served replica 0 as far as the status shows
    held = served.get("retainedRuns")
    holding = f"{held} record(s) and its tombstones" if isinstance(held, int) else "its records"
    return (f'Crew "{name}": replica 0 moves from claim "{before}" to "{after}"; "{before}" '
            f"keeps {holding} but is no longer served. A CrewJob whose action it holds, if "
            f'deleted and applied again, is not found on "{after}" and runs a second time: '
            f'keep such CrewJobs, or serve "{before}" again before re-applying them')


async def validate_crew(
    spec: Mapping[str, Any], name: str | None, namespace: str | None,
    old: Mapping[str, Any] | None = None, warnings: list[str] | None = None, **_: Any
) -> None:
    metrics.observe_admission_request("crews")
    try:
        problem = await _crew_problem(spec, name or "", namespace)
        warning = claim_move_warning(name or "", old, spec)
    except Exception as exc:
        _admit_unverified("the Crew", exc)
        return
    if problem:
        raise kopf.AdmissionError(problem, code=FORBIDDEN)
    if warning and warnings is not None:
        warnings.append(warning)


async def _pod_problem(body: Mapping[str, Any], namespace: str | None) -> str | None:
    claims = pod_claims(dict(body))
    ns = namespace or (body.get("metadata") or {}).get("namespace")
    if not claims or not ns:
        return None
    results = await asyncio.gather(
        *(asyncio.to_thread(kube.get_claim, ns, claim) for claim in claims),
        return_exceptions=True)
    owners: list[StateClaimOwner] = []
    for claim, result in zip(claims, results, strict=True):
        if isinstance(result, BaseException):
            _admit_unverified(f'claim "{claim}"', result)  # this claim: not tied to a Crew
            continue
        owner = state_claim_owner(result) if result is not None else None
        if owner is not None:
            owners.append(owner)
    return pod_rejection(dict(body), owners)


async def validate_pod(body: Mapping[str, Any], namespace: str | None, **_: Any) -> None:
    metrics.observe_admission_request("pods")
    try:
        problem = await _pod_problem(body, namespace)
    except Exception as exc:
        _admit_unverified("the pod's claims", exc)
        return
    if problem:
        raise kopf.AdmissionError(problem, code=FORBIDDEN)


def certificate_files(cfg: config.WebhookConfig) -> certs.CertFiles:
    """Serving certificate: kept in a Secret by the operator (the chart's default), mounted
    (cert-manager), or generated for this process (out of cluster). Blocking."""
    directory = Path(cfg.cert_dir) if cfg.cert_dir else Path(
        tempfile.mkdtemp(prefix="crewfence-webhook-"))
    if cfg.tls_secret:
        return admission_install.keep_certificate(cfg, directory)
    mounted = certs.existing(directory) if cfg.cert_dir else None
    if mounted is not None:
        return mounted
    hosts = [h for h in (cfg.host, cfg.addr, "127.0.0.1", "localhost") if h]
    return certs.generate(directory, hosts)


def make_server(cfg: config.WebhookConfig, files: certs.CertFiles) -> kopf.WebhookServer:
    """kopf's own server with our certificates."""
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


def prepare(cfg: config.OperatorConfig) -> certs.CertFiles | None:
    """Blocking start-up work: the certificate, and out of cluster (managed mode) the same
    policies and scoped webhook configuration the chart installs."""
    if cfg.webhook.mode is config.WebhookMode.OFF:
        return None
    files = certificate_files(cfg.webhook)
    if cfg.webhook.mode is config.WebhookMode.MANAGED:
        admission_install.install_policies(cfg)
        admission_install.install_webhook_configuration(cfg, files)
    return files


def configure(settings: kopf.OperatorSettings, cfg: config.WebhookConfig,
              files: certs.CertFiles | None) -> None:
    """Serve admission; kopf never manages the configuration (ours carries matchConditions and
    a namespace selector, and failurePolicy Ignore, which kopf's managed mode cannot)."""
    if cfg.mode is config.WebhookMode.OFF or files is None:
        return
    settings.admission.server = make_server(cfg, files)
    settings.admission.managed = None
