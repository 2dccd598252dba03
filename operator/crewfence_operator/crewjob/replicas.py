"""The Crew's replicas as the CrewJob side reads them from the Crew's status.

Every journal that might hold an Action is listed here, not only the serving replicas:
``status.replicas`` (live, draining, and, once the scale-down work lands, retained entries with
a ``state``) and ``status.retainedClaims`` (claims kept without a pod). A journal that is listed
but cannot answer is exactly what the probe before the first admission must wait for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ReplicaState(StrEnum):
    ACTIVE = "Active"
    """Serving: may receive new admissions when ready and unfenced."""
    DRAINING = "Draining"
    """Being scaled away: answers lookups and cancels, refuses admissions (503 ``draining``)."""
    RETAINED = "Retained"
    """Its claim (and journal) is kept; it may have no pod to answer."""


@dataclass(frozen=True)
class Replica:
    ordinal: int
    pod: str
    claim: str
    address: str | None
    journal_id: str | None
    ready: bool
    fenced: bool
    state: ReplicaState = ReplicaState.ACTIVE

    @property
    def eligible(self) -> bool:
        """May receive a new admission: an active, ready, unfenced replica whose journal id is
        known (the assignment pins it before the admission is sent)."""
        return (self.state is ReplicaState.ACTIVE and self.ready and not self.fenced
                and bool(self.address) and bool(self.journal_id))

    @property
    def can_answer(self) -> bool:
        """Has an address to ask (draining replicas answer lookups too)."""
        return bool(self.address)

    @property
    def label(self) -> str:
        where = self.pod or self.claim or "?"
        suffix = "" if self.state is ReplicaState.ACTIVE else f", {self.state.value.lower()}"
        return f"{self.ordinal} ({where}{suffix})"


def _state(raw: object, serving_hint: bool) -> ReplicaState:
    if isinstance(raw, str):
        for state in ReplicaState:
            if raw.lower() == state.value.lower():
                return state
    return ReplicaState.ACTIVE if serving_hint else ReplicaState.DRAINING


def parse_replicas(crew: Mapping[str, Any]) -> list[Replica]:
    """Every replica whose journal might hold an Action, in ordinal order.

    Entries of ``status.replicas`` carry their ``state`` (``Active|Draining|Retained``) when the
    Crew writes one; without it an entry is Active, unless its ordinal is at or above
    ``spec.replicas`` (being scaled away: Draining). ``status.retainedClaims`` entries not listed
    among the replicas become Retained replicas without an address. Malformed entries are
    skipped.
    """
    status = crew.get("status") or {}
    desired_raw = (crew.get("spec") or {}).get("replicas")
    desired = int(desired_raw) if isinstance(desired_raw, int) else None
    out: dict[int, Replica] = {}
    for item in status.get("replicas") or []:
        ordinal = _ordinal(item)
        if ordinal is None:
            continue
        serving = desired is None or ordinal < desired
        out[ordinal] = Replica(
            ordinal=ordinal, pod=str(item.get("pod") or ""), claim=str(item.get("claim") or ""),
            address=str(item["address"]) if item.get("address") else None,
            journal_id=str(item["journalId"]) if item.get("journalId") else None,
            ready=bool(item.get("ready")), fenced=bool(item.get("fenced")),
            state=_state(item.get("state") or item.get("role"), serving),
        )
    for item in status.get("retainedClaims") or []:
        ordinal = _ordinal(item)
        if ordinal is None or ordinal in out:
            continue
        out[ordinal] = Replica(
            ordinal=ordinal, pod=str(item.get("pod") or ""), claim=str(item.get("claim") or ""),
            address=str(item["address"]) if item.get("address") else None,
            journal_id=str(item["journalId"]) if item.get("journalId") else None,
            ready=False, fenced=False, state=ReplicaState.RETAINED)
    return [out[o] for o in sorted(out)]


def _ordinal(item: object) -> int | None:
    if not isinstance(item, Mapping) or item.get("ordinal") is None:
        return None
    try:
        return int(item["ordinal"])
    except (TypeError, ValueError):
        return None


def journal_changed(recorded: str | None, current: str | None) -> bool:
    """A different journal id on the assigned replica means its state was lost."""
    return bool(recorded) and bool(current) and recorded != current


def asking_order(listed: Iterable[Replica], first: object) -> list[Replica]:
    """Where an action's facts are looked for: the replica it was assigned to (``first``, an
    ordinal or None) first, then every other listed replica by ordinal; pure.

    Invariant (an action's facts live wherever its journal or tombstone went): a tombstone
    handed over on scale-down lives on a survivor and a re-used ordinal has a fresh journal,
    so the successor gate and the resolution handler ask every listed replica, never the
    assigned one alone, and both in this one order."""
    return sorted(listed, key=lambda r: (r.ordinal != first, r.ordinal))
