"""The campaign's schedule: a seeded, randomized list of operations. Pure (no cluster).

Invariant: the same ``(seed, operations)`` always gives the same schedule, so a failing seed
replays the same operations in the same order (the cluster's timing is not replayed: which
job an operation hits is chosen at run time from ``pick`` among the jobs it applies to).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

JOB_KINDS: Final = ("apply", "reapply", "cancel", "delete", "delete_reapply", "resolve",
                    "rerun", "successor")
FAULT_KINDS: Final = ("scale", "retention", "operator_kill", "sidecar_kill", "pod_delete",
                      "sigstop", "crew_orphan")
KINDS: Final = (*JOB_KINDS, *FAULT_KINDS, "pause")

WEIGHTS: Final[dict[str, float]] = {
    "apply": 5, "reapply": 2, "cancel": 1.2, "delete": 1.5, "delete_reapply": 1.5,
    "resolve": 2.5, "rerun": 1.5, "successor": 1.2,
    "scale": 0.8, "retention": 0.6, "operator_kill": 0.8, "sidecar_kill": 1.0,
    "pod_delete": 1.0, "sigstop": 0.7, "crew_orphan": 0.4, "pause": 2.0,
}
SLEEPS: Final = (1, 3, 6, 12)
"""Seconds each model call of a job sleeps (``[[sleep:N]]``; a job makes two calls)."""
OUTCOMES: Final = ("NotHappened", "NotHappened", "Compensated", "Happened")
MAX_GAP: Final = 4.0


@dataclass(frozen=True)
class Op:
    """One operation. ``pick`` chooses the target among the eligible ones at run time."""

    index: int
    kind: str
    pick: int = 0
    sleep: int = 0
    """apply: seconds per model call; pause/sigstop/operator_kill: seconds (down/stopped)."""
    policy: str = "Cancel"
    """apply: deletionPolicy."""
    outcome: str = ""
    """resolve: the finding."""
    with_cancel: bool = False
    """delete_reapply: re-apply with spec.cancel true."""
    with_resolution: bool = False
    """delete_reapply: re-apply with the last accepted spec.resolution."""
    replicas: int = 0
    """scale: the new replica count."""
    retention: str = ""
    """retention: the window (``""``: retention off)."""
    gap: float = 0.0
    """Seconds to let pass after the operation (the campaign's pace, part of the schedule)."""

    @property
    def fault(self) -> bool:
        return self.kind in FAULT_KINDS

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in ("", 0, 0.0, False, "Cancel")
                or k in ("index", "kind")}


def _op(rng: random.Random, index: int, kind: str) -> Op:
    op = _kind_op(rng, index, kind)
    return replace(op, gap=round(rng.uniform(0.0, MAX_GAP), 1))


def _kind_op(rng: random.Random, index: int, kind: str) -> Op:
    pick = rng.randrange(1 << 16)
    if kind == "apply":
        return Op(index, kind, pick, sleep=rng.choice(SLEEPS),
                  policy=rng.choice(("Cancel", "Cancel", "Orphan")))
    if kind == "resolve":
        return Op(index, kind, pick, outcome=rng.choice(OUTCOMES))
    if kind == "delete_reapply":
        return Op(index, kind, pick, with_cancel=rng.random() < 0.3,
                  with_resolution=rng.random() < 0.3)
    if kind == "scale":
        return Op(index, kind, pick, replicas=rng.choice((1, 2, 2, 3)))
    if kind == "retention":
        return Op(index, kind, pick, retention=rng.choice(("", "15s", "60s")))
    if kind in ("pause", "sigstop"):
        return Op(index, kind, pick, sleep=rng.randint(1, 6))
    if kind == "operator_kill":
        return Op(index, kind, pick, sleep=rng.randint(0, 4))
    return Op(index, kind, pick)


def generate(seed: int, operations: int) -> list[Op]:
    """``operations`` operations for ``seed``; the first two always apply a job, so every
    campaign has work in flight when the first fault lands."""
    rng = random.Random(seed)
    kinds = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    ops: list[Op] = []
    for index in range(operations):
        kind = "apply" if index < 2 else rng.choices(kinds, weights)[0]
        ops.append(_op(rng, index, kind))
    return ops
