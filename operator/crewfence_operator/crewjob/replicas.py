"""The Crew's replicas as the CrewJob side reads them from ``Crew.status.replicas``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Replica:
    ordinal: int
    pod: str
    claim: str
    address: str | None
    journal_id: str | None
    ready: bool
    fenced: bool

    @property
    def eligible(self) -> bool:
        """May receive a new admission (never a fenced or unready replica)."""
        return self.ready and not self.fenced and bool(self.address)


def parse_replicas(crew: Mapping[str, Any]) -> list[Replica]:
    """Replicas in ordinal order; malformed entries are skipped."""
    raw = ((crew.get("status") or {}).get("replicas")) or []
    out: dict[int, Replica] = {}
    for item in raw:
        if not isinstance(item, Mapping) or item.get("ordinal") is None:
            continue
        try:
            ordinal = int(item["ordinal"])
        except (TypeError, ValueError):
            continue
        out[ordinal] = Replica(
            ordinal=ordinal, pod=str(item.get("pod") or ""), claim=str(item.get("claim") or ""),
            address=str(item["address"]) if item.get("address") else None,
            journal_id=str(item["journalId"]) if item.get("journalId") else None,
            ready=bool(item.get("ready")), fenced=bool(item.get("fenced")),
        )
    return [out[o] for o in sorted(out)]


def journal_changed(recorded: str | None, current: str | None) -> bool:
    """A different journal id on the assigned replica means its state was lost."""
    return bool(recorded) and bool(current) and recorded != current
