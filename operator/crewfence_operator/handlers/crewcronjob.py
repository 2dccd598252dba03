"""kopf glue for CrewCronJob: one async daemon per CrewCronJob carries out the pure tick
decisions of ``cronjob/ticks.py`` (its docstring names the invariants).

Each round reads the CrewCronJob and its children from the API server (never an older copy),
decides, and carries the steps out in order: a ``Record`` is a status patch, a ``Create`` a
create-if-absent of the tick's deterministically named child (409 = it exists: the API
server's fence), ``CancelChild`` sets the child's ``spec.cancel``, ``DeleteChild`` removes a
child beyond the history limits. The daemon then sleeps until the next tick, or until a child
or the spec changes (watch events wake it), or at most ``idle_seconds``.

Two operator replicas, a restart in the middle of a round, a lost status write: the round is
carried out again from what the API server holds, and the child names and action ids make
every repeat harmless (T1 in ``ticks.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator import kube, metrics
from crewfence_operator.cronjob import children as ch
from crewfence_operator.cronjob import status as st
from crewfence_operator.cronjob.schedule import ScheduleError, from_rfc3339, to_rfc3339
from crewfence_operator.cronjob.spec import CronSpec
from crewfence_operator.cronjob.ticks import (
    CancelChild,
    Create,
    DeleteChild,
    Facts,
    Plan,
    Record,
    SkipReason,
    decide,
)

log = logging.getLogger(__name__)
DAEMON_ID = "crewcronjob"


@dataclass
class CronSettings:
    idle_seconds: float = 60.0
    """A daemon re-reads its CrewCronJob at least this often."""
    settle_seconds: float = 0.3
    """After a wake-up, wait this long so a burst of child events costs one round."""


@dataclass
class CronState:
    settings: CronSettings = field(default_factory=CronSettings)
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    generations: dict[tuple[str, str], int] = field(default_factory=dict)


STATE = CronState()
"""Wake-up events per CrewCronJob (an optimisation only: the daemon also polls)."""


def wake(namespace: str, name: str) -> None:
    event = STATE.wakeups.get((namespace, name))
    if event is not None:
        event.set()


# --- blocking API calls (run in threads) -------------------------------------------------------
def get_cronjob(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj = kube.custom().get_namespaced_custom_object(c.GROUP, c.VERSION, namespace,
                                                         ch.PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    assert isinstance(obj, dict)
    return obj


def list_children(namespace: str, name: str) -> list[dict[str, Any]]:
    result = kube.custom().list_namespaced_custom_object(
        c.GROUP, c.VERSION, namespace, c.CREWJOB_PLURAL,
        label_selector=f"{ch.LABEL_CRONJOB}={name}")
    return list(result.get("items") or [])


def create_child(body: dict[str, Any], dry_run: bool = False) -> bool:
    """Create-if-absent; False when the name exists (the tick was created before)."""
    extra = {"dry_run": "All"} if dry_run else {}
    try:
        kube.custom().create_namespaced_custom_object(
            c.GROUP, c.VERSION, body["metadata"]["namespace"], c.CREWJOB_PLURAL, body, **extra)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def cancel_child(namespace: str, name: str) -> None:
    with contextlib.suppress(ApiException):
        kube.custom().patch_namespaced_custom_object(
            c.GROUP, c.VERSION, namespace, c.CREWJOB_PLURAL, name, {"spec": {"cancel": True}})


def delete_child(namespace: str, name: str) -> None:
    try:
        kube.custom().delete_namespaced_custom_object(c.GROUP, c.VERSION, namespace,
                                                      c.CREWJOB_PLURAL, name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def patch_status(namespace: str, name: str, patch: Mapping[str, Any],
                 resource_version: str | None = None) -> tuple[dict[str, Any], str | None]:
    """Merge-patch the status; with ``resource_version`` only if nobody wrote since (409
    otherwise: another operator replica, or this one before a restart, decided meanwhile)."""
    body: dict[str, Any] = {"status": dict(patch)}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    obj = kube.custom().patch_namespaced_custom_object_status(
        c.GROUP, c.VERSION, namespace, ch.PLURAL, name, body)
    if not isinstance(obj, Mapping):
        return {}, None
    return dict(obj.get("status") or {}), (obj.get("metadata") or {}).get("resourceVersion")


# --- one round ---------------------------------------------------------------------------------
def _changes(status: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    return any(status.get(key) != value for key, value in patch.items())


def facts_of(obj: Mapping[str, Any]) -> Facts:
    meta, status = obj["metadata"], obj.get("status") or {}

    def tick(key: str) -> int | None:
        raw = status.get(key)
        return from_rfc3339(str(raw)) if raw else None

    return Facts(created=from_rfc3339(str(meta["creationTimestamp"])),
                 last_schedule=tick("lastScheduleTime"), buffered=tick("bufferedScheduleTime"),
                 missed=int(status.get("missedTicks") or 0),
                 skipped=int(status.get("skippedTicks") or 0),
                 last_missed=tick("lastMissedTime"))


def _now_text(now: float) -> str:
    return datetime.fromtimestamp(int(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def reconcile(obj: Mapping[str, Any], now: float) -> float | None:
    """One round for one CrewCronJob; returns when the next tick is due (Unix seconds)."""
    meta = obj["metadata"]
    namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    generation = int(meta.get("generation") or 1)
    status: dict[str, Any] = dict(obj.get("status") or {})
    try:
        spec = CronSpec.from_resource(obj.get("spec") or {})
    except ScheduleError as exc:
        patch = st.invalid_patch(exc.code, exc.message, status, generation, _now_text(now))
        if _changes(status, patch):
            await asyncio.to_thread(patch_status, namespace, name, patch)
            _warn(obj, reason=exc.code, message=exc.message)
        return None
    if int(status.get("observedGeneration") or 0) != generation:
        refused = await template_refusal(obj, now)
        if refused is not None:
            patch = st.invalid_patch("InvalidJobTemplate", refused, status, generation,
                                     _now_text(now))
            if _changes(status, patch):
                await asyncio.to_thread(patch_status, namespace, name, patch)
                _warn(obj, reason="InvalidJobTemplate", message=refused)
            return None
    observed = [ch.Child.from_object(o, uid)
                for o in await asyncio.to_thread(list_children, namespace, name)]
    # Pure but possibly long (counting the ticks of a long outage): off the event loop.
    plan = await asyncio.to_thread(decide, spec, facts_of(obj), observed, int(now))
    try:
        await carry_out(obj, plan, observed, status, spec, now)
    except ApiException as exc:
        if exc.status != 409:
            raise
        # The status changed since this round read it: decide again from the new one.
        log.info("crewcronjob %s/%s: status written meanwhile; deciding again", namespace, name)
        return now + 0.5
    return float(plan.next_schedule) if plan.next_schedule is not None else None


async def template_refusal(obj: Mapping[str, Any], now: float) -> str | None:
    """A server-side dry run of a child: the CrewJob schema (one source of truth) judges the
    jobTemplate; its message when refused, None when accepted."""
    body = ch.child_manifest(obj, manual_at=int(now))
    try:
        await asyncio.to_thread(create_child, body, True)  # False (409): the name exists
    except ApiException as exc:
        if exc.status in (400, 422):
            return _api_message(exc)
        raise
    return None


async def carry_out(obj: Mapping[str, Any], plan: Plan, observed: list[ch.Child],
                    status: dict[str, Any], spec: CronSpec, now: float) -> dict[str, Any]:
    meta = obj["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    generation = int(meta.get("generation") or 1)
    version: str | None = meta.get("resourceVersion")
    """Every status write of this round is conditional on the status this round decided from
    (and on its own writes since): a replica deciding from an older status cannot overwrite a
    newer record (e.g. move lastScheduleTime back)."""
    last_record = max(i for i, s in enumerate(plan.steps) if isinstance(s, Record))
    for index, step in enumerate(plan.steps):
        if isinstance(step, Record) and index == last_record:
            patch = st.final_patch(namespace=namespace, cronjob=name, plan=plan,
                                   observed=observed, previous=status, generation=generation,
                                   now=_now_text(now), suspended=spec.suspend)
            if _changes(status, patch):
                status, version = await asyncio.to_thread(patch_status, namespace, name,
                                                           patch, version)
            _observe(obj, plan, patch)
        elif isinstance(step, Record):
            status, version = await asyncio.to_thread(patch_status, namespace, name,
                                                      st.record_patch(step), version)
        elif isinstance(step, Create):
            body = ch.child_manifest(obj, tick=step.tick)
            try:
                created = await asyncio.to_thread(create_child, body)
            except ApiException as exc:
                if exc.status in (400, 422):  # the API server refused the jobTemplate
                    message = _api_message(exc)
                    _warn(obj, reason="InvalidJobTemplate", message=message)
                    patch = st.invalid_patch("InvalidJobTemplate", message, status, generation,
                                             _now_text(now))
                    await asyncio.to_thread(patch_status, namespace, name, patch)
                    return status
                raise
            if created:
                metrics.observe_crewcronjob_ticks("run", "Scheduled")
                log.info("crewcronjob %s/%s: tick %s -> CrewJob %s", namespace, name,
                         to_rfc3339(step.tick), body["metadata"]["name"])
        elif isinstance(step, CancelChild):
            await asyncio.to_thread(cancel_child, namespace, step.name)
        elif isinstance(step, DeleteChild):
            await asyncio.to_thread(delete_child, namespace, step.name)
    return status


def _observe(obj: Mapping[str, Any], plan: Plan, patch: Mapping[str, Any]) -> None:
    """Metrics and Events of one round (after its final record was written)."""
    for _tick, reason in plan.skipped:
        metrics.observe_crewcronjob_ticks("skipped", reason.value)
    if plan.missed:
        metrics.observe_crewcronjob_ticks("missed", "OutsideCatchupWindow", plan.missed)
        _warn(obj, reason="TicksMissed",
                  message=f"{plan.missed} tick(s) older than the catch-up window were not run "
                          f"(latest {patch.get('lastMissedTime')})")
    if plan.paused_by is not None and any(r is SkipReason.PAUSED for _, r in plan.skipped):
        _warn(obj, reason="Paused",
                  message=f"schedule paused: CrewJob {plan.paused_by} has an uncertain "
                          "outcome; resolve it to resume")


def _warn(obj: Mapping[str, Any], reason: str, message: str) -> None:
    """A Warning Event on the CrewCronJob (kopf posts it)."""
    kopf.warn(dict(obj), reason=reason, message=message)  # type: ignore[arg-type]


def _api_message(exc: ApiException) -> str:
    import json

    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)


# --- kopf registration -------------------------------------------------------------------------
async def _sleep_until(event: asyncio.Event, stopped: kopf.DaemonStopped, until: float) -> None:
    while not stopped and not event.is_set():
        remaining = until - time.time()
        if remaining <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=min(1.0, remaining))


@kopf.daemon(c.GROUP, c.VERSION, ch.PLURAL, id=DAEMON_ID, cancellation_polling=1.0)
async def crewcronjob_daemon(stopped: kopf.DaemonStopped, body: kopf.Body,
                             **_: Any) -> None:
    namespace, name = str(body["metadata"]["namespace"]), str(body["metadata"]["name"])
    key = (namespace, name)
    event = STATE.wakeups.setdefault(key, asyncio.Event())
    settings = STATE.settings
    try:
        while not stopped:
            event.clear()
            obj = await asyncio.to_thread(get_cronjob, namespace, name)
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                return
            STATE.generations[key] = int(obj["metadata"].get("generation") or 1)
            try:
                due = await reconcile(obj, time.time())
            except ApiException as exc:
                log.warning("crewcronjob %s/%s: API error %s; retrying", namespace, name,
                            exc.status)
                due = time.time() + 5.0
            until = time.time() + settings.idle_seconds
            if due is not None:
                until = min(until, due + 0.05)
            await _sleep_until(event, stopped, until)
            if event.is_set():
                await asyncio.sleep(settings.settle_seconds)
    finally:
        STATE.wakeups.pop(key, None)
        STATE.generations.pop(key, None)


@kopf.on.event(c.GROUP, c.VERSION, ch.PLURAL, id="crewcronjob-spec")
async def crewcronjob_changed(event: Mapping[str, Any], **_: Any) -> None:
    """A spec change (new generation) wakes the daemon; our own status writes do not."""
    meta = (event.get("object") or {}).get("metadata") or {}
    key = (str(meta.get("namespace")), str(meta.get("name")))
    seen = STATE.generations.get(key)
    if seen is not None and int(meta.get("generation") or 0) != seen:
        wake(*key)


@kopf.on.event(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id="crewcronjob-children",
               labels={ch.LABEL_CRONJOB: kopf.PRESENT})
async def crewcronjob_child_changed(event: Mapping[str, Any], **_: Any) -> None:
    """A child changed (phase, deletion): its CrewCronJob may run a buffered tick, resume
    after a resolution, or trim its history."""
    meta = (event.get("object") or {}).get("metadata") or {}
    owner = (meta.get("labels") or {}).get(ch.LABEL_CRONJOB)
    if owner:
        wake(str(meta.get("namespace")), str(owner))
