"""Where kopf keeps its per-object state: the diff base, with no copy on CrewJobs.

kopf writes its "last-handled-configuration" annotation after the first processing cycle of
every object whose kind has a change handler (``on.create/update/delete/resume``), so that it
can later tell an update from a creation. CrewJobs have exactly one such handler,
``on.delete`` (``handlers/crewjob.py``: the cancel of a CrewJob deleted while the operator
was down), and no create, update or resume handler. For them that annotation is one API write
per CrewJob that nothing ever reads: a deletion is detected from ``deletionTimestamp`` alone,
and the daemon and the event handlers do not look at diffs.

Invariant (no diff base on CrewJobs): for a CrewJob kopf neither reads nor writes a diff
base, so the cause kopf detects for a live CrewJob is always "creation" (which has no
handler: nothing runs) and for a deleted one "deletion" (the on.delete handler runs, as
before). Every other kind (Crews, CrewCronJobs) keeps the annotation as kopf stores it.
Adding a create/update/resume handler on CrewJobs would need the diff base back: the test
``tests/unit/operator_crewjob/test_persistence.py`` fails when such a handler is registered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from crewfence_operator import constants as c


def is_crewjob(body: Mapping[str, Any]) -> bool:
    return (body.get("kind") == c.CREWJOB_KIND
            and str(body.get("apiVersion") or "").split("/")[0] == c.GROUP)


class DiffBaseExceptCrewJobs(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff base for every kind but CrewJobs (see the module docstring)."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        if is_crewjob(body):
            return None
        return super().fetch(body=body)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        if is_crewjob(body):
            return
        super().store(body=body, patch=patch, essence=essence)
