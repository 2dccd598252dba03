"""aiohttp client for one crewfence sidecar, with the reference's failure taxonomy.

Every failure becomes a :class:`SidecarFailure` carrying the connector table's category and
``uncertain`` flag. "Invocation" calls (admission, cancel) may have side effects, so a transport
failure, a 429/5xx or an oversized answer there leaves the outcome uncertain; the same failure on a
read (health, record, events) only means "could not look".

The bearer token never appears in a message, a log line or a repr.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import aiohttp
from crewfence_sidecar import contract
from crewfence_sidecar.contract import FailureCategory, JobEvent, JobRecord, StartRequest
from yarl import URL

from crewfence_operator import metrics

MAX_HEALTH_BYTES: Final = 256 * 1024
MAX_RECORD_BYTES: Final = 16 * 1024 * 1024
MAX_PAGE_BYTES: Final = 16 * 1024 * 1024
MAX_SSE_EVENT_BYTES: Final = 4 * 1024 * 1024
MAX_MESSAGE_CHARS: Final = 512
T = TypeVar("T")


@dataclass(eq=False)
class SidecarFailure(Exception):
    """A failed sidecar call, classified per the reference's connector failure table."""

    category: FailureCategory
    code: str
    message: str
    http_status: int | None = None
    uncertain: bool = False
    """True when the call may have had an effect nobody can confirm."""
    retryable: bool = False
    """Always False: the connector never retries on its own (reconcile first)."""

    def __str__(self) -> str:
        where = f"HTTP {self.http_status}" if self.http_status is not None else "no HTTP answer"
        return f"{self.category.value}/{self.code} ({where}): {self.message}"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def classify_http_failure(status: int, body: object, *, invocation: bool) -> SidecarFailure:
    """Table rows "401/403 → Auth", "429/5xx → Temporary", "other → Permanent"."""
    category = contract.classify_http_status(status)
    code, message = f"http_{status}", f"sidecar answered HTTP {status}"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = str(err.get("code") or code)[:128]
        message = str(err.get("message") or message)
    uncertain = invocation and category is FailureCategory.TEMPORARY
    return SidecarFailure(category, code, _clip(message), status, uncertain)


def classify_transport_failure(exc: BaseException, *, invocation: bool) -> SidecarFailure:
    """Table row "HTTP transport failure → Transport": uncertain when the request may have left.

    A refused connection proves nothing was sent; any later failure (reset, timeout while
    waiting for the answer) may come after the sidecar acted.
    """
    not_sent = isinstance(exc, aiohttp.ClientConnectorError)
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return SidecarFailure(FailureCategory.TRANSPORT, "transport_error", _clip(message), None,
                          uncertain=invocation and not not_sent)


def response_too_large(limit: int, *, invocation: bool) -> SidecarFailure:
    """Table row "Response limit exceeded → Connector"."""
    return SidecarFailure(FailureCategory.CONNECTOR, "response_too_large",
                          f"sidecar answer exceeded {limit} bytes", None, uncertain=invocation)


def invalid_stream(message: str) -> SidecarFailure:
    """Table row "Invalid or incomplete stream → Connector, uncertain"."""
    return SidecarFailure(FailureCategory.CONNECTOR, "invalid_stream", _clip(message), None,
                          uncertain=True)


def _from_object(payload: object, parse: Callable[[dict[str, Any]], T], *, what: str,
                 status: int, uncertain: bool, code: str = "invalid_response") -> T:
    """``parse`` over an answer that must be a JSON object. Invariant (malformed answers are
    connector failures): anything unreadable raises :class:`SidecarFailure`, never a bare
    KeyError/TypeError/ValueError into the caller."""
    try:
        if not isinstance(payload, dict):
            raise TypeError("not an object")
        return parse(payload)
    except (KeyError, TypeError, ValueError) as exc:
        raise SidecarFailure(FailureCategory.CONNECTOR, code,
                             f"{what} is malformed: {type(exc).__name__}", status,
                             uncertain=uncertain) from None


def cancel_unconfirmed(cause: SidecarFailure) -> SidecarFailure:
    """Table row "Cancellation not confirmed → Temporary, uncertain"."""
    return SidecarFailure(FailureCategory.TEMPORARY, "cancelled_unconfirmed",
                          _clip(f"the sidecar did not confirm the cancel: {cause.message}"),
                          cause.http_status, uncertain=True)


@dataclass(frozen=True)
class Endpoint:
    """Where one replica's sidecar listens and how to authenticate to it."""

    address: str
    """``host:port`` (IPv6 hosts in brackets)."""
    token: str = field(repr=False)
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    """HTTPS with this context (the Crew's CA and the operator's client certificate)."""
    server_name: str | None = None
    """The name the serving certificate must carry (the replica's DNS name), checked on every
    call; the connection itself goes to ``address``."""

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    def url(self, path: str, query: dict[str, str] | None = None) -> URL:
        host, _, port = self.address.rpartition(":")
        host = host.strip("[]")
        return URL.build(scheme=self.scheme, host=host, port=int(port), path=path,
                         query=query, encoded=False)

    def job_url(self, action_id: str, suffix: str = "") -> URL:
        # The action id defaults to <namespace>/<name>: its "/" must stay one path segment.
        path = contract.job_path(action_id, suffix)
        host, _, port = self.address.rpartition(":")
        return URL.build(scheme=self.scheme, host=host.strip("[]"), port=int(port), path=path,
                         encoded=True)


@dataclass(frozen=True)
class Timeouts:
    connect: float = 3.0
    read: float = 15.0
    follow_idle: float = 30.0
    """A following stream quiet this long is reopened (a restart may have cut it silently)."""


@dataclass(frozen=True)
class Lookup:
    """What ``GET /jobs/{id}`` told: a record, a tombstone (archived), or nothing."""

    record: JobRecord | None = None
    tombstone: dict[str, Any] | None = None
    journal_id: str | None = None

    @property
    def known(self) -> bool:
        return self.record is not None or self.tombstone is not None


@dataclass(frozen=True)
class Admission:
    http_status: int
    record: JobRecord
    journal_id: str | None
    seconds: float


@dataclass(frozen=True)
class SidecarHealth:
    """The fields of ``GET /health`` the operator decides on (the raw answer is kept too)."""

    journal_id: str | None
    draining: bool
    unarchived_records: int
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class EventsPage:
    cursor: int
    next_cursor: int
    status: contract.Status
    events: list[JobEvent]


@dataclass(frozen=True)
class ResolutionAnswer:
    """What the journal holds as the action's resolution after a resolution write."""

    event: JobEvent
    """The journaled ``resolution`` event (this finding, or the different one on conflict)."""
    conflict: bool = False
    """True when the journal holds a different finding (written once: it stays)."""
    successor: JobEvent | None = None
    """The journaled ``successor`` claim, when there is one."""


@dataclass(frozen=True)
class SuccessorAnswer:
    claim: JobEvent
    resolution: JobEvent
    created: bool


class SidecarClient:
    """One sidecar. The caller owns the session (one per operator event loop)."""

    def __init__(self, session: aiohttp.ClientSession, endpoint: Endpoint,
                 timeouts: Timeouts | None = None) -> None:
        self._session = session
        self.endpoint = endpoint
        self.timeouts = timeouts or Timeouts()

    # --- plumbing ---------------------------------------------------------------------------
    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.endpoint.token}",
                   "Accept": "application/json"}
        headers.update(extra or {})
        return headers

    def _tls(self) -> dict[str, Any]:
        """aiohttp arguments for HTTPS: the context, and the replica name to verify."""
        if self.endpoint.ssl_context is None:
            return {}
        return {"ssl": self.endpoint.ssl_context, "server_hostname": self.endpoint.server_name}

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=None, connect=self.timeouts.connect,
                                     sock_read=self.timeouts.read)

    async def _read_json(self, resp: aiohttp.ClientResponse, limit: int,
                         *, invocation: bool) -> object:
        declared = resp.content_length
        if declared is not None and declared > limit:
            raise response_too_large(limit, invocation=invocation)
        data = bytearray()
        async for chunk in resp.content.iter_chunked(64 * 1024):
            data.extend(chunk)
            if len(data) > limit:
                raise response_too_large(limit, invocation=invocation)
        if not data:
            return None
        try:
            return json.loads(bytes(data))
        except ValueError:
            if resp.status >= 400:
                return None  # a proxy's HTML error page: the status code says enough
            raise SidecarFailure(FailureCategory.CONNECTOR, "invalid_response",
                                 "sidecar answered with invalid JSON", resp.status,
                                 uncertain=invocation) from None

    async def _call(self, method: str, url: URL, *, limit: int, invocation: bool,
                    body: object = None, headers: dict[str, str] | None = None,
                    ok: tuple[int, ...] = (200,)) -> tuple[int, object, str | None]:
        metrics.observe_sidecar_request(route_of(method, url))
        try:
            async with self._session.request(
                method, url, json=body, headers=self._headers(headers),
                timeout=self._timeout(), allow_redirects=False, **self._tls(),
            ) as resp:
                payload = await self._read_json(resp, limit, invocation=invocation)
                journal_id = resp.headers.get(contract.JOURNAL_ID_HEADER)
                if resp.status not in ok:
                    raise classify_http_failure(resp.status, payload, invocation=invocation)
                return resp.status, payload, journal_id
        except SidecarFailure:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise classify_transport_failure(exc, invocation=invocation) from None

    @staticmethod
    def _record(payload: object, status: int, *, invocation: bool) -> JobRecord:
        return _from_object(payload, JobRecord.from_wire, what="sidecar record", status=status,
                            code="invalid_record", uncertain=invocation)

    # --- routes -----------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        _, payload, _ = await self._call("GET", self.endpoint.url("/health"),
                                         limit=MAX_HEALTH_BYTES, invocation=False)
        if not isinstance(payload, dict):
            raise SidecarFailure(FailureCategory.CONNECTOR, "invalid_response",
                                 "health answer is not an object", 200)
        return payload

    async def health_status(self) -> SidecarHealth:
        """``GET /health`` as :class:`SidecarHealth` (draining and unarchived record count).

        A sidecar from before draining existed lacks the two fields: it cannot drain, so it
        reads as not draining with an unknown (0) count.
        """
        payload = await self.health()
        try:
            drain = (contract.DrainState.from_wire(payload)
                     if "draining" in payload else contract.DrainState(False, 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise SidecarFailure(FailureCategory.CONNECTOR, "invalid_response",
                                 f"health answer is malformed: {type(exc).__name__}",
                                 200) from None
        journal_id = payload.get("journal_id")
        return SidecarHealth(journal_id=str(journal_id) if journal_id else None,
                             draining=drain.draining,
                             unarchived_records=drain.unarchived_records, raw=payload)

    async def set_draining(self, draining: bool) -> contract.DrainState:
        """``POST /admin/drain``: switch draining on or off (journaled by the sidecar)."""
        status, payload, _ = await self._call(
            "POST", self.endpoint.url(contract.DRAIN_PATH), limit=MAX_HEALTH_BYTES,
            invocation=True, body={"draining": bool(draining)})
        return _from_object(payload, contract.DrainState.from_wire, what="drain answer",
                            status=status, uncertain=True)

    async def archive_older_than(self, seconds: int, *, recorded_only: bool = False,
                                 ) -> contract.BulkArchiveResult:
        """``POST /admin/archive``: archive every terminal record older than ``seconds``
        (``recorded_only``: only those whose outcome a client marked recorded)."""
        headers = {contract.ARCHIVE_CONFIRMATION_HEADER:
                   contract.bulk_archive_confirmation(seconds)}
        body: dict[str, Any] = {"older_than_seconds": seconds}
        if recorded_only:
            body["recorded_only"] = True
        status, payload, _ = await self._call(
            "POST", self.endpoint.url(contract.BULK_ARCHIVE_PATH), limit=MAX_RECORD_BYTES,
            invocation=True, body=body, headers=headers)
        return _from_object(payload, contract.BulkArchiveResult.from_wire,
                            what="archive answer", status=status, uncertain=True)

    async def tombstone_page(self, after: str = "",
                             limit: int = contract.MAX_TOMBSTONES_PER_PAGE,
                             ) -> tuple[list[contract.Tombstone], str | None]:
        """``GET /admin/tombstones``: one page of tombstones and where the next one starts."""
        url = self.endpoint.url(contract.TOMBSTONES_PATH,
                                {"after": after, "limit": str(limit)})
        status, payload, _ = await self._call("GET", url, limit=MAX_RECORD_BYTES,
                                              invocation=False)

        def parse(raw: dict[str, Any]) -> tuple[list[contract.Tombstone], str | None]:
            try:
                stones = [contract.Tombstone.from_wire(t) for t in raw["tombstones"]]
            except contract.ContractError as exc:
                raise ValueError(exc.message) from None
            following = raw.get("next_after")
            if following is not None and not isinstance(following, str):
                raise ValueError("next_after must be a string or null")
            return stones, following

        return _from_object(payload, parse, what="tombstone page", status=status,
                            uncertain=False)

    async def import_tombstones(self, stones: list[contract.Tombstone],
                                ) -> contract.TombstoneImportResult:
        """``POST /admin/tombstones``: keep these tombstones in this replica's journal."""
        status, payload, _ = await self._call(
            "POST", self.endpoint.url(contract.TOMBSTONES_PATH), limit=MAX_RECORD_BYTES,
            invocation=True, body={"tombstones": [t.to_wire() for t in stones]})
        return _from_object(payload, contract.TombstoneImportResult.from_wire,
                            what="tombstone import answer", status=status, uncertain=True)

    async def get_job(self, action_id: str) -> Lookup:
        status, payload, journal_id = await self._call(
            "GET", self.endpoint.job_url(action_id), limit=MAX_RECORD_BYTES,
            invocation=False, ok=(200, 404, 410))
        if status == 404:
            return Lookup(journal_id=journal_id)
        if status == 410:
            tomb = payload.get("tombstone") if isinstance(payload, dict) else None
            return Lookup(tombstone=dict(tomb) if isinstance(tomb, dict) else {"archived": True},
                          journal_id=journal_id)
        return Lookup(record=self._record(payload, status, invocation=False),
                      journal_id=journal_id)

    async def start(self, request: StartRequest, idempotency_key: str,
                    expected_journal_id: str | None = None) -> Admission:
        """``POST /jobs`` with ``Prefer: respond-async``: 202 (admitted) or 200 (exact repeat).

        ``expected_journal_id``: the journal the action is assigned to; a sidecar serving
        another one admits nothing (412 ``journal_mismatch``)."""
        began = time.monotonic()
        headers = {contract.IDEMPOTENCY_KEY_HEADER: idempotency_key,
                   contract.PREFER_HEADER: contract.PREFER_ASYNC}
        if expected_journal_id:
            headers[contract.EXPECTED_JOURNAL_ID_HEADER] = expected_journal_id
        status, payload, journal_id = await self._call(
            "POST", self.endpoint.url("/jobs"), limit=MAX_RECORD_BYTES, invocation=True,
            body=request.to_wire(), headers=headers, ok=(200, 201, 202))
        record = self._record(payload, status, invocation=True)
        return Admission(status, record, journal_id, time.monotonic() - began)

    async def cancel(self, crew_id: str, action_id: str, reason: str | None = None) -> JobRecord:
        body: dict[str, Any] = {"crew_id": crew_id, "action_id": action_id}
        if reason:
            body["reason"] = reason[: contract.MAX_REASON_CHARS]
        status, payload, _ = await self._call(
            "POST", self.endpoint.job_url(action_id, "/cancel"), limit=MAX_RECORD_BYTES,
            invocation=True, body=body, ok=(200, 202))
        return self._record(payload, status, invocation=True)

    async def mark_recorded(self, crew_id: str, action_id: str) -> None:
        """``POST /jobs/{id}/recorded``: this finished job's outcome is in its CrewJob's status
        now (idempotent; an archived job answers 410, which is fine too)."""
        await self._call("POST", self.endpoint.job_url(action_id, contract.RECORDED_SUFFIX),
                         limit=MAX_RECORD_BYTES, invocation=False,
                         body={"crew_id": crew_id, "action_id": action_id}, ok=(200, 410))

    async def resolve(self, request: contract.ResolutionRequest) -> ResolutionAnswer:
        """``POST /jobs/{id}/resolution``: the journaled ``resolution`` event (201 new, 200 an
        identical repeat), the journaled successor claim when there is one, or (409
        ``resolution_conflict``) the different finding the journal holds. An invocation: a
        lost answer is retried by the caller, which is safe because the route is idempotent."""
        status, payload, _ = await self._call(
            "POST", self.endpoint.job_url(request.action_id, "/resolution"),
            limit=MAX_RECORD_BYTES, invocation=True, body=request.to_wire(),
            ok=(200, 201, 409))
        try:
            if not isinstance(payload, dict):
                raise TypeError("not an object")
            if status == 409:
                err = payload.get("error") or {}
                if not isinstance(err, dict) or err.get("code") != "resolution_conflict" \
                        or not isinstance(err.get("journaled"), dict):
                    raise classify_http_failure(status, payload, invocation=True)
                journaled = JobEvent.from_wire(err["journaled"])
                return ResolutionAnswer(event=journaled, conflict=True)
            successor = payload.get("successor")
            return ResolutionAnswer(
                event=JobEvent.from_wire(payload["event"]),
                successor=JobEvent.from_wire(successor) if isinstance(successor, dict)
                else None)
        except (KeyError, TypeError, ValueError) as exc:
            raise SidecarFailure(FailureCategory.CONNECTOR, "invalid_response",
                                 f"resolution answer is malformed: {type(exc).__name__}", status,
                                 uncertain=True) from None

    async def claim_successor(self, request: contract.SuccessorRequest) -> SuccessorAnswer:
        """``POST /jobs/{id}/successor``: the journaled claim (201 new, 200 an exact repeat)
        and the journaled resolution it rests on; a refusal is a SidecarFailure whose
        ``code`` is the journal's reason (``unresolved``, ``happened``, ...)."""
        status, payload, _ = await self._call(
            "POST", self.endpoint.job_url(request.action_id, "/successor"),
            limit=MAX_RECORD_BYTES, invocation=True, body=request.to_wire(), ok=(200, 201))
        try:
            if not isinstance(payload, dict):
                raise TypeError("not an object")
            return SuccessorAnswer(claim=JobEvent.from_wire(payload["event"]),
                                   resolution=JobEvent.from_wire(payload["resolution"]),
                                   created=status == 201)
        except (KeyError, TypeError, ValueError) as exc:
            raise SidecarFailure(FailureCategory.CONNECTOR, "invalid_response",
                                 f"successor answer is malformed: {type(exc).__name__}", status,
                                 uncertain=True) from None

    async def events_page(self, action_id: str, cursor: int) -> EventsPage:
        url = self.endpoint.job_url(action_id, "/events").with_query(cursor=str(cursor))
        _, payload, _ = await self._call("GET", url, limit=MAX_PAGE_BYTES, invocation=False)
        return parse_events_page(payload, cursor)

    async def follow(self, action_id: str, cursor: int) -> AsyncIterator[JobEvent]:
        """Follow events as SSE from ``cursor``; ends when the sidecar closes the stream.

        Sequences are checked to be contiguous from ``cursor``: a gap or a malformed event is an
        invalid stream (uncertain). A dropped connection is not: the caller re-attaches.
        """
        url = self.endpoint.job_url(action_id, "/events").with_query(cursor=str(cursor))
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeouts.connect,
                                        sock_read=self.timeouts.follow_idle)
        headers = self._headers({"Accept": "text/event-stream"})
        metrics.observe_sidecar_request(route_of("GET", url))
        try:
            async with self._session.get(url, headers=headers, timeout=timeout,
                                         allow_redirects=False, **self._tls()) as resp:
                if resp.status != 200:
                    payload = await self._read_json(resp, MAX_PAGE_BYTES, invocation=False)
                    raise classify_http_failure(resp.status, payload, invocation=False)
                if not resp.content_type.startswith("text/event-stream"):
                    payload = await self._read_json(resp, MAX_PAGE_BYTES, invocation=False)
                    for event in parse_events_page(payload, cursor).events:
                        yield event
                    return
                expected = cursor
                async for event in _sse_events(resp, expected):
                    if event.sequence != expected:
                        raise invalid_stream(
                            f"event sequence {event.sequence} where {expected} was expected")
                    expected += 1
                    yield event
        except SidecarFailure:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise classify_transport_failure(exc, invocation=False) from None


def route_of(method: str, url: URL) -> str:
    """A bounded metric label: the method and the path with the action id left out."""
    parts = url.raw_path.split("/")
    if len(parts) >= 3 and parts[1] == "jobs" and parts[2] != "stream":  # /jobs/{id}[/...]
        return " ".join((method, "/".join(["/jobs/{id}", *parts[3:]]).rstrip("/")))
    return f"{method} {url.raw_path}"


def parse_events_page(payload: object, cursor: int) -> EventsPage:
    """Validate a JSON events page: contiguous sequences starting at ``cursor``."""
    if not isinstance(payload, dict) or not isinstance(payload.get("events"), list):
        raise invalid_stream("events page is not an object with an events list")
    try:
        events = [JobEvent.from_wire(raw) for raw in payload["events"]]
        status = contract.Status(payload["status"])
        next_cursor = int(payload.get("next_cursor", cursor + len(events)))
    except (KeyError, TypeError, ValueError) as exc:
        raise invalid_stream(f"malformed events page: {type(exc).__name__}") from None
    for offset, event in enumerate(events):
        if event.sequence != cursor + offset:
            raise invalid_stream(
                f"event sequence {event.sequence} where {cursor + offset} was expected")
    if next_cursor != cursor + len(events):
        raise invalid_stream("next_cursor does not follow the events on the page")
    return EventsPage(cursor=cursor, next_cursor=next_cursor, status=status, events=events)


def parse_sse_block(block: str, expected: int) -> JobEvent | None:
    """One SSE block (lines up to a blank line) → an event; None for comments/keep-alives."""
    name: str | None = None
    event_id: str | None = None
    data_lines: list[str] = []
    for line in block.split("\n"):
        if not line or line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "event":
            name = value
        elif key == "data":
            data_lines.append(value)
        elif key == "id":
            event_id = value
    if not data_lines and name is None:
        return None
    try:
        data = json.loads("\n".join(data_lines)) if data_lines else {}
    except ValueError:
        raise invalid_stream(f"SSE event {name!r} carries invalid JSON") from None
    if isinstance(data, dict) and "sequence" in data and "event" in data:
        try:
            return JobEvent.from_wire(data)
        except (KeyError, TypeError, ValueError):
            raise invalid_stream("SSE event is malformed") from None
    if name is None:
        raise invalid_stream("SSE event without a name")
    try:
        sequence = int(event_id) if event_id is not None else expected
    except ValueError:
        raise invalid_stream("SSE event id is not a sequence number") from None
    return JobEvent(event=name, sequence=sequence, data=data if isinstance(data, dict) else
                    {"value": data})


async def _sse_events(resp: aiohttp.ClientResponse, expected: int) -> AsyncIterator[JobEvent]:
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            raw, buffer = buffer.split(b"\n\n", 1)
            event = parse_sse_block(raw.decode("utf-8", "replace"), expected)
            if event is not None:
                expected = event.sequence + 1
                yield event
        if len(buffer) > MAX_SSE_EVENT_BYTES:
            raise response_too_large(MAX_SSE_EVENT_BYTES, invocation=False)
