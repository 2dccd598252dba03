"""kopf glue for ``spec.ttlSecondsAfterFinished``: delete a finished CrewJob when it is due.

The decision is ``crewjob/ttl.py`` (pure; its docstring names T1-T3). No daemon or timer (kopf
would put a finalizer on every finished CrewJob): the CrewJob watch schedules one sleeping task
per CrewJob that has a deadline; every event of that CrewJob reschedules it (an operator
restart replays every object). Just before deleting, the CrewJob is read again and the
decision made again on what was read; the deletion is preconditioned on its uid, so a
re-created CrewJob of the same name is never the one deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator import kube
from crewfence_operator.crewjob import ttl
from crewfence_operator.crewjob.outcome import TERMINAL_PHASES
from crewfence_operator.runtime import runtime_of

log = logging.getLogger(__name__)


def _tasks(memo: Any) -> dict[str, asyncio.Task[None]]:
    return runtime_of(memo).ttl_tasks


async def _crew_spec(memo: Any, obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    spec = obj.get("spec") or {}
    if isinstance(spec.get("ttlSecondsAfterFinished"), int):
        return None  # its own TTL wins (T1): no Crew read
    crew, _ = await runtime_of(memo).io.read_crew(
        str(obj["metadata"]["namespace"]), str((spec.get("crewRef") or {}).get("name")))
    return (crew or {}).get("spec")


def _delete(namespace: str, name: str, uid: str) -> bool:
    """Delete this CrewJob object (uid precondition); False when gone or another object."""
    try:
        kube.custom().delete_namespaced_custom_object(
            c.GROUP, c.VERSION, namespace, c.CREWJOB_PLURAL, name,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid),
                                        propagation_policy="Background"))
    except ApiException as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


async def _expire(memo: Any, namespace: str, name: str, uid: str, seconds: float) -> None:
    await asyncio.sleep(max(0.0, seconds))
    obj = await asyncio.to_thread(kube.get_crewjob, namespace, name)
    if obj is None or obj["metadata"].get("uid") != uid:
        return
    due = ttl.deletion_due(obj, await _crew_spec(memo, obj), time.time())
    if due is None or due > 0:
        return  # the next event of this CrewJob schedules it again
    if await asyncio.to_thread(_delete, namespace, name, uid):
        log.info("crewjob %s/%s: deleted %s s after it finished (ttlSecondsAfterFinished)",
                 namespace, name, ttl.ttl_seconds(obj.get("spec") or {}, None) or "the Crew's")


@kopf.on.event(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id="crewjob-ttl")
async def crewjob_ttl(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    """(Re)schedule the deletion of a finished CrewJob (T1-T3 decide; no API write here)."""
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    tasks = _tasks(memo)
    previous = tasks.pop(uid, None)
    if previous is not None and not previous.done():
        previous.cancel()
    if event.get("type") == "DELETED" or not uid:
        return
    if (obj.get("status") or {}).get("phase") not in {p.value for p in TERMINAL_PHASES}:
        return
    due = ttl.deletion_due(obj, await _crew_spec(memo, obj), time.time())
    if due is None:
        return
    tasks[uid] = asyncio.create_task(
        _expire(memo, str(meta["namespace"]), str(meta["name"]), uid, due),
        name=f"ttl {meta['namespace']}/{meta['name']}")


@kopf.on.cleanup()
async def crewjob_ttl_cleanup(memo: kopf.Memo, **_: Any) -> None:
    for task in _tasks(memo).values():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
