"""A fault-injecting sidecar double: a real aiohttp HTTP server speaking the wire contract.

It validates requests and computes request hashes with ``crewfence_sidecar.contract`` (the one
copy of the contract), keeps records and events in memory (its "journal", which survives a
:meth:`FaultySidecar.restart` unless told to lose it), and counts admissions per action id, so a
test can assert "never twice". It runs no crew: a test decides when a job ends
(:meth:`FaultySidecar.finish`).

Faults are queued per route and consumed one per request (:meth:`FaultySidecar.inject`):

- ``admit_then_drop``  (POST /jobs) persist the admission, then cut the connection unanswered;
- ``status``           answer ``http_status`` with error ``code`` and change nothing;
- ``stall``            hold the request until :meth:`release` (the client's timeout fires);
- ``garbage``          (events) answer an SSE event out of sequence (an invalid stream).

Other states: :meth:`stop`/:meth:`start` (the process "dies": connection refused),
:meth:`restart` (same port; running records become failed ``sidecar_restarted`` with
``uncertain_outcome`` unless the journal is lost), :meth:`change_journal` (a new journal id and
no records), ``draining`` (admissions answer 503 ``draining``), ``token`` (401 otherwise).
``POST /jobs/{id}/recorded`` (fault route ``recorded``) notes the action in ``recorded`` and
the record carries the first mark's time (``recorded_at``).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from crewfence_sidecar import contract
from crewfence_sidecar.contract import ContractError, JobEvent, JobRecord, Status


@dataclass
class Fault:
    kind: str
    http_status: int = 503
    code: str = "injected"


@dataclass
class Job:
    record: JobRecord
    events: list[JobEvent] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, name: str, data: dict[str, Any] | None = None) -> None:
        self.events.append(JobEvent(name, len(self.events), data or {}))
        self.record.event_count = len(self.events)
        self.record.updated_at = _now()
        self.changed.set()
        self.changed = asyncio.Event()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FaultySidecar:
    def __init__(self, *, token: str = "test-token", journal_id: str = "journal-a",
                 crew_id: str = "research") -> None:
        self.token = token
        self.journal_id = journal_id
        self.crew_id = crew_id
        self.port = 0
        """Chosen by the kernel at the first :meth:`start` and kept: a restart binds it again."""
        self.jobs: dict[str, Job] = {}
        self.admissions: dict[str, int] = defaultdict(int)
        """Admissions that created a record, per action id, over the double's whole life."""
        self.cancels: dict[str, int] = defaultdict(int)
        self.recorded: set[str] = set()
        """Terminal records the client marked recorded (``POST /jobs/{id}/recorded``)."""
        self.requests: list[tuple[str, str]] = []
        self.faults: dict[str, deque[Fault]] = defaultdict(deque)
        self.draining = False
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None

    # --- lifecycle --------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/jobs", self._start_job)
        app.router.add_get("/jobs/{action_id}", self._get_job)
        app.router.add_get("/jobs/{action_id}/events", self._events)
        app.router.add_post("/jobs/{action_id}/cancel", self._cancel)
        app.router.add_post("/jobs/{action_id}" + contract.RECORDED_SUFFIX, self._recorded)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        # Bound here, not probed free and bound later: a port released between the two is
        # anyone's (CI's other workers took one), and a restart must keep the address.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = int(sock.getsockname()[1])
        await web.SockSite(runner, sock).start()
        self._runner = runner

    async def stop(self) -> None:
        """The sidecar dies: connections are refused until :meth:`start`."""
        self._released.set()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        self._released = asyncio.Event()

    async def restart(self, *, lose_journal: bool = False, journal_id: str | None = None) -> None:
        """Like the real sidecar: running records are restored as failed and uncertain."""
        await self.stop()
        if lose_journal:
            self.change_journal(journal_id or f"{self.journal_id}-new")
        for job in self.jobs.values():
            if not job.record.terminal:
                self._end(job, Status.FAILED, error={
                    "code": "sidecar_restarted",
                    "message": "the sidecar restarted while this job was running"},
                    uncertain=True)
        await self.start()

    def change_journal(self, journal_id: str) -> None:
        self.journal_id = journal_id
        self.jobs.clear()

    # --- programming ------------------------------------------------------------------------
    def inject(self, route: str, fault: Fault, times: int = 1) -> None:
        """Queue a fault for ``route`` in ``post``, ``get``, ``events``, ``cancel``."""
        for _ in range(times):
            self.faults[route].append(fault)

    def release(self) -> None:
        self._released.set()
        self._released = asyncio.Event()

    def finish(self, action_id: str, status: Status = Status.COMPLETED, *, output: Any = "done",
               error: dict[str, Any] | None = None, uncertain: bool = False) -> None:
        job = self.jobs[action_id]
        self._end(job, status, output=output if status is Status.COMPLETED else None,
                  error=error, uncertain=uncertain)

    def _end(self, job: Job, status: Status, *, output: Any = None,
             error: dict[str, Any] | None = None, uncertain: bool = False) -> None:
        job.record.status = status
        job.record.output = output
        job.record.error = error
        job.record.uncertain_outcome = uncertain
        job.add(contract.TERMINAL_EVENT_FOR_STATUS[status].value,
                {"uncertain_outcome": uncertain, **({"error": error} if error else {})})

    # --- plumbing ---------------------------------------------------------------------------
    def _json(self, status: int, body: object) -> web.Response:
        return web.json_response(body, status=status,
                                 headers={contract.JOURNAL_ID_HEADER: self.journal_id})

    def _error(self, status: int, code: str, message: str = "injected") -> web.Response:
        return self._json(status, contract.error_body(code, message))

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    async def _fault(self, route: str, request: web.Request) -> Fault | web.Response | None:
        self.requests.append((request.method, request.path))
        if not self._authorized(request):
            return web.json_response(contract.error_body("unauthorized", "bad token"), status=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        queue = self.faults.get(route)
        if not queue:
            return None
        fault = queue.popleft()
        if fault.kind == "status":
            return self._error(fault.http_status, fault.code)
        if fault.kind == "stall":
            released = self._released
            await released.wait()
            return self._error(503, "stalled")
        return fault

    # --- routes -----------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return self._json(200, {"status": "draining" if self.draining else "ready",
                                "journal_id": self.journal_id, "crews": [self.crew_id]})

    async def _start_job(self, request: web.Request) -> web.StreamResponse:
        fault = await self._fault("post", request)
        if isinstance(fault, web.Response):
            return fault
        try:
            req = contract.parse_start_request(await request.json())
            key = contract.validate_idempotency_key(
                request.headers.get(contract.IDEMPOTENCY_KEY_HEADER))
        except ContractError as exc:
            return self._error(exc.status, exc.code, exc.message)
        digest = contract.request_hash(req, key)
        known = self.jobs.get(req.action_id)
        if known is not None:
            if known.record.request_hash != digest:
                return self._error(409, "request_changed", "same action id, other request")
            return self._json(200, known.record.to_wire())
        if self.draining:
            return self._error(503, contract.DRAINING_CODE, "draining")
        now = _now()
        job = Job(JobRecord(action_id=req.action_id, crew_id=req.crew_id,
                            operation=req.operation.value, request_hash=digest,
                            status=Status.RUNNING, event_count=0, created_at=now,
                            updated_at=now))
        job.add("started")
        self.jobs[req.action_id] = job
        self.admissions[req.action_id] += 1
        if isinstance(fault, Fault) and fault.kind == "admit_then_drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        return self._json(202, job.record.to_wire())

    async def _get_job(self, request: web.Request) -> web.Response:
        fault = await self._fault("get", request)
        if isinstance(fault, web.Response):
            return fault
        job = self.jobs.get(request.match_info["action_id"])
        if job is None:
            return self._error(404, "unknown_job", "no such job")
        return self._json(200, job.record.to_wire())

    async def _cancel(self, request: web.Request) -> web.Response:
        fault = await self._fault("cancel", request)
        if isinstance(fault, web.Response):
            return fault
        action_id = request.match_info["action_id"]
        try:
            contract.parse_cancel_request(await request.json(), action_id)
        except ContractError as exc:
            return self._error(exc.status, exc.code, exc.message)
        job = self.jobs.get(action_id)
        if job is None:
            return self._error(404, "unknown_job", "no such job")
        self.cancels[action_id] += 1
        if not job.record.terminal:
            self._end(job, Status.CANCELLED, error={"code": "cancelled",
                                                    "message": "cancelled on request"},
                      uncertain=True)
        return self._json(200, job.record.to_wire())

    async def _recorded(self, request: web.Request) -> web.Response:
        fault = await self._fault("recorded", request)
        if isinstance(fault, web.Response):
            return fault
        try:
            _, action_id = contract.parse_recorded_request(await request.json(),
                                                           request.match_info["action_id"])
        except ContractError as exc:
            return self._error(exc.status, exc.code, exc.message)
        job = self.jobs.get(action_id)
        if job is None:
            return self._error(404, "unknown_job", "no such job")
        if not job.record.terminal:
            return self._error(409, "job_running", "the job is still running")
        self.recorded.add(action_id)
        if job.record.recorded_at is None:  # the record carries its first mark, as ours does
            job.record.recorded_at = _now()
        return self._json(200, {"action_id": action_id,
                                "recorded_at": job.record.recorded_at})

    async def _events(self, request: web.Request) -> web.StreamResponse:
        fault = await self._fault("events", request)
        if isinstance(fault, web.Response):
            return fault
        job = self.jobs.get(request.match_info["action_id"])
        if job is None:
            return self._error(404, "unknown_job", "no such job")
        cursor = int(request.query.get("cursor", "0"))
        if cursor > len(job.events):
            return self._error(416, "cursor_out_of_range", "cursor beyond the events")
        if "text/event-stream" not in request.headers.get("Accept", ""):
            page = contract.events_page(job.record.action_id, cursor, job.record.status,
                                        job.events[cursor:])
            return self._json(200, page)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           contract.JOURNAL_ID_HEADER: self.journal_id})
        await resp.prepare(request)
        if isinstance(fault, Fault) and fault.kind == "garbage":
            bad = JobEvent("chunk", cursor + 7, {})
            await resp.write(f"id: {bad.sequence}\nevent: chunk\ndata: "
                             f"{json.dumps(bad.to_wire())}\n\n".encode())
            return resp
        released = self._released
        while True:
            while cursor < len(job.events):
                ev = job.events[cursor]
                await resp.write(f"id: {ev.sequence}\nevent: {ev.event}\ndata: "
                                 f"{json.dumps(ev.to_wire())}\n\n".encode())
                cursor += 1
            if job.record.terminal:
                return resp
            changed = asyncio.ensure_future(job.changed.wait())
            stop = asyncio.ensure_future(released.wait())
            await asyncio.wait({changed, stop}, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            stop.cancel()
            if released.is_set() or self._runner is None:
                return resp
