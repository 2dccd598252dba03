"""A CrewCronJob's children: one CrewJob per tick, named and identified by the tick alone.

Which object holds which fact:

- the tick time: computed from the spec (``schedule.py``); never stored to be trusted;
- that a tick's Action exists: the child CrewJob ``<cronjob>-<unix seconds of the tick>``,
  annotation ``crewfence.dev/scheduled-time`` (RFC 3339 UTC), action id
  ``<namespace>/<cronjob>/<scheduled time>``, a controller owner reference to the CrewCronJob;
- that the Action was admitted (and its outcome): the Crew's journal, keyed by the action id;
  the child's status mirrors it;
- that a tick was handled (run, skipped or missed): the CrewCronJob's
  ``status.lastScheduleTime``.

So the API server fences a tick by the child's name (create answers 409 for the second
attempt) and the sidecar fences it by the action id (a re-created child is an exact repeat,
never a second run). Manual runs (``trigger``) are ``<cronjob>-manual-<unix seconds>`` with
the action id ``<namespace>/<cronjob>/manual-<time>``: their own Actions, never a tick's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from crewfence_operator import constants as c
from crewfence_operator.cronjob.schedule import from_rfc3339, to_rfc3339

KIND: Final = "CrewCronJob"
PLURAL: Final = "crewcronjobs"
LABEL_CRONJOB: Final = "crewfence.dev/crewcronjob"
ANNOTATION_SCHEDULED: Final = "crewfence.dev/scheduled-time"
ANNOTATION_MANUAL: Final = "crewfence.dev/triggered-at"
MAX_NAME: Final = 52
"""CEL limit on a CrewCronJob's name: ``<name>-<10 digits>`` stays a 63-character label."""

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed", "Cancelled"})


def child_name(cronjob: str, tick: int) -> str:
    return f"{cronjob}-{tick}"


def manual_name(cronjob: str, moment: int) -> str:
    return f"{cronjob}-manual-{moment}"


def action_id(namespace: str, cronjob: str, tick: int) -> str:
    return f"{namespace}/{cronjob}/{to_rfc3339(tick)}"


def manual_action_id(namespace: str, cronjob: str, moment: int) -> str:
    return f"{namespace}/{cronjob}/manual-{to_rfc3339(moment)}"


def child_manifest(owner: Mapping[str, Any], *, tick: int | None = None,
                   manual_at: int | None = None) -> dict[str, Any]:
    """The CrewJob for one tick (or one manual run) of ``owner`` (a CrewCronJob object)."""
    assert (tick is None) != (manual_at is None)
    meta = owner["metadata"]
    namespace, cronjob = str(meta["namespace"]), str(meta["name"])
    template = (owner.get("spec") or {}).get("jobTemplate") or {}
    tmeta = template.get("metadata") or {}
    labels = {**dict(tmeta.get("labels") or {}), LABEL_CRONJOB: cronjob,
              c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE}
    annotations = dict(tmeta.get("annotations") or {})
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    if tick is not None:
        name, aid = child_name(cronjob, tick), action_id(namespace, cronjob, tick)
        annotations[ANNOTATION_SCHEDULED] = to_rfc3339(tick)
    else:
        assert manual_at is not None
        name = manual_name(cronjob, manual_at)
        aid = manual_action_id(namespace, cronjob, manual_at)
        annotations[ANNOTATION_MANUAL] = to_rfc3339(manual_at)
    spec["actionId"] = aid
    return {
        "apiVersion": c.API_VERSION, "kind": c.CREWJOB_KIND,
        "metadata": {
            "name": name, "namespace": namespace, "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": c.API_VERSION, "kind": KIND, "name": cronjob,
                "uid": meta["uid"], "controller": True, "blockOwnerDeletion": False,
            }],
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class Child:
    """One observed child CrewJob, as the decisions need it."""

    name: str
    tick: int | None
    """The scheduled time (None for a manual run)."""
    phase: str | None
    uncertain: bool = False
    resolved: bool = False
    created: int = 0
    cancel_requested: bool = False
    finished: int | None = None
    owned: bool = True
    """Controlled by this incarnation of the CrewCronJob (only those are ever deleted)."""

    @property
    def active(self) -> bool:
        return self.phase not in TERMINAL_PHASES

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"

    @property
    def needs_person(self) -> bool:
        """An uncertain outcome nobody has resolved yet."""
        return self.uncertain and not self.resolved

    @property
    def order(self) -> int:
        return self.tick if self.tick is not None else self.created

    @classmethod
    def from_object(cls, obj: Mapping[str, Any], owner_uid: str | None = None) -> Child:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        status = obj.get("status") or {}
        tick = _time(annotations.get(ANNOTATION_SCHEDULED))
        created = _time(meta.get("creationTimestamp")) or 0
        resolution = status.get("resolution") or {}
        return cls(name=str(meta.get("name")), tick=tick, phase=status.get("phase"),
                   uncertain=bool(status.get("uncertainOutcome")),
                   resolved=bool(resolution.get("outcome")), created=created,
                   cancel_requested=bool((obj.get("spec") or {}).get("cancel")),
                   finished=_time(status.get("finishedAt")),
                   owned=owner_uid is None or owned_by(obj, owner_uid))


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """The child's controller is exactly this CrewCronJob (this incarnation)."""
    return any(ref.get("controller") and ref.get("uid") == uid
               for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def _time(raw: Any) -> int | None:
    if not raw:
        return None
    try:
        return from_rfc3339(str(raw))
    except ValueError:
        return None
