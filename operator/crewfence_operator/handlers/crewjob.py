"""kopf glue for CrewJob: registrations, and the I/O that carries out the machine's steps.

Every decision is made by the pure state machine in ``crewjob/machine.py`` (its docstring names
the invariants); this module only observes (the CrewJob, its Crew, the sidecar's answers),
writes the status patch a decision carries (before the step: so the intended assignment is in
status before the admission leaves), and carries the step out. One async daemon per
non-terminal CrewJob drives it; after an operator restart a new daemon starts from the status.

Per-operator state (the HTTP session, the short Crew cache, the sidecar answers per job, which
jobs have a daemon) lives in kopf's ``memo`` as one ``runtime.Runtime``, never in module
globals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import kopf
from crewfence_sidecar import contract

from crewfence_operator import constants as c
from crewfence_operator import metrics
from crewfence_operator.crewjob import machine, outcome
from crewfence_operator.crewjob.effects import EffectLog
from crewfence_operator.crewjob.machine import (
    NO_HOLD,
    OPEN_GATE,
    Admit,
    Cancel,
    CrewView,
    Decision,
    Finish,
    Follow,
    Lookup_,
    Memory,
    Observation,
    Probe,
    ReadEffects,
    Release,
    StreamEnded,
    Wait,
)
from crewfence_operator.crewjob.outcome import Phase
from crewfence_operator.crewjob.output import CONFIGMAP_KEY, foreign_configmap_note
from crewfence_operator.crewjob.replicas import Replica, parse_replicas
from crewfence_operator.crewjob.spec import JobSpec, SpecError
from crewfence_operator.crewjob.status import (
    Cancellation,
    Progress,
    now_iso,
    restamped_conditions,
)
from crewfence_operator.runtime import KubeIO, ObjectGone, Runtime, runtime_of
from crewfence_operator.sidecar_client import (
    Endpoint,
    Lookup,
    SidecarClient,
    SidecarFailure,
)

log = logging.getLogger(__name__)
DAEMON_ID = "crewjob"


# --- the driver ----------------------------------------------------------------------------------
def configmap_body(body: Mapping[str, Any], name: str, value: str) -> dict[str, Any]:
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


def without_configmap(patch: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The terminal patch when a foreign ConfigMap holds the output's name: no pointer to it,
    and a note saying why the full output is not stored."""
    output = {k: v for k, v in (patch.get("output") or {}).items() if k != "configMap"}
    output["configMap"] = None
    output["configMapError"] = foreign_configmap_note(name)
    return {**patch, "output": output}


def merge_status(status: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge of a status patch (what the API server does; null deletes)."""
    out = dict(status)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            current = out.get(key)
            out[key] = merge_status(current if isinstance(current, Mapping) else {}, value)
        else:
            out[key] = value
    return out


class JobDriver:
    """Carries out the machine's steps for one CrewJob.

    The status the machine sees is the one this driver last wrote (the API server's answer to
    the write), never an older copy from the watch: so an assignment, once written, is seen by
    every later decision (I1 in ``crewjob/machine.py``).
    """

    def __init__(self, body: Mapping[str, Any], runtime: Runtime) -> None:
        self.body = body
        self.rt = runtime
        self.settings = runtime.settings
        meta = body["metadata"]
        self.namespace = str(meta["namespace"])
        self.name = str(meta["name"])
        self.uid = str(meta.get("uid") or f"{self.namespace}/{self.name}")
        self.status: dict[str, Any] = dict(body.get("status") or {})
        self.spec: JobSpec | SpecError = self._parse_spec()
        memory = runtime.memories.get(self.uid)
        if memory is None:
            memory = Memory(cursor=int(self.status.get("eventCursor") or 0),
                            progress=Progress.from_status(self.status.get("progress")))
        self.memory = memory
        self.done = False
        self._progress_clock: float | None = None
        """Starts at the first event after ``started`` (the job is executing, not queued)."""
        self._written_cursor = self.memory.cursor
        self._wake = asyncio.Event()

    def _parse_spec(self) -> JobSpec | SpecError:
        try:
            return JobSpec.from_resource(self.namespace, self.name, self.body.get("spec") or {})
        except SpecError as exc:
            return exc

    @property
    def cancel_requested(self) -> bool:
        """spec.cancel, or an eviction seen by the Workload watch (machine I9)."""
        return bool((self.body.get("spec") or {}).get("cancel")) or \
            self.uid in self.rt.evictions

    def _remember(self, memory: Memory) -> None:
        self.memory = memory
        self.rt.memories[self.uid] = memory

    # --- observing --------------------------------------------------------------------------
    async def observe(self, *, deleting: bool) -> Observation:
        spec = self._parse_spec() if isinstance(self.spec, JobSpec) else self.spec
        self.spec = spec
        crew_view: CrewView | None = None
        if isinstance(spec, JobSpec):
            crew, token = await self.rt.io.read_crew(self.namespace, spec.crew)
            if crew is not None:
                crew_view = CrewView(tuple(parse_replicas(crew)), bool(token))
                self._token = token
        claim_exists = await self._assigned_claim_exists(crew_view)
        gate = OPEN_GATE
        if self.rt.gate is not None and not self.status.get("assignment") and not deleting:
            gate = await self.rt.gate(self.body, self.rt)
        hold = NO_HOLD
        if self.rt.hold is not None and not deleting:
            hold = await self.rt.hold(self.body, self.status)
            evicted = self.rt.evictions.get(self.uid)
            if evicted and self.status.get("assignment") and not hold.evicted:
                hold = replace(hold, evicted=evicted)  # the watch saw it first
        return Observation(
            namespace=self.namespace, name=self.name,
            generation=int(self.body["metadata"].get("generation") or 1), spec=spec,
            status=self.status, crew=crew_view, memory=self.memory, now=time.time(),
            deleting=deleting, gate=gate, hold=hold, settings=self.settings.machine,
            assigned_claim_exists=claim_exists)

    async def _assigned_claim_exists(self, crew_view: CrewView | None) -> bool | None:
        """Read the assigned claim only while the Crew does not serve it (machine I4)."""
        claim = (self.status.get("assignment") or {}).get("claim")
        if not claim or (crew_view is not None
                         and any(r.claim == claim for r in crew_view.replicas)):
            return None
        return await self.rt.io.claim_exists(self.namespace, str(claim))

    _token: str | None = None

    async def client(self, replica: Replica) -> SidecarClient:
        assert replica.address and self._token and isinstance(self.spec, JobSpec)
        options = await self.rt.io.endpoint_options(self.namespace, self.spec.crew,
                                                    replica.ordinal)
        return SidecarClient(self.rt.session(), Endpoint(replica.address, self._token,
                                                         **options), self.settings.timeouts)

    # --- the loop ---------------------------------------------------------------------------
    async def run(self, *, deleting: bool = False) -> None:
        """Decide and carry out until the job is finished (or, deleting, released)."""
        self.rt.wakers[self.uid] = self._wake
        try:
            while not self.done:
                decision = machine.decide(await self.observe(deleting=deleting))
                await self.carry_out(decision)
        finally:
            if self.rt.wakers.get(self.uid) is self._wake:
                del self.rt.wakers[self.uid]

    async def carry_out(self, decision: Decision) -> None:
        self._remember(decision.memory)
        if decision.warning is not None:
            if decision.warning.uncertain_reason:
                metrics.observe_uncertain_outcome(decision.warning.uncertain_reason)
            self.rt.io.warn(self.body, decision.warning.reason, decision.warning.message)
        step = decision.step
        patch = decision.patch
        if isinstance(step, Finish) and step.output is not None and step.configmap:
            stored = await self.rt.io.create_configmap(
                configmap_body(self.body, step.configmap, step.output.configmap_value))
            if not stored and patch is not None:
                patch = without_configmap(patch, step.configmap)
        if patch is not None:
            await self.write(patch)
        if isinstance(step, Finish) and step.counts_effects and step.effects is not None \
                and isinstance(self.spec, JobSpec):
            # Counted once, with the terminal write and before any other await: the write
            # makes the job not live, and the daemon kopf then stops may be cancelled while
            # the mark below still waits for its sidecar. A terminal status is never finished
            # again (machine.decide releases it), and a re-applied CrewJob finds its record
            # marked recorded (machine I10), so the count is not repeated either.
            metrics.observe_job_effects(self.namespace, self.spec.crew, step.effects)
        if isinstance(step, Finish) and step.mark_on is not None:
            await self._mark_recorded(step.mark_on)
        if isinstance(step, Finish):
            self.done = True
            log.info("crewjob %s/%s: %s (%s)%s", self.namespace, self.name,
                     step.verdict.phase.value, step.verdict.reason.value,
                     " uncertain" if step.verdict.uncertain else "")
        elif isinstance(step, Release):
            self.done = True
        elif isinstance(step, Wait):
            await self.pause(step.seconds)
            self._remember(self.memory.fresh_round())
        elif isinstance(step, Probe):
            answers = await asyncio.gather(*(self._get(r) for r in step.replicas))
            probes = dict(self.memory.probes)
            probes.update({r.ordinal: a for r, a in zip(step.replicas, answers, strict=True)})
            self._remember(replace(self.memory, probes=probes))
        elif isinstance(step, Lookup_):
            self._remember(replace(self.memory, lookup=await self._get(step.replica)))
        elif isinstance(step, Admit):
            await self._admit(step)
        elif isinstance(step, Cancel):
            await self._cancel(step)
        elif isinstance(step, Follow):
            await self._follow(step)
        elif isinstance(step, ReadEffects):
            await self._read_effects(step)

    async def write(self, patch: Mapping[str, Any]) -> None:
        written = await self.rt.io.patch_status(self.namespace, self.name, patch)
        self.status = dict(written) if written is not None else merge_status(self.status, patch)
        log.info("crewjob %s/%s: %s (%s) %s", self.namespace, self.name,
                 self.status.get("phase"), self.status.get("reason"),
                 self.status.get("message"))

    async def pause(self, seconds: float) -> None:
        """Wait before looking again; returns early when spec.cancel turns true.

        Invariant (a waiting CrewJob costs nothing per second): the driver sleeps on its
        waker, set by a watch event of this CrewJob (kopf has updated ``self.body`` by then)
        or an eviction (``Runtime.wake``), never on a short poll: with thousands of CrewJobs
        live, a poll per job per quarter second was most of the operator's CPU."""
        deadline = time.monotonic() + seconds
        was_cancelled = self.cancel_requested
        while (remaining := deadline - time.monotonic()) > 0:
            if await self._woken(remaining) and self.cancel_requested and not was_cancelled:
                return

    async def _woken(self, seconds: float) -> bool:
        """Wait for the waker (True) or ``seconds`` (False); the waker is cleared first."""
        self._wake.clear()
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except TimeoutError:
            return False
        return True

    # --- sidecar calls ----------------------------------------------------------------------
    async def _get(self, replica: Replica) -> Lookup | SidecarFailure:
        assert isinstance(self.spec, JobSpec)
        try:
            return await (await self.client(replica)).get_job(self.spec.action_id)
        except SidecarFailure as exc:
            metrics.observe_sidecar_failure(exc.category.value)
            return exc

    async def _mark_recorded(self, replica: Replica) -> None:
        """Best effort: an unmarked record is only archived a day later than marked ones."""
        if not replica.address or not self._token or not isinstance(self.spec, JobSpec):
            return
        try:
            await (await self.client(replica)).mark_recorded(self.spec.crew,
                                                             self.spec.action_id)
        except SidecarFailure as exc:
            log.info("crewjob %s/%s: could not mark the record recorded on replica %s: %s",
                     self.namespace, self.name, replica.label, exc)

    async def _admit(self, step: Admit) -> None:
        assert isinstance(self.spec, JobSpec)
        client = await self.client(step.replica)
        try:
            admission = await client.start(self.spec.start_request(), self.spec.idempotency_key,
                                           step.journal_id)
        except SidecarFailure as exc:
            metrics.observe_sidecar_failure(exc.category.value)
            self._remember(replace(self.memory, admission=exc))
            return
        metrics.observe_admission_seconds(admission.seconds)
        self._remember(replace(self.memory, admission=admission))

    async def _cancel(self, step: Cancel) -> None:
        assert isinstance(self.spec, JobSpec)
        client = await self.client(step.replica)
        try:
            record = await client.cancel(self.spec.crew, self.spec.action_id, reason=step.reason)
        except SidecarFailure as exc:
            metrics.observe_sidecar_failure(exc.category.value)
            self._remember(replace(self.memory, cancel=exc))
            return
        self._remember(replace(self.memory, cancel=record))

    async def _follow(self, step: Follow) -> None:
        """Read events until the stream ends; stop early when spec.cancel turns true."""
        before = self.memory.cursor
        task = asyncio.create_task(self._read_stream(step.replica))
        result: StreamEnded | SidecarFailure = StreamEnded()
        try:
            while not task.done():
                self._wake.clear()
                if self.cancel_requested and not self.memory.cancel_confirmed:
                    break
                woken = asyncio.create_task(self._wake.wait())
                try:
                    await asyncio.wait({task, woken}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
            if task.done():
                task.result()
        except SidecarFailure as exc:
            metrics.observe_sidecar_failure(exc.category.value)
            result = exc
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, SidecarFailure):
                    await task
        if (isinstance(result, StreamEnded) and self.memory.cursor == before
                and not self.cancel_requested):
            await self.pause(self.settings.idle_follow_seconds)
        self._remember(replace(self.memory, stream=result))

    async def _read_stream(self, replica: Replica) -> None:
        assert isinstance(self.spec, JobSpec)
        progress = self.memory.progress
        client = await self.client(replica)
        async for event in client.follow(self.spec.action_id, self.memory.cursor):
            self._remember(replace(self.memory, cursor=event.sequence + 1))
            self.memory.effects.observe(event)
            progress.events += 1
            progress.last_event = event.event
            if event.event == contract.EventName.CHUNK:
                progress.chunks += 1
            if event.event in contract.TERMINAL_EVENTS:
                return
            if self._progress_clock is None:
                if event.event != contract.EventName.STARTED:
                    self._progress_clock = time.monotonic()
                continue
            await self._maybe_write_progress()

    async def _read_effects(self, step: ReadEffects) -> None:
        """The terminal record's events from 0 (its stream ends after the terminal event; at
        most the journal's events per run), for ``status.effects``. No API write."""
        assert isinstance(self.spec, JobSpec)
        effect_log = EffectLog()
        try:
            client = await self.client(step.replica)
            async for event in client.follow(self.spec.action_id, 0):
                effect_log.observe(event)
                if event.event in contract.TERMINAL_EVENTS:
                    break
        except SidecarFailure as exc:
            metrics.observe_sidecar_failure(exc.category.value)
            self._remember(replace(self.memory, effects_read=exc))
            return
        self._remember(replace(self.memory, effects_read=effect_log))

    async def _maybe_write_progress(self) -> None:
        """At most one progress write per ``progress_seconds`` of execution: a job that ends
        within that time after its first event past ``started`` costs no progress write (the
        terminal patch carries the cursor and the counts anyway)."""
        clock = self._progress_clock
        if (clock is not None and self.memory.cursor != self._written_cursor
                and time.monotonic() - clock >= self.settings.progress_seconds):
            await self.write({"eventCursor": self.memory.cursor,
                              "progress": self.memory.progress.to_status()})
            self._written_cursor = self.memory.cursor
            self._progress_clock = time.monotonic()



# --- kopf registration -----------------------------------------------------------------------
def is_live(status: Mapping[str, Any] | None, **_: Any) -> bool:
    """Only non-terminal CrewJobs get a daemon (and so a finalizer)."""
    return (status or {}).get("phase") not in {p.value for p in outcome.TERMINAL_PHASES}


async def _wait_stopped(stopped: kopf.DaemonStopped) -> None:
    await stopped.wait()


async def drive_deletion(driver: JobDriver) -> None:
    """The CrewJob is being deleted: the machine decides what the sidecar must hear (bounded by
    ``MachineSettings.deletion_wait_seconds``), then the finalizer goes."""
    driver.done = False
    with contextlib.suppress(ObjectGone):
        await driver.run(deleting=True)
    driver.rt.memories.pop(driver.uid, None)


# No forced cancellation: the daemon exits by itself (at once when the operator stops; after a
# bounded deletion step when the CrewJob is deleted), and kopf re-checks every second.
@kopf.daemon(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id=DAEMON_ID, when=is_live,
             cancellation_polling=1.0)
async def crewjob_daemon(stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo,
                         **_: Any) -> None:
    rt = runtime_of(memo)
    driver = JobDriver(body, rt)
    rt.daemon_uids.add(driver.uid)  # the deletion handler leaves a deletion to this daemon
    deleted = False
    work = asyncio.create_task(driver.run(), name=f"crewjob {driver.namespace}/{driver.name}")
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
            await drive_deletion(driver)
    finally:
        stop.cancel()
        if not work.done():
            work.cancel()
        if not deleted:
            rt.daemon_uids.discard(driver.uid)
        if driver.done:
            rt.memories.pop(driver.uid, None)


# kopf starts no daemon for an object that is already being deleted, so a CrewJob deleted
# while the operator was down would lose its finalizer without the cancel that
# deletionPolicy Cancel promises. This handler covers exactly that case; when a daemon of this
# process runs for the CrewJob, kopf stops it on deletion and the daemon does the cancel.
@kopf.on.delete(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id="crewjob-deletion", when=is_live)
async def crewjob_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rt = runtime_of(memo)
    uid = str(body["metadata"]["uid"])
    if uid in rt.daemon_uids:
        rt.daemon_uids.discard(uid)
        return
    await drive_deletion(JobDriver(body, rt))


@kopf.on.event(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id="crewjob-phases")
async def crewjob_phase_tracker(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    """The phase gauge, kept from the watch stream itself (no API calls, no writes)."""
    rt = runtime_of(memo)
    phases = rt.phases
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    rt.wake(str(meta.get("uid") or ""))  # e.g. spec.cancel: a waiting driver looks now
    key = (str(meta.get("namespace")), str(meta.get("name")))
    old = phases.get(key)
    status = obj.get("status") or {}
    new = None if event.get("type") == "DELETED" else str(status.get("phase") or
                                                          Phase.PENDING.value)
    if new is not None and is_terminal_and_behind(obj):
        await acknowledge_late_spec_change(obj)
    if old == new:
        return
    if new is None:
        phases.pop(key, None)
    else:
        phases[key] = new
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
        "conditions": restamped_conditions(
            status, generation=generation,
            cancel_requested=bool((obj.get("spec") or {}).get("cancel")), now=now_iso()),
    }
    if (obj.get("spec") or {}).get("cancel") and not (status.get("cancellation") or {}).get(
            "requested"):
        # Terminal means the sidecar's record (or a definitive refusal) decided: never while
        # the outcome could still be learned (I2), so nothing was running to cancel.
        patch["cancellation"] = Cancellation(
            requested=True, message="the job had already ended; nothing was cancelled").to_status()
    with contextlib.suppress(ObjectGone):
        await KubeIO().patch_status(meta["namespace"], meta["name"], patch)


# kopf gives every object a shallow copy of the operator-wide memo: the Runtime must be in the
# operator-wide memo before the first object is seen, so that all objects share one session,
# one Crew cache and one view of which daemons run.
@kopf.on.startup()
async def crewjob_runtime(memo: kopf.Memo, **_: Any) -> None:
    runtime_of(memo)


@kopf.on.cleanup()
async def crewjob_cleanup(memo: kopf.Memo, **_: Any) -> None:
    await runtime_of(memo).close()
