"""Building CrewJob status patches, with kstatus-style conditions.

kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status: Flux without health expressions, kpt,
Config Sync) judges a resource by ``observedGeneration``, then ``Reconciling=True``
(InProgress), ``Stalled=True`` (Failed), then ``Ready`` (True: Current, False: InProgress).
Invariant kept by :func:`health`: a terminal CrewJob is never InProgress for kstatus, and its
verdict is the one docs/gitops-flux.md promises for the documented health expressions:
Succeeded and a cancel asked for in ``spec.cancel`` are Current (``Ready=True``); Failed, a
cancel nobody asked for in the spec, and any unresolved uncertain outcome are Failed
(``Stalled=True``); an accepted resolution settles the job (Current). Checked against the real
kstatus library by tests/e2e/test_kstatus_verdicts.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from crewfence_sidecar.contract import JobRecord

from crewfence_operator.crewjob.outcome import TERMINAL_PHASES, Phase, Verdict
from crewfence_operator.crewjob.output import BoundedOutput

CONDITION_TYPES = ("Ready", "Reconciling", "Stalled", "Succeeded", "Failed", "OutcomeUncertain")


@dataclass(frozen=True)
class Health:
    """The kstatus-facing conditions of a CrewJob: ``Ready`` and ``Stalled`` (never both)."""

    ready: bool
    stalled: bool


def health(phase: Phase, *, uncertain: bool, cancel_requested: bool,
           resolved: bool = False) -> Health:
    """Ready/Stalled for kstatus (see the module docstring); working phases are neither."""
    if phase not in TERMINAL_PHASES:
        return Health(ready=False, stalled=False)
    if resolved:
        return Health(ready=True, stalled=False)
    stalled = (uncertain or phase is Phase.FAILED
               or (phase is Phase.CANCELLED and not cancel_requested))
    return Health(ready=not stalled, stalled=stalled)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Assignment:
    ordinal: int
    pod: str
    claim: str
    journal_id: str | None

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ordinal": self.ordinal, "pod": self.pod, "claim": self.claim}
        if self.journal_id:
            out["journalId"] = self.journal_id
        return out

    @classmethod
    def from_status(cls, raw: Mapping[str, Any] | None) -> Assignment | None:
        if not raw or raw.get("ordinal") is None:
            return None
        return cls(ordinal=int(raw["ordinal"]), pod=str(raw.get("pod") or ""),
                   claim=str(raw.get("claim") or ""),
                   journal_id=str(raw["journalId"]) if raw.get("journalId") else None)


@dataclass
class Cancellation:
    requested: bool = False
    dispatched: bool = False
    remote_stop_confirmed: bool = False
    message: str | None = None
    work_stopped: bool = False
    """The record says the job's worker process was killed and reaped (sidecar evidence)."""
    stopped_at: str | None = None

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requested": self.requested, "dispatched": self.dispatched,
                               "remoteStopConfirmed": self.remote_stop_confirmed}
        if self.work_stopped:
            out["workStopped"] = True
            if self.stopped_at:
                out["stoppedAt"] = self.stopped_at
        if self.message:
            out["message"] = self.message[:1024]
        return out

    @classmethod
    def from_status(cls, raw: Mapping[str, Any] | None) -> Cancellation:
        raw = raw or {}
        return cls(requested=bool(raw.get("requested")), dispatched=bool(raw.get("dispatched")),
                   remote_stop_confirmed=bool(raw.get("remoteStopConfirmed")),
                   message=raw.get("message"), work_stopped=bool(raw.get("workStopped")),
                   stopped_at=raw.get("stoppedAt"))


@dataclass
class Progress:
    events: int = 0
    chunks: int = 0
    last_event: str | None = None

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"events": self.events, "chunks": self.chunks}
        if self.last_event:
            out["lastEvent"] = self.last_event
        return out

    @classmethod
    def from_status(cls, raw: Mapping[str, Any] | None) -> Progress:
        raw = raw or {}
        return cls(events=int(raw.get("events") or 0), chunks=int(raw.get("chunks") or 0),
                   last_event=raw.get("lastEvent"))


def _condition(ctype: str, true: bool, reason: str, message: str, generation: int,
               previous: Mapping[str, Mapping[str, Any]], now: str) -> dict[str, Any]:
    status = "True" if true else "False"
    before = previous.get(ctype)
    since = (before.get("lastTransitionTime") if before and before.get("status") == status
             else None) or now
    return {"type": ctype, "status": status, "reason": reason, "message": message[:1024],
            "lastTransitionTime": since, "observedGeneration": generation}


def build_conditions(phase: Phase, reason: str, message: str, *, uncertain_reason: str | None,
                     generation: int, previous: Sequence[Mapping[str, Any]] | None,
                     now: str, cancel_requested: bool = False,
                     extra: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Every condition type, Ready/Stalled from :func:`health`; ``extra`` conditions (e.g.
    ``Suspended``) are appended."""
    prev = {str(c.get("type")): c for c in (previous or []) if isinstance(c, Mapping)}
    working = phase not in TERMINAL_PHASES
    uncertain_msg = message if uncertain_reason else "the outcome is known"
    verdict = health(phase, uncertain=uncertain_reason is not None,
                     cancel_requested=cancel_requested)
    return [
        _condition("Ready", verdict.ready, reason, message, generation, prev, now),
        _condition("Reconciling", working, reason, message, generation, prev, now),
        _condition("Stalled", verdict.stalled, reason, message, generation, prev, now),
        _condition("Succeeded", phase is Phase.SUCCEEDED, reason, message, generation, prev, now),
        _condition("Failed", phase is Phase.FAILED, reason, message, generation, prev, now),
        _condition("OutcomeUncertain", uncertain_reason is not None,
                   uncertain_reason or "OutcomeKnown", uncertain_msg, generation, prev, now),
        *(_condition(str(e["type"]), e["status"] == "True", str(e["reason"]),
                     str(e["message"]), generation, prev, now) for e in extra),
    ]


@dataclass
class StatusContext:
    """What every patch needs to know about the object being written."""

    generation: int
    action_id: str
    previous_conditions: list[dict[str, Any]] = field(default_factory=list)
    cancel_requested: bool = False
    """``spec.cancel`` is true: a Cancelled verdict is the desired state (Ready)."""
    extra_conditions: tuple[Mapping[str, Any], ...] = ()
    """Conditions beyond :data:`CONDITION_TYPES` to write (``Suspended``)."""


def working_patch(ctx: StatusContext, phase: Phase, reason: str, message: str, *,
                  now: str, uncertain_reason: str | None = None,
                  extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Pending or Running: phase, reason, conditions (+ assignment etc. in ``extra``)."""
    patch: dict[str, Any] = {
        "phase": phase.value, "reason": reason, "message": message[:1024],
        "actionId": ctx.action_id, "observedGeneration": ctx.generation,
        "conditions": build_conditions(phase, reason, message, uncertain_reason=uncertain_reason,
                                       generation=ctx.generation,
                                       previous=ctx.previous_conditions, now=now,
                                       extra=ctx.extra_conditions),
    }
    if uncertain_reason is not None:
        patch["uncertainOutcome"] = True
    patch.update(extra or {})
    return patch


def record_times(record: JobRecord | None) -> dict[str, Any]:
    """startedAt/finishedAt from the sidecar record, so an exact repeat shows the original."""
    if record is None:
        return {}
    out: dict[str, Any] = {"startedAt": record.created_at, "requestHash": record.request_hash}
    if record.terminal:
        out["finishedAt"] = record.updated_at
    return out


def terminal_patch(ctx: StatusContext, verdict: Verdict, *, now: str,
                   record: JobRecord | None = None, output: BoundedOutput | None = None,
                   configmap: str | None = None, extra: Mapping[str, Any] | None = None,
                   ) -> dict[str, Any]:
    patch: dict[str, Any] = {
        "phase": verdict.phase.value, "reason": verdict.reason.value,
        "message": verdict.message[:1024], "actionId": ctx.action_id,
        "uncertainOutcome": verdict.uncertain, "recovery": verdict.recovery,
        "observedGeneration": ctx.generation,
        "failure": verdict.failure.to_status() if verdict.failure else None,
        "conditions": build_conditions(
            verdict.phase, verdict.reason.value, verdict.message,
            uncertain_reason=verdict.uncertain_reason.value if verdict.uncertain_reason else None,
            generation=ctx.generation, previous=ctx.previous_conditions, now=now,
            cancel_requested=ctx.cancel_requested, extra=ctx.extra_conditions),
    }
    patch.update(record_times(record))
    if record is not None and not record.terminal:
        patch["finishedAt"] = now
    if record is None:
        patch["finishedAt"] = now
    if output is not None:
        patch["output"] = output.status_fields(configmap)
    patch.update(extra or {})
    return patch


def restamped_conditions(status: Mapping[str, Any], *, generation: int,
                         cancel_requested: bool, now: str) -> list[dict[str, Any]]:
    """A finished CrewJob's conditions after a late spec change (only ``cancel`` can change):
    every condition stamped with ``generation`` and Ready/Stalled recomputed by :func:`health`
    (a Cancelled job whose cancel is now asked for in the spec is the desired state)."""
    raw_phase = status.get("phase")
    phase = Phase(str(raw_phase)) if raw_phase in {p.value for p in Phase} else None
    conditions = [dict(c) for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    if phase is None:
        return [{**c, "observedGeneration": generation} for c in conditions]
    resolution = status.get("resolution")
    verdict = health(phase, uncertain=bool(status.get("uncertainOutcome")),
                     cancel_requested=cancel_requested,
                     resolved=isinstance(resolution, Mapping) and bool(resolution.get("outcome")))
    wanted = {"Ready": verdict.ready, "Stalled": verdict.stalled}
    out = []
    for cond in conditions:
        ctype = str(cond.get("type"))
        if ctype in wanted:
            value = "True" if wanted[ctype] else "False"
            if cond.get("status") != value:
                cond = {**cond, "status": value, "lastTransitionTime": now}
        out.append({**cond, "observedGeneration": generation})
    return out
