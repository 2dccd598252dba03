"""Contract: key validation, start-body parsing, per-operation input and the request hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import rfc8785
from crewfence_sidecar import contract as c
from hypothesis import given
from hypothesis import strategies as st


def _req(**over: object) -> dict[str, object]:
    body: dict[str, object] = {"crew_id": "crew", "action_id": "ns/job", "operation": "run",
                               "input": {"topic": "x"}}
    body.update(over)
    return body


# --- idempotency key -----------------------------------------------------------------------
@pytest.mark.parametrize("value", [None, "", "   ", "\t"])
def test_missing_or_blank_key_is_428(value: str | None) -> None:
    with pytest.raises(c.ContractError) as err:
        c.validate_idempotency_key(value)
    assert err.value.status == 428


@pytest.mark.parametrize("value", ["a\x00b", "a\x1fb", "a\x7fb", "x" * 513, "é" * 257])
def test_malformed_key_is_400(value: str) -> None:
    with pytest.raises(c.ContractError) as err:
        c.validate_idempotency_key(value)
    assert err.value.status == 400


def test_key_at_the_byte_limit_is_accepted() -> None:
    assert c.validate_idempotency_key("é" * 256) == "é" * 256
    assert c.validate_idempotency_key("k" * 512) == "k" * 512


@given(st.text(max_size=700))
def test_key_validation_property(value: str) -> None:
    """Accepted exactly when non-blank, no C0 control / DEL, and at most 512 UTF-8 bytes."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        size = None
    expected_ok = (
        value.strip() != ""
        and not any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value)
        and size is not None and size <= 512
    )
    try:
        assert c.validate_idempotency_key(value) == value
        ok = True
    except c.ContractError as err:
        assert err.status in (400, 428)
        assert (err.status == 428) == (value.strip() == "")
        ok = False
    assert ok == expected_ok


# --- start body ----------------------------------------------------------------------------
def test_parse_accepts_a_minimal_body() -> None:
    req = c.parse_start_request(_req())
    assert req.operation is c.Operation.RUN
    assert req.timeout_ms is None
    assert req.effective_timeout_ms == c.TIMEOUT_MS_DEFAULT


@pytest.mark.parametrize("body, status", [
    ([], 400),
    (_req(extra=1), 400),
    ({"crew_id": "c", "action_id": "a", "operation": "run"}, 400),
    (_req(crew_id=""), 400),
    (_req(action_id="a" * 257), 400),
    (_req(crew_id=5), 400),
    (_req(operation="explode"), 400),
    (_req(input=[1]), 400),
    (_req(timeout_ms=0), 400),
    (_req(timeout_ms=3_600_001), 400),
    (_req(timeout_ms=True), 400),
    (_req(timeout_ms=1.5), 400),
    (_req(input={"x": "y" * c.MAX_INPUT_BYTES}), 413),
])
def test_parse_rejects(body: object, status: int) -> None:
    with pytest.raises(c.ContractError) as err:
        c.parse_start_request(body)
    assert err.value.status == status


def test_ids_at_the_limit_are_accepted() -> None:
    req = c.parse_start_request(_req(action_id="a" * 256, timeout_ms=3_600_000))
    assert len(req.action_id) == 256 and req.timeout_ms == 3_600_000


# --- per-operation input -------------------------------------------------------------------
GOOD_INPUTS: dict[c.Operation, dict[str, Any]] = {
    c.Operation.RUN: {"topic": "t"},
    c.Operation.BATCH_RUN: {"inputs": [{"topic": "a"}, {"topic": "b"}]},
    c.Operation.REPLAY: {"task_id": "abc", "inputs": {"topic": "a"}},
    c.Operation.TRAIN: {"n_iterations": 1, "artifact_name": "model.pkl", "feedback": []},
    c.Operation.TEST: {"n_iterations": 2, "eval_llm": "crewfence/offline"},
    c.Operation.KNOWLEDGE_QUERY: {"query": ["what"], "results_limit": 3, "score_threshold": 0.2},
    c.Operation.MEMORY_RESET: {"command_type": "all"},
}


@pytest.mark.parametrize("op", list(c.Operation))
def test_good_inputs_pass(op: c.Operation) -> None:
    c.validate_operation_input(op, dict(GOOD_INPUTS[op]))


@pytest.mark.parametrize("op, value", [
    (c.Operation.BATCH_RUN, {}),
    (c.Operation.BATCH_RUN, {"inputs": []}),
    (c.Operation.BATCH_RUN, {"inputs": [1]}),
    (c.Operation.REPLAY, {"inputs": {}}),
    (c.Operation.REPLAY, {"task_id": ""}),
    (c.Operation.TRAIN, {"n_iterations": 0, "artifact_name": "a"}),
    (c.Operation.TRAIN, {"n_iterations": 1, "artifact_name": "../escape"}),
    (c.Operation.TRAIN, {"n_iterations": 1, "artifact_name": "/etc/passwd"}),
    (c.Operation.TRAIN, {"n_iterations": 1, "artifact_name": ".hidden"}),
    (c.Operation.TRAIN, {"n_iterations": 1, "artifact_name": "a/b"}),
    (c.Operation.TRAIN, {"n_iterations": 1, "artifact_name": "a" * 129}),
    (c.Operation.TRAIN, {"n_iterations": True, "artifact_name": "a"}),
    (c.Operation.TEST, {"n_iterations": 1}),
    (c.Operation.KNOWLEDGE_QUERY, {"query": []}),
    (c.Operation.KNOWLEDGE_QUERY, {"query": ["q"], "score_threshold": 2}),
    (c.Operation.KNOWLEDGE_QUERY, {"query": ["q"], "results_limit": 0}),
    (c.Operation.MEMORY_RESET, {"command_type": "everything"}),
    (c.Operation.MEMORY_RESET, {"command_type": "all", "x": 1}),
])
def test_bad_inputs_are_422(op: c.Operation, value: dict[str, object]) -> None:
    with pytest.raises(c.ContractError) as err:
        c.validate_operation_input(op, value)
    assert err.value.status == 422


@given(st.text(max_size=140))
def test_artifact_names_never_escape(name: str) -> None:
    try:
        c.validate_artifact_name(name)
    except c.ContractError:
        return
    assert "/" not in name and "\\" not in name and not name.startswith(".")
    assert name not in ("", ".", "..")


# --- hash ----------------------------------------------------------------------------------
def test_hash_matches_jcs_of_the_documented_material() -> None:
    req = c.parse_start_request(_req())
    material = {"crew_id": "crew", "action_id": "ns/job", "operation": "run",
                "input": {"topic": "x"}, "timeout_ms": None, "idempotency_key": "k"}
    assert c.request_hash(req, "k") == hashlib.sha256(rfc8785.dumps(material)).hexdigest()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
inputs = st.dictionaries(st.text(max_size=8), json_values, max_size=5)


@given(inputs, st.text(min_size=1, max_size=30))
def test_hash_ignores_key_order_and_whitespace(value: dict[str, object], key: str) -> None:
    reordered = json.loads(json.dumps(dict(reversed(list(value.items()))), indent=3))
    a = c.StartRequest("c", "a", c.Operation.RUN, value)
    b = c.StartRequest("c", "a", c.Operation.RUN, reordered)
    assert c.request_hash(a, key) == c.request_hash(b, key)


@given(inputs, st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30))
def test_hash_separates_keys_and_timeouts(value: dict[str, object], k1: str, k2: str) -> None:
    base = c.StartRequest("c", "a", c.Operation.RUN, value)
    timed = c.StartRequest("c", "a", c.Operation.RUN, value, timeout_ms=c.TIMEOUT_MS_DEFAULT)
    # an omitted timeout hashes as null, not as the default
    assert c.request_hash(base, k1) != c.request_hash(timed, k1)
    assert (c.request_hash(base, k1) == c.request_hash(base, k2)) == (k1 == k2)


@given(inputs, inputs)
def test_hash_separates_inputs(v1: dict[str, object], v2: dict[str, object]) -> None:
    h1 = c.request_hash(c.StartRequest("c", "a", c.Operation.RUN, v1), "k")
    h2 = c.request_hash(c.StartRequest("c", "a", c.Operation.RUN, v2), "k")
    assert (h1 == h2) == (rfc8785.dumps(v1) == rfc8785.dumps(v2))  # type: ignore[arg-type]


def test_hash_of_unrepresentable_number_is_400() -> None:
    req = c.StartRequest("c", "a", c.Operation.RUN, {"n": 2**60})
    with pytest.raises(c.ContractError) as err:
        c.request_hash(req, "k")
    assert err.value.status == 400


# --- taxonomy and records ------------------------------------------------------------------
@pytest.mark.parametrize("status, cat", [
    (401, c.FailureCategory.AUTH), (403, c.FailureCategory.AUTH),
    (429, c.FailureCategory.TEMPORARY), (500, c.FailureCategory.TEMPORARY),
    (507, c.FailureCategory.TEMPORARY), (404, c.FailureCategory.PERMANENT),
    (409, c.FailureCategory.PERMANENT), (410, c.FailureCategory.PERMANENT),
])
def test_classify(status: int, cat: c.FailureCategory) -> None:
    assert c.classify_http_status(status) is cat


def test_traits_table() -> None:
    cancellable = {op for op, t in c.OPERATION_TRAITS.items() if t.cancellable}
    assert cancellable == {"run", "batch_run", "replay", "train", "test"}
    # crewai 1.15 runs the LLM call of its async path in a worker thread (see contract.py)
    assert all(t.thread_backed for t in c.OPERATION_TRAITS.values())


def test_record_round_trip() -> None:
    rec = c.JobRecord("a", "c", "run", "h", c.Status.RUNNING, 1, "t0", "t1")
    wire = rec.to_wire()
    assert set(wire) == {"action_id", "crew_id", "operation", "request_hash", "status",
                         "event_count", "output", "error", "uncertain_outcome",
                         "work_stopped", "stopped_at", "created_at", "updated_at",
                         "recorded_at"}
    assert wire["work_stopped"] is False and wire["stopped_at"] is None
    assert wire["recorded_at"] is None
    assert c.JobRecord.from_wire(wire) == rec
    done = c.JobRecord("a", "c", "run", "h", c.Status.COMPLETED, 2, "t0", "t1",
                       recorded_at="t2")
    assert c.JobRecord.from_wire(done.to_wire()) == done
    stopped = c.JobRecord("a", "c", "run", "h", c.Status.CANCELLED, 2, "t0", "t2",
                          error={"code": "cancelled", "work_stopped": True, "stopped_at": "t2"},
                          uncertain_outcome=True)
    assert (stopped.to_wire()["work_stopped"], stopped.to_wire()["stopped_at"]) == (True, "t2")
    assert c.JobRecord.from_wire(stopped.to_wire()) == stopped
    ev = c.JobEvent("started", 0, {"x": 1})
    assert c.JobEvent.from_wire(ev.to_wire()) == ev


def test_a_tombstone_carries_its_findings_on_the_wire_and_pages_fit_a_body() -> None:
    """The hand-over's wire form keeps the findings (a wrong event is refused), and a page of
    tombstones stops short of MAX_TOMBSTONE_PAGE_BYTES so its import fits a request body."""
    res = c.JobEvent("resolution", 4, {"outcome": "NotHappened", "note": "n" * 4000})
    suc = c.JobEvent("successor", 5, {"successor_action_id": "ns/next", "resume": True})
    stone = c.Tombstone(action_id="ns/p", crew_id="research", operation="run",
                        request_hash="a" * 64, status=c.Status.FAILED,
                        archived_at="2026-12-02T00:00:00.000Z", uncertain_outcome=True,
                        resolution=res, successor=suc)
    assert c.Tombstone.from_wire(stone.to_wire()) == stone
    assert "'ns/next'" in stone.findings_summary()
    with pytest.raises(ValueError):
        c.Tombstone.from_wire({**stone.to_wire(), "resolution": suc.to_wire()})
    many = [c.Tombstone(**{**stone.__dict__, "action_id": f"ns/p{i:04d}"}) for i in range(500)]
    page = c.tombstone_page(many, 500)
    size = len(json.dumps(page["tombstones"]).encode())
    assert 0 < len(page["tombstones"]) < 500 and size <= c.MAX_TOMBSTONE_PAGE_BYTES + 1000
    assert page["next_after"] == page["tombstones"][-1]["action_id"]
