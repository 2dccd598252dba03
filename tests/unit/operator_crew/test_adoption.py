"""A re-created Crew takes its orphaned pods and claims back; nothing owned elsewhere."""

from __future__ import annotations

from typing import Any

import pytest
from crewfence_operator.crew.adoption import adoption_patch, is_orphan
from crewfence_operator.crew.identity import CrewRef

CREW = CrewRef(namespace="team-a", name="research", uid="new-uid")
LABELS = {"app.kubernetes.io/managed-by": "crewfence", "crewfence.dev/crew": "research",
          "crewfence.dev/replica": "0"}


def _obj(**meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "research-0", "labels": dict(LABELS),
                         "resourceVersion": "7", **meta}}


def test_an_object_of_this_crew_without_a_controller_is_an_orphan() -> None:
    assert is_orphan(_obj(), CREW)
    assert is_orphan(_obj(ownerReferences=[{"kind": "Other", "name": "x", "uid": "u"}]), CREW)


@pytest.mark.parametrize("obj", [
    _obj(ownerReferences=[{"kind": "Crew", "name": "research", "uid": "old",
                           "controller": True}]),                     # still controlled
    _obj(ownerReferences=[{"kind": "StatefulSet", "name": "s", "uid": "u",
                           "controller": True}]),                     # somebody else's
    _obj(labels={**LABELS, "crewfence.dev/crew": "other"}),          # another Crew's
    _obj(labels={"crewfence.dev/crew": "research"}),                  # not the operator's
    _obj(deletionTimestamp="2026-01-01T00:00:00Z"),                  # going away
])
def test_anything_controlled_foreign_or_terminating_is_never_taken(obj: Any) -> None:
    assert not is_orphan(obj, CREW)


def test_the_patch_adds_the_crew_as_controller_guarded_by_resource_version() -> None:
    other = {"kind": "Other", "name": "x", "uid": "u"}
    patch = adoption_patch(_obj(ownerReferences=[other]), CREW)
    meta = patch["metadata"]
    assert meta["resourceVersion"] == "7"
    assert meta["ownerReferences"][0] == other
    new = meta["ownerReferences"][1]
    assert (new["kind"], new["name"], new["uid"], new["controller"]) == (
        "Crew", "research", "new-uid", True)
