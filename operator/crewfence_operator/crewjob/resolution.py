"""Resolving an uncertain outcome: validate ``spec.resolution`` against the status, and build
the status patches that record it. Pure: no API, no sidecar, no clock (``now`` is passed in).

Invariants kept here (each named where it is decided):
- *only uncertain outcomes are resolved*: a resolution on a job whose outcome is known is
  ignored with a ``Resolved=False/ResolutionIgnored`` condition, never copied to status;
- *a resolution is a finding, not a rewrite of history*: the patches never touch ``phase``,
  ``reason``, ``failure``, ``output`` or ``uncertainOutcome``; they add ``status.resolution``
  and turn the ``OutcomeUncertain`` condition False with reason ``Resolved``;
- *level-triggered*: :func:`decide` looks only at the object as it is now, so a decision
  interrupted halfway (operator restart, a concurrent status write that clobbered the
  conditions) is simply taken again;
- *the journal's finding wins*: a resolution is journaled once on the replica that ran the
  job; when a re-applied CrewJob's ``spec.resolution`` disagrees with it, the status mirrors
  the journaled finding and a ``ResolutionConflict`` condition says so (:func:`conflict_patch`);
  nothing else changes, and nothing is retried;
- *status shows only a confirmed finding*: for a job with an assigned replica (a journal may
  hold its record) :func:`decide` says ``CONFIRM``: the journal is asked first and
  ``status.resolution`` is written only from its answer (:func:`confirmed_patch` or
  :func:`conflict_patch`); until it answers, only ``Resolved=False/JournalPending`` is shown
  (:func:`unconfirmed_patch`). A re-applied predecessor therefore never shows, even for a
  moment, a resolution its journal does not hold;
- *an archived record keeps its finding*: the sidecar answers a resolution on a tombstone as on
  the record (the journaled finding, or a 409 naming it; written with the tombstone when it
  had none), so a re-applied predecessor whose record was archived mirrors the journal too;
  only "no journal holds the action" (404) records the spec's finding as not journaled
  (:func:`when_not_held`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from crewfence_sidecar.contract import ResolutionOutcome, ResolutionRequest

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed", "Cancelled"})
RESOLVED_CONDITION: Final = "Resolved"
UNCERTAIN_CONDITION: Final = "OutcomeUncertain"
REASON_RESOLVED: Final = "Resolved"
REASON_IGNORED: Final = "ResolutionIgnored"
CONFLICT_CONDITION: Final = "ResolutionConflict"
REASON_JOURNAL_DISAGREES: Final = "JournalDisagrees"
FIELD_MANAGER: Final = "kubectl-crewfence"


class JournalState(StrEnum):
    PENDING = "Pending"
    JOURNALED = "Journaled"
    NOT_APPLICABLE = "NotApplicable"


@dataclass(frozen=True)
class Resolution:
    outcome: ResolutionOutcome
    note: str
    evidence: tuple[str, ...] = ()

    @classmethod
    def from_spec(cls, raw: object) -> Resolution | None:
        """``spec.resolution`` (already schema-checked by the API server), or None."""
        if not isinstance(raw, Mapping) or not raw.get("outcome"):
            return None
        try:
            outcome = ResolutionOutcome(str(raw["outcome"]))
        except ValueError:
            return None
        evidence = raw.get("evidence") or []
        return cls(outcome=outcome, note=str(raw.get("note") or ""),
                   evidence=tuple(str(e) for e in evidence))

    def matches(self, status_resolution: Mapping[str, Any] | None) -> bool:
        raw = status_resolution or {}
        return (raw.get("outcome") == self.outcome.value and raw.get("note") == self.note
                and tuple(raw.get("evidence") or ()) == self.evidence)

    @property
    def allows_successor(self) -> bool:
        """NotHappened or Compensated: the work is not in effect, a successor may run it."""
        return self.outcome in (ResolutionOutcome.NOT_HAPPENED, ResolutionOutcome.COMPENSATED)


class Step(StrEnum):
    NOTHING = "Nothing"
    WAIT = "Wait"
    """The job has not finished: nothing to resolve yet (looked at again on its next change)."""
    IGNORE = "Ignore"
    ACCEPT = "Accept"
    """No replica was assigned (no journal can hold the record): status records it directly."""
    CONFIRM = "Confirm"
    """A replica was assigned: journal first, then write status from the journal's answer."""
    REFRESH = "Refresh"
    """Accepted before, but the conditions do not show it (a concurrent write): write again."""
    JOURNAL = "Journal"


@dataclass(frozen=True)
class Decision:
    step: Step
    message: str = ""
    resolution: Resolution | None = None


def _condition(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == ctype:
            return cond
    return None


def decide(spec: Mapping[str, Any], status: Mapping[str, Any] | None,
           generation: int) -> Decision:
    """What to do about ``spec.resolution`` now (see the module's invariants)."""
    resolution = Resolution.from_spec(spec.get("resolution"))
    if resolution is None:
        return Decision(Step.NOTHING)
    status = status or {}
    accepted = status.get("resolution")
    if isinstance(accepted, Mapping) and accepted.get("outcome"):
        uncertain_cond = _condition(status, UNCERTAIN_CONDITION)
        if (uncertain_cond is not None and uncertain_cond.get("status") == "True") or \
                int(status.get("observedGeneration") or 0) < generation:
            return Decision(Step.REFRESH, "the conditions do not show the accepted resolution",
                            resolution)
        state = (accepted.get("journal") or {}).get("state")
        if state == JournalState.PENDING.value:
            return Decision(Step.JOURNAL, "the resolution is not journaled yet", resolution)
        return Decision(Step.NOTHING)
    phase = str(status.get("phase") or "Pending")
    if phase not in TERMINAL_PHASES:
        return Decision(Step.WAIT, f"the job is {phase}: a resolution applies once it ended "
                                   "with an uncertain outcome", resolution)
    # Invariant: only uncertain outcomes are resolved.
    if status.get("uncertainOutcome") is not True:
        ignored = _condition(status, RESOLVED_CONDITION)
        if ignored is not None and ignored.get("reason") == REASON_IGNORED and \
                int(status.get("observedGeneration") or 0) >= generation:
            return Decision(Step.NOTHING)
        return Decision(
            Step.IGNORE,
            f"spec.resolution was ignored: the outcome of this job is known (phase {phase}, "
            f"reason {status.get('reason') or 'unknown'}); a resolution applies only to an "
            "uncertain outcome", resolution)
    if journal_possible(status):
        # Invariant: status shows only a confirmed finding (module docstring).
        return Decision(Step.CONFIRM, f"resolving {resolution.outcome.value}: the journal of "
                                      "record is asked first", resolution)
    return Decision(Step.ACCEPT, f"resolved {resolution.outcome.value} by a person",
                    resolution)


def journal_possible(status: Mapping[str, Any]) -> bool:
    """A replica was assigned to the job, so a journal may hold its record."""
    assignment = status.get("assignment") or {}
    return bool(assignment.get("pod") or assignment.get("ordinal") is not None)


def resolver(managed_fields: Sequence[Mapping[str, Any]] | None) -> str:
    """Who set ``spec.resolution``: the field manager that owns it in ``managedFields``.

    The API server records the manager (client-chosen, e.g. ``kubectl-patch``,
    ``kubectl-crewfence``), not the authenticated user; this is the best identity a
    status-writing operator can read without an admission webhook.
    """
    best: tuple[str, str] | None = None
    for entry in managed_fields or []:
        fields = entry.get("fieldsV1") or {}
        spec = fields.get("f:spec") if isinstance(fields, Mapping) else None
        if isinstance(spec, Mapping) and "f:resolution" in spec:
            stamp = str(entry.get("time") or "")
            if best is None or stamp >= best[0]:
                best = (stamp, str(entry.get("manager") or "unknown"))
    return best[1] if best else "unknown"


def _replace_conditions(status: Mapping[str, Any], updates: Sequence[dict[str, Any]],
                        generation: int) -> list[dict[str, Any]]:
    """All conditions (merge patch replaces the list), with ``updates`` put in by type and
    every condition stamped with ``generation`` (kstatus readers wait for it)."""
    by_type = {str(u["type"]): u for u in updates}
    out: list[dict[str, Any]] = []
    for cond in status.get("conditions") or []:
        if not isinstance(cond, Mapping):
            continue
        ctype = str(cond.get("type"))
        out.append(dict(by_type.pop(ctype)) if ctype in by_type
                   else {**cond, "observedGeneration": generation})
    out.extend(by_type.values())
    return out


def _cond(status: Mapping[str, Any], ctype: str, true: bool, reason: str, message: str,
          generation: int, now: str) -> dict[str, Any]:
    value = "True" if true else "False"
    before = _condition(status, ctype)
    since = (before.get("lastTransitionTime") if before and before.get("status") == value
             else None) or now
    return {"type": ctype, "status": value, "reason": reason, "message": message[:1024],
            "lastTransitionTime": since, "observedGeneration": generation}


def previous_reason(status: Mapping[str, Any]) -> str:
    cond = _condition(status, UNCERTAIN_CONDITION)
    if cond is not None and cond.get("status") == "True" and cond.get("reason"):
        return str(cond["reason"])
    return str(status.get("reason") or "Unknown")


def accepted_patch(status: Mapping[str, Any], resolution: Resolution, *, resolved_by: str,
                   generation: int, now: str, journal_possible: bool) -> dict[str, Any]:
    """The status patch accepting a resolution (invariant: a finding, not a rewrite)."""
    accepted = status.get("resolution") if isinstance(status.get("resolution"), Mapping) \
        else None
    if accepted and (resolution.matches(accepted) or conflict_shown(status)):
        record = dict(accepted)  # REFRESH: keep who/when/journal (the journal's) as written
        resolution = Resolution.from_spec(accepted) or resolution
    else:
        record = {
            "outcome": resolution.outcome.value, "note": resolution.note,
            "evidence": list(resolution.evidence), "resolvedBy": resolved_by,
            "resolvedAt": now, "previousReason": previous_reason(status),
            "journal": ({"state": JournalState.PENDING.value} if journal_possible else
                        {"state": JournalState.NOT_APPLICABLE.value,
                         "message": "no replica was assigned to this job, so no journal "
                                    "holds its record"}),
        }
    message = (f"resolved {resolution.outcome.value} by {record.get('resolvedBy')}: "
               f"{resolution.note}")
    # A resolution settles the job for kstatus too (crewjob/status.py ``health``): Ready,
    # never Stalled, whatever the finding.
    conditions = _replace_conditions(status, [
        _cond(status, UNCERTAIN_CONDITION, False, REASON_RESOLVED, message, generation, now),
        _cond(status, RESOLVED_CONDITION, True, resolution.outcome.value, message, generation,
              now),
        _cond(status, "Ready", True, REASON_RESOLVED, message, generation, now),
        _cond(status, "Stalled", False, REASON_RESOLVED, message, generation, now),
    ], generation)
    return {"resolution": record, "conditions": conditions, "observedGeneration": generation}


REASON_JOURNAL_PENDING: Final = "JournalPending"


def confirmed_patch(status: Mapping[str, Any], resolution: Resolution,
                    journaled: Mapping[str, Any], *, sequence: int, ordinal: object,
                    successor: Mapping[str, Any] | None, resolved_by: str, generation: int,
                    now: str) -> dict[str, Any]:
    """The journal took (or already held) exactly this finding: the accepted patch, with who
    and when as the journal first recorded them, its sequence, and the journaled successor
    claim (``status.supersededBy``) when there is one."""
    patch = accepted_patch(status, resolution, resolved_by=resolved_by, generation=generation,
                           now=str(journaled.get("recorded_at") or now), journal_possible=True)
    mirrored = journaled_patch(journaled, sequence=sequence, ordinal=ordinal,
                               successor=successor)
    patch["resolution"] = {**patch["resolution"], **mirrored.pop("resolution")}
    return {**patch, **mirrored}


def unconfirmed_patch(status: Mapping[str, Any], resolution: Resolution, why: str, *,
                      generation: int, now: str) -> dict[str, Any]:
    """The journal could not be asked yet: ``Resolved=False/JournalPending`` says so, and
    nothing else (no ``status.resolution``: it is not a finding until the journal holds it)."""
    message = (f"spec.resolution {resolution.outcome.value} is not journaled yet ({why}); "
               "it is shown once the journal of record holds it")
    conditions = _replace_conditions(status, [
        _cond(status, RESOLVED_CONDITION, False, REASON_JOURNAL_PENDING, message, generation,
              now)], generation)
    return {"conditions": conditions}


def conflict_shown(status: Mapping[str, Any]) -> bool:
    cond = _condition(status, CONFLICT_CONDITION)
    return cond is not None and cond.get("status") == "True"


def from_journal(data: Mapping[str, Any]) -> Resolution | None:
    """The finding in a journaled ``resolution`` event's data."""
    return Resolution.from_spec(data)


def conflict_patch(status: Mapping[str, Any], journaled: Mapping[str, Any], *, sequence: int,
                   spec_resolution: Resolution, generation: int, now: str) -> dict[str, Any]:
    """``spec.resolution`` disagrees with the finding the journal holds (a re-applied
    manifest): the status mirrors the journal's finding, ``ResolutionConflict=True`` says
    which disagrees with which, and nothing else changes (invariant: the journal's finding
    wins)."""
    found = from_journal(journaled)
    outcome = found.outcome.value if found else str(journaled.get("outcome"))
    record = {
        "outcome": outcome, "note": str(journaled.get("note") or ""),
        "evidence": [str(e) for e in journaled.get("evidence") or []],
        "resolvedBy": str(journaled.get("resolved_by") or "unknown"),
        "resolvedAt": str(journaled.get("recorded_at") or now),
        "previousReason": str((status.get("resolution") or {}).get("previousReason")
                              or previous_reason(status)),
        "journal": {"state": JournalState.JOURNALED.value, "sequence": sequence,
                    "message": "the journal holds this finding; spec.resolution disagrees"},
    }
    message = (f"spec.resolution says {spec_resolution.outcome.value} but the journal of "
               f"record holds {outcome} (journal event {sequence}, by "
               f"{record['resolvedBy']}); a resolution is written once: the journal's "
               "finding stands and nothing was changed")
    settled = f"resolved {outcome} by {record['resolvedBy']}: {record['note']}"
    conditions = _replace_conditions(status, [
        _cond(status, UNCERTAIN_CONDITION, False, REASON_RESOLVED, settled, generation, now),
        _cond(status, RESOLVED_CONDITION, True, outcome, settled, generation, now),
        _cond(status, CONFLICT_CONDITION, True, REASON_JOURNAL_DISAGREES, message, generation,
              now),
    ], generation)
    return {"resolution": record, "conditions": conditions, "observedGeneration": generation}


def journaled_patch(data: Mapping[str, Any], *, sequence: int, ordinal: object,
                    successor: Mapping[str, Any] | None) -> dict[str, Any]:
    """The journal took (or already held) this finding: mirror who wrote it first, the
    event's sequence, and the journaled successor claim (``status.supersededBy``) when there
    is one (a re-applied predecessor's status then shows it again)."""
    patch: dict[str, Any] = journal_patch(
        JournalState.JOURNALED, sequence=sequence,
        message=f"journaled on replica {ordinal} as event {sequence}")
    if data.get("resolved_by"):
        patch["resolution"]["resolvedBy"] = str(data["resolved_by"])
    if successor and successor.get("successor_action_id"):
        patch["supersededBy"] = {"actionId": str(successor["successor_action_id"])}
    return patch


def ignored_patch(status: Mapping[str, Any], message: str, *, generation: int,
                  now: str) -> dict[str, Any]:
    """A resolution on a known outcome: say why it was ignored; change nothing else."""
    conditions = _replace_conditions(status, [
        _cond(status, RESOLVED_CONDITION, False, REASON_IGNORED, message, generation, now),
    ], generation)
    return {"conditions": conditions, "observedGeneration": generation}


def journal_patch(state: JournalState, *, sequence: int | None = None,
                  message: str | None = None) -> dict[str, Any]:
    """Merge patch of ``status.resolution.journal`` only."""
    journal: dict[str, Any] = {"state": state.value}
    if sequence is not None:
        journal["sequence"] = sequence
    journal["message"] = (message or "")[:1024] or None
    return {"resolution": {"journal": journal}}


class NotHeld(StrEnum):
    """What a resolution write answered with 404 or 410 means (:func:`when_not_held`)."""

    ACCEPT_UNJOURNALED = "AcceptUnjournaled"
    """No journal holds the action (404): nothing can disagree; the spec's finding is recorded
    in status, marked as not journaled."""
    WAIT = "Wait"
    """A tombstone holds the action but its sidecar did not answer for the finding kept with
    it (410: an image from before findings were kept with tombstones): the finding may differ,
    so status shows nothing yet and the write is tried again."""


def when_not_held(http_status: int | None) -> NotHeld:
    """The decision on a 404/410 answer to ``POST /jobs/{id}/resolution``; pure.

    Invariant (an archived record keeps its finding): a sidecar answers a resolution on a
    tombstone from the finding it keeps (200/201/409), so a 410 never lets the spec's finding
    into status: it may contradict the one journaled before the archive."""
    return NotHeld.WAIT if http_status == 410 else NotHeld.ACCEPT_UNJOURNALED


def held_nowhere(*, listed: Collection[int], not_held: Collection[int]) -> bool:
    """Whether no journal holds the action: every replica the Crew lists, and the assigned
    one, answered 404 (one that could not be asked holds it as far as anyone knows); pure.

    Invariant (a finding is looked for wherever the action's facts went): a tombstone handed
    over on scale-down lives on another replica, and a re-used ordinal has a fresh journal,
    so the assigned replica's 404 alone never lets the spec's finding into status; every
    listed replica is asked first, as the successor gate does."""
    return bool(listed) and set(listed) <= set(not_held)


TOMBSTONE_SILENT: Final = ("the replica holds only a tombstone of this action and its sidecar "
                           "does not answer for the finding kept with it (upgrade its image)")


def sidecar_request(*, crew: str, action_id: str, resolution: Resolution,
                    resolved_by: str) -> ResolutionRequest:
    """The journal copy. Its identity is stable across retries (no timestamps in it)."""
    return ResolutionRequest(crew_id=crew, action_id=action_id, outcome=resolution.outcome,
                             note=resolution.note, evidence=resolution.evidence,
                             resolved_by=resolved_by)
