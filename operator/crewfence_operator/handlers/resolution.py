"""kopf glue for the human half of an uncertain outcome: ``spec.resolution``. Decisions are
pure (``crewjob/resolution.py``); this module only reads, writes status, posts Events and calls
the sidecar. The other half, the gate of a successor (``spec.supersedes``), is
``supersedes_gate.py``, called by the CrewJob daemon through ``runtime.Runtime.gate``.

Level-triggered on purpose: one ``on.event`` handler looks at every CrewJob event and carries
out whatever :func:`resolution.decide` says now, so an interrupted step (operator restart, a
concurrent status write) is taken again on the next event, and a resolution that arrives
with a re-applied manifest applies as soon as the job's outcome turns uncertain. kopf never
retries an ``on.event`` handler, so a timer (``crewjob-resolution-retry``) runs the same step
every ``TIMER_SECONDS`` while :func:`resolution.decide` says there is something to do: a
step that failed on a transient API error is taken again without waiting for another event
(and kopf retries the timer's own errors).

The journal's answer is final: an exact repeat (the same finding, whoever re-sent it) is
``Journaled``; a different finding (a re-applied manifest) is mirrored from the journal with a
``ResolutionConflict`` condition, never retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import kopf

from crewfence_operator import constants as c
from crewfence_operator import kube, metrics
from crewfence_operator.crewjob import resolution as res
from crewfence_operator.crewjob import supersede
from crewfence_operator.crewjob.replicas import Replica, asking_order, parse_replicas
from crewfence_operator.crewjob.status import now_iso
from crewfence_operator.runtime import KubeIO, Runtime, read_crew_and_token, runtime_of
from crewfence_operator.sidecar_client import Endpoint, SidecarClient, SidecarFailure
from crewfence_operator.supersedes_gate import as_body

log = logging.getLogger(__name__)

JOURNAL_ATTEMPTS = 4
JOURNAL_BACKOFF_SECONDS = 1.0
RETRY_SECONDS = 30.0
"""After the attempts failed: look again this much later (in this process), until journaled."""
TIMER_SECONDS = 10.0
"""How often the retry timer takes a pending step again (only while there is one)."""
_retries: dict[tuple[str, str], asyncio.Task[None]] = {}


# --- API (blocking calls, always in a thread) -----------------------------------------------
_get_crewjob_blocking = kube.get_crewjob


async def _patch_status(namespace: str, name: str, status: dict[str, Any]) -> bool:
    """False when the CrewJob is gone."""
    return await asyncio.to_thread(kube.patch_crewjob_status_unless_gone, namespace, name,
                                   status)


# --- the gauge of unresolved uncertain outcomes ---------------------------------------------
def _epoch(stamp: object) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def unresolved_entry(obj: Mapping[str, Any]) -> tuple[str, str, float] | None:
    """``(crew, reason, since)`` for an uncertain, unresolved CrewJob; None otherwise."""
    status = obj.get("status") or {}
    if status.get("uncertainOutcome") is not True or (status.get("resolution") or {}).get(
            "outcome"):
        return None
    crew = str(((obj.get("spec") or {}).get("crewRef") or {}).get("name") or "")
    since: float | None = None
    reason = str(status.get("reason") or "Unknown")
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == res.UNCERTAIN_CONDITION:
            reason = str(cond.get("reason") or reason)
            since = _epoch(cond.get("lastTransitionTime"))
    since = since or _epoch(status.get("finishedAt")) or _epoch(
        (obj.get("metadata") or {}).get("creationTimestamp")) or 0.0
    return crew, reason, since


# --- resolution -------------------------------------------------------------------------------
@kopf.on.event(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id="crewjob-resolution")
async def crewjob_resolution(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    runtime = runtime_of(memo)
    if event.get("type") == "DELETED":
        metrics.observe_unresolved_uncertain(namespace, name, None)
        runtime.forget_resolution_lock(namespace, name)
        return
    metrics.observe_unresolved_uncertain(namespace, name, unresolved_entry(obj))
    # Most events have no resolution step (no spec.resolution, or done): no lock, no state.
    if not has_a_step(obj.get("spec") or {}, obj.get("status") or {}, meta):
        return
    await carry_out(obj, runtime)


def has_a_step(spec: Mapping[str, Any], status: Mapping[str, Any], meta: Mapping[str, Any],
               **_: Any) -> bool:
    """The timer's filter: a resolution step is due now (not done, not waiting for the job)."""
    if meta.get("deletionTimestamp") or not spec.get("resolution"):
        return False
    step = res.decide(spec, status, int(meta.get("generation") or 1)).step
    return step not in (res.Step.NOTHING, res.Step.WAIT)


@kopf.on.timer(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id="crewjob-resolution-retry",
               interval=TIMER_SECONDS, initial_delay=TIMER_SECONDS,
               backoff=TIMER_SECONDS, when=has_a_step)
async def crewjob_resolution_retry(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The retry of :func:`crewjob_resolution` (see the module docstring): errors raise, so
    kopf retries them."""
    await carry_out(body, runtime_of(memo))


async def carry_out(obj: Mapping[str, Any], runtime: Runtime) -> None:
    """One step of :func:`res.decide` (and the journal write that may follow an accept).
    ``runtime`` is the per-operator state (kopf memo) the CrewJob handler uses: its HTTP
    session serves the journal write too. One step at a time per CrewJob (the event handler
    and the timer may fire together); the object is read again under the lock when another
    step ran meanwhile."""
    meta = obj["metadata"]
    lock = runtime.resolution_lock(str(meta["namespace"]), str(meta["name"]))
    waited = lock.locked()
    async with lock:
        if waited:
            fresh = await asyncio.to_thread(_get_crewjob_blocking, str(meta["namespace"]),
                                            str(meta["name"]))
            if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp"):
                return
            obj = fresh
        await _carry_out(obj, runtime)


async def _carry_out(obj: Mapping[str, Any], runtime: Runtime) -> None:
    meta, spec = obj["metadata"], obj.get("spec") or {}
    status = dict(obj.get("status") or {})
    namespace, name = str(meta["namespace"]), str(meta["name"])
    generation = int(meta.get("generation") or 1)
    decision = res.decide(spec, status, generation)
    if decision.step in (res.Step.NOTHING, res.Step.WAIT) or decision.resolution is None:
        return
    now = now_iso()
    if decision.step is res.Step.IGNORE:
        if await _patch_status(namespace, name, res.ignored_patch(
                status, decision.message, generation=generation, now=now)):
            kopf.warn(as_body(obj), reason=res.REASON_IGNORED, message=decision.message[:1000])
        return
    resolved_by = res.resolver(meta.get("managedFields"))
    if decision.step is res.Step.CONFIRM:
        await journal(obj, decision.resolution, resolved_by=resolved_by, runtime=runtime,
                      confirm=True)
        return
    if decision.step in (res.Step.ACCEPT, res.Step.REFRESH):
        journal_possible = res.journal_possible(status)
        patch = res.accepted_patch(status, decision.resolution, resolved_by=resolved_by,
                                   generation=generation, now=now,
                                   journal_possible=journal_possible)
        if not await _patch_status(namespace, name, patch):
            return
        if decision.step is res.Step.ACCEPT:
            metrics.observe_unresolved_uncertain(namespace, name, None)
            kopf.event(as_body(obj), type="Normal", reason=res.REASON_RESOLVED,
                       message=f"Outcome resolved {decision.resolution.outcome.value} by "
                               f"{resolved_by}: {decision.resolution.note}"[:1000])
        if patch["resolution"]["journal"].get("state") != res.JournalState.PENDING.value:
            return
        resolved_by = str(patch["resolution"].get("resolvedBy") or resolved_by)
    else:  # JOURNAL
        resolved_by = str((status.get("resolution") or {}).get("resolvedBy") or resolved_by)
    await journal(obj, decision.resolution, resolved_by=resolved_by, runtime=runtime)


async def journal(obj: Mapping[str, Any], resolution: res.Resolution, *, resolved_by: str,
                  runtime: Runtime, confirm: bool = False) -> None:
    """Record the resolution in the assigned replica's journal (idempotent route; retried).

    ``confirm`` (:attr:`res.Step.CONFIRM`): status does not show the resolution yet; it is
    written here from the journal's answer only (invariant: status shows only a confirmed
    finding), and while the journal cannot be asked only ``Resolved=False/JournalPending``."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    namespace, name = str(meta["namespace"]), str(meta["name"])
    crew_name = str((spec.get("crewRef") or {}).get("name") or "")
    ordinal = (status.get("assignment") or {}).get("ordinal")
    action_id = supersede.effective_action_id(obj)
    request = res.sidecar_request(crew=crew_name, action_id=action_id, resolution=resolution,
                                  resolved_by=resolved_by)
    why = "the assigned replica is not reachable"
    for attempt in range(JOURNAL_ATTEMPTS):
        crew, token = await read_crew_and_token(namespace, crew_name)
        listed = parse_replicas(crew or {})
        asked = [r for r in asking_order(listed, ordinal) if r.address and token]
        not_held: set[int] = set()
        tombstone_silent = False
        for replica in asked:
            try:
                client = await _client(runtime, crew=(namespace, crew_name), replica=replica,
                                       token=str(token))
                answer = await client.resolve(request)
            except SidecarFailure as exc:
                metrics.observe_sidecar_failure(exc.category.value)
                if exc.http_status == 404:
                    not_held.add(replica.ordinal)
                    continue
                if exc.http_status == 410:
                    tombstone_silent = res.when_not_held(410) is res.NotHeld.WAIT
                    break
                why = str(exc)
                continue
            await _answered(obj, answer, resolution, resolved_by=resolved_by,
                            ordinal=replica.ordinal, confirm=confirm)
            return
        if tombstone_silent:
            why = res.TOMBSTONE_SILENT
            break  # not journaled; tried again later (never the spec's finding)
        expected = {r.ordinal for r in listed} | ({int(ordinal)} if ordinal is not None else set())
        if res.held_nowhere(listed=expected, not_held=not_held):
            gone = "no journal of the Crew's replicas holds the action"
            if confirm:
                await _accept_unjournaled(obj, resolution, resolved_by, gone)
                return
            await _patch_status(namespace, name, res.journal_patch(
                res.JournalState.NOT_APPLICABLE, message=gone))
            return
        await asyncio.sleep(JOURNAL_BACKOFF_SECONDS * (2 ** attempt))
    if confirm:
        if await _patch_status(namespace, name, res.unconfirmed_patch(
                status, resolution, why, generation=int(meta.get("generation") or 1),
                now=now_iso())):
            _retry_later(namespace, name, runtime)
        return
    if await _patch_status(namespace, name, res.journal_patch(
            res.JournalState.PENDING,
            message=f"not journaled yet ({why}); trying again every {RETRY_SECONDS:.0f}s")):
        _retry_later(namespace, name, runtime)


async def _answered(obj: Mapping[str, Any], answer: Any, resolution: res.Resolution, *,
                    resolved_by: str, ordinal: int, confirm: bool) -> None:
    """Status from the journal's answer to the resolution write (replica ``ordinal``)."""
    meta, status = obj["metadata"], obj.get("status") or {}
    namespace, name = str(meta["namespace"]), str(meta["name"])
    event = answer.event
    if answer.conflict:
        # Invariant: the journal's finding wins; say so, change nothing, no retry.
        current = await asyncio.to_thread(_get_crewjob_blocking, namespace, name)
        latest = (current or obj).get("status") or status
        patch = res.conflict_patch(
            latest, event.data, sequence=event.sequence, spec_resolution=resolution,
            generation=int(meta.get("generation") or 1), now=now_iso())
        if await _patch_status(namespace, name, patch):
            kopf.warn(as_body(obj), reason=res.CONFLICT_CONDITION,
                      message=next(cond["message"] for cond in patch["conditions"]
                                   if cond["type"] == res.CONFLICT_CONDITION))
        log.warning("crewjob %s/%s: spec.resolution disagrees with the journaled "
                    "one (event %s)", namespace, name, event.sequence)
        return
    successor = answer.successor.data if answer.successor else None
    if confirm:
        if await _patch_status(namespace, name, res.confirmed_patch(
                status, resolution, event.data, sequence=event.sequence,
                ordinal=ordinal, successor=successor, resolved_by=resolved_by,
                generation=int(meta.get("generation") or 1), now=now_iso())):
            _resolved(obj, resolution, str(event.data.get("resolved_by") or resolved_by))
    else:
        await _patch_status(namespace, name, res.journaled_patch(
            event.data, sequence=event.sequence, ordinal=ordinal, successor=successor))
    log.info("crewjob %s/%s: resolution journaled (event %s)", namespace, name,
             event.sequence)


def _resolved(obj: Mapping[str, Any], resolution: res.Resolution, resolved_by: str) -> None:
    meta = obj["metadata"]
    metrics.observe_unresolved_uncertain(str(meta["namespace"]), str(meta["name"]), None)
    kopf.event(as_body(obj), type="Normal", reason=res.REASON_RESOLVED,
               message=f"Outcome resolved {resolution.outcome.value} by {resolved_by}: "
                       f"{resolution.note}"[:1000])


async def _accept_unjournaled(obj: Mapping[str, Any], resolution: res.Resolution,
                              resolved_by: str, why: str) -> None:
    """No journal holds the action (404: neither its record nor its tombstone): nothing can
    disagree, so the spec's finding is recorded in status as not journaled, saying why. An
    archived action (410 before) is answered by the sidecar from its tombstone's finding."""
    meta, status = obj["metadata"], obj.get("status") or {}
    patch = res.accepted_patch(status, resolution, resolved_by=resolved_by,
                               generation=int(meta.get("generation") or 1), now=now_iso(),
                               journal_possible=False)
    patch["resolution"]["journal"]["message"] = why[:1024]
    if await _patch_status(str(meta["namespace"]), str(meta["name"]), patch):
        _resolved(obj, resolution, resolved_by)


async def _client(runtime: Runtime, *, crew: tuple[str, str], replica: Replica,
                  token: str) -> SidecarClient:
    """A client for the replica over the operator's one HTTP session (``runtime``, closed by
    the CrewJob handler's cleanup), with the same endpoint options (mutual TLS when the
    operator runs with it) as the CrewJob daemon's."""
    assert replica.address
    namespace, crew_name = crew
    options = await KubeIO(cache_seconds=0.0).endpoint_options(namespace, crew_name,
                                                                    replica.ordinal)
    return SidecarClient(runtime.session(), Endpoint(replica.address, token, **options))


def _retry_later(namespace: str, name: str, runtime: Runtime) -> None:
    """One pending retry per CrewJob: re-read it after RETRY_SECONDS and carry out again
    (level-triggered, so a CrewJob resolved, journaled or deleted meanwhile ends it)."""
    key = (namespace, name)
    running = _retries.get(key)
    if running is not None and not running.done():
        return

    async def later() -> None:
        await asyncio.sleep(RETRY_SECONDS)
        _retries.pop(key, None)
        try:
            obj = await asyncio.to_thread(_get_crewjob_blocking, namespace, name)
            if obj is not None and not (obj.get("metadata") or {}).get("deletionTimestamp"):
                await carry_out(obj, runtime)
        except Exception:  # a background retry must not die silently
            log.exception("crewjob %s/%s: retrying the resolution's journal write failed",
                          namespace, name)

    _retries[key] = asyncio.create_task(later(), name=f"resolution-journal {namespace}/{name}")
