"""The campaign's history: every operation with its outcome, and every observation (CrewJob
status samples, sidecar record samples, the final Events, metrics and the model-call ledger).

Invariant: the history holds only what was observed from outside the operator (kubectl, the
sidecar's HTTP API, the operator's /metrics, the ledger file the offline LLM appends to), each
with the monotonic time it was taken, so the checker can order observations.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from campaign.schedule import Op

TERMINAL = frozenset({"Succeeded", "Failed", "Cancelled"})


@dataclass(frozen=True)
class OpRecord:
    t: float
    op: Op
    outcome: str
    """``done``, ``skipped: why`` or ``error: what``."""
    target: str = ""


@dataclass(frozen=True)
class JobSample:
    """One CrewJob as ``kubectl get`` showed it."""

    t: float
    name: str
    uid: str
    phase: str
    reason: str = ""
    uncertain: bool = False
    action_id: str = ""
    ordinal: int | None = None
    journal_id: str = ""
    started: bool = False
    supersedes: str = ""
    """spec.supersedes."""
    linked: str = ""
    """status.supersedes.name (the gate let it through)."""
    superseded_by: str = ""
    resolution: str = ""
    """status.resolution.outcome."""
    conditions: tuple[tuple[str, str, str], ...] = ()
    """(type, status, reason)."""

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def admitted(self) -> bool:
        """The job got past its admission gate (it has an assignment or ran)."""
        return self.ordinal is not None or self.started or bool(self.linked) or \
            self.phase in ("Running", "Succeeded")

    def condition(self, ctype: str) -> tuple[str, str] | None:
        for kind, status, reason in self.conditions:
            if kind == ctype:
                return status, reason
        return None

    @classmethod
    def from_object(cls, t: float, obj: Mapping[str, Any]) -> JobSample:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        status = obj.get("status") or {}
        assignment = status.get("assignment") or {}
        return cls(
            t=t, name=str(meta.get("name")), uid=str(meta.get("uid", "")),
            phase=str(status.get("phase") or ""), reason=str(status.get("reason") or ""),
            uncertain=bool(status.get("uncertainOutcome")),
            action_id=str(status.get("actionId") or spec.get("actionId") or ""),
            ordinal=assignment.get("ordinal"), journal_id=str(assignment.get("journalId") or ""),
            started=bool(status.get("startedAt")),
            supersedes=str(spec.get("supersedes") or ""),
            linked=str((status.get("supersedes") or {}).get("name") or ""),
            superseded_by=str((status.get("supersededBy") or {}).get("name") or ""),
            resolution=str((status.get("resolution") or {}).get("outcome") or ""),
            conditions=tuple((str(c.get("type")), str(c.get("status")), str(c.get("reason")))
                             for c in status.get("conditions") or []))


@dataclass(frozen=True)
class RecordSample:
    """The sidecar's record of one action on one replica (``GET /jobs/{id}``)."""

    t: float
    action_id: str
    ordinal: int
    status: str
    """The record's status, ``absent`` (404) or ``archived`` (410)."""


@dataclass(frozen=True)
class EventSample:
    uid: str
    name: str
    type: str
    reason: str


@dataclass
class History:
    seed: int
    namespace: str
    ops: list[OpRecord] = field(default_factory=list)
    jobs: list[JobSample] = field(default_factory=list)
    records: list[RecordSample] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    """CrewJob name -> the unique token its input carries (a rerun copies its predecessor's)."""
    final_jobs: list[JobSample] = field(default_factory=list)
    events: list[EventSample] = field(default_factory=list)
    unresolved_gauge: dict[str, float] = field(default_factory=dict)
    """crewfence_operator_unresolved_uncertain_crewjobs in this namespace, by reason."""
    ledger: list[str] = field(default_factory=list)
    """The task excerpt of every offline LLM call the campaign's pods made."""
    settled: bool = True

    def faults(self) -> Counter[str]:
        return Counter(r.op.kind for r in self.ops if r.op.fault and r.outcome == "done")

    def summary(self) -> dict[str, Any]:
        outcomes = Counter(r.outcome.split(":")[0] for r in self.ops)
        return {
            "seed": self.seed, "namespace": self.namespace, "operations": len(self.ops),
            "outcomes": dict(outcomes),
            "by_kind": dict(Counter(r.op.kind for r in self.ops if r.outcome == "done")),
            "faults": dict(self.faults()), "faults_total": sum(self.faults().values()),
            "jobs": len(self.tokens), "model_calls": len(self.ledger),
            "final_phases": dict(Counter(f"{j.phase}/{j.reason}" for j in self.final_jobs)),
            "uncertain": sum(j.uncertain for j in self.final_jobs), "settled": self.settled,
            "samples": {"jobs": len(self.jobs), "records": len(self.records)},
        }

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> History:
        """A history saved by :meth:`to_json` (to check it again with a newer checker)."""
        raw = json.loads(text)

        def job(d: dict[str, Any]) -> JobSample:
            return JobSample(**{**d, "conditions": tuple(tuple(c) for c in d["conditions"])})

        return cls(
            seed=raw["seed"], namespace=raw["namespace"],
            ops=[OpRecord(r["t"], Op(**r["op"]), r["outcome"], r["target"]) for r in raw["ops"]],
            jobs=[job(j) for j in raw["jobs"]],
            records=[RecordSample(**r) for r in raw["records"]], tokens=raw["tokens"],
            final_jobs=[job(j) for j in raw["final_jobs"]],
            events=[EventSample(**e) for e in raw["events"]],
            unresolved_gauge=raw["unresolved_gauge"], ledger=raw["ledger"],
            settled=raw["settled"])

    def log_lines(self) -> list[str]:
        return [f"{r.t:7.1f}s #{r.op.index:<3} {r.op.kind:<15} {r.target:<22} {r.outcome}"
                for r in self.ops]
