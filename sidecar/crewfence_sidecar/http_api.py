"""The sidecar's HTTP API (aiohttp): routes, headers and status codes of the wire contract."""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final
from urllib.parse import unquote

import yaml
from aiohttp import web

from crewfence_sidecar.contract import (
    ARCHIVE_CONFIRMATION_HEADER,
    BLOCKING_CANCELLED_DETAIL,
    BLOCKING_FAILED_DETAIL,
    BULK_ARCHIVE_PATH,
    DRAIN_PATH,
    DRAINING_CODE,
    DRAINING_RETRY_AFTER_SECONDS,
    EXACT_REPEAT_HEADER,
    EXPECTED_JOURNAL_ID_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    JOURNAL_ID_HEADER,
    JOURNAL_MISMATCH_CODE,
    MAX_BODY_BYTES,
    PREFER_ASYNC,
    PREFER_HEADER,
    RECORDED_SUFFIX,
    SCHEMA_VERSION,
    TOMBSTONES_PATH,
    BulkArchiveResult,
    ContractError,
    JobRecord,
    Operation,
    StartRequest,
    Status,
    error_body,
    events_page,
    health_operations,
    job_path,
    parse_bulk_archive_request,
    parse_cancel_request,
    parse_drain_request,
    parse_recorded_request,
    parse_resolution_request,
    parse_start_request,
    parse_successor_request,
    parse_tombstone_import,
    parse_tombstone_page_query,
    tombstone_page,
)
from crewfence_sidecar.credentials import TokenSource, matches
from crewfence_sidecar.runtime import Admission, Draining, Gone, JournalUnavailable, Runtime
from crewfence_sidecar.tls import client_certificate_middleware

log = logging.getLogger("crewfence.sidecar.http")

MAX_PAGE: Final = 1000
SSE_HEARTBEAT_S: Final = 15.0
PUBLIC_PATHS: Final = frozenset({"/health", "/metrics", "/openapi.json", "/openapi.yaml"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ApiSettings:
    token: str | None
    crew_ids: tuple[str, ...]
    operations: tuple[str, ...]
    durable_journal: bool
    max_retained_runs: int
    max_state_bytes: int
    tokens: TokenSource | None = None
    """Accepted bearer tokens (a token file re-read on change); default: ``token`` alone."""
    client_certificate_required: bool = False
    """HTTPS with client certificates: every route but /health and /metrics needs one."""
    pod_uid: str | None = None
    """This pod's uid, named in /health (None outside a pod: not named)."""


RUNTIME_KEY: Final = web.AppKey("runtime", Runtime)
SETTINGS_KEY: Final = web.AppKey("settings", ApiSettings)


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=json.dumps(body, ensure_ascii=False),
                        content_type="application/json", headers=headers)


def _error(status: int, code: str, message: str, **extra: Any) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="crewfence"'} if status == 401 else None
    return _json(status, error_body(code, message, **extra), headers)


# --- middlewares ---------------------------------------------------------------------------
def connections_middleware(
    count: Callable[[], None],
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Counts each client connection once, at its first request (``connections_total``)."""
    seen: weakref.WeakSet[Any] = weakref.WeakSet()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        if transport is not None and transport not in seen:
            seen.add(transport)
            count()
        return await handler(request)

    return middleware


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[RUNTIME_KEY].metrics
    try:
        return await handler(request)
    except ContractError as err:
        metrics.rejection(err.code)
        return _error(err.status, err.code, err.message, **err.extra)
    except web.HTTPRequestEntityTooLarge:
        metrics.rejection("body_too_large")
        return _error(413, "body_too_large", f"the body is over {MAX_BODY_BYTES} bytes")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = (exc.reason or "http_error").lower().replace(" ", "_")
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return _json(exc.status, error_body(code, exc.reason or "error"), headers)


def auth_middleware(
    token: str | None, tokens: TokenSource | None = None,
) -> Callable[..., Awaitable[web.StreamResponse]]:
    if tokens is None and token is not None:
        tokens = TokenSource.from_token(token)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if tokens is None or request.path in PUBLIC_PATHS:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, credential = header.partition(" ")
        presented = credential.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not matches(presented, tokens.current()):
            request.app[RUNTIME_KEY].metrics.rejection("unauthenticated")
            return _error(401, "unauthenticated", "a valid bearer token is required")
        return await handler(request)

    return middleware


# --- helpers -------------------------------------------------------------------------------
def _runtime(request: web.Request) -> Runtime:
    return request.app[RUNTIME_KEY]


async def _read_json(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES,
                                            actual_size=request.content_length)
    raw = await request.read()
    if not raw:
        raise ContractError(400, "invalid_json", "the body must be a JSON object")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ContractError(400, "invalid_json", "the body is not valid JSON") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _wants_async(request: web.Request) -> bool:
    prefer = request.headers.getall(PREFER_HEADER, [])
    return any(PREFER_ASYNC in [p.strip().lower() for p in v.split(",")] for v in prefer)


def _record_headers(request: web.Request, admission: Admission | None = None,
                    record: JobRecord | None = None) -> dict[str, str]:
    rt = _runtime(request)
    headers = {JOURNAL_ID_HEADER: rt.journal.journal_id}
    rec = record or (admission.record if admission else None)
    if rec is not None:
        headers["Location"] = job_path(rec.action_id)
    if admission is not None and not admission.created:
        headers[EXACT_REPEAT_HEADER] = "true"
    return headers


def _gone(g: Gone) -> web.Response:
    """410 with the tombstone; its message names the findings kept with it (a successor route
    on an archived predecessor says which resolution and claim the journal holds)."""
    message = "this action was archived; it is never run again"
    kept = g.tombstone.findings_summary()
    if kept:
        message = f"{message}; {kept}"
    return _json(410, {**error_body("archived", message), "tombstone": g.tombstone.to_wire()})


def _draining() -> web.Response:
    message = "the sidecar is draining: it admits no new jobs; known jobs still answer"
    return _json(503, {"detail": message, "code": DRAINING_CODE,
                       **error_body(DRAINING_CODE, message)},
                 {"Retry-After": str(DRAINING_RETRY_AFTER_SECONDS)})


def _unavailable(exc: JournalUnavailable) -> web.Response:
    code = "journal_full" if exc.full else "journal_unavailable"
    return _error(507, code, str(exc))


def _journal_mismatch(request: web.Request) -> web.Response | None:
    """412 when the admission expects another journal than this one, else None.

    Invariant (an action is admitted only into the journal it was assigned to): the client
    names the journal it chose (``X-Crewfence-Expected-Journal-Id``); an address that now
    reaches another journal (a replaced pod on a renamed or re-created claim, a reused pod IP)
    admits nothing, so one action never runs in a journal its client is not watching.
    """
    expected = request.headers.get(EXPECTED_JOURNAL_ID_HEADER)
    journal_id = _runtime(request).journal.journal_id
    if expected is None or expected == journal_id:
        return None
    message = (f"this sidecar serves journal {journal_id}, not {expected[:64]}; nothing was "
               "admitted")
    return _json(412, error_body(JOURNAL_MISMATCH_CODE, message, journal_id=journal_id),
                 {JOURNAL_ID_HEADER: journal_id})


async def _admit(request: web.Request) -> tuple[Admission, StartRequest] | web.Response:
    mismatch = _journal_mismatch(request)
    if mismatch is not None:
        return mismatch
    body = await _read_json(request)
    req = parse_start_request(body)
    try:
        admission = await _runtime(request).admit(
            req, request.headers.get(IDEMPOTENCY_KEY_HEADER))
    except Gone as g:
        return _gone(g)
    except Draining:
        return _draining()
    except JournalUnavailable as exc:
        return _unavailable(exc)
    return admission, req


# --- routes --------------------------------------------------------------------------------
async def start_job(request: web.Request) -> web.StreamResponse:
    admitted = await _admit(request)
    if isinstance(admitted, web.Response):
        return admitted
    admission, req = admitted
    record = admission.record
    headers = _record_headers(request, admission)
    if _wants_async(request):
        headers["Preference-Applied"] = PREFER_ASYNC
        return _json(200 if record.terminal else 202, record.to_wire(), headers)
    # The blocking route waits with the request's own timeout, separately from the job's.
    rt = _runtime(request)
    with rt.answering(record.action_id):  # written before the job's worker goes on
        done = await rt.wait_terminal(record.action_id, req.effective_timeout_ms / 1000)
        current = rt.journal.get(record.action_id) or record
        answer = _blocking_answer(current, done=done, headers=headers)
        await answer.prepare(request)
        await answer.write_eof()
    return answer


def _blocking_answer(record: JobRecord, *, done: bool, headers: dict[str, str]) -> web.Response:
    """The AIP blocking answer: 200 with the output itself only for ``completed``.

    Invariant (never report a cancelled or failed job as completed): a 2xx here means the
    record completed; cancelled -> 409, failed -> 502, wait expired -> 504. Each non-2xx body
    carries the reference's ``detail`` plus crewfence's ``error`` and ``record``.
    """
    if not done:
        message = "the blocking wait expired; the job keeps running and keeps its record"
        return _json(504, {"detail": message, **error_body("wait_expired", message),
                           "record": record.to_wire()}, headers)
    if record.status is Status.COMPLETED:
        return _json(200, record.output, headers)
    if record.status is Status.CANCELLED:
        status, detail, code = 409, BLOCKING_CANCELLED_DETAIL, "run_cancelled"
    else:
        status, detail, code = 502, BLOCKING_FAILED_DETAIL, "run_failed"
    return _json(status, {"detail": detail, **error_body(code, detail),
                          "record": record.to_wire()}, headers)


async def stream_job(request: web.Request) -> web.StreamResponse:
    admitted = await _admit(request)
    if isinstance(admitted, web.Response):
        return admitted
    admission, _req = admitted
    return await _sse(request, admission.record.action_id, 0,
                      _record_headers(request, admission))


async def get_job(request: web.Request) -> web.StreamResponse:
    action_id = request.match_info["action_id"]
    rt = _runtime(request)
    record = rt.journal.get(action_id)
    if record is None:
        stone = rt.journal.tombstone(action_id)
        if stone is not None:
            return _gone(Gone(stone))
        return _error(404, "unknown_job", "no such job")
    return _json(200, record.to_wire(), _record_headers(request, record=record))


def _cursor(request: web.Request) -> tuple[int, int]:
    raw = request.query.get("cursor")
    last_id = request.headers.get("Last-Event-ID")
    try:
        if raw is not None:
            cursor = int(raw)
        elif last_id is not None and last_id.strip():
            cursor = int(last_id) + 1
        else:
            cursor = 0
        limit = int(request.query.get("limit", MAX_PAGE))
    except ValueError:
        raise ContractError(400, "invalid_cursor", "cursor and limit must be integers") from None
    if cursor < 0 or not 1 <= limit <= MAX_PAGE:
        raise ContractError(400, "invalid_cursor", f"cursor >= 0 and limit 1..{MAX_PAGE}")
    return cursor, limit


async def job_events(request: web.Request) -> web.StreamResponse:
    action_id = request.match_info["action_id"]
    rt = _runtime(request)
    cursor, limit = _cursor(request)
    record = rt.journal.get(action_id)
    if record is None:
        stone = rt.journal.tombstone(action_id)
        if stone is not None:
            return _gone(Gone(stone))
        return _error(404, "unknown_job", "no such job")
    if cursor > record.event_count:
        return _json(416, error_body("cursor_out_of_range",
                                     f"cursor {cursor} is beyond the end ({record.event_count})",
                                     event_count=record.event_count),
                     {"Content-Range": f"events */{record.event_count}"})
    if "text/event-stream" in request.headers.get("Accept", ""):
        return await _sse(request, action_id, cursor, _record_headers(request, record=record))
    events = rt.events(action_id, cursor, limit)
    return _json(200, events_page(action_id, cursor, record.status, events),
                 _record_headers(request, record=record))


async def _sse(request: web.Request, action_id: str, cursor: int,
               headers: dict[str, str]) -> web.StreamResponse:
    """Follow the action's events as SSE until its terminal event has been sent."""
    rt = _runtime(request)
    resp = web.StreamResponse(status=200, headers={
        **headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    try:
        while True:
            record = rt.journal.get(action_id)
            if record is None:  # archived while following
                break
            events = rt.events(action_id, cursor, MAX_PAGE)
            for ev in events:
                payload = json.dumps(ev.to_wire(), ensure_ascii=False)
                await resp.write(f"id: {ev.sequence}\nevent: {ev.event}\ndata: {payload}\n\n"
                                 .encode())
                cursor = ev.sequence + 1
            if events:
                continue
            if record.terminal and cursor >= record.event_count:
                break
            before = record.event_count
            await rt.wait_change(action_id, SSE_HEARTBEAT_S)
            current = rt.journal.get(action_id)
            if current is not None and current.event_count == before and not current.terminal:
                await resp.write(b": keep-alive\n\n")
        await resp.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        # The reader detached; the job is NOT cancelled by that.
        if asyncio.current_task() and asyncio.current_task().cancelling():  # type: ignore[union-attr]
            raise
    return resp


async def cancel_job(request: web.Request) -> web.StreamResponse:
    action_id = request.match_info["action_id"]
    body = await _read_json(request)
    req = parse_cancel_request(body, action_id)
    try:
        record = await _runtime(request).cancel(req.crew_id, req.action_id, req.reason)
    except Gone as g:
        return _gone(g)
    return _json(200, record.to_wire(), _record_headers(request, record=record))


async def mark_recorded(request: web.Request) -> web.StreamResponse:
    """``POST /jobs/{id}/recorded``: the client wrote this finished job's outcome where it
    keeps it; recorded-only retention may archive the record from now on."""
    crew_id, action_id = parse_recorded_request(await _read_json(request),
                                                request.match_info["action_id"])
    try:
        record, at = _runtime(request).mark_recorded(crew_id, action_id)
    except Gone as g:
        return _gone(g)
    except JournalUnavailable as exc:
        return _unavailable(exc)
    return _json(200, {"action_id": action_id, "recorded_at": at},
                 _record_headers(request, record=record))


async def resolve_job(request: web.Request) -> web.StreamResponse:
    """Journal a person's resolution of a finished job: 201 when journaled now, 200 when an
    identical resolution was journaled before (idempotent), 409 for a different one; the same
    for an archived job, from the finding kept with its tombstone."""
    action_id = request.match_info["action_id"]
    req = parse_resolution_request(await _read_json(request), action_id)
    rt = _runtime(request)
    try:
        event, created = rt.resolve(req)  # an archived action answers from its tombstone
    except JournalUnavailable as exc:
        return _unavailable(exc)
    record = rt.journal.get(action_id)
    body: dict[str, Any] = {"action_id": action_id, "created": created,
                            "event": event.to_wire()}
    successor = rt.journal.successor(action_id)
    if successor is not None:
        body["successor"] = successor.to_wire()
    return _json(201 if created else 200, body, _record_headers(request, record=record))


async def claim_successor(request: web.Request) -> web.StreamResponse:
    """Claim the one successor slot of an uncertain action (crewfence extension): 201 when
    journaled now, 200 for an exact repeat, 409 when the journal refuses (its code says why:
    ``unresolved``, ``happened``, ``already_superseded``, ``not_uncertain``, ``job_running``)."""
    action_id = request.match_info["action_id"]
    req = parse_successor_request(await _read_json(request), action_id)
    rt = _runtime(request)
    try:
        event, resolution, created = rt.claim_successor(req)
    except Gone as g:
        return _gone(g)
    except JournalUnavailable as exc:
        return _unavailable(exc)
    record = rt.journal.get(action_id)
    return _json(201 if created else 200,
                 {"action_id": action_id, "created": created, "event": event.to_wire(),
                  "resolution": resolution.to_wire()},
                 _record_headers(request, record=record))


async def archive_job(request: web.Request) -> web.StreamResponse:
    action_id = request.match_info["action_id"]
    confirmation = request.headers.get(ARCHIVE_CONFIRMATION_HEADER)
    if confirmation is None or not confirmation.strip():
        return _error(428, "archive_confirmation_required",
                      f"header {ARCHIVE_CONFIRMATION_HEADER} must name the action id")
    if confirmation != action_id and unquote(confirmation) != action_id:
        return _error(400, "archive_confirmation_mismatch",
                      f"{ARCHIVE_CONFIRMATION_HEADER} does not name this action id")
    try:
        stone = _runtime(request).archive(action_id)
    except Gone as g:
        return _gone(g)
    except JournalUnavailable as exc:
        return _unavailable(exc)
    return _json(200, stone.to_wire())


async def set_draining(request: web.Request) -> web.StreamResponse:
    """``POST /admin/drain``: switch draining on or off at run time (journaled)."""
    draining = parse_drain_request(await _read_json(request))
    try:
        state = _runtime(request).set_draining(draining)
    except JournalUnavailable as exc:
        return _unavailable(exc)
    return _json(200, state.to_wire(), _record_headers(request))


async def archive_older_than(request: web.Request) -> web.StreamResponse:
    """``POST /admin/archive``: archive every terminal record older than N seconds."""
    body = await _read_json(request)
    seconds = parse_bulk_archive_request(body, request.headers.get(ARCHIVE_CONFIRMATION_HEADER))
    recorded_only = bool(body.get("recorded_only", False))  # checked by the parse
    try:
        stones = _runtime(request).archive_older_than(seconds, recorded_only=recorded_only)
    except JournalUnavailable as exc:
        return _unavailable(exc)
    result = BulkArchiveResult(archived=tuple(s.action_id for s in stones))
    return _json(200, result.to_wire(), _record_headers(request))


async def list_tombstones(request: web.Request) -> web.StreamResponse:
    """``GET /admin/tombstones?after=&limit=``: this journal's tombstones, a page at a time."""
    after, limit = parse_tombstone_page_query(request.query.get("after"),
                                              request.query.get("limit"))
    stones = _runtime(request).journal.tombstone_page(after, limit)
    return _json(200, tombstone_page(stones, limit), _record_headers(request))


async def import_tombstones(request: web.Request) -> web.StreamResponse:
    """``POST /admin/tombstones``: keep a retiring replica's tombstones here (durably)."""
    stones = parse_tombstone_import(await _read_json(request))
    try:
        result = _runtime(request).import_tombstones(stones)
    except JournalUnavailable as exc:
        return _unavailable(exc)
    return _json(200, result.to_wire(), _record_headers(request))


async def health(request: web.Request) -> web.StreamResponse:
    rt = _runtime(request)
    s = request.app[SETTINGS_KEY]
    return _json(200, {
        "status": "ready",
        "schema_version": SCHEMA_VERSION,
        "crews": list(s.crew_ids),
        "operations": list(s.operations),  # startable + control operations, sorted
        "durable_journal": s.durable_journal,
        "journal_id": rt.journal.journal_id,
        "active_runs": rt.active_runs,
        "retained_runs": len(rt.journal.records),
        "tombstones": rt.journal.tombstone_count(),
        "max_retained_runs": s.max_retained_runs,
        "journal_bytes": rt.journal.state_bytes(),
        "max_state_bytes": s.max_state_bytes,
        "journal_over_bounds": [b.to_wire() for b in rt.journal.over_bounds()],
        "authenticated": s.token is not None,
        **({"pod_uid": s.pod_uid} if s.pod_uid else {}),
        **rt.drain_state().to_wire(),
        **_model_credentials(rt),
    }, {JOURNAL_ID_HEADER: rt.journal.journal_id})


def _model_credentials(rt: Runtime) -> dict[str, Any]:
    """``model_credentials`` (per declarative crew: model, hosted, credentials
    present|missing|not_needed) and ``model_credentials_missing`` (crew ids), when the crews
    come from the worker template; the key itself never appears."""
    report = getattr(rt.crews, "model_credentials", None)
    if report is None:
        return {}
    entries = report()
    return {"model_credentials": entries,
            "model_credentials_missing": sorted(c for c, e in entries.items()
                                                if e.get("credentials") == "missing")}


async def metrics(request: web.Request) -> web.StreamResponse:
    rt = _runtime(request)
    return web.Response(body=rt.metrics.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def openapi_document() -> dict[str, Any]:
    text = resources.files("crewfence_sidecar").joinpath("openapi.yaml").read_text("utf-8")
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


async def openapi_json(request: web.Request) -> web.StreamResponse:
    return _json(200, openapi_document())


async def openapi_yaml(request: web.Request) -> web.StreamResponse:
    text = resources.files("crewfence_sidecar").joinpath("openapi.yaml").read_text("utf-8")
    return web.Response(text=text, content_type="application/yaml")


def _certificate_middlewares(runtime: Runtime, settings: ApiSettings) -> list[Any]:
    if not settings.client_certificate_required:
        return []
    return [client_certificate_middleware(runtime.metrics.rejection)]


def build_app(runtime: Runtime, settings: ApiSettings) -> web.Application:
    app = web.Application(
        client_max_size=MAX_BODY_BYTES,
        middlewares=[connections_middleware(runtime.metrics.connections.inc), errors_middleware,
                     *_certificate_middlewares(runtime, settings),
                     auth_middleware(settings.token, settings.tokens)],
    )
    app[RUNTIME_KEY] = runtime
    app[SETTINGS_KEY] = settings
    r = app.router
    r.add_get("/health", health)
    r.add_get("/metrics", metrics)
    r.add_get("/openapi.json", openapi_json)
    r.add_get("/openapi.yaml", openapi_yaml)
    r.add_post("/jobs", start_job)
    r.add_post("/jobs/stream", stream_job)
    r.add_get("/jobs/{action_id}", get_job)
    r.add_delete("/jobs/{action_id}", archive_job)
    r.add_get("/jobs/{action_id}/events", job_events)
    r.add_post("/jobs/{action_id}/cancel", cancel_job)
    r.add_post("/jobs/{action_id}/resolution", resolve_job)
    r.add_post("/jobs/{action_id}" + RECORDED_SUFFIX, mark_recorded)
    r.add_post("/jobs/{action_id}/successor", claim_successor)
    r.add_post(DRAIN_PATH, set_draining)
    r.add_post(BULK_ARCHIVE_PATH, archive_older_than)
    r.add_get(TOMBSTONES_PATH, list_tombstones)
    r.add_post(TOMBSTONES_PATH, import_tombstones)
    return app


def default_operations(allowed: frozenset[Operation]) -> tuple[str, ...]:
    """What ``/health`` lists: enabled startable operations plus cancel/events/status, sorted."""
    return tuple(health_operations(allowed))
