"""``kubectl crewfence trigger <crewcronjob>``: one manual run, its own Action.

A manual run is a child CrewJob ``<cronjob>-manual-<unix seconds>`` with the action id
``<namespace>/<cronjob>/manual-<time, RFC 3339 UTC>``: never a tick's name or action id, so
it can neither replace nor repeat a scheduled run, and it does not move
``status.lastScheduleTime``. It is created if absent: triggering twice within one second is
one run (the second answer says it already existed). It counts as an active child for the
concurrency policy and, with ``onUncertain: Pause``, its uncertain outcome pauses the
schedule like any other. The plugin's ``kubectl/trigger.py`` wires :func:`trigger` to its verb.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from crewfence_operator import constants as c
from crewfence_operator.cronjob import children as ch


class TriggerError(Exception):
    """The manual run could not be created; the message says why (for the user)."""


class TriggerApi(Protocol):
    """The two calls :func:`trigger` makes (the ``kubernetes`` CustomObjectsApi has both)."""

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                     plural: str, name: str) -> Any: ...

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                        plural: str, body: Any) -> Any: ...


@dataclass(frozen=True)
class TriggerResult:
    name: str
    action_id: str
    created: bool
    """False: a manual run of the same second already existed (nothing new was started)."""

    def message(self, namespace: str) -> str:
        verb = "created" if self.created else "already existed"
        return (f"crewjob.crewfence.dev/{self.name} {verb} in {namespace} "
                f"(action id {self.action_id})")


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return int(status) if isinstance(status, int) else None


def _reason_of(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    try:
        return str(json.loads(body or "{}").get("message") or exc)
    except (TypeError, ValueError):
        return str(exc)


def trigger(api: TriggerApi, namespace: str, cronjob: str, *,
            now: float | None = None) -> TriggerResult:
    """Create one manual run of ``cronjob`` now (``now``: Unix seconds, for tests)."""
    try:
        owner = api.get_namespaced_custom_object(c.GROUP, c.VERSION, namespace, ch.PLURAL,
                                                 cronjob)
    except Exception as exc:
        if _status_of(exc) == 404:
            raise TriggerError(f"crewcronjob {namespace}/{cronjob} not found") from None
        raise
    if not isinstance(owner, Mapping) or not (owner.get("metadata") or {}).get("uid"):
        raise TriggerError(f"crewcronjob {namespace}/{cronjob}: unexpected answer")
    moment = int(time.time() if now is None else now)
    body = ch.child_manifest(owner, manual_at=moment)
    name = body["metadata"]["name"]
    aid = str(body["spec"]["actionId"])
    try:
        api.create_namespaced_custom_object(c.GROUP, c.VERSION, namespace, c.CREWJOB_PLURAL,
                                            body)
    except Exception as exc:
        status = _status_of(exc)
        if status == 409:
            return TriggerResult(name=name, action_id=aid, created=False)
        if status in (400, 403, 422):
            raise TriggerError(f"the API server refused the manual run {name}: "
                               f"{_reason_of(exc)}") from None
        raise
    return TriggerResult(name=name, action_id=aid, created=True)
