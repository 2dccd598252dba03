"""Status mapping for every row of the reference's connector failure table and every record."""

from __future__ import annotations

import aiohttp
import pytest
from crewfence_operator.crewjob import outcome
from crewfence_operator.crewjob.outcome import Phase, Reason
from crewfence_operator.sidecar_client import (
    cancel_unconfirmed,
    classify_http_failure,
    classify_transport_failure,
    invalid_stream,
    response_too_large,
)
from crewfence_sidecar.contract import FailureCategory, JobRecord, Status


# --- connector failure table -----------------------------------------------------------------
@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("invocation", [True, False])
def test_auth_rows(status: int, invocation: bool) -> None:
    f = classify_http_failure(status, None, invocation=invocation)
    assert (f.category, f.uncertain, f.retryable) == (FailureCategory.AUTH, False, False)


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 507])
def test_temporary_rows_uncertain_only_for_invocation(status: int) -> None:
    inv = classify_http_failure(status, None, invocation=True)
    read = classify_http_failure(status, None, invocation=False)
    assert inv.category is read.category is FailureCategory.TEMPORARY
    assert inv.uncertain and not read.uncertain
    assert not inv.retryable


@pytest.mark.parametrize("status", [400, 404, 409, 410, 413, 422, 428])
def test_other_statuses_are_permanent(status: int) -> None:
    body = {"error": {"code": "some_code", "message": "nope"}}
    f = classify_http_failure(status, body, invocation=True)
    assert (f.category, f.uncertain, f.code, f.message) == (
        FailureCategory.PERMANENT, False, "some_code", "nope")


def test_transport_uncertain_only_when_the_request_may_have_left() -> None:
    sent = classify_transport_failure(aiohttp.ServerDisconnectedError(), invocation=True)
    assert (sent.category, sent.uncertain) == (FailureCategory.TRANSPORT, True)
    read = classify_transport_failure(aiohttp.ServerDisconnectedError(), invocation=False)
    assert not read.uncertain
    refused = classify_transport_failure(
        aiohttp.ClientConnectorError(aiohttp.client_reqrep.ConnectionKey(
            "h", 1, False, True, None, None, None), OSError(111, "refused")), invocation=True)
    assert refused.category is FailureCategory.TRANSPORT and not refused.uncertain


def test_invalid_stream_is_connector_and_uncertain() -> None:
    f = invalid_stream("gap")
    assert (f.category, f.uncertain) == (FailureCategory.CONNECTOR, True)


def test_response_limit_uncertain_only_for_invocation() -> None:
    assert response_too_large(10, invocation=True).uncertain
    assert not response_too_large(10, invocation=False).uncertain
    assert response_too_large(10, invocation=True).category is FailureCategory.CONNECTOR


def test_cancel_not_confirmed_is_temporary_and_uncertain() -> None:
    f = cancel_unconfirmed(classify_transport_failure(TimeoutError(), invocation=True))
    assert (f.category, f.uncertain, f.code) == (
        FailureCategory.TEMPORARY, True, "cancelled_unconfirmed")


def test_failure_text_never_carries_the_token() -> None:
    from crewfence_operator.sidecar_client import Endpoint
    ep = Endpoint("127.0.0.1:8090", "s3cr3t-token")
    assert "s3cr3t" not in repr(ep)


# --- terminal records ------------------------------------------------------------------------
def record(status: Status, *, error: dict[str, str] | None = None, uncertain: bool = False,
           output: object = None) -> JobRecord:
    return JobRecord(action_id="ns/j", crew_id="c", operation="run", request_hash="h",
                     status=status, event_count=2, created_at="2026-01-01T00:00:00Z",
                     updated_at="2026-01-01T00:00:05Z", output=output, error=error,
                     uncertain_outcome=uncertain)


def test_completed_is_succeeded_with_the_retained_result_advice() -> None:
    v = outcome.verdict_from_record(record(Status.COMPLETED, output="x"), thread_backed=False,
                                    cancel_requested=False)
    assert (v.phase, v.reason, v.uncertain, v.failure) == (
        Phase.SUCCEEDED, Reason.COMPLETED, False, None)
    assert "do not dispatch again" in v.recovery


def test_restored_record_is_sidecar_restarted_and_uncertain() -> None:
    err = {"code": "sidecar_restarted", "message": "restarted"}
    v = outcome.verdict_from_record(record(Status.FAILED, error=err, uncertain=True),
                                    thread_backed=False, cancel_requested=False)
    assert (v.phase, v.reason, v.uncertain) == (Phase.FAILED, Reason.SIDECAR_RESTARTED, True)
    assert v.failure is not None and v.failure.code == "sidecar_restarted"
    assert "Reconcile external effects" in v.recovery
    assert v.failure.to_status()["retryable"] is False


def test_ordinary_failure_is_known() -> None:
    err = {"code": "execution_error", "message": "the operation raised ValueError"}
    v = outcome.verdict_from_record(record(Status.FAILED, error=err), thread_backed=False,
                                    cancel_requested=False)
    assert (v.phase, v.reason, v.uncertain) == (Phase.FAILED, Reason.EXECUTION_FAILED, False)
    assert v.failure is not None and v.failure.category is FailureCategory.EXECUTION


@pytest.mark.parametrize(("thread_backed", "uncertain"), [(True, True), (False, False)])
def test_timeout_uncertain_for_thread_backed(thread_backed: bool, uncertain: bool) -> None:
    err = {"code": "timeout", "message": "exceeded"}
    v = outcome.verdict_from_record(record(Status.FAILED, error=err, uncertain=thread_backed),
                                    thread_backed=thread_backed, cancel_requested=False)
    assert (v.phase, v.reason, v.uncertain) == (Phase.FAILED, Reason.TIMEOUT, uncertain)


def test_cancel_of_async_work_is_known_with_independent_check_advice() -> None:
    v = outcome.verdict_from_record(record(Status.CANCELLED, error={"code": "cancelled"}),
                                    thread_backed=False, cancel_requested=True)
    assert (v.phase, v.reason, v.uncertain) == (Phase.CANCELLED, Reason.CANCELLED, False)
    assert "confirm provider and tool state independently" in v.recovery


def test_cancel_of_thread_backed_work_is_uncertain() -> None:
    v = outcome.verdict_from_record(
        record(Status.CANCELLED, error={"code": "cancelled"}, uncertain=True),
        thread_backed=True, cancel_requested=True)
    assert (v.phase, v.reason, v.uncertain) == (Phase.CANCELLED, Reason.CANCEL_UNCONFIRMED, True)
    assert "assume work may continue" in v.recovery


def test_409_is_request_changed_permanent() -> None:
    v = outcome.verdict_from_rejection(FailureCategory.PERMANENT, "conflict", "different", 409)
    assert (v.phase, v.reason, v.uncertain) == (Phase.FAILED, Reason.REQUEST_CHANGED, False)
    assert v.failure is not None and v.failure.category is FailureCategory.PERMANENT
    assert "409 collision is protective" in v.recovery


def test_410_is_archived() -> None:
    v = outcome.verdict_from_rejection(FailureCategory.PERMANENT, "archived", "gone", 410)
    assert v.reason is Reason.ARCHIVED and not v.uncertain


def test_auth_rejection() -> None:
    v = outcome.verdict_from_rejection(FailureCategory.AUTH, "unauthorized", "no", 401)
    assert v.reason is Reason.AUTH_FAILED and v.failure is not None
    assert v.failure.category is FailureCategory.AUTH


def test_every_uncertain_reason_has_recovery_words() -> None:
    for reason in outcome.UNCERTAIN_REASONS:
        assert reason in outcome.RECOVERY
        v = outcome.uncertain(reason, FailureCategory.TRANSPORT, "c", "m")
        assert v.uncertain and v.uncertain_reason is reason and v.recovery


def test_sticky_uncertainty_survives_a_later_success() -> None:
    done = outcome.verdict_from_record(record(Status.COMPLETED), thread_backed=False,
                                       cancel_requested=True)
    v = outcome.with_uncertainty(done, Reason.CANCEL_UNCONFIRMED, "cancel unconfirmed")
    assert v.phase is Phase.SUCCEEDED and v.uncertain
    assert v.reason is Reason.CANCEL_UNCONFIRMED


def test_a_completed_record_flagged_uncertain_is_reported_uncertain() -> None:
    v = outcome.verdict_from_record(record(Status.COMPLETED, output="x", uncertain=True),
                                    thread_backed=True, cancel_requested=False)
    assert (v.phase, v.reason, v.uncertain) == (Phase.SUCCEEDED, Reason.RECORD_UNCERTAIN, True)
    assert v.recovery == outcome.RECOVERY[Reason.RECORD_UNCERTAIN]


def test_a_cancel_whose_reason_mentions_deadline_is_no_timeout() -> None:
    err = {"code": "cancelled", "message": "cancelled on request", "reason": "deadline passed"}
    v = outcome.verdict_from_record(record(Status.CANCELLED, error=err), thread_backed=False,
                                    cancel_requested=True)
    assert (v.phase, v.reason) == (Phase.CANCELLED, Reason.CANCELLED)
    assert not outcome.is_timeout({"type": "timeout_like", "reason": "timeout"})
    assert outcome.is_timeout({"code": "timeout"})


def test_the_records_flag_decides_uncertainty_not_the_operation() -> None:
    err = {"code": "timeout", "message": "exceeded"}
    certain = outcome.verdict_from_record(record(Status.FAILED, error=err, uncertain=False),
                                          thread_backed=True, cancel_requested=False)
    assert (certain.reason, certain.uncertain) == (Reason.TIMEOUT, False)
    failed = outcome.verdict_from_record(
        record(Status.FAILED, error={"code": "execution_error"}, uncertain=True),
        thread_backed=False, cancel_requested=False)
    assert (failed.reason, failed.uncertain) == (Reason.RECORD_UNCERTAIN, True)


# --- a 410 is read for the outcome it carries (issue 19) -------------------------------------
@pytest.mark.parametrize(("status", "phase"), [
    ("completed", Phase.SUCCEEDED), ("cancelled", Phase.CANCELLED), ("failed", Phase.FAILED),
    (None, Phase.FAILED),
])
def test_a_tombstone_keeps_the_archived_outcome(status: str | None, phase: Phase) -> None:
    v = outcome.archived_verdict({"status": status, "uncertain_outcome": False,
                                  "archived": True})
    assert (v.phase, v.reason, v.uncertain) == (phase, Reason.ARCHIVED, False)
    assert "no longer held" in v.message
    assert (v.failure is None) == (phase is not Phase.FAILED)


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_an_uncertain_tombstone_stays_uncertain(status: str) -> None:
    v = outcome.archived_verdict({"status": status, "uncertain_outcome": True})
    assert v.uncertain and v.phase is Phase.FAILED and v.reason is Reason.RECORD_UNCERTAIN
