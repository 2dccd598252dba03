"""The CrewJob reconciliation as a pure state machine: what is known -> the one next step.

:func:`decide` takes an :class:`Observation` (the CrewJob's spec and status, the Crew's
replicas including draining and retained ones, the sidecar's last answers held in
:class:`Memory`, the time) and returns a :class:`Decision`: one :data:`Step`, the status patch it
implies (written BEFORE the step is carried out), the memory to keep, and an optional Warning.
``handlers/crewjob.py`` only carries steps out. Nothing here does I/O.

Invariants kept here (each is checked by ``tests/unit/operator_crewjob/test_machine*.py``):

I1  At most one admission of an action id across the Crew's life. The probe before the first
    admission asks every replica the Crew lists (active, draining, retained); a replica that
    might know and cannot answer means Wait, with a reason naming it. The intended assignment
    (ordinal, pod, claim, journal id) is in the patch of the :class:`Admit` step, so it is in
    status before the POST leaves; once assigned, an admission is only ever re-sent to that
    ordinal and journal (an exact repeat the sidecar deduplicates), never to another replica,
    except after a definitive "draining" refusal, a lookup that shows the replica does not hold
    the action and the settle window (see :class:`MachineSettings`) having passed since the
    assignment: then the assignment is cleared and the full probe runs again.
I2  Never a verdict while the outcome can still be learned. A lost admission answer or an
    unreadable stream keeps the job Running with ``OutcomeUncertain=True`` (``AnswerLost``,
    ``InvalidStream``) and the machine keeps asking the assigned replica with capped backoff.
    Only the sidecar's record, a changed journal id, or the Crew/claim being gone ends it.
I3  Cancel and deletion (``deletionPolicy: Cancel``) reach the sidecar whenever the record may be
    running: failed cancels are retried with capped backoff; a deletion with an assignment looks
    at the intended replica (through the settle window) before letting go.
I4  Only an assigned claim that is gone (or a changed journal id) loses the journal: it ends
    the job within ``gone_grace_seconds`` as ``Failed``, uncertain, ``JournalLost``, with the
    recovery text. A missing Crew object, a replica the Crew no longer lists or a renamed
    claim, while the claim itself exists (or cannot be read), means wait, with a reason that
    names it; the job continues once a Crew serves the claim again. A changed journal id is
    read from the Crew's entry for the replica (the claim its pod mounts and that pod's
    journal id) alone: an answer at the replica's address from another journal, a probe's
    included, decides nothing and is asked again (the address may reach another pod), and an
    admission names its assigned journal, so another journal admits nothing (412).
I5  Every uncertain verdict carries its reason and recovery text (``outcome.RECOVERY``), and the
    record's ``uncertain_outcome`` and error ``code`` decide verdicts
    (``outcome.verdict_from_record``).
I6  No verdict before the probe. A CrewJob's status can be new while its action is not (GitOps
    prune and re-apply): ``cancel: true`` and the admission gate are decided only after every
    replica answered that it does not know the action; one that does is attached to.
I7  A terminal record's ``status.effects`` / ``status.usage`` come only from events covering the
    record from sequence 0 without a gap (``crewjob/effects.py``): the stream the driver
    followed when it covered the record, else one :class:`ReadEffects` from 0, before the one
    terminal patch (no extra API write). An uncertain verdict names the tool calls in doubt or
    says none was in flight; after ``effects.MAX_READS`` failed reads it says they are unknown
    (``tests/unit/operator_crewjob/test_effects.py``). Its part of "an in-doubt call is always
    listed" (the invariant and its tests: ``effects.with_effects``).

I8  Retention never races the operator: a finished record is marked recorded on its replica
    only after the terminal patch (its outcome and output) was written (:attr:`Finish.mark_on`);
    the Crew's retention archives only marked records (or ones a day past the window).
I9  Held means never admitted. While :class:`Hold` holds the job (``spec.suspend``, or a Kueue
    Workload not admitted: ``handlers/kueue.py`` turns the Workload into this input), nothing
    is dispatched: phase Pending, condition ``Suspended=True``. The probe still runs first (I6:
    an action found anywhere is attached to, not admitted again). An eviction of an assigned
    job is a cancel on the sidecar (like ``spec.cancel``), reported in ``status.cancellation``;
    the job is never re-admitted under the same action id.
I10 A finished action's usage is counted once in the per-Crew counters, whatever Git does
    with its CrewJob: a finish counts its effects (:attr:`Finish.counts_effects`) only when
    its record carries no ``recorded_at``, the mark an earlier CrewJob object of the same
    action set after its own terminal patch (I8). A CrewJob deleted and re-applied (GitOps
    prune and re-sync, ``ttlSecondsAfterFinished`` and re-sync) attaches to the same finished
    record (I6) and writes its status, but adds nothing to the counters. The same mark keeps
    an uncertain outcome counted once (``uncertain_outcomes_total``); the new object still
    gets its warning event.

The admission gate: :class:`Gate` is the one place where a "wait: predecessor not resolved"
check (``spec.supersedes``) plugs in; it is consulted only before the first admission.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from crewfence_sidecar import contract
from crewfence_sidecar.contract import EffectSummary, FailureCategory, JobRecord

from crewfence_operator.assignment import choose_ordinal
from crewfence_operator.crewjob import outcome
from crewfence_operator.crewjob.effects import MAX_READS, EffectLog, usage_status, with_effects
from crewfence_operator.crewjob.outcome import TERMINAL_PHASES, Phase, Reason, Verdict
from crewfence_operator.crewjob.output import BoundedOutput, bound_output, configmap_name
from crewfence_operator.crewjob.replicas import Replica, ReplicaState, journal_changed
from crewfence_operator.crewjob.spec import DeletionPolicy, JobSpec, SpecError
from crewfence_operator.crewjob.status import (
    Assignment,
    Cancellation,
    Progress,
    StatusContext,
    terminal_patch,
    working_patch,
)
from crewfence_operator.sidecar_client import Admission, Lookup, SidecarFailure

NOT_ADMITTED_STATUSES: Final = frozenset({429, 507})
"""Answers that promise nothing was scheduled (back-pressure, journal full)."""


# --- inputs --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MachineSettings:
    retry_seconds: float = 3.0
    """Pause before looking again while Pending (no Crew, replicas not answering, ...)."""
    backoff_base_seconds: float = 1.0
    backoff_cap_seconds: float = 30.0
    """Capped exponential backoff for asking the assigned replica and for retrying cancels."""
    poll_seconds: float = 2.0
    """Record polling interval once the event stream proved unreadable."""
    settle_seconds: float = 30.0
    """After the assignment was written, how long an admission POST may still land on the
    sidecar (it persists before answering within milliseconds; the client gives up after
    connect + read timeouts of 18 s). A lookup that finds nothing after this window proves the
    action was never admitted there."""
    gone_grace_seconds: float = 15.0
    """How long a missing Crew or assigned claim is tolerated before JournalLost (a bound)."""
    deletion_wait_seconds: float = 30.0
    """With deletionPolicy Cancel: how long a deletion waits for the sidecar's answer."""
    full_retry_seconds: float = 60.0
    """How long a replica whose journal answered 507 (full) is passed over for this job."""

    def backoff(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return float(min(self.backoff_cap_seconds,
                         self.backoff_base_seconds * 2 ** min(failures - 1, 16)))


@dataclass(frozen=True)
class Gate:
    """May this job be admitted at all yet? (``spec.supersedes`` plugs in here.)"""

    open: bool = True
    reason: str = Reason.PREDECESSOR_UNRESOLVED.value
    """The Pending reason while closed."""
    message: str = ""
    refusal: Verdict | None = None
    """Set when the job may never be admitted: it finishes with this verdict."""
    pin_ordinal: int | None = None
    """``spec.resume``: admit only on this replica (the predecessor's, whose journal holds the
    trajectory the job continues); Pending with reason PredecessorReplicaUnavailable while it
    cannot serve."""
    pin_journal: str | None = None
    """The predecessor's journal id there; another journal id means that journal is gone."""


OPEN_GATE: Final = Gate()


class HoldReason:
    SUSPENDED = "Suspended"
    """``spec.suspend: true``."""
    WAITING_FOR_WORKLOAD = "WaitingForWorkload"
    """Labelled for a Kueue queue: its Workload is missing or not admitted."""


@dataclass(frozen=True)
class Hold:
    """Whether the job is held back from admission, and whether a queue evicted it."""

    held: bool = False
    reason: str = HoldReason.SUSPENDED
    message: str = ""
    evicted: str | None = None
    """A queue's eviction message: an assigned job is cancelled on the sidecar (I9)."""
    queued: bool = False
    """The job is managed by a queue (it had or has a Workload): ``Suspended`` is shown."""


NO_HOLD: Final = Hold()


@dataclass(frozen=True)
class CrewView:
    """The Crew as the machine needs it: every replica that may hold a journal."""

    replicas: tuple[Replica, ...]
    has_token: bool

    def replica(self, ordinal: int) -> Replica | None:
        return next((r for r in self.replicas if r.ordinal == ordinal), None)


ProbeAnswer = Lookup | SidecarFailure


@dataclass(frozen=True)
class StreamEnded:
    """The event stream closed (a terminal event read, or the sidecar closed it)."""


@dataclass(frozen=True)
class Memory:
    """The sidecar's last answers and a few clocks: per operator process (kopf memo).

    Losing it (operator restart) is always safe: the machine then asks again.
    """

    probes: Mapping[int, ProbeAnswer] = field(default_factory=dict)
    lookup: Lookup | SidecarFailure | None = None
    """The last GET at the assigned replica, this round."""
    admission: Admission | SidecarFailure | None = None
    cancel: JobRecord | SidecarFailure | None = None
    stream: StreamEnded | SidecarFailure | None = None
    failures: int = 0
    """Consecutive failed contacts with the assigned replica (backoff)."""
    cancel_failures: int = 0
    cancel_confirmed: bool = False
    admitted: bool = False
    """This process saw a record of the action on the assigned replica."""
    stream_invalid: bool = False
    gone_since: float | None = None
    deletion_since: float | None = None
    cursor: int = 0
    progress: Progress = field(default_factory=Progress)
    effects: EffectLog = field(default_factory=EffectLog)
    """Effect events followed from the stream (usable only if they cover the record)."""
    effects_read: EffectLog | SidecarFailure | None = None
    """The answer to :class:`ReadEffects` (the record's events read again from 0)."""
    effects_failures: int = 0

    def fresh_round(self) -> Memory:
        """After a wait: probe and lookup answers are stale."""
        return replace(self, probes={}, lookup=None)


@dataclass(frozen=True)
class Observation:
    namespace: str
    name: str
    generation: int
    spec: JobSpec | SpecError
    status: Mapping[str, Any]
    crew: CrewView | None
    """None when the Crew does not exist."""
    memory: Memory
    now: float
    """Epoch seconds."""
    deleting: bool = False
    gate: Gate = OPEN_GATE
    hold: Hold = NO_HOLD
    settings: MachineSettings = field(default_factory=MachineSettings)
    assigned_claim_exists: bool | None = None
    """Whether the assigned state claim object exists, read only while the Crew does not list
    it (deleted Crew, removed replica, renamed claim); None: not read, or unreadable."""


# --- steps ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """GET the action on each of these replicas (before the first admission)."""

    replicas: tuple[Replica, ...]


@dataclass(frozen=True)
class Lookup_:
    """GET the action on the assigned replica."""

    replica: Replica


@dataclass(frozen=True)
class Admit:
    """POST the admission to this replica (its assignment is already in status)."""

    replica: Replica
    journal_id: str | None = None
    """The assigned journal: a sidecar serving another one admits nothing (412)."""


@dataclass(frozen=True)
class Follow:
    """Read the event stream from ``Memory.cursor`` until it ends."""

    replica: Replica


@dataclass(frozen=True)
class ReadEffects:
    """Read the (terminal) record's events from sequence 0 to summarize its effects."""

    replica: Replica


@dataclass(frozen=True)
class Cancel:
    """POST the cancel route on the assigned replica (idempotent)."""

    replica: Replica
    reason: str


@dataclass(frozen=True)
class Wait:
    seconds: float
    reason: str


@dataclass(frozen=True)
class Finish:
    verdict: Verdict
    record: JobRecord | None
    output: BoundedOutput | None
    configmap: str | None
    effects: EffectSummary | None = None
    """The record's effect summary (``status.effects``; the per-Crew counters)."""
    mark_on: Replica | None = None
    """Once the patch is written, tell this replica the outcome is recorded (its record may
    then be archived by retention: machine I8)."""

    @property
    def counts_effects(self) -> bool:
        """Whether this finish adds its effects to the per-Crew counters (I10): not when
        the record was marked recorded already, by an earlier CrewJob object of its action."""
        return self.effects is not None and (self.record is None
                                             or self.record.recorded_at is None)


@dataclass(frozen=True)
class Release:
    """Deletion handled: let kopf remove the finalizer."""


Step = Probe | Lookup_ | Admit | Follow | ReadEffects | Cancel | Wait | Finish | Release


@dataclass(frozen=True)
class Warning_:
    reason: str
    message: str
    uncertain_reason: str | None = None
    """Set when this Warning is an uncertain outcome (the metric counts it)."""


@dataclass(frozen=True)
class Decision:
    step: Step
    patch: dict[str, Any] | None
    memory: Memory
    warning: Warning_ | None = None


# --- the status as the machine reads it -----------------------------------------------------------
@dataclass(frozen=True)
class Known:
    phase: Phase | None
    reason: str | None
    message: str | None
    uncertain: bool
    assignment: Assignment | None
    assigned_at: float | None
    cancellation: Cancellation
    started: bool
    full: Mapping[int, tuple[str | None, float]] = field(default_factory=dict)
    """``status.journalFull``: ordinal -> (journal id, when) of replicas that answered 507."""

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> Known:
        raw_phase = status.get("phase")
        try:
            phase = Phase(str(raw_phase)) if raw_phase else None
        except ValueError:
            phase = None
        raw_assignment = status.get("assignment") or {}
        return cls(phase=phase, reason=status.get("reason"), message=status.get("message"),
                   uncertain=bool(status.get("uncertainOutcome")),
                   assignment=Assignment.from_status(raw_assignment),
                   assigned_at=parse_time(raw_assignment.get("assignedAt")),
                   cancellation=Cancellation.from_status(status.get("cancellation")),
                   started=bool(status.get("startedAt")),
                   full=_full_journals(status.get("journalFull")))


def _full_journals(raw: object) -> dict[int, tuple[str | None, float]]:
    out: dict[int, tuple[str | None, float]] = {}
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("ordinal"), int):
            at = parse_time(entry.get("at"))
            out[int(entry["ordinal"])] = (entry.get("journalId"), at or 0.0)
    return out


def parse_time(raw: object) -> float | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.strptime(raw, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the machine ---------------------------------------------------------------------------------
class _Ctx:
    """One decision's inputs plus the helpers that turn a verdict or a wait into a patch."""

    def __init__(self, obs: Observation) -> None:
        self.obs = obs
        self.known = Known.from_status(obs.status)
        self.settings = obs.settings
        self.mem = obs.memory

    @property
    def spec(self) -> JobSpec:
        assert isinstance(self.obs.spec, JobSpec)
        return self.obs.spec

    def _status_ctx(self) -> StatusContext:
        action_id = (self.obs.spec.action_id if isinstance(self.obs.spec, JobSpec)
                     else f"{self.obs.namespace}/{self.obs.name}")
        cancel = isinstance(self.obs.spec, JobSpec) and self.obs.spec.cancel
        return StatusContext(generation=self.obs.generation, action_id=action_id,
                             previous_conditions=list(self.obs.status.get("conditions") or []),
                             cancel_requested=cancel,
                             extra_conditions=self.suspended_condition())

    def suspended_condition(self) -> tuple[dict[str, str], ...]:
        """I9: ``Suspended`` while held before admission; once shown, it stays (False)."""
        hold = self.obs.hold
        shown = hold.queued or any(c.get("type") == "Suspended"
                                   for c in self.obs.status.get("conditions") or [])
        if hold.held and self.known.assignment is None:
            return ({"type": "Suspended", "status": "True", "reason": hold.reason,
                     "message": hold.message},)
        if hold.evicted:
            return ({"type": "Suspended", "status": "False", "reason": "Evicted",
                     "message": hold.evicted},)
        if shown:
            return ({"type": "Suspended", "status": "False", "reason": "Admitted",
                     "message": "admitted: no longer held"},)
        return ()

    @property
    def stop_wanted(self) -> bool:
        """``spec.cancel``, or a queue's eviction (I9): the sidecar must hear a cancel."""
        return (isinstance(self.obs.spec, JobSpec) and self.obs.spec.cancel) \
            or bool(self.obs.hold.evicted)

    def decision(self, step: Step, patch: dict[str, Any] | None = None,
                 warning: Warning_ | None = None, **memory: Any) -> Decision:
        return Decision(step, patch, replace(self.mem, **memory), warning)

    # --- working (Pending/Running) ----------------------------------------------------------
    def working(self, phase: Phase, reason: Reason | str, message: str, *,
                uncertain: Reason | None = None, extra: Mapping[str, Any] | None = None,
                keep_uncertain: bool = True) -> dict[str, Any] | None:
        """A working patch, or None when a reader would see nothing new (no API write).

        An uncertainty already in status stays (``keep_uncertain``) until a record decides.
        """
        reason = str(reason)
        if uncertain is None and keep_uncertain and self.known.uncertain:
            prior = self.obs.status.get("conditions") or []
            cond = next((c for c in prior if c.get("type") == "OutcomeUncertain"), None)
            try:
                uncertain = Reason(str((cond or {}).get("reason") or Reason.ANSWER_LOST))
            except ValueError:
                uncertain = Reason.ANSWER_LOST
        if (not extra and self.known.phase is phase and self.known.reason == reason
                and self.known.message == message and self.known.uncertain == bool(uncertain)
                and self.obs.generation == int(self.obs.status.get("observedGeneration") or 0)):
            return None
        patch = working_patch(self._status_ctx(), phase, reason, message, now=iso(self.obs.now),
                              uncertain_reason=uncertain.value if uncertain else None,
                              extra=extra)
        if uncertain is not None:
            patch["recovery"] = outcome.RECOVERY[uncertain]
        elif self.known.uncertain:
            patch["uncertainOutcome"] = False
            patch["recovery"] = None
        return patch

    def wait(self, seconds: float, phase: Phase, reason: Reason | str, message: str, *,
             uncertain: Reason | None = None, warning: Warning_ | None = None,
             keep_uncertain: bool = True, **memory: Any) -> Decision:
        patch = None if self.obs.deleting else self.working(
            phase, reason, message, uncertain=uncertain, keep_uncertain=keep_uncertain)
        return self.decision(Wait(seconds, str(reason)), patch, warning, **memory)

    # --- terminal ---------------------------------------------------------------------------
    def finish(self, verdict: Verdict, record: JobRecord | None = None,
               assignment: Assignment | None = None,
               effects: EffectSummary | None = None) -> Decision:
        """The terminal patch: one write carrying the verdict, output and effects."""
        partial = False
        if effects is None and record is None and verdict.uncertain \
                and not self.mem.effects.broken and self.mem.effects.next_sequence > 0:
            # No record to read (e.g. the journal is gone): what the stream showed is evidence.
            effects, partial = self.mem.effects.summary(), True
        verdict = with_effects(verdict, effects, partial=partial)
        output = bound_output(record.output) if record is not None else None
        # The full text goes to a ConfigMap only when status cannot hold it (output.py).
        cm = configmap_name(self.obs.name) if output is not None and output.needs_configmap \
            else None
        extra: dict[str, Any] = {"eventCursor": self.mem.cursor,
                                 "progress": self.mem.progress.to_status()}
        cancellation = self.cancellation_now()
        if record is not None and record.work_stopped:
            cancellation.work_stopped = True
            cancellation.stopped_at = record.stopped_at
        if cancellation.requested or cancellation.work_stopped:
            extra["cancellation"] = cancellation.to_status()
        chosen = assignment or self.known.assignment
        if chosen is not None:
            extra["assignment"] = self.assignment_status(chosen)
        if isinstance(self.obs.spec, JobSpec) and record is None:
            extra["requestHash"] = self.spec.request_hash()
        if effects is not None:
            extra["effects"] = effects.to_status()
            extra["usage"] = usage_status(effects)
        patch = terminal_patch(self._status_ctx(), verdict, now=iso(self.obs.now), record=record,
                               output=output, configmap=cm, extra=extra)
        warning = None
        if verdict.uncertain:
            # I10: the new object of a re-applied CrewJob warns too, but the outcome became
            # uncertain once: only a record no earlier object recorded counts in the metric
            first = record is None or record.recorded_at is None
            warning = Warning_(f"OutcomeUncertain{verdict.reason.value}",
                               f"{verdict.message}. {verdict.recovery}"[:1000],
                               verdict.reason.value if first else None)
        mark_on = None
        if record is not None and record.terminal and chosen is not None \
                and self.obs.crew is not None:
            mark_on = self.obs.crew.replica(chosen.ordinal)
        return self.decision(Finish(verdict, record, output, cm, effects, mark_on), patch,
                             warning)

    def cancellation_now(self) -> Cancellation:
        c = Cancellation.from_status(self.obs.status.get("cancellation"))
        if self.stop_wanted:
            c.requested = True
        if self.mem.cancel_confirmed:
            c.dispatched = True
            c.remote_stop_confirmed = True
            c.message = ("the sidecar's cancel route answered success; this is not proof that "
                         "the provider stopped")
        evicted = self.obs.hold.evicted
        if evicted and not (isinstance(self.obs.spec, JobSpec) and self.obs.spec.cancel):
            # I9: say who asked for the cancel (its queue), whatever the sidecar answered.
            note = f"evicted by its queue ({evicted})"
            message = c.message or ""
            if not message.startswith("evicted by its queue"):
                message = f"{note}; {message}" if message else note
            c.message = message[:1024]
        return c

    def assignment_status(self, a: Assignment) -> dict[str, Any]:
        out = a.to_status()
        raw = self.obs.status.get("assignment") or {}
        if raw.get("assignedAt") and Assignment.from_status(raw) == a:
            out["assignedAt"] = raw["assignedAt"]
        return out


def decide(obs: Observation) -> Decision:
    """The one next step for a CrewJob, and the status patch to write before taking it."""
    ctx = _Ctx(obs)
    if ctx.known.phase in TERMINAL_PHASES:
        return ctx.decision(Release())
    if isinstance(obs.spec, SpecError):
        if obs.deleting:
            return ctx.decision(Release())
        return ctx.finish(outcome.invalid_spec(obs.spec.code, obs.spec.message))
    if obs.deleting:
        return _deleting(ctx)
    if ctx.known.assignment is None:
        return _before_admission(ctx)
    return _assigned(ctx, ctx.known.assignment)


# --- before the first admission ---------------------------------------------------------------
def _before_admission(ctx: _Ctx) -> Decision:
    """I1: nothing was ever sent from this object's status (the assignment is written before
    any POST). I6: the status may be new while the action is not (a deleted and re-applied
    manifest), so no verdict is written before the probe says where the action lives: a
    ``cancel: true`` finishes "nothing was dispatched" and the gate (``spec.supersedes``)
    decides only once every replica answered that it does not know the action; an action
    found anywhere is attached to (and cancelled there, when asked)."""
    obs, spec, s = ctx.obs, ctx.spec, ctx.settings
    crew = obs.crew
    if crew is None:
        return ctx.wait(s.retry_seconds, Phase.PENDING, Reason.CREW_NOT_FOUND,
                        f"Crew {spec.crew!r} not found in {obs.namespace}")
    if not crew.has_token or not crew.replicas:
        return ctx.wait(s.retry_seconds, Phase.PENDING, Reason.WAITING_FOR_REPLICAS,
                        f"Crew {spec.crew!r} has no replicas with a token yet")
    probes = ctx.mem.probes
    unasked = tuple(r for r in crew.replicas if r.can_answer and r.ordinal not in probes)
    if unasked:
        return ctx.decision(Probe(unasked))
    known = [(r, a) for r in crew.replicas
             if isinstance(a := probes.get(r.ordinal), Lookup) and a.known
             and _probe_agrees(r, a)]
    if known:
        known.sort(key=lambda ra: (ra[1].record is None, ra[0].ordinal))
        return _attach_found(ctx, *known[0])
    silent = [r for r in crew.replicas if not _probe_agrees(r, probes.get(r.ordinal))]
    if silent:
        names = ", ".join(_silent_label(r, probes.get(r.ordinal)) for r in silent)
        # a probe answered from another journal is asked again (the Crew's entry may move)
        kept = {o: a for o, a in probes.items()
                if not (isinstance(a, Lookup) and not _probe_agrees(crew.replica(o), a))}
        return ctx.wait(s.retry_seconds, Phase.PENDING, Reason.WAITING_FOR_REPLICAS,
                        f"replica(s) {names} of Crew {spec.crew!r} may hold this action's journal "
                        "and cannot answer; waiting before any admission", probes=kept)
    if spec.cancel:
        return ctx.finish(outcome.cancelled_before_admission())
    if obs.gate.refusal is not None:
        return ctx.finish(obs.gate.refusal)
    if not obs.gate.open:
        return ctx.wait(s.retry_seconds, Phase.PENDING, obs.gate.reason, obs.gate.message)
    if obs.hold.held:  # I9
        return ctx.wait(s.retry_seconds, Phase.PENDING, obs.hold.reason,
                        obs.hold.message or "held: nothing is admitted")
    # every probe answered from the journal its entry lists (``_probe_agrees``, above)
    journals = {r.ordinal: r.journal_id for r in crew.replicas}
    full = _still_full(ctx, journals)
    eligible = [r for r in crew.replicas
                if r.state is ReplicaState.ACTIVE and r.ready and not r.fenced and r.address
                and journals[r.ordinal] and r.ordinal not in full]
    if obs.gate.pin_ordinal is not None:
        pinned = _pinned(ctx, eligible, journals)
        if not isinstance(pinned, list):
            return pinned
        eligible = pinned
    ordinal = choose_ordinal(spec.action_id, [r.ordinal for r in eligible])
    if ordinal is None and full:
        return ctx.wait(s.retry_seconds, Phase.PENDING, Reason.JOURNAL_FULL,
                        f"the journal of every eligible replica of Crew {spec.crew!r} is full "
                        f"(replica(s) {', '.join(map(str, sorted(full)))} answered 507); "
                        f"nothing was admitted. {outcome.RECOVERY['journal_full']}")
    if ordinal is None:
        return ctx.wait(s.retry_seconds, Phase.PENDING, Reason.NO_ELIGIBLE_REPLICA,
                        f"no ready, unfenced, active replica of Crew {spec.crew!r} with a known "
                        "journal id")
    replica = next(r for r in eligible if r.ordinal == ordinal)
    assignment = Assignment(replica.ordinal, replica.pod, replica.claim, journals[ordinal])
    extra = {"assignment": {**assignment.to_status(), "assignedAt": iso(obs.now)},
             "requestHash": spec.request_hash(), "eventCursor": ctx.mem.cursor,
             "progress": ctx.mem.progress.to_status()}
    patch = ctx.working(Phase.RUNNING, Reason.DISPATCHED,
                        f"dispatched to replica {replica.label}", extra=extra)
    return ctx.decision(Admit(replica, assignment.journal_id), patch)


def _pinned(ctx: _Ctx, eligible: list[Replica],
            journals: Mapping[int, str | None]) -> list[Replica] | Decision:
    """A resuming job's replicas: the predecessor's one when it can serve (a list of one);
    otherwise wait (it cannot serve now) or finish (its journal was replaced: the trajectory
    is gone). Invariant: a resume is admitted only where its predecessor's journal is."""
    gate, spec = ctx.obs.gate, ctx.spec
    ordinal, journal = gate.pin_ordinal, gate.pin_journal
    here = journals.get(ordinal) if ordinal is not None else None
    if journal is not None and here is not None and here != journal:
        message = (f"spec.resume: the predecessor ran on replica {ordinal} with journal "
                   f"{journal}, but that replica now has journal {here}; the predecessor's "
                   "trajectory is gone: rerun without --resume")
        return ctx.finish(outcome.invalid_spec("resume_journal_gone", message))
    pinned = [r for r in eligible if r.ordinal == ordinal]
    if not pinned:
        return ctx.wait(ctx.settings.retry_seconds, Phase.PENDING,
                        Reason.PREDECESSOR_REPLICA_UNAVAILABLE,
                        f"spec.resume: the predecessor's journal is on replica {ordinal} of "
                        f"Crew {spec.crew!r}, which cannot serve now (not ready, fenced, "
                        "draining or full); waiting for it")
    return pinned


def _still_full(ctx: _Ctx, journals: Mapping[int, str | None]) -> set[int]:
    """Replicas whose journal (the same one) answered 507 within ``full_retry_seconds``."""
    window = ctx.settings.full_retry_seconds
    return {o for o, (journal, at) in ctx.known.full.items()
            if journal == journals.get(o) and ctx.obs.now - at < window}


def _silent_label(replica: Replica, answer: ProbeAnswer | None) -> str:
    if isinstance(answer, SidecarFailure):
        return f"{replica.label}: {answer.category.value}/{answer.code}"
    if isinstance(answer, Lookup):
        return (f"{replica.label}: answered from journal {answer.journal_id}, not the Crew's "
                f"{replica.journal_id}")
    return f"{replica.label}: no address"


def _probe_agrees(replica: Replica | None, answer: ProbeAnswer | None) -> bool:
    """A probe answered, from the journal the Crew's entry lists for the replica.

    Invariant (I1, I4: a probe speaks for the listed journal only): the address may reach
    another journal than the entry's (a replaced pod on another claim, a reused pod IP, a
    journal the entry does not list yet). Such an answer neither attaches the job nor clears
    the replica for an admission elsewhere: the replica counts as silent until the entry and
    the answer agree. A sidecar that names no journal is taken at its word (older sidecars).
    """
    if replica is None or not isinstance(answer, Lookup):
        return False
    return answer.journal_id is None or answer.journal_id == replica.journal_id


def _attach_found(ctx: _Ctx, replica: Replica, lookup: Lookup) -> Decision:
    """A replica already knows the action (an exact repeat after delete + re-apply, or a
    restart): attach to it; never admit anywhere."""
    spec = ctx.spec
    assignment = Assignment(replica.ordinal, replica.pod, replica.claim, replica.journal_id)
    if lookup.record is None:
        return ctx.finish(_archived(lookup), None, assignment)
    record = lookup.record
    if record.request_hash != spec.request_hash():
        return ctx.finish(outcome.request_changed(record.request_hash, spec.request_hash()),
                          None, assignment)
    if record.terminal:
        return _finish_record(ctx, replica, record, assignment)
    extra = {"assignment": {**assignment.to_status(), "assignedAt": iso(ctx.obs.now)},
             "requestHash": record.request_hash, "startedAt": record.created_at,
             "eventCursor": ctx.mem.cursor, "progress": ctx.mem.progress.to_status()}
    patch = ctx.working(Phase.RUNNING, Reason.ADMITTED,
                        f"the action is running on replica {replica.label}", extra=extra)
    return ctx.decision(Follow(replica), patch, admitted=True, lookup=None)


def _archived(lookup: Lookup) -> Verdict:
    return outcome.archived_verdict(lookup.tombstone or {})


def _finish_record(ctx: _Ctx, replica: Replica, record: JobRecord,
                   assignment: Assignment | None = None) -> Decision:
    """A terminal record decides; its effects come from events covering it from 0.

    The events followed live are used when they cover the record; otherwise one
    :class:`ReadEffects` reads them again (no API write: the status is written once, by the
    terminal patch). After :data:`effects.MAX_READS` failed reads the verdict is written
    without ``status.effects`` and its message says the tool calls are unknown.
    """
    log: EffectLog | None = ctx.mem.effects if ctx.mem.effects.covers(record) else None
    read = ctx.mem.effects_read
    if log is None and isinstance(read, EffectLog) and read.covers(record):
        log = read
    elif log is None and read is not None:
        failures = ctx.mem.effects_failures + 1
        if failures < MAX_READS:
            return ctx.decision(Wait(ctx.settings.backoff(failures), "EffectsUnread"), None,
                                effects_read=None, effects_failures=failures)
        ctx.mem = replace(ctx.mem, effects_failures=failures)
    elif log is None and ctx.mem.effects_failures < MAX_READS and replica.can_answer:
        return ctx.decision(ReadEffects(replica))
    return ctx.finish(_record_verdict(ctx, record), record, assignment,
                      effects=log.summary() if log is not None else None)


def _record_verdict(ctx: _Ctx, record: JobRecord) -> Verdict:
    return outcome.with_stop(outcome.verdict_from_record(
        record, thread_backed=ctx.spec.thread_backed,
        cancel_requested=ctx.cancellation_now().requested or ctx.mem.cancel_confirmed), record)


# --- assigned ------------------------------------------------------------------------------------
def _assigned(ctx: _Ctx, a: Assignment) -> Decision:
    obs, s = ctx.obs, ctx.settings
    replica = obs.crew.replica(a.ordinal) if obs.crew is not None else None
    gone = _gone_why(ctx, a, replica)
    if gone is None and replica is None:
        return ctx.wait(s.retry_seconds, Phase.RUNNING, Reason.REPLICA_UNAVAILABLE,
                        "the Crew lists no replicas at the moment; waiting")
    if gone is not None and a.claim and obs.assigned_claim_exists is not False:
        return _claim_lives_on(ctx, a, gone[0])
    if gone is not None:
        since = ctx.mem.gone_since if ctx.mem.gone_since is not None else obs.now
        if obs.now - since >= s.gone_grace_seconds:
            return ctx.finish(outcome.uncertain(
                Reason.JOURNAL_LOST, FailureCategory.CONNECTOR, gone[0], gone[1]))
        return ctx.wait(min(s.retry_seconds, s.gone_grace_seconds), Phase.RUNNING,
                        Reason.REPLICA_UNAVAILABLE, f"{gone[1]}; waiting to be sure",
                        gone_since=since)
    assert replica is not None and obs.crew is not None
    if ctx.mem.gone_since is not None:
        ctx.mem = replace(ctx.mem, gone_since=None)
    if not obs.crew.has_token:
        failures = ctx.mem.failures + 1
        return ctx.wait(s.backoff(failures), Phase.RUNNING, Reason.REPLICA_UNAVAILABLE,
                        "the Crew's token Secret cannot be read; waiting to ask the assigned "
                        f"replica {replica.label}", failures=failures)
    if journal_changed(a.journal_id, replica.journal_id):
        return _journal_lost(ctx, a, replica.journal_id)
    # Answers are consumed newest-first: the step just carried out left exactly one.
    if ctx.mem.admission is not None:
        return _after_admission(ctx, a, replica, ctx.mem.admission)
    if ctx.mem.cancel is not None:
        return _after_cancel(ctx, a, replica, ctx.mem.cancel)
    if ctx.mem.stream is not None:
        return _after_stream(ctx, a, replica, ctx.mem.stream)
    lookup = ctx.mem.lookup
    if lookup is None:
        if not replica.can_answer:
            return ctx.wait(s.backoff(max(1, ctx.mem.failures)), Phase.RUNNING,
                            Reason.REPLICA_UNAVAILABLE,
                            f"assigned replica {replica.label} is not reachable; waiting (the "
                            "action is never moved to another replica)",
                            failures=ctx.mem.failures + 1)
        return ctx.decision(Lookup_(replica))
    if isinstance(lookup, SidecarFailure):
        failures = ctx.mem.failures + 1
        return ctx.wait(s.backoff(failures), Phase.RUNNING, Reason.REPLICA_UNAVAILABLE,
                        f"assigned replica {replica.label} did not answer "
                        f"({lookup.category.value}/{lookup.code}); asking again with backoff",
                        failures=failures, lookup=None)
    return _after_lookup(ctx, a, replica, lookup)


def _gone_why(ctx: _Ctx, a: Assignment, replica: Replica | None) -> tuple[str, str] | None:
    crew_name = ctx.spec.crew if isinstance(ctx.obs.spec, JobSpec) else "?"
    if ctx.obs.crew is None:
        return ("crew_deleted", f"the Crew {crew_name!r} holding the assigned replica "
                                f"{a.ordinal} was deleted; the action's journal is gone")
    if replica is None and not ctx.obs.crew.replicas:
        return None  # a Crew listing nothing at all is a status in flux, not evidence
    if replica is None:
        return ("claim_gone", f"the Crew no longer lists replica {a.ordinal} or its claim "
                              f"{a.claim or '?'}; the action's journal is gone")
    if a.claim and replica.claim and replica.claim != a.claim:
        return ("claim_gone", f"replica {a.ordinal} now uses claim {replica.claim}, not "
                              f"{a.claim}; the action's journal is gone")
    return None


def _claim_lives_on(ctx: _Ctx, a: Assignment, why: str) -> Decision:
    """I4: the Crew object no longer shows the assigned replica (Crew deleted with
    ``--cascade=orphan`` or re-created by a GitOps tool, replica removed, claim renamed in the
    spec), but the claim, which holds the journal, still exists or cannot be read: the outcome
    can still be learned, so wait; a re-created Crew that serves the claim again continues the
    job. The action is never moved to another replica."""
    s = ctx.settings
    known = ("still exists" if ctx.obs.assigned_claim_exists
             else "cannot be read to tell whether it still exists")
    crew = ctx.spec.crew if isinstance(ctx.obs.spec, JobSpec) else "?"
    if why == "crew_deleted":
        return ctx.wait(s.retry_seconds, Phase.RUNNING, Reason.CREW_NOT_FOUND,
                        f"Crew {crew!r} is gone but the assigned claim {a.claim}, which holds "
                        f"this action's journal, {known}; waiting for the Crew to serve it "
                        "again (never moved to another replica)", gone_since=None)
    return ctx.wait(s.retry_seconds, Phase.RUNNING, Reason.REPLICA_UNAVAILABLE,
                    f"Crew {crew!r} no longer serves the assigned claim {a.claim} of replica "
                    f"{a.ordinal} (removed or renamed), but the claim {known}; waiting (never "
                    "moved to another replica)", gone_since=None)


def _journal_lost(ctx: _Ctx, a: Assignment, current: str | None) -> Decision:
    return ctx.finish(outcome.uncertain(
        Reason.JOURNAL_LOST, FailureCategory.CONNECTOR, "journal_changed",
        f"the journal of replica {a.ordinal} changed from {a.journal_id} to {current}; the "
        "action's record is lost"))


def _another_journal_answered(ctx: _Ctx, a: Assignment, replica: Replica,
                              what: str) -> Decision:
    """I4: an answer at the replica's address came from another journal than the assigned one,
    while the Crew's entry for the replica (the claim its pod mounts and that pod's journal id:
    one pod's facts) still lists the assigned journal, or none.

    Invariant (a lost journal is decided from the Crew's entry alone): one answer at an
    address is no evidence that the assigned journal is gone; the address may reach a replaced
    pod on a renamed claim, or a reused pod IP, while the assigned claim lives on. So nothing
    is decided here and the job waits; ``_assigned`` ends it JournalLost once the entry shows
    another journal on the assigned claim, and waits while the claim lives on elsewhere. An
    admission is never sent anywhere else meanwhile (it names its journal: 412 elsewhere).
    """
    failures = ctx.mem.failures + 1
    return ctx.wait(ctx.settings.backoff(failures), Phase.RUNNING, Reason.REPLICA_UNAVAILABLE,
                    f"replica {replica.label} {what}, not from the assigned journal "
                    f"{a.journal_id} that the Crew still lists for claim {a.claim or '?'}; "
                    "waiting for the Crew's status to show which journal the replica serves "
                    "(never moved to another replica)", failures=failures)


def _within_settle(ctx: _Ctx) -> bool:
    """I1/I3: an admission POST sent for this assignment may still land."""
    since = ctx.known.assigned_at
    return since is None or ctx.obs.now - since < ctx.settings.settle_seconds


def _after_admission(ctx: _Ctx, a: Assignment, replica: Replica,
                     answer: Admission | SidecarFailure) -> Decision:
    s = ctx.settings
    if isinstance(answer, Admission):
        if journal_changed(a.journal_id, answer.journal_id):
            return _journal_lost(ctx, a, answer.journal_id)
        ctx.mem = replace(ctx.mem, admission=None,
                          lookup=Lookup(record=answer.record, journal_id=answer.journal_id))
        return _after_lookup(ctx, a, replica, Lookup(record=answer.record,
                                                     journal_id=answer.journal_id))
    exc = answer
    ctx.mem = replace(ctx.mem, admission=None, lookup=None)
    failures = ctx.mem.failures + 1
    if exc.code == contract.JOURNAL_MISMATCH_CODE:
        return _another_journal_answered(ctx, a, replica, "admitted nothing")
    if exc.category is FailureCategory.TRANSPORT and not exc.uncertain:
        return ctx.wait(s.backoff(failures), Phase.RUNNING, Reason.REPLICA_UNAVAILABLE,
                        f"replica {replica.label} refused the connection; nothing was sent",
                        failures=failures)
    if exc.code == contract.DRAINING_CODE:
        return ctx.wait(s.backoff(failures), Phase.RUNNING, Reason.REPLICA_DRAINING,
                        f"replica {replica.label} is draining and refused the admission; "
                        "nothing was scheduled there", failures=failures)
    if exc.http_status in NOT_ADMITTED_STATUSES:
        reason = Reason.JOURNAL_FULL if exc.http_status == 507 else Reason.SIDECAR_BUSY
        message = f"replica {replica.label} did not admit the action ({exc.code}); nothing was " \
                  "scheduled; trying again"
        phase = Phase.RUNNING
        if exc.http_status == 507:
            message = f"{message}. {outcome.RECOVERY['journal_full']}"
            phase = Phase.PENDING  # nothing was admitted (the 507 promise)
        return ctx.wait(s.backoff(failures), phase, reason, message, failures=failures)
    if exc.uncertain:
        first = not (ctx.known.uncertain and ctx.known.reason == Reason.ANSWER_LOST.value)
        message = (f"the answer to the admission on replica {replica.label} was lost; the "
                   "sidecar may have admitted the action; asking it again with backoff")
        warning = Warning_(f"OutcomeUncertain{Reason.ANSWER_LOST.value}",
                           f"{message}. {outcome.RECOVERY[Reason.ANSWER_LOST]}"[:1000],
                           Reason.ANSWER_LOST.value) if first else None
        return ctx.wait(s.backoff(failures), Phase.RUNNING, Reason.ANSWER_LOST, message,
                        uncertain=Reason.ANSWER_LOST, warning=warning, failures=failures)
    # A definitive refusal of this POST. If an earlier POST's answer was lost it may still land.
    if ctx.known.uncertain and _within_settle(ctx) and exc.http_status not in (409, 410):
        return ctx.wait(s.backoff(failures), Phase.RUNNING, Reason.ANSWER_LOST,
                        f"replica {replica.label} refused a repeated admission ({exc.code}) "
                        "while an earlier one may still land; asking again",
                        uncertain=Reason.ANSWER_LOST, failures=failures)
    return ctx.finish(outcome.verdict_from_rejection(exc.category, exc.code, exc.message,
                                                     exc.http_status))


def _after_cancel(ctx: _Ctx, a: Assignment, replica: Replica,
                  answer: JobRecord | SidecarFailure) -> Decision:
    s = ctx.settings
    if isinstance(answer, JobRecord):
        ctx.mem = replace(ctx.mem, cancel=None, cancel_confirmed=True, cancel_failures=0,
                          lookup=Lookup(record=answer))
        return _after_lookup(ctx, a, replica, Lookup(record=answer))
    failures = ctx.mem.cancel_failures + 1
    ctx.mem = replace(ctx.mem, cancel=None, lookup=None, cancel_failures=failures)
    if answer.http_status in (404, 410):
        return ctx.decision(Lookup_(replica))  # the lookup decides (unknown or archived)
    if ctx.obs.deleting:
        return ctx.decision(Wait(s.backoff(failures), Reason.CANCEL_PENDING.value))
    cancellation = ctx.cancellation_now()
    cancellation.dispatched = True
    cancellation.message = (f"the sidecar did not confirm the cancel ({answer.code}); "
                            "retrying with backoff")
    patch = ctx.working(Phase.RUNNING, Reason.CANCEL_PENDING,
                        f"the cancel on replica {replica.label} was not confirmed; retrying",
                        extra={"cancellation": cancellation.to_status()}
                        if failures == 1 else None)
    return ctx.decision(Wait(s.backoff(failures), Reason.CANCEL_PENDING.value), patch)


def _after_stream(ctx: _Ctx, a: Assignment, replica: Replica,
                  answer: StreamEnded | SidecarFailure) -> Decision:
    s = ctx.settings
    ctx.mem = replace(ctx.mem, stream=None, lookup=None)
    if isinstance(answer, StreamEnded):
        return ctx.decision(Lookup_(replica), failures=0)
    if answer.code in ("invalid_stream", "invalid_record", "invalid_response") or \
            answer.http_status == 416:
        first = not ctx.mem.stream_invalid
        message = (f"the event stream of replica {replica.label} was unreadable "
                   f"({answer.code}); following the record instead")
        warning = Warning_(f"OutcomeUncertain{Reason.INVALID_STREAM.value}",
                           f"{message}. {outcome.RECOVERY[Reason.INVALID_STREAM]}"[:1000],
                           Reason.INVALID_STREAM.value) if first else None
        return ctx.wait(0.0, Phase.RUNNING, Reason.INVALID_STREAM, message,
                        uncertain=Reason.INVALID_STREAM, warning=warning, stream_invalid=True)
    failures = ctx.mem.failures + 1
    return ctx.wait(s.backoff(failures), Phase.RUNNING, Reason.REPLICA_UNAVAILABLE,
                    f"lost contact with replica {replica.label} while following "
                    f"({answer.category.value}/{answer.code}); asking again with backoff",
                    failures=failures)


def _after_lookup(ctx: _Ctx, a: Assignment, replica: Replica, lookup: Lookup) -> Decision:
    s, spec = ctx.settings, ctx.spec
    if journal_changed(a.journal_id, lookup.journal_id):
        ctx.mem = replace(ctx.mem, lookup=None)
        return _another_journal_answered(ctx, a, replica,
                                         f"answered from journal {lookup.journal_id}")
    ctx.mem = replace(ctx.mem, failures=0)
    if lookup.record is None and lookup.tombstone is not None:
        return ctx.finish(_archived(lookup))
    record = lookup.record
    if record is None:
        return _not_known(ctx, a, replica)
    if record.request_hash != spec.request_hash():
        return ctx.finish(outcome.request_changed(record.request_hash, spec.request_hash()))
    ctx.mem = replace(ctx.mem, admitted=True)
    if record.terminal:
        return _finish_record(ctx, replica, record)
    # Running: the record settles any earlier AnswerLost (not an InvalidStream: that one stays
    # until a terminal record decides, see I2).
    settled = ctx.known.uncertain and ctx.known.reason == Reason.ANSWER_LOST.value
    recovered = settled or ctx.known.reason in _TROUBLE
    wants_cancel = ctx.stop_wanted and not ctx.mem.cancel_confirmed
    if wants_cancel:
        # (after a failed cancel the backoff wait already happened: this is the retry)
        cancellation = ctx.cancellation_now()
        cancellation.dispatched = True
        patch = None
        if not ctx.known.cancellation.dispatched:
            patch = ctx.working(Phase.RUNNING, Reason.CANCEL_PENDING,
                                f"cancel sent to replica {replica.label}",
                                extra={"cancellation": cancellation.to_status()},
                                keep_uncertain=not settled)
        why = (f"evicted by its queue: {ctx.obs.hold.evicted}" if ctx.obs.hold.evicted
               and not spec.cancel else "spec.cancel set on the CrewJob")
        return ctx.decision(Cancel(replica, why[:500]), patch, lookup=None)
    if ctx.mem.stream_invalid:
        return ctx.decision(Wait(s.poll_seconds, Reason.INVALID_STREAM.value), None, lookup=None)
    patch = None
    if recovered:
        patch = ctx.working(Phase.RUNNING, Reason.ADMITTED,
                            f"admitted by replica {replica.label}",
                            extra={"startedAt": record.created_at}, keep_uncertain=False)
    return ctx.decision(Follow(replica), patch, lookup=None)


_TROUBLE: Final = frozenset({Reason.REPLICA_UNAVAILABLE.value, Reason.REPLICA_DRAINING.value,
                            Reason.JOURNAL_FULL.value, Reason.SIDECAR_BUSY.value})
"""Working reasons a running record proves outdated (the status says "admitted" again)."""


def _not_known(ctx: _Ctx, a: Assignment, replica: Replica) -> Decision:
    """The assigned replica (same journal) does not hold the action."""
    s = ctx.settings
    ctx.mem = replace(ctx.mem, lookup=None)
    if ctx.mem.admitted or ctx.known.started:
        return ctx.finish(outcome.uncertain(
            Reason.JOURNAL_LOST, FailureCategory.CONNECTOR, "record_missing",
            f"the assigned replica {replica.label} no longer knows the action"))
    if ctx.stop_wanted:
        if _within_settle(ctx):
            return ctx.wait(s.retry_seconds, Phase.RUNNING, Reason.CANCEL_PENDING,
                            f"cancel requested; replica {replica.label} does not hold the action "
                            "yet, but an admission sent to it may still land: looking again")
        return ctx.finish(outcome.cancelled_before_admission())
    if ctx.known.reason == Reason.JOURNAL_FULL.value and not _within_settle(ctx):
        # I1 + the 507 promise: the full journal admitted nothing, and past the settle window
        # no earlier POST can land either; send the work where there is room, after asking
        # every replica again, and pass this journal over for a while.
        full = [{"ordinal": o, "journalId": j, "at": iso(at)}
                for o, (j, at) in ctx.known.full.items() if o != a.ordinal]
        full.append({"ordinal": a.ordinal, "journalId": a.journal_id, "at": iso(ctx.obs.now)})
        patch = ctx.working(Phase.PENDING, Reason.JOURNAL_FULL,
                            f"the journal of replica {replica.label} is full and admitted "
                            "nothing; choosing a replica with room after asking every replica",
                            extra={"assignment": None, "journalFull": full})
        return ctx.decision(Wait(0.0, Reason.JOURNAL_FULL.value), patch, probes={})
    if replica.state is not ReplicaState.ACTIVE and not _within_settle(ctx):
        # I1: the replica refuses admissions and, past the settle window, provably never got
        # one: clear the assignment and probe every replica again.
        patch = ctx.working(Phase.PENDING, Reason.REPLICA_DRAINING,
                            f"assigned replica {replica.label} is no longer active and never "
                            "admitted the action; choosing again after asking every replica",
                            extra={"assignment": None})
        return ctx.decision(Wait(0.0, Reason.REPLICA_DRAINING.value), patch, probes={})
    if not (replica.ready and replica.address and not replica.fenced):
        return ctx.wait(s.backoff(max(1, ctx.mem.failures + 1)), Phase.RUNNING,
                        Reason.REPLICA_UNAVAILABLE,
                        f"assigned replica {replica.label} is not ready for the admission; "
                        "waiting (never moved)", failures=ctx.mem.failures + 1)
    # (Re-)send the exact same request to the same journal: reconciliation, not retry.
    return ctx.decision(Admit(replica, a.journal_id))


# --- deletion ------------------------------------------------------------------------------------
def _deleting(ctx: _Ctx) -> Decision:
    """I3: with deletionPolicy Cancel, a record that may be running gets the cancel."""
    obs, s, spec = ctx.obs, ctx.settings, ctx.spec
    if spec.deletion_policy is DeletionPolicy.ORPHAN:
        return ctx.decision(Release())
    a = ctx.known.assignment
    if a is None:
        return ctx.decision(Release())  # nothing was ever sent
    since = ctx.mem.deletion_since if ctx.mem.deletion_since is not None else obs.now
    ctx.mem = replace(ctx.mem, deletion_since=since)
    if obs.now - since >= s.deletion_wait_seconds:
        return _release_unconfirmed(ctx, "the sidecar did not confirm the cancel in time")
    replica = obs.crew.replica(a.ordinal) if obs.crew is not None else None
    if replica is None or not replica.can_answer or not obs.crew or not obs.crew.has_token:
        if _gone_why(ctx, a, replica) is not None:
            return _release_unconfirmed(ctx, "the assigned replica is gone")
        return ctx.decision(Wait(min(s.retry_seconds, 1.0), Reason.REPLICA_UNAVAILABLE.value))
    if isinstance(ctx.mem.admission, Admission):
        ctx.mem = replace(ctx.mem, lookup=Lookup(record=ctx.mem.admission.record),
                          admission=None)
    elif ctx.mem.admission is not None:
        ctx.mem = replace(ctx.mem, admission=None, lookup=None)
    if isinstance(ctx.mem.cancel, JobRecord):
        ctx.mem = replace(ctx.mem, cancel_confirmed=True, lookup=Lookup(record=ctx.mem.cancel),
                          cancel=None)
    elif ctx.mem.cancel is not None:
        failures = ctx.mem.cancel_failures + 1
        ctx.mem = replace(ctx.mem, cancel=None, cancel_failures=failures, lookup=None)
        return ctx.decision(Wait(min(s.backoff(failures), 2.0), Reason.CANCEL_PENDING.value))
    ctx.mem = replace(ctx.mem, stream=None)
    lookup = ctx.mem.lookup
    if lookup is None:
        return ctx.decision(Lookup_(replica))
    if isinstance(lookup, SidecarFailure):
        return ctx.decision(Wait(1.0, Reason.REPLICA_UNAVAILABLE.value), lookup=None)
    record = lookup.record
    if record is None:
        if lookup.tombstone is None and _within_settle(ctx):
            return ctx.decision(Wait(1.0, Reason.CANCEL_PENDING.value), lookup=None)
        if (lookup.tombstone or {}).get("uncertain_outcome"):
            return ctx.decision(Release(), lookup=None, warning=_deleted_warning(
                "the sidecar archived this action's record, which marked the outcome uncertain",
                outcome.RECOVERY[Reason.RECORD_UNCERTAIN], Reason.RECORD_UNCERTAIN))
        return ctx.decision(Release(), lookup=None)  # never admitted (or archived)
    if record.terminal:
        # I5 on deletion too: an uncertain record is announced (Event + metric) even though
        # the CrewJob that would have shown it in status is going away.
        if ctx.mem.cancel_confirmed and record.uncertain_outcome:
            return ctx.decision(Release(), warning=_deleted_warning(
                "the sidecar cancelled the task, but its record says the work may continue",
                outcome.RECOVERY["cancel_thread"]))
        if record.uncertain_outcome:
            return ctx.decision(Release(), warning=_deleted_warning(
                f"the sidecar's record ended {record.status.value} with an uncertain outcome",
                outcome.RECOVERY[Reason.RECORD_UNCERTAIN], Reason.RECORD_UNCERTAIN))
        return ctx.decision(Release())
    if not ctx.mem.cancel_confirmed:
        return ctx.decision(Cancel(replica, "CrewJob deleted (deletionPolicy Cancel)"),
                            lookup=None)
    return ctx.decision(Wait(0.5, Reason.CANCEL_PENDING.value), lookup=None)


def _deleted_warning(detail: str, advice: str,
                     reason: Reason = Reason.CANCEL_UNCONFIRMED) -> Warning_:
    return Warning_(f"OutcomeUncertain{reason.value}",
                    f"CrewJob deleted: {detail}. {advice}"[:1000], reason.value)


def _release_unconfirmed(ctx: _Ctx, detail: str) -> Decision:
    return ctx.decision(Release(), warning=_deleted_warning(
        detail, outcome.RECOVERY[Reason.CANCEL_UNCONFIRMED]))
