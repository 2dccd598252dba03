"""Crew reconciliation: children on create/update/resume, and one async daemon per Crew that
keeps pods present, rolls them on spec changes, scales down safely, audits shared state and
writes the status the CrewJob handler dispatches by."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import kopf
from crewfence_sidecar.contract import Tombstone

from crewfence_operator import config, kube, metrics
from crewfence_operator import constants as c
from crewfence_operator.assignment import choose_ordinal
from crewfence_operator.crew import audit, children
from crewfence_operator.crew.fencing import ForeignMount
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.model_credentials import decide as credentials_verdict
from crewfence_operator.crew.model_credentials import reported_states
from crewfence_operator.crew.pod import PodSettings
from crewfence_operator.crew.probe import fetch_health
from crewfence_operator.crew.resources import claim_for_ordinal
from crewfence_operator.crew.scaledown import (
    HANDED_OVER_ANNOTATION,
    Decision,
    ExcessReplica,
    decide,
    handed_over_mark,
    needs_undrain,
    retention_due,
)
from crewfence_operator.crew.spec import CrewSpec, SpecError, parse_spec
from crewfence_operator.crew.status import (
    CrewObservation,
    Health,
    ReplicaObservation,
    crew_status,
    health_of_pod,
    pod_address,
    pod_is_ready,
)
from crewfence_operator.crew.template import pod_template_hash
from crewfence_operator.crew.tool_servers import CHECK_SECONDS as TOOLS_CHECK_SECONDS
from crewfence_operator.crew.tool_servers import decide as tools_verdict
from crewfence_operator.crew.tool_servers import probe as probe_tools
from crewfence_operator.sidecar_client import Endpoint, SidecarClient, SidecarFailure
from crewfence_operator.transport import cert_source, pki_apply, token_roll

TlsFor = Callable[[int], dict[str, Any]]
"""Endpoint TLS arguments per replica ordinal (empty when sidecar TLS is off)."""

FULL_ENSURE_SECONDS = 60.0
"""How often the daemon re-checks the Secret, Service and ConfigMap without a spec change."""

POD_INDEX = "crewfence_pods"
"""The pod index's id: kopf passes it to every handler as the keyword argument of that name."""
PodIndex = kopf.Index[str, dict[str, Any]]
"""Namespace -> the pods :func:`children.pod_index_entry` keeps (see :func:`crewfence_pods`)."""

_wakers: dict[str, asyncio.Event] = {}


def wake(key: str) -> None:
    """Make the Crew's daemon run its next pass now instead of at its next interval."""
    event = _wakers.get(key)
    if event is not None:
        event.set()


def pod_settings(cfg: config.OperatorConfig) -> PodSettings:
    return PodSettings(default_image=cfg.sidecar_image,
                       image_pull_policy=cfg.image_pull_policy, port=cfg.sidecar_port,
                       journal_defaults=cfg.journal_defaults, sidecar_tls=cfg.sidecar_tls,
                       cert_manager=cfg.cert_manager_settings())


@kopf.index("", "v1", "pods", id=POD_INDEX)
def crewfence_pods(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]] | None:
    """The pods each Crew pass reads, kept current by the pod watch: no pod list per pass."""
    return children.pod_index_entry(body)


def _pod_index(kwargs: Mapping[str, Any]) -> PodIndex:
    """kopf hands every handler its indexes as keyword arguments named after the index."""
    index: PodIndex = kwargs[POD_INDEX]
    return index


def _namespace_pods(index: PodIndex, namespace: str) -> list[dict[str, Any]]:
    return list(index.get(namespace, ()))


@kopf.on.resume(c.GROUP, c.VERSION, c.CREW_PLURAL)
@kopf.on.create(c.GROUP, c.VERSION, c.CREW_PLURAL)
@kopf.on.update(c.GROUP, c.VERSION, c.CREW_PLURAL, field="spec")
async def crew_changed(body: kopf.Body, logger: kopf.Logger, **kwargs: Any) -> None:
    crew = CrewRef.from_body(body)
    try:
        spec = parse_spec(body.get("spec"))
    except SpecError as exc:
        raise kopf.PermanentError(str(exc)) from exc
    try:
        snap = await asyncio.to_thread(children.ensure, crew, spec,
                                       pod_settings(config.current()),
                                       _namespace_pods(_pod_index(kwargs), crew.namespace))
    except children.ChildError as exc:
        logger.warning(f"Crew {crew.key} cannot be reconciled: {exc}")
    except Exception as exc:
        if not _namespace_terminating(exc):
            raise kopf.TemporaryError(f"reconcile failed: {_describe(exc)}", delay=5) from None
        logger.debug(f"Crew {crew.key}: namespace is terminating")
    else:
        if snap.created_pods:
            logger.info(f"created pods {snap.created_pods}")
    wake(crew.key)


@kopf.on.event("", "v1", "pods", labels={c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE})
async def replica_pod_event(body: kopf.Body, namespace: str | None, **_: Any) -> None:
    crew_name = (body.get("metadata", {}).get("labels") or {}).get(c.LABEL_CREW)
    if crew_name and namespace:
        wake(f"{namespace}/{crew_name}")


@dataclass
class DaemonState:
    token: str | None = None
    retention_applied: float | None = None
    """Monotonic time the journal retention was last applied."""
    last_audit: float = 0.0
    mounts: list[ForeignMount] = field(default_factory=list)
    announced: set[str] = field(default_factory=set)
    full_ensure: tuple[int | None, float] = (None, 0.0)
    """(generation, monotonic time) of the last full ensure."""
    tool_answers: dict[str, str | None] = field(default_factory=dict)
    tools_checked: tuple[int | None, float] = (None, 0.0)
    """(generation, monotonic time) of the last MCP server check (``crew/tool_servers.py``)."""


@kopf.daemon(c.GROUP, c.VERSION, c.CREW_PLURAL, cancellation_timeout=10.0)
async def crew_daemon(
    stopped: kopf.DaemonStopped, namespace: str | None, name: str, logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    assert namespace is not None  # Crews are namespaced
    key = f"{namespace}/{name}"
    event = _wakers.setdefault(key, asyncio.Event())
    state = DaemonState()
    cfg = config.current()
    pod_index = _pod_index(kwargs)
    try:
        async with aiohttp.ClientSession() as session:
            while not stopped:
                event.clear()
                try:
                    await reconcile_once(session, state, cfg, namespace, name, logger,
                                         pod_index)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # keep the daemon alive; the next pass retries
                    if _namespace_terminating(exc):
                        logger.debug(f"Crew {key}: namespace is terminating")
                    else:
                        logger.warning(f"Crew {key} reconcile pass failed: {_describe(exc)}")
                await _pause(event, stopped, cfg.status_interval)
    finally:
        if _wakers.get(key) is event:
            del _wakers[key]
        metrics.observe_fenced_replicas(key, 0)


def _namespace_terminating(exc: BaseException) -> bool:
    return kube.is_status(exc, 403) and "being terminated" in str(getattr(exc, "body", ""))


def _describe(exc: BaseException) -> str:
    """A log-safe description: API errors by status and reason, never their request bodies."""
    status = getattr(exc, "status", None)
    if status is not None:
        return f"{type(exc).__name__} HTTP {status} {getattr(exc, 'reason', '')}".strip()
    return repr(exc)


async def _pause(event: asyncio.Event, stopped: kopf.DaemonStopped, interval: float) -> None:
    deadline = time.monotonic() + interval
    while not stopped:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            await asyncio.wait_for(event.wait(), timeout=min(remaining, 1.0))
            return
        except TimeoutError:
            continue


async def _healths(
    session: aiohttp.ClientSession, pods: Mapping[int, Mapping[str, Any]], token: str | None,
    cfg: config.OperatorConfig, tls: TlsFor | None = None,
) -> dict[int, Health | None]:
    async def one(ordinal: int, pod: Mapping[str, Any]) -> Health | None:
        address = pod_address(pod, cfg.sidecar_port)
        if address is None:
            return None
        return health_of_pod(pod, await fetch_health(
            session, address, token, cfg.health_timeout, **(tls(ordinal) if tls else {})))

    ordinals = list(pods)
    results = await asyncio.gather(*(one(o, pods[o]) for o in ordinals))
    return dict(zip(ordinals, results, strict=True))


async def reconcile_once(
    session: aiohttp.ClientSession, state: DaemonState, cfg: config.OperatorConfig,
    namespace: str, name: str, logger: kopf.Logger, pod_index: PodIndex,
) -> None:
    body = await asyncio.to_thread(kube.get_crew, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return
    crew = CrewRef.from_body(body)
    generation = body["metadata"].get("generation")
    previous: dict[str, Any] = body.get("status") or {}
    settings = pod_settings(cfg)
    error: str | None = None
    try:
        spec = parse_spec(body.get("spec"))
    except SpecError as exc:
        await _write_status(crew, previous, CrewObservation(
            generation=generation, desired_replicas=0, replicas=[], retained_claims=[],
            previous_conditions=previous.get("conditions") or [], port=cfg.sidecar_port,
            error=str(exc)))
        return
    now = time.monotonic()
    last_generation, last_time = state.full_ensure
    full = last_generation != generation or now - last_time >= FULL_ENSURE_SECONDS
    pods = _namespace_pods(pod_index, namespace)
    try:
        snap = await asyncio.to_thread(children.ensure, crew, spec, settings, pods, full=full)
        if full:
            state.full_ensure = (generation, now)
    except children.ChildError as exc:
        error = str(exc)
        snap = await asyncio.to_thread(children.observe, crew, spec, pods)
    if state.token is None:
        state.token = token_roll.sending_token(await asyncio.to_thread(
            kube.read_secret_value, namespace, c.token_secret_name(name), c.TOKEN_SECRET_KEY))
    tls_for = await cert_source.endpoint_options_for(cfg, namespace, name)
    healths, _ = await asyncio.gather(_healths(session, snap.pods, state.token, cfg, tls_for),
                                      _check_tools(session, state, spec, generation, now))
    if cfg.sidecar_tls:  # token files are re-read by the sidecars: a roll is possible
        addresses = {o: a for o, pod in snap.pods.items()
                     if (a := pod_address(pod, cfg.sidecar_port)) is not None}
        rolled = await token_roll.advance(namespace, name,
                                          body["metadata"].get("annotations") or {},
                                          session, addresses, tls_for)
        if rolled is not None:
            logger.info(f"token roll: phase {rolled}")
            state.token = token_roll.sending_token(await asyncio.to_thread(
                kube.read_secret_value, namespace, c.token_secret_name(name),
                c.TOKEN_SECRET_KEY))
        if cfg.cert_manager_settings() is None:  # the operator's own CA: renewed by it
            ca_step = await pki_apply.advance_ca_rotation(
                session, pki_apply.RotationContext(
                    crew=crew, crew_annotations=body["metadata"].get("annotations") or {},
                    ordinals=tuple(sorted(set(range(spec.replicas)) | set(snap.pods))),
                    pods=snap.pods, addresses=addresses, token=state.token))
            if ca_step is not None:
                logger.info(f"CA rotation: phase {ca_step.phase} ({ca_step.reason})")

    ordinals = set(range(spec.replicas)) | set(snap.pods) | set(snap.claims)
    claims_by_ordinal = {o: claim_for_ordinal(crew, spec, o) for o in sorted(ordinals)}
    claims_by_ordinal.update({o: cl["metadata"]["name"] for o, cl in snap.claims.items()})
    if now - state.last_audit >= cfg.audit_interval or not state.last_audit:
        state.mounts = audit.find_foreign_mounts(crew.name, claims_by_ordinal,
                                                 snap.namespace_pods)
        state.last_audit = now
        audit.announce(kopf.Body(body),  # type: ignore[arg-type]  # a raw body dict
                       state.mounts, state.announced, previous)
    fence_by_ordinal: dict[int, str] = {}
    for mount in state.mounts:
        fence_by_ordinal.setdefault(mount.ordinal, mount.reason)

    await _roll_one_pod(crew, spec, settings, snap, healths, fence_by_ordinal, logger)

    clients = {o: _client(session, snap.pods.get(o), state.token, cfg, tls_for(o))
               for o in snap.pods}
    survivors = _serving(spec, snap, healths, clients, fence_by_ordinal)
    decisions = _scale_down_decisions(spec, snap, healths, claims_by_ordinal, survivors)
    for ordinal in range(spec.replicas):
        client = clients.get(ordinal)
        if needs_undrain(healths.get(ordinal)) and client is not None:
            healths[ordinal] = await _switch_draining(client, healths[ordinal], False, logger)
    for decision in decisions:
        if decision.hand_over_to:
            await _hand_over_tombstones(crew, decision, clients, healths, logger)
        healths[decision.ordinal] = await _execute(
            crew, spec, settings, decision, snap, clients.get(decision.ordinal),
            healths.get(decision.ordinal), logger)
    if retention_due(spec.journal.retention_seconds, state.retention_applied, now):
        assert spec.journal.retention_seconds is not None
        state.retention_applied = now
        await _apply_retention(clients, healths, spec.journal.retention_seconds, logger)

    observations = [
        ReplicaObservation(
            ordinal=o, pod_name=c.pod_name(name, o), claim=claims_by_ordinal[o],
            pod=snap.pods.get(o), health=healths.get(o), fence_reason=fence_by_ordinal.get(o))
        for o in range(spec.replicas)
    ]
    observations += [
        ReplicaObservation(
            ordinal=d.ordinal, pod_name=c.pod_name(name, d.ordinal), claim=d.claim,
            pod=snap.pods.get(d.ordinal), health=healths.get(d.ordinal),
            fence_reason=fence_by_ordinal.get(d.ordinal), message=d.message, state=d.state)
        for d in decisions if d.state is not None
    ]
    obs = CrewObservation(
        generation=generation, desired_replicas=spec.replicas, replicas=observations,
        retained_claims=[d.retained for d in decisions if d.retained],
        previous_conditions=previous.get("conditions") or [], port=cfg.sidecar_port,
        error=error, credentials=credentials_verdict(spec, reported_states(
            name, {o: h.model_credentials if h else None for o, h in healths.items()})),
        tools=tools_verdict(spec.tools, state.tool_answers))
    metrics.observe_fenced_replicas(crew.key, len(fence_by_ordinal))
    await _write_status(crew, previous, obs)


async def _check_tools(session: aiohttp.ClientSession, state: DaemonState, spec: CrewSpec,
                       generation: int | None, now: float) -> None:
    """Ask the MCP servers again when due (bounded: ``crew/tool_servers.py``)."""
    last_generation, last_time = state.tools_checked
    if not spec.tools.mcp_servers:
        state.tool_answers = {}
        return
    if last_generation == generation and now - last_time < TOOLS_CHECK_SECONDS:
        return
    state.tool_answers = await probe_tools(session, spec.tools)
    state.tools_checked = (generation, now)


def _client(session: aiohttp.ClientSession, pod: Mapping[str, Any] | None, token: str | None,
            cfg: config.OperatorConfig,
            tls: Mapping[str, Any] | None = None) -> SidecarClient | None:
    address = pod_address(pod, cfg.sidecar_port)
    if address is None or not token:
        return None
    return SidecarClient(session, Endpoint(address, token, **(tls or {})))


async def _switch_draining(client: SidecarClient, health: Health | None, draining: bool,
                           logger: kopf.Logger) -> Health | None:
    """Ask the sidecar to drain (or serve again); the health it reports afterwards."""
    try:
        answer = await client.set_draining(draining)
    except SidecarFailure as exc:
        logger.warning(f"replica at {client.endpoint.address}: could not switch draining "
                       f"{'on' if draining else 'off'}: {exc}")
        return health
    logger.info(f"replica at {client.endpoint.address}: draining "
                f"{'on' if answer.draining else 'off'} ({answer.unarchived_records} unarchived "
                "record(s))")
    if health is None:
        return None
    return replace(health, draining=answer.draining,
                   unarchived_records=answer.unarchived_records)


async def _apply_retention(clients: Mapping[int, SidecarClient | None],
                           healths: Mapping[int, Health | None], seconds: int,
                           logger: kopf.Logger) -> None:
    """``journal.retention``: bulk-archive terminal records older than the window, on every
    replica that answers (active and draining alike). Only records whose outcome the operator
    already wrote into the CrewJob (marked recorded) go, so retention never races the
    operator; one that nobody marked goes a day after the window."""
    for ordinal, client in sorted(clients.items()):
        if client is None or healths.get(ordinal) is None:
            continue
        try:
            result = await client.archive_older_than(seconds, recorded_only=True)
        except SidecarFailure as exc:
            logger.warning(f"replica {ordinal}: journal retention not applied: {exc}")
            continue
        if result.count:
            logger.info(f"replica {ordinal}: journal retention archived {result.count} "
                        "record(s)")


async def _write_status(crew: CrewRef, previous: Mapping[str, Any],
                        obs: CrewObservation) -> None:
    status = crew_status(obs)
    # Write only on change: the daemon runs every few seconds and API writes are not free.
    if all(previous.get(k) == v for k, v in status.items()):
        return
    await asyncio.to_thread(kube.patch_crew_status, crew.namespace, crew.name, status)


async def _roll_one_pod(
    crew: CrewRef, spec: CrewSpec, settings: PodSettings, snap: children.Snapshot,
    healths: Mapping[int, Health | None], fenced: Mapping[int, str], logger: kopf.Logger,
) -> None:
    """Replace at most one outdated pod per pass, and only one with no active run."""
    for ordinal in range(spec.replicas):
        pod = snap.pods.get(ordinal)
        if pod is None or pod["metadata"].get("deletionTimestamp") or ordinal in fenced:
            continue
        if pod_template_hash(pod) == children.desired_hash(crew, spec, ordinal, settings):
            continue
        health = healths.get(ordinal)
        if health is not None and (health.active_runs or 0) > 0:
            continue  # wait for its jobs; an interrupted job would become an uncertain outcome
        if health is None and pod_is_ready(pod):
            continue  # ready but not answering: do not guess
        logger.info(f"rolling pod {pod['metadata']['name']} to the current spec")
        await asyncio.to_thread(kube.delete_pod, crew.namespace, pod["metadata"]["name"],
                                pod["metadata"].get("uid"))
        return


def _scale_down_decisions(
    spec: CrewSpec, snap: children.Snapshot, healths: Mapping[int, Health | None],
    claims_by_ordinal: Mapping[int, str], survivors: tuple[int, ...],
) -> list[Decision]:
    excess = sorted(o for o in set(snap.pods) | set(snap.claims) if o >= spec.replicas)
    return [decide(ExcessReplica(
        ordinal=ordinal, claim=claims_by_ordinal[ordinal], claim_obj=snap.claims.get(ordinal),
        pod=snap.pods.get(ordinal), health=healths.get(ordinal),
        delete_claim_when_empty=spec.storage.when_scaled == "Delete", survivors=survivors))
        for ordinal in excess]


def _serving(spec: CrewSpec, snap: children.Snapshot, healths: Mapping[int, Health | None],
             clients: Mapping[int, SidecarClient | None],
             fenced: Mapping[int, str]) -> tuple[int, ...]:
    """Replicas that can take over a retiring replica's tombstones: below ``spec.replicas``,
    a live pod, a sidecar that answered with a journal id and is not draining, not fenced."""
    def serving(o: int) -> bool:
        pod, health = snap.pods.get(o), healths.get(o)
        return (pod is not None and not pod["metadata"].get("deletionTimestamp")
                and clients.get(o) is not None and o not in fenced and health is not None
                and bool(health.journal_id) and health.draining is not True)

    return tuple(o for o in range(spec.replicas) if serving(o))


async def _hand_over_tombstones(crew: CrewRef, d: Decision,
                                clients: Mapping[int, SidecarClient | None],
                                healths: Mapping[int, Health | None],
                                logger: kopf.Logger) -> None:
    """Copy a drained replica's tombstones to the serving replicas (each to its rendezvous
    owner among them), then mark the claim so the pod may go (``scaledown`` invariant "a
    tombstone outlives its replica"). Any failure or conflict leaves the claim unmarked: the
    replica stays and the next pass tries again (imports are idempotent)."""
    source, health = clients.get(d.ordinal), healths.get(d.ordinal)
    targets = {o: cl for o in d.hand_over_to if (cl := clients.get(o)) is not None}
    if source is None or health is None or not health.journal_id or not targets:
        return
    moved, after = 0, ""
    try:
        while True:
            stones, following = await source.tombstone_page(after)
            batches: dict[int, list[Tombstone]] = {}
            for stone in stones:
                owner = choose_ordinal(stone.action_id, sorted(targets))
                assert owner is not None  # targets is not empty
                batches.setdefault(owner, []).append(stone)
            for ordinal, batch in sorted(batches.items()):
                result = await targets[ordinal].import_tombstones(batch)
                if result.conflicts:
                    logger.warning(
                        f"scale down: replica {ordinal} already holds other work under "
                        f"{len(result.conflicts)} action id(s) of replica {d.ordinal}'s "
                        f"tombstones (e.g. {result.conflicts[0]!r}); replica {d.ordinal} is "
                        "kept: reconcile those actions by hand")
                    return
            moved += len(stones)
            if following is None:
                break
            after = following
    except SidecarFailure as exc:
        logger.warning(f"scale down: tombstones of replica {d.ordinal} not handed over yet: "
                       f"{exc}")
        return
    await asyncio.to_thread(children.apply_claim_annotations, crew.namespace, d.claim,
                            {HANDED_OVER_ANNOTATION: handed_over_mark(health.journal_id, moved)})
    logger.info(f"scale down: {moved} tombstone(s) of replica {d.ordinal} handed over to "
                f"replica(s) {', '.join(map(str, sorted(targets)))}")


async def _execute(
    crew: CrewRef, spec: CrewSpec, settings: PodSettings, d: Decision, snap: children.Snapshot,
    client: SidecarClient | None, health: Health | None, logger: kopf.Logger,
) -> Health | None:
    """Carry out one scale-down decision; the replica's health as it stands afterwards."""
    if d.drain and client is not None:
        health = await _switch_draining(client, health, True, logger)
    if d.annotate:
        await asyncio.to_thread(children.apply_claim_annotations, crew.namespace, d.claim,
                                d.annotate)
    if d.create_pod:
        await asyncio.to_thread(children.create_pods, crew, spec, settings, snap, [d.ordinal])
        if c.pod_name(crew.name, d.ordinal) in snap.created_pods:
            logger.info(f"scale down: claim {d.claim} had no pod; created a draining one")
    pod = snap.pods.get(d.ordinal)
    if d.delete_pod and pod is not None:
        logger.info(f"scale down: replica {d.ordinal} is drained and its journal holds no "
                    f"unarchived record; deleting pod {pod['metadata']['name']}")
        await asyncio.to_thread(kube.delete_pod, crew.namespace, pod["metadata"]["name"],
                                pod["metadata"].get("uid"))
    if d.delete_claim:
        logger.info(f"scale down: deleting claim {d.claim} (journal held no unarchived record; "
                    "storage.whenScaled: Delete)")
        await asyncio.to_thread(kube.delete_claim, crew.namespace, d.claim)
    return health
