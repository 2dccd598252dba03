"""Who may mount a state claim: the rules shared by the admission webhook and the audit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from crewfence_operator import constants as c
from crewfence_operator.crew.adoption import is_orphan_of
from crewfence_operator.crew.identity import is_owned_by_crew, parse_ordinal
from crewfence_operator.crew.pod import pod_claims

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class StateClaimOwner:
    """The Crew replica a state claim belongs to, read from the claim's labels."""

    claim: str
    crew: str
    ordinal: int


def state_claim_owner(claim: Mapping[str, Any]) -> StateClaimOwner | None:
    """The owner of a claim labelled ``crewfence.dev/role: state`` (None for other claims)."""
    meta = claim.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(c.LABEL_ROLE) != c.ROLE_STATE:
        return None
    ordinal = parse_ordinal(labels.get(c.LABEL_REPLICA))
    return StateClaimOwner(
        claim=str(meta.get("name")),
        crew=str(labels.get(c.LABEL_CREW, "")),
        ordinal=ordinal if ordinal is not None else -1,
    )


def _named_and_labelled_as_replica(meta: Mapping[str, Any], owner: StateClaimOwner) -> bool:
    labels = meta.get("labels") or {}
    return (
        labels.get(c.LABEL_MANAGED_BY) == c.MANAGED_BY_VALUE
        and labels.get(c.LABEL_CREW) == owner.crew
        and parse_ordinal(labels.get(c.LABEL_REPLICA)) == owner.ordinal
        and meta.get("name") == c.pod_name(owner.crew, owner.ordinal)
    )


def is_operator_pod_for(pod: Mapping[str, Any], owner: StateClaimOwner) -> bool:
    """True only for the operator's own pod of that Crew replica."""
    meta = pod.get("metadata") or {}
    return _named_and_labelled_as_replica(meta, owner) and is_owned_by_crew(meta, owner.crew)


def is_replica_pod_awaiting_adoption(pod: Mapping[str, Any], owner: StateClaimOwner) -> bool:
    """The replica's own pod, left without any controller (its Crew was deleted with
    ``--cascade=orphan`` and the garbage collector stripped the reference).

    Invariant (the audit agrees with adoption): such a pod is this Crew's (``crew/adoption.py``
    makes the Crew its controller again), so the audit never fences its replica as shared,
    not even in a pass whose adoption patch lost a race (409 on a stale resourceVersion) or
    never ran (the pass failed before it); that fence would stand until the next audit and
    post a false ``StateVolumeShared`` warning. The admission webhook stays strict: a pod
    created without the Crew's reference is refused (``pod_rejection``)."""
    return _named_and_labelled_as_replica(pod.get("metadata") or {}, owner) and is_orphan_of(
        pod, owner.crew)


def _pod_display_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("name") or (str(meta.get("generateName") or "") + "<generated>"))


def pod_rejection(pod: Mapping[str, Any], owners: Iterable[StateClaimOwner]) -> str | None:
    """Why the webhook must reject ``pod`` (None: admit). ``owners``: its claims that are state."""
    for owner in owners:
        if not is_operator_pod_for(pod, owner):
            return (
                f'pod "{_pod_display_name(pod)}" may not mount PersistentVolumeClaim '
                f'"{owner.claim}": it holds the crewfence journal of Crew "{owner.crew}" '
                f"replica {owner.ordinal}, and only that replica's operator-managed pod "
                f'"{c.pod_name(owner.crew, owner.ordinal)}" may mount it (one writer per journal; '
                f"a second mount would share writable state)"
            )
    return None


@dataclass(frozen=True)
class ForeignMount:
    claim: str
    ordinal: int
    pod: str

    @property
    def reason(self) -> str:
        return (
            f'state claim "{self.claim}" of replica {self.ordinal} is also mounted by foreign '
            f'pod "{self.pod}"; no new jobs are dispatched to this replica until that pod is gone'
        )


def foreign_mounts(
    crew: str, claims_by_ordinal: Mapping[int, str], pods: Iterable[Mapping[str, Any]]
) -> list[ForeignMount]:
    """Pods other than the replica's own pod (owned, or orphaned and about to be adopted)
    that mount one of this Crew's state claims."""
    ordinal_by_claim = {claim: ordinal for ordinal, claim in claims_by_ordinal.items()}
    found: list[ForeignMount] = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            continue
        for claim in pod_claims(dict(pod)):
            ordinal = ordinal_by_claim.get(claim)
            if ordinal is None:
                continue
            owner = StateClaimOwner(claim=claim, crew=crew, ordinal=ordinal)
            if not (is_operator_pod_for(pod, owner)
                    or is_replica_pod_awaiting_adoption(pod, owner)):
                found.append(ForeignMount(claim=claim, ordinal=ordinal,
                                          pod=_pod_display_name(pod)))
    return sorted(found, key=lambda m: (m.ordinal, m.pod))
