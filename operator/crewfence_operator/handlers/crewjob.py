"""kopf glue for CrewJob: one async daemon per non-terminal CrewJob drives its Action.

Why a daemon and not create/resume handlers: a daemon is re-spawned for every live object when
the operator restarts, it re-attaches from ``status.eventCursor`` without kopf progress
annotations, and it costs no API writes of its own beyond kopf's finalizer. Status is written in
few merge patches (admission, rare progress, terminal), to keep API writes per job low.

The rules this file enforces (see docs and the reference):
- never invent an action id or key; never retry an uncertain outcome;
- before the first admission ask every replica whether it knows the action;
- assignment is sticky: recorded once in ``status.assignment`` and never moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf
from crewfence_sidecar import contract
from crewfence_sidecar.contract import FailureCategory, JobRecord
from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator import kube, metrics
from crewfence_operator.assignment import choose_ordinal
from crewfence_operator.crewjob import outcome
from crewfence_operator.crewjob.outcome import Phase, Reason, Verdict
from crewfence_operator.crewjob.output import CONFIGMAP_KEY, bound_output, configmap_name
from crewfence_operator.crewjob.replicas import Replica, journal_changed, parse_replicas
from crewfence_operator.crewjob.spec import DeletionPolicy, JobSpec, SpecError
from crewfence_operator.crewjob.status import (
    Assignment,
    Cancellation,
    Progress,
    StatusContext,
    now_iso,
    terminal_patch,
    working_patch,
)
from crewfence_operator.sidecar_client import (
    Endpoint,
    Lookup,
    SidecarClient,
    SidecarFailure,
    cancel_unconfirmed,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerSettings:
    retry_seconds: float = 3.0
    """Pause before looking again while Pending (no replica, sidecar busy, ...)."""
    progress_seconds: float = 30.0
    """At most one progress write (eventCursor, progress) per this many seconds."""
    deletion_wait_seconds: float = 30.0
    """With deletionPolicy Cancel: how long deletion waits for the sidecar's acknowledgement."""
    reconcile_attempts: int = 3
    """GETs after an admission whose answer was lost, before calling the outcome uncertain."""
    reconcile_backoff_seconds: float = 1.0
    max_admission_failures: int = 3
    """Non-backpressure 5xx answers (checked with GET: not admitted) before giving up."""


SETTINGS = RunnerSettings()
DAEMON_ID = "crewjob"

# --- one HTTP session per event loop ------------------------------------------------------------
_sessions: dict[int, aiohttp.ClientSession] = {}


def http_session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    session = _sessions.get(id(loop))
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        session = aiohttp.ClientSession(connector=connector)
        _sessions[id(loop)] = session
    return session


async def close_sessions() -> None:
    for key, session in list(_sessions.items()):
        await session.close()
        _sessions.pop(key, None)


# --- API writes and reads (blocking client calls, always in a thread) ---------------------------
def _patch_status_blocking(namespace: str, name: str, status: dict[str, Any]) -> None:
    kube.custom().patch_namespaced_custom_object_status(
        c.GROUP, c.VERSION, namespace, c.CREWJOB_PLURAL, name, {"status": status})


def _configmap_body(body: Mapping[str, Any], name: str, value: str) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": name, "namespace": meta["namespace"],
            "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE,
                       "crewfence.dev/crewjob": meta["name"][:63].rstrip("-_.")},
            "ownerReferences": [{
                "apiVersion": c.API_VERSION, "kind": c.CREWJOB_KIND, "name": meta["name"],
                "uid": meta["uid"], "controller": True, "blockOwnerDeletion": False,
            }],
        },
        "data": {CONFIGMAP_KEY: value},
    }


# Many CrewJobs of one Crew start together; one read of the Crew and its token serves them all
# for a moment (a replica's readiness or journal id a second old is still checked again later).
CREW_CACHE_SECONDS = 1.0
_crew_cache: dict[tuple[str, str], tuple[float, dict[str, Any] | None, str | None]] = {}
_crew_locks: dict[tuple[str, str], asyncio.Lock] = {}


async def read_crew_and_token(namespace: str,
                              crew: str) -> tuple[dict[str, Any] | None, str | None]:
    key = (namespace, crew)
    lock = _crew_locks.setdefault(key, asyncio.Lock())
    async with lock:
        cached = _crew_cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1], cached[2]
        crew_obj = await asyncio.to_thread(kube.get_crew, namespace, crew)
        token = None
        if crew_obj is not None:
            token = await asyncio.to_thread(kube.read_secret_value, namespace,
                                            c.token_secret_name(crew), c.TOKEN_SECRET_KEY)
        _crew_cache[key] = (time.monotonic() + CREW_CACHE_SECONDS, crew_obj, token)
        return crew_obj, token


class ObjectGone(Exception):
    """The CrewJob disappeared while we worked on it."""


@dataclass
class Attached:
    replica: Replica
    client: SidecarClient
    assignment: Assignment
    record: JobRecord


# --- the runner ---------------------------------------------------------------------------------
class JobRunner:
    """Drives one CrewJob from its live kopf body until its status is terminal."""

    def __init__(self, body: kopf.Body, settings: RunnerSettings = SETTINGS) -> None:
        self.body = body
        self.settings = settings
        self.namespace = str(body["metadata"]["namespace"])
        self.name = str(body["metadata"]["name"])
        status = dict(body.get("status") or {})
        self.cancellation = Cancellation.from_status(status.get("cancellation"))
        self.progress = Progress.from_status(status.get("progress"))
        self.cursor = int(status.get("eventCursor") or 0)
        self.attached: Attached | None = None
        self.spec: JobSpec | None = None
        self.sticky_uncertain: tuple[Reason, str] | None = None
        self._last_working: tuple[str, str, str] | None = None
        self._last_progress_write = time.monotonic()
        self._written_cursor = self.cursor
        self.finished = False

    # --- live views -------------------------------------------------------------------------
    @property
    def status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    @property
    def cancel_requested(self) -> bool:
        return bool((self.body.get("spec") or {}).get("cancel"))

    def _ctx(self) -> StatusContext:
        action_id = self.spec.action_id if self.spec else str(
            (self.body.get("spec") or {}).get("actionId") or f"{self.namespace}/{self.name}")
        return StatusContext(generation=int(self.body["metadata"].get("generation") or 1),
                             action_id=action_id,
                             previous_conditions=list(self.status.get("conditions") or []))

    # --- writes -----------------------------------------------------------------------------
    async def _patch(self, status: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(_patch_status_blocking, self.namespace, self.name, status)
        except ApiException as exc:
            if exc.status == 404:
                raise ObjectGone(self.name) from None
            raise

    async def working(self, phase: Phase, reason: Reason, message: str,
                      extra: Mapping[str, Any] | None = None) -> None:
        """A Pending/Running write, skipped when nothing a reader cares about changed."""
        key = (phase.value, reason.value, message)
        if key == self._last_working and not extra:
            return
        current = self.status
        if (not extra and current.get("phase") == phase.value
                and current.get("reason") == reason.value and current.get("message") == message):
            self._last_working = key
            return
        uncertain = self.sticky_uncertain[0].value if self.sticky_uncertain else None
        patch = working_patch(self._ctx(), phase, reason.value, message, now=now_iso(),
                              uncertain_reason=uncertain, extra=extra)
        if self.sticky_uncertain:
            patch["recovery"] = outcome.RECOVERY[self.sticky_uncertain[0]]
        await self._patch(patch)
        self._last_working = key
        log.info("crewjob %s/%s: %s (%s) %s", self.namespace, self.name, phase.value,
                 reason.value, message)

    async def finish(self, verdict: Verdict, record: JobRecord | None = None) -> None:
        if self.sticky_uncertain:
            verdict = outcome.with_uncertainty(verdict, *self.sticky_uncertain)
        output = bound_output(record.output) if record is not None else None
        cm_name: str | None = None
        if output is not None:
            cm_name = configmap_name(self.name)
            await asyncio.to_thread(kube.create_if_absent,
                                    _configmap_body(self.body, cm_name, output.configmap_value))
        extra: dict[str, Any] = {"eventCursor": self.cursor, "progress": self.progress.to_status()}
        if self.cancellation.requested:
            extra["cancellation"] = self.cancellation.to_status()
        if self.attached is not None:
            extra["assignment"] = self.attached.assignment.to_status()
        if self.spec is not None and record is None:
            extra["requestHash"] = self.spec.request_hash()
        if verdict.uncertain:
            metrics.observe_uncertain_outcome(verdict.reason.value)
            kopf.warn(self.body, reason=f"OutcomeUncertain{verdict.reason.value}",
                      message=f"{verdict.message}. {verdict.recovery}"[:1000])
        await self._patch(terminal_patch(self._ctx(), verdict, now=now_iso(), record=record,
                                         output=output, configmap=cm_name, extra=extra))
        self.finished = True
        log.info("crewjob %s/%s: %s (%s)%s", self.namespace, self.name, verdict.phase.value,
                 verdict.reason.value, " uncertain" if verdict.uncertain else "")

    async def maybe_write_progress(self) -> None:
        if (self.cursor != self._written_cursor
                and time.monotonic() - self._last_progress_write >= self.settings.progress_seconds):
            await self._patch({"eventCursor": self.cursor, "progress": self.progress.to_status()})
            self._written_cursor = self.cursor
            self._last_progress_write = time.monotonic()

    # --- waiting ----------------------------------------------------------------------------
    async def pause(self, seconds: float | None = None) -> None:
        """Wait before looking again; returns early when spec.cancel turns true."""
        deadline = time.monotonic() + (seconds if seconds is not None
                                       else self.settings.retry_seconds)
        was_cancelled = self.cancel_requested
        while (remaining := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(0.5, remaining))
            if self.cancel_requested and not was_cancelled:
                return

    # --- cluster reads ----------------------------------------------------------------------
    async def crew_and_token(self, crew: str) -> tuple[dict[str, Any] | None, str | None]:
        return await read_crew_and_token(self.namespace, crew)

    @staticmethod
    def client_for(replica: Replica, token: str) -> SidecarClient:
        assert replica.address
        return SidecarClient(http_session(), Endpoint(replica.address, token))

    # --- the whole life ---------------------------------------------------------------------
    async def run(self) -> None:
        try:
            self.spec = JobSpec.from_resource(self.namespace, self.name,
                                              self.body.get("spec") or {})
        except SpecError as exc:
            await self.finish(outcome.invalid_spec(exc.code, exc.message))
            return
        assignment = Assignment.from_status(self.status.get("assignment"))
        if assignment is None:
            attached = await self.acquire()
        else:
            attached = await self.reattach(assignment)
        if attached is None:
            return
        await self.follow(attached)

    # --- before the first admission ---------------------------------------------------------
    async def _ask(self, replica: Replica, token: str) -> Lookup | SidecarFailure | None:
        if not replica.address:
            return None
        try:
            return await self.client_for(replica, token).get_job(self.spec_.action_id)
        except SidecarFailure as exc:
            metrics.observe_sidecar_failure(exc.category.value)
            return exc

    @property
    def spec_(self) -> JobSpec:
        assert self.spec is not None
        return self.spec

    async def _attach_known(self, replica: Replica, token: str, lookup: Lookup) -> Attached | None:
        """Attach to an Action a replica already knows (after checking the request fence)."""
        spec = self.spec_
        if lookup.tombstone is not None:
            await self.finish(outcome.verdict_from_rejection(
                FailureCategory.PERMANENT, "archived",
                "the sidecar holds only a tombstone of this action", 410))
            return None
        assert lookup.record is not None
        ours = spec.request_hash()
        if lookup.record.request_hash != ours:
            await self.finish(outcome.request_changed(lookup.record.request_hash, ours))
            return None
        journal = lookup.journal_id or replica.journal_id
        assignment = Assignment(replica.ordinal, replica.pod, replica.claim, journal)
        return Attached(replica, self.client_for(replica, token), assignment, lookup.record)

    async def acquire(self) -> Attached | None:
        """Find or admit the Action; None when the job already ended (status written)."""
        spec = self.spec_
        failures = 0
        while True:
            if self.cancel_requested:
                self.cancellation = Cancellation(requested=True, dispatched=False,
                                                 message="cancelled before admission")
                await self.finish(outcome.cancelled_before_admission())
                return None
            crew, token = await self.crew_and_token(spec.crew)
            if crew is None:
                await self.working(Phase.PENDING, Reason.CREW_NOT_FOUND,
                                   f"Crew {spec.crew!r} not found in {self.namespace}")
                await self.pause()
                continue
            replicas = parse_replicas(crew)
            if not token or not replicas:
                await self.working(Phase.PENDING, Reason.WAITING_FOR_REPLICAS,
                                   f"Crew {spec.crew!r} has no replicas with a token yet")
                await self.pause()
                continue
            answers = await asyncio.gather(*(self._ask(r, token) for r in replicas))
            known = [(r, a) for r, a in zip(replicas, answers, strict=True)
                     if isinstance(a, Lookup) and a.known]
            if known:
                known.sort(key=lambda ra: (ra[1].record is None, ra[0].ordinal))
                replica, lookup = known[0]
                attached = await self._attach_known(replica, token, lookup)
                if attached is not None:
                    await self.record_attached(attached)
                return attached
            silent = [r.ordinal for r, a in zip(replicas, answers, strict=True)
                      if not isinstance(a, Lookup)]
            if silent:
                await self.working(
                    Phase.PENDING, Reason.WAITING_FOR_REPLICAS,
                    f"replica(s) {', '.join(map(str, silent))} of Crew {spec.crew!r} cannot say "
                    "whether they already know this action; waiting before any admission")
                await self.pause()
                continue
            eligible = [r for r in replicas if r.eligible]
            ordinal = choose_ordinal(spec.action_id, [r.ordinal for r in eligible])
            if ordinal is None:
                await self.working(Phase.PENDING, Reason.NO_ELIGIBLE_REPLICA,
                                   f"no ready, unfenced replica of Crew {spec.crew!r}")
                await self.pause()
                continue
            replica = next(r for r in eligible if r.ordinal == ordinal)
            client = self.client_for(replica, token)
            try:
                admission = await client.start(spec.start_request(), spec.idempotency_key)
            except SidecarFailure as exc:
                metrics.observe_sidecar_failure(exc.category.value)
                decided = await self._after_failed_admission(replica, token, client, exc)
                if isinstance(decided, Attached):
                    return decided
                if decided is False:
                    return None
                if exc.http_status not in (429, 503, 507):
                    failures += 1
                if failures >= self.settings.max_admission_failures:
                    await self.finish(Verdict(
                        Phase.FAILED, Reason.REJECTED,
                        f"the sidecar kept failing the admission ({exc}); it holds no record "
                        "of the action", outcome.RECOVERY[Reason.REJECTED],
                        outcome.Failure(exc.category, exc.code, exc.message)))
                    return None
                await self.pause()
                continue
            metrics.observe_admission_seconds(admission.seconds)
            journal = admission.journal_id or replica.journal_id
            if journal is None:
                with contextlib.suppress(SidecarFailure):
                    journal = str((await client.health()).get("journal_id") or "") or None
            attached = Attached(replica, client,
                                Assignment(replica.ordinal, replica.pod, replica.claim, journal),
                                admission.record)
            await self.record_attached(attached)
            return attached

    async def _after_failed_admission(self, replica: Replica, token: str, client: SidecarClient,
                                      exc: SidecarFailure) -> Attached | bool | None:
        """Decide after a failed POST: an Attached, False (finished), or None (wait, retry)."""
        # (True is never returned; bool keeps the three outcomes distinct for the caller.)
        if exc.category is FailureCategory.TRANSPORT and not exc.uncertain:
            await self.working(Phase.PENDING, Reason.REPLICA_UNAVAILABLE,
                               f"replica {replica.ordinal} refused the connection; "
                               "nothing was sent")
            return None
        if not exc.uncertain:
            await self.finish(outcome.verdict_from_rejection(exc.category, exc.code, exc.message,
                                                             exc.http_status))
            return False
        # The request may have been admitted: look before deciding (reconciliation, not retry).
        lookup = await self.reconcile_lookup(client)
        if lookup is None:
            await self.finish(outcome.uncertain(
                Reason.TRANSPORT_FAILURE, exc.category, exc.code,
                f"the admission on replica {replica.ordinal} may have been sent but its answer "
                f"was lost ({exc}), and the replica could not be asked afterwards"))
            return False
        if lookup.known:
            attached = await self._attach_known(replica, token, lookup)
            if attached is None:
                return False
            await self.record_attached(attached)
            return attached
        message = f"replica {replica.ordinal} did not admit the action ({exc}); trying again"
        if exc.http_status == 507:
            message = f"{message}. {outcome.RECOVERY['journal_full']}"
        await self.working(Phase.PENDING, Reason.SIDECAR_BUSY, message)
        return None

    async def reconcile_lookup(self, client: SidecarClient) -> Lookup | None:
        for attempt in range(self.settings.reconcile_attempts):
            try:
                return await client.get_job(self.spec_.action_id)
            except SidecarFailure as exc:
                metrics.observe_sidecar_failure(exc.category.value)
                if attempt + 1 < self.settings.reconcile_attempts:
                    await asyncio.sleep(self.settings.reconcile_backoff_seconds * (attempt + 1))
        return None

    async def record_attached(self, attached: Attached) -> None:
        """The one write at assignment (unless the record is already terminal)."""
        self.attached = attached
        record = attached.record
        if record.terminal:
            return  # follow() finishes at once, in a single write
        extra = {"assignment": attached.assignment.to_status(),
                 "requestHash": record.request_hash, "startedAt": record.created_at,
                 "eventCursor": self.cursor, "progress": self.progress.to_status()}
        await self.working(Phase.RUNNING, Reason.ADMITTED,
                           f"admitted by {attached.assignment.pod or attached.replica.ordinal}",
                           extra)

    # --- after an operator restart ----------------------------------------------------------
    async def reattach(self, assignment: Assignment) -> Attached | None:
        """Re-attach to the recorded replica (sticky: it is never moved)."""
        spec = self.spec_
        while True:
            crew, token = await self.crew_and_token(spec.crew)
            replica = next((r for r in parse_replicas(crew or {})
                            if r.ordinal == assignment.ordinal), None)
            if replica is not None and journal_changed(assignment.journal_id,
                                                       replica.journal_id):
                await self._journal_lost(assignment, replica.journal_id)
                return None
            if replica is None or not token or not replica.address:
                await self.working(Phase.RUNNING, Reason.REPLICA_UNAVAILABLE,
                                   f"assigned replica {assignment.ordinal} is not reachable; "
                                   "waiting (the action is never moved to another replica)")
                await self.pause()
                continue
            client = self.client_for(replica, token)
            try:
                lookup = await client.get_job(spec.action_id)
            except SidecarFailure as exc:
                metrics.observe_sidecar_failure(exc.category.value)
                await self.working(Phase.RUNNING, Reason.REPLICA_UNAVAILABLE,
                                   f"assigned replica {assignment.ordinal} did not answer: {exc}")
                await self.pause()
                continue
            if journal_changed(assignment.journal_id, lookup.journal_id):
                await self._journal_lost(assignment, lookup.journal_id)
                return None
            if not lookup.known:
                await self.finish(outcome.uncertain(
                    Reason.JOURNAL_LOST, FailureCategory.CONNECTOR, "record_missing",
                    f"the assigned replica {assignment.ordinal} no longer knows the action"))
                return None
            attached = await self._attach_known(replica, token, lookup)
            if attached is None:
                return None
            self.attached = Attached(replica, client, assignment, attached.record)
            return self.attached

    async def _journal_lost(self, assignment: Assignment, current: str | None) -> None:
        await self.finish(outcome.uncertain(
            Reason.JOURNAL_LOST, FailureCategory.CONNECTOR, "journal_changed",
            f"the journal of replica {assignment.ordinal} changed from "
            f"{assignment.journal_id} to {current}; the action's record is lost"))

    # --- following ----------------------------------------------------------------------------
    async def follow(self, attached: Attached) -> None:
        spec = self.spec_
        record = attached.record
        while not record.terminal:
            if self.cancel_requested and not self.cancellation.dispatched:
                await self.send_cancel(attached)
            cursor_before = self.cursor
            try:
                await self._drain(attached)
                lookup = await attached.client.get_job(spec.action_id)
            except SidecarFailure as exc:
                metrics.observe_sidecar_failure(exc.category.value)
                # 416: our cursor lies beyond the record's events, which a journal that kept
                # its records cannot produce.
                if (exc.code in ("invalid_stream", "invalid_record", "invalid_response")
                        or exc.http_status == 416):
                    await self.finish(outcome.uncertain(
                        Reason.INVALID_STREAM, exc.category, exc.code,
                        f"invalid answer from the sidecar after admission: {exc.message}",
                        phase=Phase.FAILED))
                    return
                refreshed = await self._refresh(attached, str(exc))
                if refreshed is None:
                    return
                attached = refreshed
                continue
            if journal_changed(attached.assignment.journal_id, lookup.journal_id):
                await self._journal_lost(attached.assignment, lookup.journal_id)
                return
            if lookup.record is None:
                if lookup.tombstone is not None:
                    await self.finish(outcome.verdict_from_rejection(
                        FailureCategory.PERMANENT, "archived", "archived while followed", 410))
                else:
                    await self.finish(outcome.uncertain(
                        Reason.JOURNAL_LOST, FailureCategory.CONNECTOR, "record_missing",
                        "the assigned replica no longer knows the action"))
                return
            record = lookup.record
            if not record.terminal and self.cursor == cursor_before:
                await self.pause(1.0)  # the stream closed without news: do not spin
        verdict = outcome.verdict_from_record(record, thread_backed=spec.thread_backed,
                                              cancel_requested=self.cancellation.requested)
        await self.finish(verdict, record)

    async def _drain(self, attached: Attached) -> None:
        """Read events until the stream ends or a terminal event; watch spec.cancel meanwhile."""
        task = asyncio.create_task(self._read_stream(attached))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=0.5)
                if self.cancel_requested and not self.cancellation.dispatched:
                    await self.send_cancel(attached)
            task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, SidecarFailure):
                    await task

    async def _read_stream(self, attached: Attached) -> None:
        async for event in attached.client.follow(self.spec_.action_id, self.cursor):
            self.cursor = event.sequence + 1
            self.progress.events += 1
            self.progress.last_event = event.event
            if event.event == contract.EventName.CHUNK:
                self.progress.chunks += 1
            if event.event in contract.TERMINAL_EVENTS:
                return
            await self.maybe_write_progress()

    async def _refresh(self, attached: Attached, why: str) -> Attached | None:
        """The assigned replica stopped answering: wait for it (same ordinal) to come back."""
        assignment = attached.assignment
        await self.working(Phase.RUNNING, Reason.REPLICA_UNAVAILABLE,
                           f"lost contact with replica {assignment.ordinal}: {why}; waiting")
        await self.pause()
        crew, token = await self.crew_and_token(self.spec_.crew)
        replica = next((r for r in parse_replicas(crew or {})
                        if r.ordinal == assignment.ordinal), None)
        if replica is not None and journal_changed(assignment.journal_id, replica.journal_id):
            await self._journal_lost(assignment, replica.journal_id)
            return None
        if replica is None or not replica.address or not token:
            return attached
        return Attached(replica, self.client_for(replica, token), assignment, attached.record)

    async def send_cancel(self, attached: Attached) -> None:
        """spec.cancel → the cancel route, once (never repeated: it is an invocation)."""
        self.cancellation = Cancellation(requested=True, dispatched=True)
        try:
            record = await attached.client.cancel(self.spec_.crew, self.spec_.action_id,
                                                  reason="spec.cancel set on the CrewJob")
        except SidecarFailure as exc:
            metrics.observe_sidecar_failure(exc.category.value)
            failure = cancel_unconfirmed(exc)
            self.cancellation.message = failure.message
            self.sticky_uncertain = (Reason.CANCEL_UNCONFIRMED,
                                     "the cancel request was not confirmed")
            await self.working(Phase.RUNNING, Reason.CANCEL_UNCONFIRMED, failure.message,
                               {"cancellation": self.cancellation.to_status()})
            return
        self.cancellation.remote_stop_confirmed = True
        self.cancellation.message = ("the sidecar's cancel route answered success; this is not "
                                     "proof that the provider stopped")
        if record.terminal:
            attached.record = record


# --- deletion ------------------------------------------------------------------------------------
async def cancel_on_deletion(runner: JobRunner) -> None:
    """deletionPolicy Cancel: ask the sidecar to cancel, wait (bounded) for its answer."""
    spec, body = runner.spec, runner.body
    if spec is None or spec.deletion_policy is DeletionPolicy.ORPHAN or runner.finished:
        return
    attached = runner.attached or await _attach_for_deletion(runner, spec)
    deadline = time.monotonic() + runner.settings.deletion_wait_seconds
    confirmed = False
    if attached is None:
        if Assignment.from_status(runner.status.get("assignment")) is None:
            return  # nothing admitted as far as this operator knows
    elif attached.record.terminal:
        return  # it ended before the deletion: nothing to cancel
    else:
        confirmed = await _cancel_and_wait(attached, spec, deadline)
    if confirmed and not spec.thread_backed:
        return
    _warn_deleted_uncertain(body, confirmed)


async def _cancel_and_wait(attached: Attached, spec: JobSpec, deadline: float) -> bool:
    """True when the sidecar acknowledged the cancel and its record became terminal."""
    confirmed = False
    try:
        record = await attached.client.cancel(spec.crew, spec.action_id,
                                              reason="CrewJob deleted (deletionPolicy Cancel)")
        confirmed = True
        while not record.terminal and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            lookup = await attached.client.get_job(spec.action_id)
            if lookup.record is None:
                break
            record = lookup.record
        confirmed = record.terminal
    except SidecarFailure as exc:
        metrics.observe_sidecar_failure(exc.category.value)
    return confirmed


def _warn_deleted_uncertain(body: kopf.Body, confirmed: bool) -> None:
    reason = Reason.CANCEL_UNCONFIRMED
    metrics.observe_uncertain_outcome(reason.value)
    if confirmed:
        detail = "the sidecar cancelled the task, but its worker thread can continue"
        advice = outcome.RECOVERY["cancel_thread"]
    else:
        detail = "the sidecar did not acknowledge the cancel in time"
        advice = outcome.RECOVERY[reason]
    kopf.warn(body, reason=f"OutcomeUncertain{reason.value}",
              message=f"CrewJob deleted: {detail}. {advice}"[:1000])


async def _attach_for_deletion(runner: JobRunner, spec: JobSpec) -> Attached | None:
    """Deleted before the runner re-attached: use the recorded (sticky) assignment."""
    assignment = Assignment.from_status(runner.status.get("assignment"))
    if assignment is None:
        return None
    crew, token = await runner.crew_and_token(spec.crew)
    replica = next((r for r in parse_replicas(crew or {}) if r.ordinal == assignment.ordinal),
                   None)
    if replica is None or not replica.address or not token:
        return None
    client = runner.client_for(replica, token)
    try:
        lookup = await client.get_job(spec.action_id)
    except SidecarFailure:
        return None
    if lookup.record is None:
        return None
    return Attached(replica, client, assignment, lookup.record)


# --- kopf registration -----------------------------------------------------------------------
def is_live(status: Mapping[str, Any] | None, **_: Any) -> bool:
    """Only non-terminal CrewJobs get a daemon (and so a finalizer)."""
    return (status or {}).get("phase") not in {p.value for p in outcome.TERMINAL_PHASES}


# uids of CrewJobs with a daemon in this process (kept after a deletion stop, until the
# deletion handler has seen it).
_daemon_uids: set[str] = set()


async def _wait_stopped(stopped: kopf.DaemonStopped) -> None:
    await stopped.wait()


# No forced cancellation: the daemon exits by itself (at once when the operator stops; after a
# bounded cancel wait when the CrewJob is deleted), and kopf re-checks every second.
@kopf.daemon(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id=DAEMON_ID, when=is_live,
             cancellation_polling=1.0)
async def crewjob_daemon(stopped: kopf.DaemonStopped, body: kopf.Body, **_: Any) -> None:
    uid = str(body["metadata"]["uid"])
    _daemon_uids.add(uid)  # the deletion handler leaves a deletion to this daemon
    deleted = False
    runner = JobRunner(body)
    work = asyncio.create_task(runner.run(), name=f"crewjob {runner.namespace}/{runner.name}")
    stop = asyncio.create_task(_wait_stopped(stopped))
    try:
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            with contextlib.suppress(ObjectGone):
                work.result()
            return
        reason = stopped.reason or kopf.DaemonStoppingReason.DONE
        if reason == kopf.DaemonStoppingReason.FILTERS_MISMATCH:
            # Our own terminal write made the filter stop us: let the last steps finish.
            with contextlib.suppress(ObjectGone, TimeoutError):
                await asyncio.wait_for(asyncio.shield(work), 10.0)
            return
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, ObjectGone, Exception):
            await work
        if reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
            deleted = True
            await cancel_on_deletion(runner)
    finally:
        stop.cancel()
        if not work.done():
            work.cancel()
        if not deleted:
            _daemon_uids.discard(uid)


# kopf starts no daemon for an object that is already being deleted, so a CrewJob deleted
# while the operator was down would lose its finalizer without the cancel that
# deletionPolicy Cancel promises. This handler covers exactly that case; when a daemon of this
# process runs for the CrewJob, kopf stops it on deletion and the daemon does the cancel.
@kopf.on.delete(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id="crewjob-deletion", when=is_live)
async def crewjob_deleted(body: kopf.Body, **_: Any) -> None:
    uid = str(body["metadata"]["uid"])
    if uid in _daemon_uids:
        _daemon_uids.discard(uid)
        return
    runner = JobRunner(body)
    try:
        runner.spec = JobSpec.from_resource(runner.namespace, runner.name,
                                            body.get("spec") or {})
    except SpecError:
        return  # never admitted: nothing to cancel
    await cancel_on_deletion(runner)


# The phase gauge, kept from the watch stream itself (no API calls, no writes).
_phases: dict[tuple[str, str], str] = {}


@kopf.on.event(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id="crewjob-phases")
async def crewjob_phase_tracker(event: Mapping[str, Any], **_: Any) -> None:
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    key = (str(meta.get("namespace")), str(meta.get("name")))
    old = _phases.get(key)
    status = obj.get("status") or {}
    new = None if event.get("type") == "DELETED" else str(status.get("phase") or
                                                          Phase.PENDING.value)
    if new is not None and is_terminal_and_behind(obj):
        await acknowledge_late_spec_change(obj)
    if old == new:
        return
    if new is None:
        _phases.pop(key, None)
    else:
        _phases[key] = new
    metrics.observe_crewjob_phase_change(old, new)


def is_terminal_and_behind(obj: Mapping[str, Any]) -> bool:
    """A finished CrewJob whose spec changed since (only `cancel` can): kstatus readers wait
    for observedGeneration, so it must catch up even though no daemon runs any more."""
    status = obj.get("status") or {}
    meta = obj.get("metadata") or {}
    return (not is_live(status) and meta.get("deletionTimestamp") is None
            and int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0))


async def acknowledge_late_spec_change(obj: Mapping[str, Any]) -> None:
    meta, status = obj["metadata"], dict(obj.get("status") or {})
    generation = int(meta["generation"])
    patch: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": [{**cond, "observedGeneration": generation}
                       for cond in status.get("conditions") or []],
    }
    if (obj.get("spec") or {}).get("cancel") and not (status.get("cancellation") or {}).get(
            "requested"):
        patch["cancellation"] = Cancellation(
            requested=True, message="the job had already ended; nothing was cancelled").to_status()
    try:
        await asyncio.to_thread(_patch_status_blocking, meta["namespace"], meta["name"], patch)
    except ApiException as exc:
        if exc.status != 404:
            raise


@kopf.on.cleanup()
async def crewjob_cleanup(**_: Any) -> None:
    await close_sessions()
