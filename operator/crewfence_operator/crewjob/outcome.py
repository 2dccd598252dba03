"""Phases, reasons, failures and the reference's recovery decisions for a CrewJob.

Every terminal answer the operator can give is a :class:`Verdict`; the handlers only choose
which one applies and write it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Final

from crewfence_sidecar.contract import FailureCategory, JobRecord, Status


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


TERMINAL_PHASES: Final = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})


class Reason(StrEnum):
    # uncertain outcomes (condition OutcomeUncertain=True)
    SIDECAR_RESTARTED = "SidecarRestarted"
    TIMEOUT = "Timeout"
    CANCEL_UNCONFIRMED = "CancelUnconfirmed"
    TRANSPORT_FAILURE = "TransportFailure"
    INVALID_STREAM = "InvalidStream"
    JOURNAL_LOST = "JournalLost"
    ANSWER_LOST = "AnswerLost"
    RECORD_UNCERTAIN = "RecordUncertain"
    # known outcomes
    COMPLETED = "Completed"
    EXECUTION_FAILED = "ExecutionFailed"
    CANCELLED = "Cancelled"
    CANCELLED_BEFORE_ADMISSION = "CancelledBeforeAdmission"
    REQUEST_CHANGED = "RequestChanged"
    REJECTED = "Rejected"
    AUTH_FAILED = "AuthFailed"
    ARCHIVED = "Archived"
    INVALID_SPEC = "InvalidSpec"
    # still working
    ADMITTED = "Admitted"
    CREW_NOT_FOUND = "CrewNotFound"
    WAITING_FOR_REPLICAS = "WaitingForReplicas"
    NO_ELIGIBLE_REPLICA = "NoEligibleReplica"
    SIDECAR_BUSY = "SidecarBusy"
    REPLICA_UNAVAILABLE = "ReplicaUnavailable"
    DISPATCHED = "Dispatched"
    REPLICA_DRAINING = "ReplicaDraining"
    JOURNAL_FULL = "JournalFull"
    CANCEL_PENDING = "CancelPending"
    PREDECESSOR_UNRESOLVED = "PredecessorUnresolved"
    PREDECESSOR_REPLICA_UNAVAILABLE = "PredecessorReplicaUnavailable"


UNCERTAIN_REASONS: Final = frozenset({
    Reason.SIDECAR_RESTARTED, Reason.TIMEOUT, Reason.CANCEL_UNCONFIRMED,
    Reason.TRANSPORT_FAILURE, Reason.INVALID_STREAM, Reason.JOURNAL_LOST,
    Reason.ANSWER_LOST, Reason.RECORD_UNCERTAIN,
})

# The reference's "Choose a recovery action" table, plus what each uncertain reason implies.
_RECONCILE = ("Reconcile external effects (provider logs, tool effects, generated artifacts, "
              "downstream systems) before any retry or compensation; do not submit a "
              "replacement Action, and compensate only through a separately authorized Action.")
RECOVERY: Final[dict[str, str]] = {
    "completed": "Exact repeat returns completed: use the retained result; do not dispatch again.",
    "running": "Exact repeat returns running: continue status or event observation within "
               "policy.",
    Reason.SIDECAR_RESTARTED: "Restored record reports uncertain failure: the sidecar restarted "
                              "while the job ran. " + _RECONCILE,
    "cancel_async": "Cancel route succeeded for an async stream: confirm provider and tool "
                    "state independently.",
    "cancel_thread": "Cancel route succeeded for thread-backed work: assume work may continue; "
                     "contain credentials and downstream authority if necessary. " + _RECONCILE,
    Reason.CANCEL_UNCONFIRMED: "Cancellation was not confirmed by the sidecar: the job may still "
                               "be running. " + _RECONCILE,
    Reason.TIMEOUT: "The job timed out in a worker thread that can keep running after its "
                    "waiter was cancelled: assume work may continue; contain credentials and "
                    "downstream authority if necessary. " + _RECONCILE,
    Reason.TRANSPORT_FAILURE: "The admission request may have reached the sidecar but no answer "
                              "proved what happened. " + _RECONCILE,
    Reason.INVALID_STREAM: "The sidecar's event stream was invalid after admission; provider "
                           "effects may already exist. " + _RECONCILE,
    Reason.JOURNAL_LOST: "The assigned replica's journal changed or lost the record, or its Crew "
                         "or state claim was deleted, so the Action's evidence is gone. "
                         + _RECONCILE,
    Reason.ANSWER_LOST: "The answer to the admission request (or the event stream) was lost: "
                        "the sidecar may have admitted the Action. The operator keeps asking "
                        "the assigned replica with backoff and never admits it anywhere else; "
                        "the job stays Running until the replica's record, a changed journal "
                        "id or a deleted claim decides. " + _RECONCILE,
    Reason.RECORD_UNCERTAIN: "The sidecar's own record marks this outcome uncertain "
                             "(uncertain_outcome): effects may exist whatever the status says. "
                             + _RECONCILE,
    Reason.REQUEST_CHANGED: "Request changed under the same Action ID: correct the caller; the "
                            "409 collision is protective and nothing new was run. Use a new "
                            "CrewJob name (or spec.actionId) for new work.",
    "journal_full": "Journal is full: archive only terminal records after the replay-retention "
                    "window (crewfence journal archive); the job stays Pending until then.",
    Reason.EXECUTION_FAILED: "The sidecar recorded an ordinary execution failure of this Action; "
                             "it will not run again under this action id. Fix the cause and "
                             "create a new CrewJob for new work.",
    Reason.REJECTED: "The sidecar refused the request before running anything: correct the "
                     "spec and create a new CrewJob.",
    Reason.AUTH_FAILED: "The sidecar refused the operator's credential or the operation: check "
                        "the Crew's token Secret and spec.operations; nothing was run.",
    Reason.ARCHIVED: "The Action was archived on the sidecar (tombstone): it will not run again; "
                     "its result is in the journal export, if retained.",
    Reason.INVALID_SPEC: "The spec is not a valid sidecar request; nothing was dispatched. "
                         "Create a corrected CrewJob.",
    Reason.CANCELLED_BEFORE_ADMISSION: "Cancelled before admission: nothing was dispatched.",
    "cancelled_other": "The sidecar cancelled the job (not at this CrewJob's request): confirm "
                       "provider and tool state independently.",
}


@dataclass(frozen=True)
class Failure:
    category: FailureCategory
    code: str
    message: str

    def to_status(self) -> dict[str, Any]:
        return {"category": self.category.value, "code": self.code,
                "message": self.message[:1024], "retryable": False}


@dataclass(frozen=True)
class Verdict:
    phase: Phase
    reason: Reason
    message: str
    recovery: str
    failure: Failure | None = None
    uncertain: bool = False

    @property
    def uncertain_reason(self) -> Reason | None:
        return self.reason if self.uncertain else None


def _error_code_and_message(error: dict[str, Any] | None) -> tuple[str, str]:
    if not isinstance(error, dict):
        return "execution_failed", "the sidecar recorded a failure without details"
    code = str(error.get("code") or error.get("type") or "execution_failed")[:128]
    message = str(error.get("message") or error.get("detail") or code)
    return code, message


RESTART_CODES: Final = frozenset({"sidecar_restarted", "sidecar_stopped"})
TIMEOUT_CODES: Final = frozenset({"timeout"})


def error_code(error: dict[str, Any] | None) -> str | None:
    """The record's error ``code`` (the only field verdicts read; messages are free text)."""
    if not isinstance(error, dict) or not error.get("code"):
        return None
    return str(error["code"])


def is_timeout(error: dict[str, Any] | None) -> bool:
    """By the error code alone: a cancel whose reason mentions "deadline" is no timeout."""
    return error_code(error) in TIMEOUT_CODES


def verdict_from_record(record: JobRecord, *, thread_backed: bool,
                        cancel_requested: bool) -> Verdict:
    """The outcome a terminal sidecar record proves, with its honest uncertainty.

    Invariant (record authoritative): the record's ``uncertain_outcome`` flag decides whether
    the verdict is uncertain, in every branch (a completed record flagged uncertain is
    ``Succeeded`` *and* uncertain), and only the error ``code`` chooses between timeout,
    restart and ordinary failure; nothing is inferred from free text. ``thread_backed`` only
    picks the recovery advice.
    """
    code, message = _error_code_and_message(record.error)
    flagged = record.uncertain_outcome
    if record.status is Status.COMPLETED:
        if flagged:
            return Verdict(Phase.SUCCEEDED, Reason.RECORD_UNCERTAIN,
                           "the sidecar completed the job but its record marks the outcome "
                           "uncertain", RECOVERY[Reason.RECORD_UNCERTAIN], uncertain=True)
        return Verdict(Phase.SUCCEEDED, Reason.COMPLETED, "the sidecar completed the job",
                       RECOVERY["completed"])
    phase = Phase.CANCELLED if record.status is Status.CANCELLED else Phase.FAILED
    if is_timeout(record.error):
        return Verdict(phase, Reason.TIMEOUT, f"the job timed out: {message}",
                       RECOVERY[Reason.TIMEOUT] if flagged else RECOVERY[Reason.EXECUTION_FAILED],
                       Failure(FailureCategory.EXECUTION, code, message), uncertain=flagged)
    if record.status is Status.FAILED:
        if code in RESTART_CODES:
            return Verdict(Phase.FAILED, Reason.SIDECAR_RESTARTED,
                           "the sidecar restarted while the job ran"
                           + ("; its outcome is unknown" if flagged else ""),
                           RECOVERY[Reason.SIDECAR_RESTARTED],
                           Failure(FailureCategory.EXECUTION, code, message), uncertain=flagged)
        if flagged:
            return Verdict(Phase.FAILED, Reason.RECORD_UNCERTAIN,
                           f"the job failed and its record marks the outcome uncertain: "
                           f"{message}", RECOVERY[Reason.RECORD_UNCERTAIN],
                           Failure(FailureCategory.EXECUTION, code, message), uncertain=True)
        return Verdict(Phase.FAILED, Reason.EXECUTION_FAILED, f"the job failed: {message}",
                       RECOVERY[Reason.EXECUTION_FAILED],
                       Failure(FailureCategory.EXECUTION, code, message))
    # cancelled
    if flagged:
        return Verdict(Phase.CANCELLED, Reason.CANCEL_UNCONFIRMED,
                       "the sidecar cancelled the job's task, but its record says the work may "
                       "continue", RECOVERY["cancel_thread"] if thread_backed
                       else RECOVERY[Reason.CANCEL_UNCONFIRMED], uncertain=True)
    return Verdict(Phase.CANCELLED, Reason.CANCELLED, "the sidecar cancelled the job",
                   RECOVERY["cancel_async"] if cancel_requested else RECOVERY["cancelled_other"])


def stopped_recovery(stopped_at: str | None) -> str:
    """The recovery advice when the sidecar's record proves the worker stopped."""
    when = stopped_at or "the time in the record"
    return (f"The sidecar stopped the job's worker process (its process group killed and "
            f"reaped) at {when}: nothing of this job runs any more. Work stopped at {when}: "
            f"reconcile external effects up to {when} (provider logs, tool effects, generated "
            "artifacts, downstream systems) before any retry or compensation; do not submit a "
            "replacement Action, and compensate only through a separately authorized Action.")


def with_stop(verdict: Verdict, record: JobRecord) -> Verdict:
    """An uncertain verdict whose record says ``work_stopped``: the advice changes from "work
    may continue" to "work stopped at T: reconcile effects up to T"; it stays uncertain.

    Invariant (stop evidence, not hope): only the record's ``work_stopped`` (written by the
    sidecar after it reaped the worker) changes the advice; nothing is inferred otherwise.
    """
    if not verdict.uncertain or not record.work_stopped:
        return verdict
    message = verdict.message
    if verdict.reason is Reason.CANCEL_UNCONFIRMED:
        message = ("the sidecar cancelled the job and stopped its worker process at "
                   f"{record.stopped_at}")
    return replace(verdict, message=message, recovery=stopped_recovery(record.stopped_at))


def verdict_from_rejection(category: FailureCategory, code: str, message: str,
                           http_status: int | None) -> Verdict:
    """A definitive sidecar refusal at admission: nothing was run."""
    failure = Failure(category, code, message)
    if http_status == 409:
        return Verdict(Phase.FAILED, Reason.REQUEST_CHANGED,
                       "another request already used this action id (409); nothing was run",
                       RECOVERY[Reason.REQUEST_CHANGED],
                       Failure(FailureCategory.PERMANENT, "request_changed", message))
    if http_status == 410:
        return Verdict(Phase.FAILED, Reason.ARCHIVED, "the Action was archived on the sidecar",
                       RECOVERY[Reason.ARCHIVED],
                       Failure(FailureCategory.PERMANENT, "archived", message))
    if category is FailureCategory.AUTH:
        return Verdict(Phase.FAILED, Reason.AUTH_FAILED, f"the sidecar refused: {message}",
                       RECOVERY[Reason.AUTH_FAILED], failure)
    return Verdict(Phase.FAILED, Reason.REJECTED, f"the sidecar refused: {message}",
                   RECOVERY[Reason.REJECTED], failure)


def archived_verdict(tombstone: Mapping[str, Any]) -> Verdict:
    """What a tombstone (a 410 answer) says about the archived Action's outcome.

    Invariant (a 410 is read for the outcome it carries): the tombstone keeps the record's
    final status and uncertainty, so a CrewJob whose record was archived before the operator
    wrote its verdict (retention, a hand-over, a re-applied manifest) ends with that outcome
    (only the output is gone), never as a generic failure, and an uncertain record stays
    uncertain.
    """
    held = "its record was archived on the sidecar, so its output is no longer held"
    status = tombstone.get("status")
    failure = Failure(FailureCategory.PERMANENT, "archived",
                      "the sidecar holds only a tombstone of this action")
    if tombstone.get("uncertain_outcome"):
        return Verdict(Phase.FAILED, Reason.RECORD_UNCERTAIN,
                       f"the Action was archived on the sidecar; its record marked the outcome "
                       f"uncertain ({status or 'status unknown'})",
                       RECOVERY[Reason.RECORD_UNCERTAIN], failure, uncertain=True)
    if status == "completed":
        return Verdict(Phase.SUCCEEDED, Reason.ARCHIVED, f"the Action completed; {held}",
                       RECOVERY[Reason.ARCHIVED])
    if status == "cancelled":
        return Verdict(Phase.CANCELLED, Reason.ARCHIVED, f"the Action was cancelled; {held}",
                       RECOVERY[Reason.ARCHIVED])
    what = "failed" if status == "failed" else "ended (the tombstone gives no status)"
    return Verdict(Phase.FAILED, Reason.ARCHIVED, f"the Action {what}; {held}",
                   RECOVERY[Reason.ARCHIVED], failure)


def request_changed(record_hash: str, our_hash: str) -> Verdict:
    return Verdict(Phase.FAILED, Reason.REQUEST_CHANGED,
                   "the sidecar holds a different request under this action id "
                   f"(hash {record_hash[:12]}…, this spec {our_hash[:12]}…); nothing was run",
                   RECOVERY[Reason.REQUEST_CHANGED],
                   Failure(FailureCategory.PERMANENT, "request_changed",
                           "same action id, different request hash"))


def uncertain(reason: Reason, category: FailureCategory, code: str, message: str,
              phase: Phase = Phase.FAILED) -> Verdict:
    """An outcome nobody can confirm (never retried)."""
    return Verdict(phase, reason, message, RECOVERY[reason], Failure(category, code, message),
                   uncertain=True)


def invalid_spec(code: str, message: str) -> Verdict:
    return Verdict(Phase.FAILED, Reason.INVALID_SPEC, message, RECOVERY[Reason.INVALID_SPEC],
                   Failure(FailureCategory.PERMANENT, code, message))


def cancelled_before_admission() -> Verdict:
    return Verdict(Phase.CANCELLED, Reason.CANCELLED_BEFORE_ADMISSION,
                   "cancelled before admission; nothing was dispatched",
                   RECOVERY[Reason.CANCELLED_BEFORE_ADMISSION])


def with_uncertainty(verdict: Verdict, reason: Reason, note: str) -> Verdict:
    """Keep an earlier uncertainty (e.g. an unconfirmed cancel) on a later terminal verdict."""
    if verdict.uncertain:
        return verdict
    return Verdict(verdict.phase, reason, f"{verdict.message}; {note}", RECOVERY[reason],
                   verdict.failure, uncertain=True)
