"""Deterministic, sticky assignment of an Action to a Crew replica.

Rendezvous (highest-random-weight) hashing: every replica ordinal gets a score
``sha256(action_id, ordinal)`` and the highest score wins. Removing a replica only moves
the Actions that lived on it, and the same inputs always give the same answer on every
operator instance. Stickiness itself is the caller's job: once an assignment is recorded
in ``status.assignment`` it is never recomputed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def rendezvous_score(action_id: str, ordinal: int) -> int:
    digest = hashlib.sha256(f"{ordinal}\x00{action_id}".encode("utf-8", "surrogatepass"))
    return int.from_bytes(digest.digest()[:8], "big")


def rank_ordinals(action_id: str, ordinals: Iterable[int]) -> list[int]:
    """All ordinals, best first (ties, practically impossible, break on the lower ordinal)."""
    unique = sorted(set(ordinals))
    return sorted(unique, key=lambda o: (-rendezvous_score(action_id, o), o))


def choose_ordinal(action_id: str, eligible: Iterable[int]) -> int | None:
    """The ordinal that should own ``action_id`` among ``eligible``; None when there is none."""
    ranked = rank_ordinals(action_id, eligible)
    return ranked[0] if ranked else None
