"""Re-adopting a Crew's orphaned children: pure decisions, no API calls.

``kubectl delete crew --cascade=orphan`` (or a GitOps tool re-creating the Crew) leaves the
replica pods and state claims running, and the garbage collector strips their owner
references. The Crew of the same name, re-created, must continue with them: their journals
hold Actions that are still running or answered, and a new pod beside them would be a second
writer.

Invariant (a re-created Crew continues, never forks): a pod or state claim that carries this
Crew's labels and name for its ordinal and has no Crew controller reference at all is this
Crew's, and gets the Crew as its controller again; anything owned by another object is never
taken (and stays fenced by the audit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crewfence_operator import constants as c
from crewfence_operator.crew.identity import CrewRef, owner_reference


def is_orphan(obj: Mapping[str, Any], crew: CrewRef) -> bool:
    """Labelled for this Crew, and no controller of any kind (the GC removed the old Crew's)."""
    return is_orphan_of(obj, crew.name)


def is_orphan_of(obj: Mapping[str, Any], crew_name: str) -> bool:
    """:func:`is_orphan` by the Crew's name (the shared-state audit knows no more)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(c.LABEL_MANAGED_BY) != c.MANAGED_BY_VALUE or labels.get(c.LABEL_CREW) \
            != crew_name or meta.get("deletionTimestamp"):
        return False
    return not any(ref.get("controller") for ref in meta.get("ownerReferences") or ())


def adoption_patch(obj: Mapping[str, Any], crew: CrewRef) -> dict[str, Any]:
    """The merge patch that makes ``crew`` the controller again, guarded by resourceVersion
    (a concurrent change makes the API server answer 409 and the next pass looks again)."""
    meta = obj.get("metadata") or {}
    refs = [dict(r) for r in meta.get("ownerReferences") or ()]
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                         "ownerReferences": [*refs, owner_reference(crew)]}}
