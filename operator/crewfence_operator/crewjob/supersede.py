"""The admission gate of a successor CrewJob (``spec.supersedes``). Pure: it decides from the
successor's identity and the predecessor object as read; the handler carries it out.

Invariants kept here:
- *nothing retries an uncertain outcome but a linked successor*: a successor is admitted only
  when its predecessor's uncertain outcome was resolved ``NotHappened`` or ``Compensated``;
  unresolved → it waits (Pending, reason ``PredecessorUnresolved``); resolved ``Happened`` →
  refused for good (running it again would duplicate the effects);
- *one successor per predecessor*: a predecessor whose ``status.supersededBy`` names another
  job refuses every other successor (the claim itself is written with the predecessor's
  resourceVersion, so two successors racing cannot both win);
- *a successor is new work*: it must carry a different action id than its predecessor.

:func:`decide` reads the predecessor's status: it is the plugin's early answer (``kubectl
crewfence rerun``) and the first look of the operator's gate. The operator admits a successor
only on the journal's word (:func:`precheck` then :func:`from_journal`): the predecessor's
resolution and its one-successor claim are journal facts on the replica that ran it, written
once, so deleting and re-applying the predecessor (a new, empty status, a different
``spec.resolution``: CEL transition rules do not run on create) cannot change the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from crewfence_operator.crewjob.resolution import TERMINAL_PHASES, Resolution

WAIT_REASON: Final = "PredecessorUnresolved"


class Gate(StrEnum):
    PROCEED = "Proceed"
    WAIT = "Wait"
    REFUSE = "Refuse"


@dataclass(frozen=True)
class GateDecision:
    gate: Gate
    code: str
    """A short machine-readable code (the failure code when refused)."""
    message: str
    pin: tuple[int, str | None] | None = None
    """A resuming successor: (ordinal, journal id) of the predecessor's replica, whose journal
    holds the trajectory it continues; it is admitted there or nowhere."""

    @property
    def proceed(self) -> bool:
        return self.gate is Gate.PROCEED


def effective_action_id(obj: Mapping[str, Any]) -> str:
    """The action id a CrewJob uses: status.actionId, else spec.actionId, else ns/name."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    return str(status.get("actionId") or spec.get("actionId")
               or f"{meta.get('namespace')}/{meta.get('name')}")


def decide(*, successor_name: str, successor_action_id: str,
           predecessor: Mapping[str, Any] | None, predecessor_name: str,
           resume_from: str | None = None) -> GateDecision:
    """May the successor be admitted now? (see the module's invariants)

    A resuming successor (``resume_from``, from ``spec.resume``) may also follow a
    predecessor resolved ``Happened``: it does not run the call in doubt again (the sidecar's
    replay tells the agent it was made), it only continues after it."""
    if predecessor_name == successor_name:
        return GateDecision(Gate.REFUSE, "supersedes_self", "a CrewJob cannot supersede itself")
    if predecessor is None:
        return GateDecision(Gate.WAIT, "predecessor_not_found",
                            f"spec.supersedes names CrewJob {predecessor_name!r}, which does "
                            "not exist (yet) in this namespace; waiting")
    if effective_action_id(predecessor) == successor_action_id:
        return GateDecision(Gate.REFUSE, "supersedes_same_action",
                            "a successor must run under a new action id; this one has its "
                            "predecessor's action id")
    status = predecessor.get("status") or {}
    taken = status.get("supersededBy") or {}
    if (taken.get("name") or taken.get("actionId")) and taken.get("name") != successor_name \
            and taken.get("actionId") != successor_action_id:
        return GateDecision(Gate.REFUSE, "already_superseded",
                            f"CrewJob {predecessor_name!r} is already superseded by "
                            f"{taken.get('name') or taken.get('actionId')!r}; one successor "
                            "per uncertain outcome")
    phase = str(status.get("phase") or "Pending")
    if phase not in TERMINAL_PHASES:
        return GateDecision(Gate.WAIT, "predecessor_not_finished",
                            f"predecessor {predecessor_name!r} is {phase}; a successor waits "
                            "until its outcome is known and resolved")
    if status.get("uncertainOutcome") is not True:
        return GateDecision(Gate.REFUSE, "predecessor_not_uncertain",
                            f"predecessor {predecessor_name!r} ended with a known outcome "
                            f"({phase}); supersedes is only for uncertain outcomes: create a "
                            "new CrewJob without spec.supersedes for new work")
    resolution = Resolution.from_spec(status.get("resolution"))
    if resolution is None:
        return GateDecision(Gate.WAIT, "predecessor_unresolved",
                            f"predecessor {predecessor_name!r} has an unresolved uncertain "
                            "outcome; resolve it first (kubectl crewfence resolve "
                            f"{predecessor_name} --not-happened|--compensated --note ...)")
    if resume_from is not None and effective_action_id(predecessor) != resume_from:
        return GateDecision(Gate.REFUSE, "resume_mismatch",
                            f"spec.resume continues action {resume_from!r}, but predecessor "
                            f"{predecessor_name!r} ran as {effective_action_id(predecessor)!r}")
    journal_state = ((status.get("resolution") or {}).get("journal") or {}).get("state")
    if resume_from is not None and journal_state != "Journaled":
        # the sidecar decides what the resume reruns from the resolution IT journaled
        return GateDecision(Gate.WAIT, "predecessor_resolution_not_journaled",
                            f"predecessor {predecessor_name!r} is resolved, but its sidecar "
                            "has not journaled the resolution yet; a resume waits for it")
    if not resolution.allows_successor and resume_from is None:
        return GateDecision(Gate.REFUSE, "predecessor_happened",
                            f"predecessor {predecessor_name!r} was resolved "
                            f"{resolution.outcome.value}: its work took effect, and running it "
                            "again would duplicate the effects")
    assignment = status.get("assignment") or {}
    pin = ((int(assignment["ordinal"]), assignment.get("journalId"))
           if resume_from is not None and assignment.get("ordinal") is not None else None)
    return GateDecision(Gate.PROCEED, "predecessor_resolved",
                        f"predecessor {predecessor_name!r} was resolved "
                        f"{resolution.outcome.value}", pin=pin)


def supersedes_status(predecessor: Mapping[str, Any], predecessor_name: str) -> dict[str, Any]:
    """``status.supersedes`` of the successor."""
    resolution = (predecessor.get("status") or {}).get("resolution") or {}
    return {"name": predecessor_name, "actionId": effective_action_id(predecessor),
            "outcome": resolution.get("outcome")}


def claim_patch(predecessor: Mapping[str, Any], *, successor_name: str,
                successor_action_id: str) -> dict[str, Any]:
    """The predecessor's status patch linking it to its successor, guarded by its
    resourceVersion (a concurrent claim makes the API server answer 409)."""
    return {"metadata": {"resourceVersion": (predecessor.get("metadata") or {})
                         .get("resourceVersion")},
            "status": {"supersededBy": {"name": successor_name,
                                        "actionId": successor_action_id}}}


# --- the journal's word (the operator's gate) ---------------------------------------------------
def precheck(*, successor_name: str, successor_action_id: str,
             predecessor: Mapping[str, Any] | None, predecessor_name: str,
             predecessor_action_id: str) -> GateDecision | None:
    """What is decided before the journal is asked (None: ask it). Only refusals that need no
    fact (itself, the same action id) and waits (the predecessor still runs): nothing here
    admits a successor."""
    if predecessor_name == successor_name:
        return GateDecision(Gate.REFUSE, "supersedes_self", "a CrewJob cannot supersede itself")
    if predecessor_action_id == successor_action_id:
        return GateDecision(Gate.REFUSE, "supersedes_same_action",
                            "a successor must run under a new action id; this one has its "
                            "predecessor's action id")
    if predecessor is not None:
        phase = str((predecessor.get("status") or {}).get("phase") or "Pending")
        if phase not in TERMINAL_PHASES:
            return GateDecision(Gate.WAIT, "predecessor_not_finished",
                                f"predecessor {predecessor_name!r} is {phase}; a successor "
                                "waits until its outcome is known and resolved")
    return None


class Answer(StrEnum):
    CLAIMED = "Claimed"
    REFUSED = "Refused"
    NOT_FOUND = "NotFound"
    ARCHIVED = "Archived"
    UNREACHABLE = "Unreachable"


@dataclass(frozen=True)
class JournalAnswer:
    """One replica's answer to ``POST /jobs/{predecessor}/successor``."""

    ordinal: int
    answer: Answer
    code: str = ""
    message: str = ""
    outcome: str = ""
    """The journaled resolution's outcome (CLAIMED)."""


_REFUSALS: Final = {
    "happened": (Gate.REFUSE, "predecessor_happened"),
    "already_superseded": (Gate.REFUSE, "already_superseded"),
    "not_uncertain": (Gate.REFUSE, "predecessor_not_uncertain"),
    "unresolved": (Gate.WAIT, "predecessor_unresolved"),
    "job_running": (Gate.WAIT, "predecessor_not_finished"),
}


def from_journal(answers: list[JournalAnswer], *, predecessor_name: str,
                 predecessor_action_id: str, crew: str) -> GateDecision:
    """The gate's decision from the replicas' answers (invariant: only a journaled claim
    admits; the journal's refusal is final; a journal that cannot say waits; a record the
    journal archived refuses: its facts are no longer there to admit on)."""
    for a in answers:
        if a.answer is Answer.CLAIMED:
            return GateDecision(Gate.PROCEED, "predecessor_resolved",
                                f"predecessor {predecessor_name!r} was resolved {a.outcome}; "
                                f"its journal (replica {a.ordinal}) holds this successor's "
                                "claim")
    for a in answers:
        if a.answer is Answer.REFUSED:
            gate, code = _REFUSALS.get(a.code, (Gate.WAIT, "predecessor_journal_refused"))
            hint = (" resolve it first (kubectl crewfence resolve "
                    f"{predecessor_name} --not-happened|--compensated --note ...)"
                    if code == "predecessor_unresolved" else "")
            return GateDecision(gate, code,
                                f"the journal of predecessor {predecessor_name!r} (replica "
                                f"{a.ordinal}) answers: {a.message}.{hint}")
    for a in answers:
        if a.answer is Answer.ARCHIVED:
            # the tombstone keeps the findings (the sidecar's answer names them), but a
            # successor is never admitted on an archived record: at most once wins
            said = f" (the journal answers: {a.message})" if a.message else ""
            return GateDecision(Gate.REFUSE, "predecessor_archived",
                                f"the record of predecessor {predecessor_name!r} was archived "
                                f"on replica {a.ordinal}{said}: no successor is admitted on "
                                "an archived record (at most once wins)")
    silent = [a for a in answers if a.answer is Answer.UNREACHABLE]
    if silent:
        return GateDecision(Gate.WAIT, "predecessor_journal_unreachable",
                            f"replica(s) {', '.join(str(a.ordinal) for a in silent)} of Crew "
                            f"{crew!r} may hold the journal of predecessor "
                            f"{predecessor_name!r} and cannot answer ({silent[0].message}); "
                            "waiting")
    return GateDecision(Gate.WAIT, "predecessor_not_journaled",
                        f"no replica of Crew {crew!r} holds action {predecessor_action_id!r} "
                        f"of predecessor {predecessor_name!r}; a successor is admitted only "
                        "on the word of the journal that ran it; waiting")
