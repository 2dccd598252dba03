"""Who a generated object belongs to: labels and owner references for one Crew."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crewfence_operator import constants as c


@dataclass(frozen=True)
class CrewRef:
    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> CrewRef:
        meta = body["metadata"]
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def crew_labels(crew: CrewRef) -> dict[str, str]:
    return {
        c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE,
        c.LABEL_NAME: "crewfence",
        c.LABEL_CREW: crew.name,
    }


def replica_labels(crew: CrewRef, ordinal: int) -> dict[str, str]:
    return {**crew_labels(crew), c.LABEL_REPLICA: str(ordinal)}


def state_claim_labels(crew: CrewRef, ordinal: int) -> dict[str, str]:
    return {**replica_labels(crew, ordinal), c.LABEL_ROLE: c.ROLE_STATE}


def selector_for(crew: CrewRef) -> str:
    """A label selector string matching everything the operator made for this Crew."""
    return f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY_VALUE},{c.LABEL_CREW}={crew.name}"


def owner_reference(crew: CrewRef) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.CREW_KIND,
        "name": crew.name,
        "uid": crew.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(crew: CrewRef, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": crew.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner_reference(crew)],
    }


def is_owned_by_crew(meta: Mapping[str, Any], crew_name: str | None = None) -> bool:
    """True when ``meta`` carries a controller reference to a Crew (of that name, if given)."""
    for ref in meta.get("ownerReferences") or ():
        if ref.get("kind") != c.CREW_KIND or not str(ref.get("apiVersion", "")).startswith(
            c.GROUP + "/"
        ):
            continue
        if crew_name is None or ref.get("name") == crew_name:
            return True
    return False


def parse_ordinal(value: object) -> int | None:
    try:
        ordinal = int(str(value))
    except ValueError:
        return None
    return ordinal if ordinal >= 0 else None
