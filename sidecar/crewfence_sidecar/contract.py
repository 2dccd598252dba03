"""The sidecar wire contract: validation, canonical request hash, record and event shapes.

This is the ONE copy of the contract. The operator imports it, so it must stay cheap:
standard library plus ``rfc8785`` only, never crewai.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol
from urllib.parse import quote

import rfc8785

SCHEMA_VERSION: Final = "crewfence.dev/sidecar/v1"

# --- headers ---------------------------------------------------------------------------------
IDEMPOTENCY_KEY_HEADER: Final = "Idempotency-Key"
ARCHIVE_CONFIRMATION_HEADER: Final = "X-AIP-Archive-Confirmation"
PREFER_HEADER: Final = "Prefer"
PREFER_ASYNC: Final = "respond-async"
JOURNAL_ID_HEADER: Final = "X-Crewfence-Journal-Id"
EXPECTED_JOURNAL_ID_HEADER: Final = "X-Crewfence-Expected-Journal-Id"
"""On an admission (``POST /jobs``, ``POST /jobs/stream``): the journal the client assigned the
action to. A sidecar serving another journal admits nothing and answers 412
:data:`JOURNAL_MISMATCH_CODE` (optional: a request without it is admitted as before)."""
EXACT_REPEAT_HEADER: Final = "X-Crewfence-Exact-Repeat"

# --- administrative routes (crewfence extensions; bearer auth like every job route) ----------
DRAIN_PATH: Final = "/admin/drain"
BULK_ARCHIVE_PATH: Final = "/admin/archive"
TOMBSTONES_PATH: Final = "/admin/tombstones"
MAX_TOMBSTONES_PER_PAGE: Final = 500
DRAINING_CODE: Final = "draining"
"""The ``code`` of the 503 a draining sidecar answers to a new admission."""
JOURNAL_MISMATCH_CODE: Final = "journal_mismatch"
"""The ``code`` of the 412 answered to an admission that expects another journal."""
DRAINING_RETRY_AFTER_SECONDS: Final = 30
BULK_ARCHIVE_CONFIRMATION_PREFIX: Final = "older-than:"
MAX_ARCHIVE_AGE_SECONDS: Final = 100 * 365 * 24 * 3600

# --- limits ----------------------------------------------------------------------------------
MAX_ID_CHARS: Final = 256
MAX_KEY_BYTES: Final = 512
TIMEOUT_MS_MIN: Final = 1
TIMEOUT_MS_MAX: Final = 3_600_000
TIMEOUT_MS_DEFAULT: Final = 600_000
MAX_INPUT_BYTES: Final = 1024 * 1024
# A start body is the input plus a few short fields; this is the HTTP body limit (413 above it).
MAX_BODY_BYTES: Final = MAX_INPUT_BYTES + 4096
MAX_REASON_CHARS: Final = 1024
MAX_ITERATIONS: Final = 100
MAX_BATCH_INPUTS: Final = 1000
MAX_QUERIES: Final = 100
MAX_RESULTS_LIMIT: Final = 100
ARTIFACT_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Status(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES: Final = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})


class EventName(StrEnum):
    STARTED = "started"
    CHUNK = "chunk"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # --- the effect ledger (crewfence extension; clients ignore names they do not know) ---
    TASK_STARTED = "task_started"
    TASK_COMPLETED = "task_completed"
    MODEL_CALL = "model_call"
    TOOL_CALL_STARTED = "tool_call_started"
    TOOL_CALL_FINISHED = "tool_call_finished"
    # --- resume (a successor reusing its predecessor's journaled trajectory) ---
    TASK_REUSED = "task_reused"
    TOOL_CALL_REUSED = "tool_call_reused"
    MODEL_CALL_REUSED = "model_call_reused"
    BATCH_ITEM_COMPLETED = "batch_item_completed"
    BATCH_ITEM_REUSED = "batch_item_reused"


EFFECT_EVENTS: Final = frozenset({EventName.TASK_STARTED, EventName.TASK_COMPLETED,
                                  EventName.MODEL_CALL, EventName.TOOL_CALL_STARTED,
                                  EventName.TOOL_CALL_FINISHED, EventName.TASK_REUSED,
                                  EventName.TOOL_CALL_REUSED, EventName.MODEL_CALL_REUSED,
                                  EventName.BATCH_ITEM_COMPLETED,
                                  EventName.BATCH_ITEM_REUSED})
"""Events a job's ledger appends between ``started`` and its terminal event."""


TOOL_UNAVAILABLE: Final = "tool_unavailable"
"""Error code of a job whose crew's tools could not be built (nothing ran)."""
MAX_TOOL_SETUP_MESSAGE_CHARS: Final = 500


class ToolSetupError(ValueError):
    """A crew's tools could not be built before its job ran anything: an MCP server that does
    not answer ``tools/list`` or does not offer a tool an agent names, a Python ``ref`` that
    does not import. Its message names only parts of the crew definition (server, tool,
    ref, file names; never header values or job inputs), so, unlike other exceptions of a
    job, it is journaled (``error.code`` :data:`TOOL_UNAVAILABLE`)."""


class EffectSink(Protocol):
    """Where a job's effect-ledger events go: ``sink(event, data, durable, preceding)``.

    ``preceding`` are events that happened just before ``event`` and are journaled with it,
    in order, in the same commit (a tool call's start carries the model call that ended at
    it). With ``durable`` it returns True only once all of them are committed durably (False
    when they could not be: nothing of the batch is kept); callable from any thread."""

    def __call__(self, event: str, data: dict[str, Any], durable: bool,
                 preceding: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool: ...

TERMINAL_EVENTS: Final = frozenset({EventName.COMPLETED, EventName.FAILED, EventName.CANCELLED})
TERMINAL_EVENT_FOR_STATUS: Final = {
    Status.COMPLETED: EventName.COMPLETED,
    Status.FAILED: EventName.FAILED,
    Status.CANCELLED: EventName.CANCELLED,
}


class Operation(StrEnum):
    RUN = "run"
    BATCH_RUN = "batch_run"
    REPLAY = "replay"
    TRAIN = "train"
    TEST = "test"
    KNOWLEDGE_QUERY = "knowledge_query"
    MEMORY_RESET = "memory_reset"


RESUMABLE_OPERATIONS: Final = frozenset({Operation.RUN, Operation.BATCH_RUN})
"""Operations a start may resume (``resume_from``): the ones the effect ledger journals."""

CONTROL_OPERATIONS: Final = ("cancel", "events", "status")
"""Listed by ``/health`` with the enabled startable operations, all sorted (AIP)."""


def health_operations(enabled: frozenset[Operation] | set[Operation]) -> list[str]:
    """``/health``'s ``operations``: enabled startable operations plus the control ones."""
    return sorted({op.value for op in enabled} | set(CONTROL_OPERATIONS))


BLOCKING_CANCELLED_DETAIL: Final = "CrewAI run was cancelled"
BLOCKING_FAILED_DETAIL: Final = "CrewAI run failed"
"""The ``detail`` of the blocking ``POST /jobs`` answer when its record ends cancelled (409)
or failed (502), as the AIP reference sidecar words them."""


@dataclass(frozen=True)
class OperationTraits:
    cancellable: bool
    """Runtime cancellation is advertised for this operation (the cancel route accepts any)."""
    thread_backed: bool
    """Runs in a worker thread that keeps going after its waiter is cancelled."""


# thread_backed is what crewai 1.15 really does, checked here: its native async path
# (akickoff, and akickoff_for_each built on it) still runs the LLM's synchronous `call` in an
# asyncio worker thread, so cancelling or timing out a `run`/`batch_run` leaves that call
# running exactly like replay/train/test. knowledge_query runs in a worker thread because
# crewai's aquery_knowledge needs an async chromadb client it never creates. Every
# cancelled or timed-out job therefore ends `uncertain_outcome: true`.
# Since every job runs in its own worker process (crewfence_sidecar.workers), a cancel or a
# timeout kills the worker's process group and reaps it BEFORE the terminal record is
# written, which then says `work_stopped: true` with `stopped_at`: the threads are gone too.
# thread_backed still matters: what the work did before the stop is unknown (uncertain).
OPERATION_TRAITS: Final[dict[Operation, OperationTraits]] = {
    Operation.RUN: OperationTraits(cancellable=True, thread_backed=True),
    Operation.BATCH_RUN: OperationTraits(cancellable=True, thread_backed=True),
    Operation.REPLAY: OperationTraits(cancellable=True, thread_backed=True),
    Operation.TRAIN: OperationTraits(cancellable=True, thread_backed=True),
    Operation.TEST: OperationTraits(cancellable=True, thread_backed=True),
    Operation.KNOWLEDGE_QUERY: OperationTraits(cancellable=False, thread_backed=True),
    Operation.MEMORY_RESET: OperationTraits(cancellable=False, thread_backed=True),
}

MEMORY_RESET_COMMANDS: Final = frozenset(
    {"memory", "knowledge", "agent_knowledge", "kickoff_outputs", "all",
     "long", "short", "entity", "external"}
)


# --- errors ----------------------------------------------------------------------------------
class ContractError(Exception):
    """A request that breaks the contract; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, code: str, message: str,
                 extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = dict(extra or {})
        """More fields of the ``error`` object (e.g. the journaled fact a 409 conflicts with)."""

    def to_wire(self) -> dict[str, Any]:
        return error_body(self.code, self.message, **self.extra)


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The JSON body of every non-2xx sidecar answer."""
    return {"error": {"code": code, "message": message, **extra}}


class FailureCategory(StrEnum):
    AUTH = "Auth"
    TEMPORARY = "Temporary"
    PERMANENT = "Permanent"
    TRANSPORT = "Transport"
    CONNECTOR = "Connector"
    EXECUTION = "Execution"


def classify_http_status(status: int) -> FailureCategory:
    """The reference's taxonomy for a sidecar answer that is not a success."""
    if status in (401, 403):
        return FailureCategory.AUTH
    if status == 429 or 500 <= status <= 599:
        return FailureCategory.TEMPORARY
    return FailureCategory.PERMANENT


# --- idempotency key -------------------------------------------------------------------------
def validate_idempotency_key(value: str | None) -> str:
    """Return the key unchanged, or raise 428 (missing/blank) or 400 (malformed)."""
    if value is None or value.strip() == "":
        raise ContractError(428, "idempotency_key_required",
                            f"header {IDEMPOTENCY_KEY_HEADER} is required")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise ContractError(400, "idempotency_key_invalid",
                            f"{IDEMPOTENCY_KEY_HEADER} contains a control character")
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        raise ContractError(400, "idempotency_key_invalid",
                            f"{IDEMPOTENCY_KEY_HEADER} is not valid UTF-8") from None
    if len(encoded) > MAX_KEY_BYTES:
        raise ContractError(400, "idempotency_key_invalid",
                            f"{IDEMPOTENCY_KEY_HEADER} is over {MAX_KEY_BYTES} UTF-8 bytes")
    return value


# --- start request ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StartRequest:
    crew_id: str
    action_id: str
    operation: Operation
    input: dict[str, Any]
    timeout_ms: int | None = None
    """None when the request omitted it (the hash then carries ``null``)."""
    resume_from: str | None = None
    """The predecessor's action id when this start resumes its journaled trajectory (see
    ``crewfence_sidecar.resume``); None for a fresh start. Part of the request hash only when
    set, so the hash of a request without it is what it always was."""

    @property
    def effective_timeout_ms(self) -> int:
        return TIMEOUT_MS_DEFAULT if self.timeout_ms is None else self.timeout_ms

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "crew_id": self.crew_id, "action_id": self.action_id,
            "operation": self.operation.value, "input": self.input,
        }
        if self.timeout_ms is not None:
            body["timeout_ms"] = self.timeout_ms
        if self.resume_from is not None:
            body["resume_from"] = self.resume_from
        return body


START_FIELDS: Final = frozenset({"crew_id", "action_id", "operation", "input", "timeout_ms",
                                 "resume_from"})
REQUIRED_START_FIELDS: Final = frozenset({"crew_id", "action_id", "operation", "input"})


def validate_id(name: str, value: object) -> str:
    """crew_id / action_id: a string of 1..MAX_ID_CHARS characters, valid UTF-8."""
    if not isinstance(value, str):
        raise ContractError(400, "invalid_request", f"{name} must be a string")
    if not 1 <= len(value) <= MAX_ID_CHARS:
        raise ContractError(400, "invalid_request",
                            f"{name} must have 1..{MAX_ID_CHARS} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ContractError(400, "invalid_request", f"{name} is not valid UTF-8") from None
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_SHA256_HEX_RE: Final = re.compile(r"^[0-9a-f]{64}$")


def _hex_digest(value: object) -> str:
    """A lower-case hex SHA-256 digest (a request hash), or ValueError."""
    if not isinstance(value, str) or not _SHA256_HEX_RE.match(value):
        raise ValueError("request_hash must be a lower-case hex SHA-256 digest")
    return value


def encoded_size(value: Any) -> int:
    """Bytes of the compact JSON encoding (the measure for the input bound)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8", "surrogatepass"))


def _body_object(body: object, allowed: AbstractSet[str]) -> dict[str, Any]:
    """A request body as a JSON object with no field outside ``allowed`` (400 otherwise)."""
    if not isinstance(body, dict):
        raise ContractError(400, "invalid_request", "the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ContractError(400, "unknown_fields",
                            f"unknown fields: {', '.join(map(str, unknown))[:200]}")
    return body


def _require_fields(body: Mapping[str, Any], required: AbstractSet[str]) -> None:
    """400 naming every field of ``required`` the body lacks."""
    missing = sorted(required - set(body))
    if missing:
        raise ContractError(400, "invalid_request", f"missing fields: {', '.join(missing)}")


def parse_start_request(body: object) -> StartRequest:
    """Validate the shape of a start body (400/413); per-operation input is separate (422)."""
    body = _body_object(body, START_FIELDS)
    _require_fields(body, REQUIRED_START_FIELDS)
    crew_id = validate_id("crew_id", body["crew_id"])
    action_id = validate_id("action_id", body["action_id"])
    raw_op = body["operation"]
    if not isinstance(raw_op, str) or raw_op not in Operation.__members__.values():
        raise ContractError(400, "invalid_request",
                            f"operation must be one of: {', '.join(Operation)}")
    operation = Operation(raw_op)
    raw_input = body["input"]
    if not isinstance(raw_input, dict):
        raise ContractError(400, "invalid_request", "input must be a JSON object")
    try:
        size = encoded_size(raw_input)
    except (ValueError, TypeError):
        raise ContractError(400, "invalid_request", "input is not finite JSON") from None
    if size > MAX_INPUT_BYTES:
        raise ContractError(413, "input_too_large", f"input is over {MAX_INPUT_BYTES} bytes")
    timeout_ms = body.get("timeout_ms")
    if timeout_ms is not None:
        if not _is_int(timeout_ms) or not TIMEOUT_MS_MIN <= timeout_ms <= TIMEOUT_MS_MAX:
            raise ContractError(400, "invalid_request",
                                f"timeout_ms must be an integer {TIMEOUT_MS_MIN}..{TIMEOUT_MS_MAX}")
    resume_from = body.get("resume_from")
    if resume_from is not None:
        resume_from = validate_id("resume_from", resume_from)
        if resume_from == action_id:
            raise ContractError(400, "invalid_request", "resume_from must name another action")
        if operation not in RESUMABLE_OPERATIONS:
            raise ContractError(400, "invalid_request",
                                "resume_from applies to run and batch_run only")
    return StartRequest(crew_id=crew_id, action_id=action_id, operation=operation,
                        input=raw_input, timeout_ms=timeout_ms, resume_from=resume_from)


def request_hash(req: StartRequest, idempotency_key: str) -> str:
    """SHA-256 hex over the RFC 8785 canonical JSON of the request identity."""
    material = {
        "crew_id": req.crew_id,
        "action_id": req.action_id,
        "operation": req.operation.value,
        "input": req.input,
        "timeout_ms": req.timeout_ms,
        "idempotency_key": idempotency_key,
    }
    if req.resume_from is not None:  # absent from the material otherwise: old hashes hold
        material["resume_from"] = req.resume_from
    try:
        canonical = rfc8785.dumps(material)
    except (rfc8785.CanonicalizationError, ValueError, TypeError) as exc:
        raise ContractError(400, "invalid_request",
                            f"request cannot be canonicalised: {type(exc).__name__}") from None
    return hashlib.sha256(canonical).hexdigest()


# --- per-operation input ---------------------------------------------------------------------
def _invalid(message: str) -> ContractError:
    return ContractError(422, "invalid_input", message)


def _check_keys(op: Operation, value: dict[str, Any], required: set[str],
                optional: set[str]) -> None:
    unknown = sorted(set(value) - required - optional)
    if unknown:
        raise _invalid(f"{op.value}: unknown input fields: {', '.join(unknown)[:200]}")
    missing = sorted(required - set(value))
    if missing:
        raise _invalid(f"{op.value}: missing input fields: {', '.join(missing)}")


def _check_inputs_obj(op: Operation, value: object, name: str = "inputs") -> None:
    if not isinstance(value, dict):
        raise _invalid(f"{op.value}: {name} must be an object")
    if not all(isinstance(k, str) for k in value):
        raise _invalid(f"{op.value}: {name} keys must be strings")


def _check_iterations(op: Operation, value: object) -> None:
    if not _is_int(value) or not 1 <= value <= MAX_ITERATIONS:  # type: ignore[operator]
        raise _invalid(f"{op.value}: n_iterations must be an integer 1..{MAX_ITERATIONS}")


def _check_nonempty_str(op: Operation, name: str, value: object, limit: int = 1024) -> None:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise _invalid(f"{op.value}: {name} must be a non-empty string of at most {limit} chars")


def validate_artifact_name(value: object) -> str:
    """A train artifact name: a plain file name confined to the training directory."""
    if not isinstance(value, str) or not ARTIFACT_NAME_RE.fullmatch(value):
        raise _invalid("train: artifact_name must match " + ARTIFACT_NAME_RE.pattern)
    return value


def kickoff_inputs(op: Operation, value: dict[str, Any]) -> list[dict[str, Any]]:
    """The kickoff inputs an (already validated) operation input hands to the crew's
    templates: ``run`` its input itself, ``batch_run`` each item, ``train``/``test`` their
    ``inputs`` (``{}`` when absent); none for the other operations."""
    if op is Operation.RUN:
        return [value]
    if op is Operation.BATCH_RUN:
        return [item for item in value.get("inputs", []) if isinstance(item, dict)]
    if op in (Operation.TRAIN, Operation.TEST):
        inputs = value.get("inputs")
        return [inputs if isinstance(inputs, dict) else {}]
    return []


def check_template_inputs(op: Operation, value: dict[str, Any],
                          placeholders: list[str]) -> None:
    """422 ``missing_inputs`` naming the ``{placeholders}`` of the crew's templates that an
    input lacks (crewai would fail only at execution, as "the operation raised ValueError")."""
    for n, inputs in enumerate(kickoff_inputs(op, value)):
        missing = sorted(set(placeholders) - set(inputs))
        if missing:
            where = f"inputs[{n}]" if op is Operation.BATCH_RUN else "the input"
            raise ContractError(422, "missing_inputs",
                                f"{where} lacks {', '.join(missing)}, used by the crew's "
                                "templates")


def validate_operation_input(op: Operation, value: dict[str, Any]) -> None:
    """Raise 422 when ``value`` is no valid input for ``op``."""
    if not isinstance(value, dict):
        raise _invalid("input must be an object")
    if op is Operation.RUN:
        _check_inputs_obj(op, value, "input")
    elif op is Operation.BATCH_RUN:
        _check_keys(op, value, {"inputs"}, set())
        items = value["inputs"]
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH_INPUTS:
            raise _invalid(f"batch_run: inputs must be a list of 1..{MAX_BATCH_INPUTS} objects")
        for item in items:
            _check_inputs_obj(op, item, "each inputs item")
    elif op is Operation.REPLAY:
        _check_keys(op, value, {"task_id"}, {"inputs"})
        _check_nonempty_str(op, "task_id", value["task_id"], 256)
        if "inputs" in value:
            _check_inputs_obj(op, value["inputs"])
    elif op is Operation.TRAIN:
        _check_keys(op, value, {"n_iterations", "artifact_name"}, {"inputs", "feedback"})
        _check_iterations(op, value["n_iterations"])
        validate_artifact_name(value["artifact_name"])
        if "inputs" in value:
            _check_inputs_obj(op, value["inputs"])
        if "feedback" in value:
            fb = value["feedback"]
            if not isinstance(fb, list) or not all(isinstance(x, str) for x in fb):
                raise _invalid("train: feedback must be a list of strings")
    elif op is Operation.TEST:
        _check_keys(op, value, {"n_iterations", "eval_llm"}, {"inputs"})
        _check_iterations(op, value["n_iterations"])
        _check_nonempty_str(op, "eval_llm", value["eval_llm"], 256)
        if "inputs" in value:
            _check_inputs_obj(op, value["inputs"])
    elif op is Operation.KNOWLEDGE_QUERY:
        _check_keys(op, value, {"query"}, {"results_limit", "score_threshold"})
        query = value["query"]
        if (not isinstance(query, list) or not 1 <= len(query) <= MAX_QUERIES
                or not all(isinstance(q, str) and q.strip() for q in query)):
            raise _invalid(f"knowledge_query: query must be a list of 1..{MAX_QUERIES} "
                           "non-empty strings")
        if "results_limit" in value:
            limit = value["results_limit"]
            if not _is_int(limit) or not 1 <= limit <= MAX_RESULTS_LIMIT:
                raise _invalid(f"knowledge_query: results_limit must be 1..{MAX_RESULTS_LIMIT}")
        if "score_threshold" in value:
            thr = value["score_threshold"]
            if (not isinstance(thr, int | float) or isinstance(thr, bool)
                    or not math.isfinite(thr) or not 0 <= thr <= 1):
                raise _invalid("knowledge_query: score_threshold must be a number 0..1")
    elif op is Operation.MEMORY_RESET:
        _check_keys(op, value, {"command_type"}, set())
        if value["command_type"] not in MEMORY_RESET_COMMANDS:
            raise _invalid("memory_reset: command_type must be one of: "
                           + ", ".join(sorted(MEMORY_RESET_COMMANDS)))
    else:  # pragma: no cover - Operation is closed
        raise _invalid(f"unknown operation {op}")


# --- cancel request --------------------------------------------------------------------------
@dataclass(frozen=True)
class CancelRequest:
    crew_id: str
    action_id: str
    reason: str | None = None


def _job_ids(body: dict[str, Any], path_action_id: str) -> tuple[str, str]:
    """``crew_id`` and ``action_id`` of a body about the job at the path (400 otherwise)."""
    if "crew_id" not in body or "action_id" not in body:
        raise ContractError(400, "invalid_request", "crew_id and action_id are required")
    crew_id = validate_id("crew_id", body["crew_id"])
    action_id = validate_id("action_id", body["action_id"])
    if action_id != path_action_id:
        raise ContractError(400, "invalid_request", "action_id does not match the path")
    return crew_id, action_id


def parse_cancel_request(body: object, path_action_id: str) -> CancelRequest:
    body = _body_object(body, {"crew_id", "action_id", "reason"})
    crew_id, action_id = _job_ids(body, path_action_id)
    reason = body.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
        raise ContractError(400, "invalid_request",
                            f"reason must be a string of at most {MAX_REASON_CHARS} chars")
    return CancelRequest(crew_id=crew_id, action_id=action_id, reason=reason)


# --- administrative requests (crewfence extensions) ------------------------------------------
@dataclass(frozen=True)
class DrainState:
    """The answer of ``POST /admin/drain``; ``/health`` carries the same two fields."""

    draining: bool
    unarchived_records: int
    """Records not archived yet, whatever their status."""

    def to_wire(self) -> dict[str, Any]:
        return {"draining": self.draining, "unarchived_records": self.unarchived_records}

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> DrainState:
        draining, count = raw["draining"], raw["unarchived_records"]
        if not isinstance(draining, bool) or not _is_int(count) or count < 0:
            raise ValueError("draining must be a bool and unarchived_records an integer >= 0")
        return cls(draining=draining, unarchived_records=count)


def parse_drain_request(body: object) -> bool:
    """``{"draining": true|false}``, nothing else (400 otherwise)."""
    if not isinstance(body, dict) or set(body) != {"draining"} \
            or not isinstance(body["draining"], bool):
        raise ContractError(400, "invalid_request",
                            'the body must be {"draining": true} or {"draining": false}')
    return bool(body["draining"])


def bulk_archive_confirmation(older_than_seconds: int) -> str:
    """The value of the archive confirmation header that ``POST /admin/archive`` requires."""
    return f"{BULK_ARCHIVE_CONFIRMATION_PREFIX}{older_than_seconds}"


def parse_bulk_archive_request(body: object, confirmation: str | None) -> int:
    """``{"older_than_seconds": N}`` confirmed by ``older-than:N``; returns N.

    400 for a bad body or a confirmation naming another age, 428 without a confirmation.
    """
    if not isinstance(body, dict) or "older_than_seconds" not in body \
            or not set(body) <= {"older_than_seconds", "recorded_only"} \
            or not isinstance(body.get("recorded_only", False), bool):
        raise ContractError(400, "invalid_request",
                            'the body must be {"older_than_seconds": <integer >= 0>, '
                            '"recorded_only": <bool, optional>}')
    seconds = body["older_than_seconds"]
    if not _is_int(seconds) or not 0 <= seconds <= MAX_ARCHIVE_AGE_SECONDS:
        raise ContractError(400, "invalid_request",
                            f"older_than_seconds must be an integer 0..{MAX_ARCHIVE_AGE_SECONDS}")
    if confirmation is None or not confirmation.strip():
        raise ContractError(428, "archive_confirmation_required",
                            f"header {ARCHIVE_CONFIRMATION_HEADER} must be "
                            f"{bulk_archive_confirmation(seconds)!r}")
    if confirmation.strip() != bulk_archive_confirmation(seconds):
        raise ContractError(400, "archive_confirmation_mismatch",
                            f"{ARCHIVE_CONFIRMATION_HEADER} does not confirm this age")
    return int(seconds)


UNRECORDED_GRACE_SECONDS: Final = 24 * 3600
"""``recorded_only`` retention still archives a record nobody marked recorded once it is this
much older than the window (no operator reads it: it must not stay forever)."""
RECORDED_SUFFIX: Final = "/recorded"


def parse_recorded_request(body: object, path_action_id: str) -> tuple[str, str]:
    """``POST /jobs/{id}/recorded``: ``{crew_id, action_id}``; returns both (400 otherwise)."""
    return _job_ids(_body_object(body, {"crew_id", "action_id"}), path_action_id)


@dataclass(frozen=True)
class BulkArchiveResult:
    """The answer of ``POST /admin/archive``: the action ids now archived (tombstoned)."""

    archived: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.archived)

    def to_wire(self) -> dict[str, Any]:
        return {"archived": list(self.archived), "count": self.count}

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> BulkArchiveResult:
        archived = raw["archived"]
        if not isinstance(archived, list) or not all(isinstance(a, str) for a in archived) \
                or raw.get("count", len(archived)) != len(archived):
            raise ValueError("archived must be a list of action ids matching count")
        return cls(archived=tuple(archived))


# --- tombstone hand-over (crewfence extension) -----------------------------------------------
# A drained replica's journal is removed with its pod; its tombstones must not leave with it.
# The operator pages them out (GET /admin/tombstones) and hands them to a surviving replica
# (POST /admin/tombstones) before it removes the pod, so an action id admitted anywhere in the
# Crew's life keeps answering 410 instead of running again.
def parse_tombstone_page_query(after: str | None, raw_limit: str | None) -> tuple[str, int]:
    """``?after=<action id>&limit=N`` of ``GET /admin/tombstones`` (400 otherwise)."""
    try:
        limit = MAX_TOMBSTONES_PER_PAGE if raw_limit is None else int(raw_limit)
    except ValueError:
        raise ContractError(400, "invalid_request", "limit must be an integer") from None
    if not 1 <= limit <= MAX_TOMBSTONES_PER_PAGE:
        raise ContractError(400, "invalid_request",
                            f"limit must be 1..{MAX_TOMBSTONES_PER_PAGE}")
    return after or "", limit


MAX_TOMBSTONE_PAGE_BYTES: Final = MAX_BODY_BYTES // 2
"""A page of tombstones stops before this many bytes (findings carry notes and evidence), so
the import of a page (``POST /admin/tombstones``) always fits a request body."""


def tombstone_page(stones: list[Tombstone], limit: int) -> dict[str, Any]:
    """The answer of ``GET /admin/tombstones``: a page in action-id order, and where to go on
    (cut short, never empty, when its findings would make it over MAX_TOMBSTONE_PAGE_BYTES)."""
    wires: list[dict[str, Any]] = []
    size = 0
    for stone in stones:
        wire = stone.to_wire()
        size += len(json.dumps(wire, ensure_ascii=False).encode("utf-8")) + 1
        if wires and size > MAX_TOMBSTONE_PAGE_BYTES:
            break
        wires.append(wire)
    more = len(wires) < len(stones) or len(stones) == limit
    return {"tombstones": wires,
            "next_after": wires[-1]["action_id"] if more and wires else None}


def parse_tombstone_import(body: object) -> tuple[Tombstone, ...]:
    """``{"tombstones": [<tombstone>, ...]}`` of ``POST /admin/tombstones`` (400 otherwise)."""
    if not isinstance(body, dict) or set(body) != {"tombstones"} \
            or not isinstance(body["tombstones"], list) \
            or len(body["tombstones"]) > MAX_TOMBSTONES_PER_PAGE:
        raise ContractError(400, "invalid_request",
                            'the body must be {"tombstones": [...]} with at most '
                            f"{MAX_TOMBSTONES_PER_PAGE} entries")
    try:
        return tuple(Tombstone.from_wire(t) for t in body["tombstones"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ContractError(400, "invalid_request", f"a tombstone is malformed: {exc}") from None


@dataclass(frozen=True)
class TombstoneImportResult:
    """The answer of ``POST /admin/tombstones``.

    ``imported``: new here; ``known``: this journal already held the same tombstone (an
    idempotent repeat); ``conflicts``: action ids this journal holds as a record or as a
    tombstone of another request, never overwritten (an action admitted twice: shown, not
    hidden).
    """

    imported: int
    known: int
    conflicts: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"imported": self.imported, "known": self.known,
                "conflicts": list(self.conflicts)}

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> TombstoneImportResult:
        imported, known, conflicts = raw["imported"], raw["known"], raw.get("conflicts", [])
        if not _is_int(imported) or not _is_int(known) or not isinstance(conflicts, list) \
                or not all(isinstance(a, str) for a in conflicts):
            raise ValueError("imported and known must be integers, conflicts action ids")
        return cls(imported=imported, known=known, conflicts=tuple(conflicts))


# --- records and events ----------------------------------------------------------------------
@dataclass
class JobEvent:
    event: str
    sequence: int
    data: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"event": self.event, "sequence": self.sequence, "data": self.data}

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> JobEvent:
        return cls(event=str(raw["event"]), sequence=int(raw["sequence"]),
                   data=dict(raw.get("data") or {}))


WORKER_DIED_CODE: Final = "worker_died"
"""Error code of a job whose worker process ended without a result (a signal such as SIGKILL
or SIGSEGV, ``os._exit``, a memory limit); the error carries ``signal`` or ``exit_code``."""
WORK_STOPPED_FIELD: Final = "work_stopped"
STOPPED_AT_FIELD: Final = "stopped_at"
"""A terminal record whose job's worker process was stopped and reaped before the record was
written carries ``work_stopped: true`` and ``stopped_at`` (UTC ISO-8601) in its error, at the
top level of the record's wire form and in the terminal event's data."""


@dataclass
class JobRecord:
    action_id: str
    crew_id: str
    operation: str
    request_hash: str
    status: Status
    event_count: int
    created_at: str
    updated_at: str
    output: Any = None
    error: dict[str, Any] | None = None
    uncertain_outcome: bool = False
    recorded_at: str | None = None
    """When a client (the operator) first said it recorded this terminal record's outcome
    (``POST /jobs/{id}/recorded``); None until then. A crewfence extension of the record:
    a CrewJob deleted and re-applied from Git finds its finished record already recorded, so
    its finish is not counted a second time in the per-Crew usage counters."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def work_stopped(self) -> bool:
        """The job's worker was stopped and reaped before this record became terminal."""
        return isinstance(self.error, dict) and self.error.get(WORK_STOPPED_FIELD) is True

    @property
    def stopped_at(self) -> str | None:
        if not self.work_stopped or not isinstance(self.error, dict):
            return None
        value = self.error.get(STOPPED_AT_FIELD)
        return str(value) if value is not None else None

    def to_wire(self) -> dict[str, Any]:
        return {
            "action_id": self.action_id,
            "crew_id": self.crew_id,
            "operation": self.operation,
            "request_hash": self.request_hash,
            "status": self.status.value,
            "event_count": self.event_count,
            "output": self.output,
            "error": self.error,
            "uncertain_outcome": self.uncertain_outcome,
            WORK_STOPPED_FIELD: self.work_stopped,
            STOPPED_AT_FIELD: self.stopped_at,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "recorded_at": self.recorded_at,
        }

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> JobRecord:
        return cls(
            action_id=str(raw["action_id"]), crew_id=str(raw["crew_id"]),
            operation=str(raw["operation"]), request_hash=str(raw["request_hash"]),
            status=Status(raw["status"]), event_count=int(raw["event_count"]),
            created_at=str(raw["created_at"]), updated_at=str(raw["updated_at"]),
            output=raw.get("output"), error=raw.get("error"),
            uncertain_outcome=bool(raw.get("uncertain_outcome", False)),
            recorded_at=str(raw["recorded_at"]) if raw.get("recorded_at") else None,
        )


@dataclass(frozen=True)
class Tombstone:
    """What remains of an archived record: enough to refuse running it again (410)."""

    action_id: str
    crew_id: str
    operation: str
    request_hash: str
    status: Status
    archived_at: str
    uncertain_outcome: bool = False
    resolution: JobEvent | None = None
    """The record's journaled ``resolution`` event, kept with the tombstone (or written on it
    after the archive): a person's finding is written once and outlives the record."""
    successor: JobEvent | None = None
    """The record's journaled ``successor`` claim (its data says whether it resumes)."""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "action_id": self.action_id, "crew_id": self.crew_id, "operation": self.operation,
            "request_hash": self.request_hash, "status": self.status.value,
            "archived_at": self.archived_at, "uncertain_outcome": self.uncertain_outcome,
            "archived": True,
        }
        if self.resolution is not None:
            wire["resolution"] = self.resolution.to_wire()
        if self.successor is not None:
            wire["successor"] = self.successor.to_wire()
        return wire

    def findings_summary(self) -> str:
        """The findings kept with it, in words ("" when none)."""
        said: list[str] = []
        if self.resolution is not None:
            said.append(f"its journaled resolution is {self.resolution.data.get('outcome')} "
                        f"(journal event {self.resolution.sequence})")
        if self.successor is not None:
            kind = "resuming successor" if self.successor.data.get("resume") else "successor"
            said.append(f"its one {kind} is action "
                        f"{self.successor.data.get('successor_action_id')!r}")
        return " and ".join(said)

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Tombstone:
        if not isinstance(raw, dict):
            raise TypeError("a tombstone must be an object")
        uncertain = raw.get("uncertain_outcome", False)
        if not isinstance(uncertain, bool):
            raise ValueError("uncertain_outcome must be a bool")
        return cls(action_id=validate_id("action_id", raw["action_id"]),
                   crew_id=validate_id("crew_id", raw["crew_id"]),
                   operation=Operation(raw["operation"]).value,
                   request_hash=_hex_digest(raw["request_hash"]),
                   status=Status(raw["status"]), archived_at=str(raw["archived_at"]),
                   uncertain_outcome=uncertain,
                   resolution=_tombstone_finding(raw, "resolution", RESOLUTION_EVENT),
                   successor=_tombstone_finding(raw, "successor", SUCCESSOR_EVENT))


def _tombstone_finding(raw: dict[str, Any], key: str, name: str) -> JobEvent | None:
    """A finding carried by a tombstone's wire form: an event of exactly that name."""
    found = raw.get(key)
    if found is None:
        return None
    if not isinstance(found, dict) or found.get("event") != name \
            or not isinstance(found.get("data"), dict) or not _is_int(found.get("sequence")) \
            or found["sequence"] < 0:
        raise ValueError(f"{key} must be a {name!r} event")
    return JobEvent.from_wire(found)


def events_page(action_id: str, cursor: int, status: Status,
                events: list[JobEvent]) -> dict[str, Any]:
    """The JSON page of GET /jobs/{id}/events."""
    return {
        "action_id": action_id,
        "cursor": cursor,
        "next_cursor": cursor + len(events),
        "status": status.value,
        "events": [e.to_wire() for e in events],
    }


def job_path(action_id: str, suffix: str = "") -> str:
    """The URL path of a job: action ids (e.g. ``ns/name``) are percent-encoded, ``/`` too."""
    return f"/jobs/{quote(action_id, safe='')}{suffix}"


# --- resolution of an uncertain outcome (crewfence extension) --------------------------------
RESOLUTION_EVENT: Final = "resolution"
"""The event a resolution appends after the record's terminal event (never a terminal event)."""
MAX_NOTE_CHARS: Final = 4096
MAX_EVIDENCE_LINKS: Final = 16
MAX_EVIDENCE_CHARS: Final = 2048
MAX_RESOLVER_CHARS: Final = 256


class ResolutionOutcome(StrEnum):
    """What a person found out about an uncertain outcome."""

    HAPPENED = "Happened"
    NOT_HAPPENED = "NotHappened"
    COMPENSATED = "Compensated"


RESOLUTION_FIELDS: Final = frozenset(
    {"crew_id", "action_id", "outcome", "note", "evidence", "resolved_by"})


@dataclass(frozen=True)
class ResolutionRequest:
    """Body of ``POST /jobs/{action_id}/resolution``.

    Invariant (a resolution is written once): the sidecar journals one per action; a repeat
    of the same finding (:func:`finding_of`: crew, outcome, note, evidence; not who re-sent
    it) is answered with the journaled one, a different finding is refused with 409
    ``resolution_conflict`` naming the journaled event.
    """

    crew_id: str
    action_id: str
    outcome: ResolutionOutcome
    note: str
    evidence: tuple[str, ...] = ()
    resolved_by: str | None = None

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"crew_id": self.crew_id, "action_id": self.action_id,
                                "outcome": self.outcome.value, "note": self.note,
                                "evidence": list(self.evidence)}
        if self.resolved_by is not None:
            body["resolved_by"] = self.resolved_by
        return body

    def identity(self) -> dict[str, Any]:
        """What an identical repeat must match (the event data minus ``recorded_at``)."""
        return {k: v for k, v in self.to_wire().items() if k != "action_id"}


def _bounded_text(name: str, value: object, limit: int, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > limit:
        raise ContractError(400, "invalid_request",
                            f"{name} must be a{' non-empty' if required else ''} string of at "
                            f"most {limit} characters")
    return value


def parse_resolution_request(body: object, path_action_id: str) -> ResolutionRequest:
    """Validate a resolution body (400 on anything else)."""
    body = _body_object(body, RESOLUTION_FIELDS)
    _require_fields(body, {"crew_id", "action_id", "outcome", "note"})
    crew_id = validate_id("crew_id", body["crew_id"])
    action_id = validate_id("action_id", body["action_id"])
    if action_id != path_action_id:
        raise ContractError(400, "invalid_request", "action_id does not match the path")
    raw_outcome = body["outcome"]
    if raw_outcome not in ResolutionOutcome.__members__.values():
        raise ContractError(400, "invalid_request",
                            f"outcome must be one of: {', '.join(ResolutionOutcome)}")
    note = _bounded_text("note", body["note"], MAX_NOTE_CHARS, required=True)
    evidence = body.get("evidence", [])
    if not isinstance(evidence, list) or len(evidence) > MAX_EVIDENCE_LINKS:
        raise ContractError(400, "invalid_request",
                            f"evidence must be a list of at most {MAX_EVIDENCE_LINKS} links")
    links = tuple(str(_bounded_text("evidence link", e, MAX_EVIDENCE_CHARS, required=True))
                  for e in evidence)
    resolved_by = _bounded_text("resolved_by", body.get("resolved_by"), MAX_RESOLVER_CHARS,
                                required=False)
    return ResolutionRequest(crew_id=crew_id, action_id=action_id,
                             outcome=ResolutionOutcome(raw_outcome), note=str(note),
                             evidence=links, resolved_by=resolved_by)


# --- the one successor of an uncertain outcome (crewfence extension) -------------------------
SUCCESSOR_EVENT: Final = "successor"
"""The event a successor's claim appends after the record's ``resolution`` event (at most one
per action: the journal is where the one-successor fence lives, so deleting and re-applying
the predecessor's CrewJob cannot forget it)."""
SUCCESSOR_FIELDS: Final = frozenset({"crew_id", "action_id", "successor_action_id"})
SUCCESSOR_ALLOWING: Final = frozenset({ResolutionOutcome.NOT_HAPPENED.value,
                                       ResolutionOutcome.COMPENSATED.value})
"""The journaled resolutions that allow a successor: the work is not in effect."""


@dataclass(frozen=True)
class SuccessorRequest:
    """Body of ``POST /jobs/{action_id}/successor``: claim the one successor slot of the
    uncertain action ``action_id`` for ``successor_action_id``.

    Invariant (one successor per uncertain outcome, decided by the journal): the sidecar
    journals one claim per action, only on a terminal, uncertain record whose journaled
    resolution allows a successor; an identical repeat answers with the journaled claim and
    another successor is refused with 409 ``already_superseded``.
    """

    crew_id: str
    action_id: str
    successor_action_id: str
    resume: bool = False
    """A resuming successor (``spec.resume``): it never runs a call in doubt that was
    resolved Happened again, so it may follow a predecessor resolved Happened too."""

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"crew_id": self.crew_id, "action_id": self.action_id,
                                "successor_action_id": self.successor_action_id}
        if self.resume:
            body["resume"] = True
        return body


def parse_successor_request(body: object, path_action_id: str) -> SuccessorRequest:
    """Validate a successor claim (400 on anything else)."""
    body = _body_object(body, SUCCESSOR_FIELDS | {"resume"})
    _require_fields(body, set(SUCCESSOR_FIELDS))
    resume = body.get("resume", False)
    if not isinstance(resume, bool):
        raise ContractError(400, "invalid_request", "resume must be true or false")
    crew_id = validate_id("crew_id", body["crew_id"])
    action_id = validate_id("action_id", body["action_id"])
    successor = validate_id("successor_action_id", body["successor_action_id"])
    if action_id != path_action_id:
        raise ContractError(400, "invalid_request", "action_id does not match the path")
    if successor == action_id:
        raise ContractError(400, "invalid_request",
                            "a successor must run under a new action id")
    return SuccessorRequest(crew_id=crew_id, action_id=action_id,
                            successor_action_id=successor, resume=resume)


def finding_of(resolution_data: dict[str, Any]) -> dict[str, Any]:
    """What makes two resolutions the same finding: outcome, note and evidence (and the
    crew). Who wrote it (``resolved_by``, a field manager that changes when a manifest is
    re-applied with another client) and when are not part of the finding."""
    return {"crew_id": resolution_data.get("crew_id"), "outcome": resolution_data.get("outcome"),
            "note": resolution_data.get("note"),
            "evidence": list(resolution_data.get("evidence") or [])}


# --- the effect ledger (crewfence extension) -------------------------------------------------
TOOL_IDEMPOTENCY_KEY_PREFIX: Final = "cfk1-"
MCP_IDEMPOTENCY_META_KEY: Final = "crewfence.dev/idempotency-key"
"""Where an MCP ``tools/call`` request carries the call's key in its ``_meta``."""
MAX_EFFECT_PREVIEW_CHARS: Final = 200
MAX_EFFECT_ERROR_CHARS: Final = 200
MAX_STATUS_IN_DOUBT: Final = 10
"""``status.effects.inDoubt`` lists at most this many calls (``inDoubtCount`` has them all)."""
MAX_IN_DOUBT_LISTED: Final = MAX_STATUS_IN_DOUBT


_JCS_INT_MAX: Final = 2 ** 53 - 1
"""The largest integer RFC 8785 serialises (the IEEE 754 safe range)."""
_JCS_PLAIN_TYPES: Final = (str, int, bool, type(None))


def _jcs_plain_object(value: Any) -> bytes | None:
    """RFC 8785 JSON of a flat object (ASCII keys; str, safe int, bool or null values) by
    ``json.dumps``, the common shape of tool arguments; None for any other value.

    Invariant (same bytes as ``rfc8785.dumps``): for this shape the two agree. ASCII keys
    sort the same by code point as by UTF-16 code unit; ``json.dumps`` with
    ``ensure_ascii=False`` escapes exactly what RFC 8785 escapes (``"``, ``\\``, C0
    controls, short forms for ``\\b\\f\\n\\r\\t``, lowercase ``\\u00xx``); a string
    that is not UTF-8 (a lone surrogate) is left to ``rfc8785``. Proven against ``rfc8785``
    by ``tests/unit/sidecar/test_effects_summary.py``.
    """
    if type(value) is not dict:
        return None
    for key, item in value.items():
        if type(key) is not str or not key.isascii() or type(item) not in _JCS_PLAIN_TYPES:
            return None
        if type(item) is int and not -_JCS_INT_MAX <= item <= _JCS_INT_MAX:
            return None
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False,
                          separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        return None


def tool_idempotency_key(action_id: str, task_index: int, call_index: int) -> str:
    """The stable key of one tool call: ``cfk1-`` + 40 hex chars of SHA-256 over the RFC 8785
    JSON of ``{action_id, task_index, call_index}``.

    Invariant: a replayed trajectory (same action, same task, same position of the call in
    its task) gets the same key, so a tool that deduplicates on it runs the effect once.
    """
    fields: dict[str, Any] = {"action_id": action_id, "task_index": task_index,
                              "call_index": call_index}
    material = _jcs_plain_object(fields)
    if material is None:
        material = rfc8785.dumps(fields)
    return TOOL_IDEMPOTENCY_KEY_PREFIX + hashlib.sha256(material).hexdigest()[:40]


def arguments_sha256(arguments: Any) -> str:
    """Hex SHA-256 over the RFC 8785 JSON of tool arguments (``str()`` for what JSON lacks).

    Never raises (the tool's start cannot be journaled without it): what RFC 8785 cannot
    serialise even after the ``str()`` round trip (an integer beyond 2**53, NaN, a lone
    surrogate, a cycle) is hashed from its lenient JSON text, or from its ``repr``."""
    material = _jcs_plain_object(arguments)
    if material is not None:
        return hashlib.sha256(material).hexdigest()
    try:
        material = rfc8785.dumps(arguments)
    except (rfc8785.CanonicalizationError, ValueError, TypeError):
        try:
            material = rfc8785.dumps(json.loads(json.dumps(arguments, default=str)))
        except (rfc8785.CanonicalizationError, ValueError, TypeError, RecursionError):
            material = _lenient_json(arguments)
    return hashlib.sha256(material).hexdigest()


def _lenient_json(value: Any) -> bytes:
    try:
        return json.dumps(value, default=str, separators=(",", ":")).encode()
    except (ValueError, TypeError, RecursionError):
        return repr(value).encode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class InDoubtCall:
    """A ``tool_call_started`` with no ``tool_call_finished`` in a record that ended failed or
    uncertain: the tool may or may not have had its effect."""

    tool: str
    server: str | None
    task: str | None
    started_at: str | None
    idempotency_key: str

    def to_wire(self) -> dict[str, Any]:
        return {"tool": self.tool, "server": self.server, "task": self.task,
                "started_at": self.started_at, "idempotency_key": self.idempotency_key}

    def to_status(self) -> dict[str, Any]:
        return {"tool": self.tool, "server": self.server, "task": self.task,
                "startedAt": self.started_at, "idempotencyKey": self.idempotency_key}

    def describe(self) -> str:
        short = self.tool.split("/", 1)[1] if self.server and "/" in self.tool else self.tool
        where = f" (server {self.server})" if self.server else " (python)"
        task = f", task `{self.task}`" if self.task else ""
        return f"`{short}`{where}{task}, key {self.idempotency_key}"


@dataclass(frozen=True)
class EffectSummary:
    """What a record's effect events say: counts, token use and the tool calls in doubt."""

    tasks_completed: int = 0
    tasks_total: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    in_doubt: list[InDoubtCall] = field(default_factory=list)
    resumed_from: str | None = None
    """A resumed job: the predecessor whose journaled trajectory it reused."""
    tasks_reused: int = 0
    """Tasks not run again: their journaled outputs were reused (``task_reused``)."""
    tool_calls_reused: int = 0
    """Tool calls not executed again: answered from the journal (``tool_call_reused``)."""
    model_calls_reused: int = 0
    """Model calls not made again: answered from the journal (``model_call_reused``)."""
    batch_items_reused: int = 0

    def to_status(self) -> dict[str, Any]:
        """The CrewJob ``status.effects`` shape (at most MAX_STATUS_IN_DOUBT listed)."""
        return {"tasksCompleted": self.tasks_completed, "tasksTotal": self.tasks_total,
                "modelCalls": self.model_calls, "toolCalls": self.tool_calls,
                "inDoubt": [c.to_status() for c in self.in_doubt[:MAX_STATUS_IN_DOUBT]],
                "inDoubtCount": len(self.in_doubt), **self._reused_status()}

    def _reused_status(self) -> dict[str, Any]:
        """``reused`` (only for a resumed job): what came from the predecessor's journal; the
        other counts (modelCalls, toolCalls, tasksCompleted) are what ran live."""
        if self.resumed_from is None and not (self.tasks_reused or self.tool_calls_reused
                                              or self.model_calls_reused
                                              or self.batch_items_reused):
            return {}
        return {"reused": {"fromActionId": self.resumed_from, "tasks": self.tasks_reused,
                           "toolCalls": self.tool_calls_reused,
                           "modelCalls": self.model_calls_reused,
                           "batchItems": self.batch_items_reused}}

    def to_usage(self) -> dict[str, Any]:
        """The CrewJob ``status.usage`` shape."""
        return {"promptTokens": self.prompt_tokens, "completionTokens": self.completion_tokens,
                "modelCalls": self.model_calls, "toolCalls": self.tool_calls}

    def in_doubt_message(self) -> str:
        """One sentence naming the calls in doubt, or that none was in flight."""
        if not self.in_doubt:
            return "no tool call was in flight"
        parts = [call.describe() for call in self.in_doubt[:MAX_STATUS_IN_DOUBT]]
        more = len(self.in_doubt) - MAX_STATUS_IN_DOUBT
        tail = f"; and {more} more" if more > 0 else ""
        noun = "tool call" if len(self.in_doubt) == 1 else "tool calls"
        return f"{len(self.in_doubt)} {noun} in doubt: " + "; ".join(parts) + tail


def _as_int(value: object) -> int:
    return value if _is_int(value) else 0  # type: ignore[return-value]


def summarize_effects(events: Iterable[JobEvent | dict[str, Any]]) -> EffectSummary:
    """Summarize a record's events (from sequence 0, in order); pure.

    A call is in doubt when its ``tool_call_started`` has no ``tool_call_finished`` with the
    same ``idempotency_key`` and the record ended ``failed``/``cancelled`` or uncertain (or
    has no terminal event yet: the reader may hold a prefix of a crashed record). Part of the
    invariant "an in-doubt call is always listed" (stated, with its tests, at the operator's
    ``crewjob/effects.py::with_effects``).
    """
    tasks_completed = tasks_total = model_calls = tool_calls = 0
    prompt_tokens = completion_tokens = 0
    open_calls: dict[str, InDoubtCall] = {}
    ended_clean = False
    resumed_from: str | None = None
    reused = {EventName.TASK_REUSED: 0, EventName.TOOL_CALL_REUSED: 0,
              EventName.MODEL_CALL_REUSED: 0, EventName.BATCH_ITEM_REUSED: 0}
    for raw in events:
        event = raw if isinstance(raw, JobEvent) else JobEvent.from_wire(raw)
        data = event.data
        if event.event == EventName.TASK_STARTED:
            tasks_total = max(tasks_total, _as_int(data.get("total")))
        elif event.event == EventName.TASK_COMPLETED:
            tasks_completed += 1
            tasks_total = max(tasks_total, _as_int(data.get("total")))
        elif event.event == EventName.MODEL_CALL:
            model_calls += 1
            prompt_tokens += _as_int(data.get("prompt_tokens"))
            completion_tokens += _as_int(data.get("completion_tokens"))
        elif event.event == EventName.TOOL_CALL_STARTED:
            tool_calls += 1
            key = str(data.get("idempotency_key") or "")
            server = data.get("server")
            task = data.get("task")
            open_calls[key] = InDoubtCall(
                tool=str(data.get("tool") or ""), server=None if server is None else str(server),
                task=None if task is None else str(task),
                started_at=None if data.get("at") is None else str(data.get("at")),
                idempotency_key=key)
        elif event.event == EventName.TOOL_CALL_FINISHED:
            open_calls.pop(str(data.get("idempotency_key") or ""), None)
        elif event.event in reused:
            reused[EventName(event.event)] += 1
            if event.event == EventName.TASK_REUSED:
                tasks_total = max(tasks_total, _as_int(data.get("total")))
            if isinstance(data.get("from_action"), str):
                resumed_from = data["from_action"]
        elif event.event == EventName.STARTED and isinstance(data.get("resume_from"), str):
            resumed_from = data["resume_from"]
        elif event.event in TERMINAL_EVENTS:
            ended_clean = (event.event == EventName.COMPLETED
                           and not data.get("uncertain_outcome"))
    in_doubt = [] if ended_clean else list(open_calls.values())
    return EffectSummary(tasks_completed=tasks_completed, tasks_total=tasks_total,
                         model_calls=model_calls, tool_calls=tool_calls,
                         prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         in_doubt=in_doubt, resumed_from=resumed_from,
                         tasks_reused=reused[EventName.TASK_REUSED],
                         tool_calls_reused=reused[EventName.TOOL_CALL_REUSED],
                         model_calls_reused=reused[EventName.MODEL_CALL_REUSED],
                         batch_items_reused=reused[EventName.BATCH_ITEM_REUSED])
