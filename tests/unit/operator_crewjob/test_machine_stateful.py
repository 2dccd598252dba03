"""Hypothesis stateful test of the CrewJob machine against a simulated Crew of sidecars.

The simulation keeps one journal per claim (records survive pod and sidecar restarts, as on the
PVC), counts every admission that created a record, and carries steps out with faults drawn by
Hypothesis (lost answers, dead sidecars). Rules interleave operator restarts (memory lost,
status kept), sidecar restarts, scale up/down (draining, retained claims without pods), cancel,
delete + re-apply, Crew deletion and the passage of time. After every step:

- never two admissions of one action id (I1);
- never a terminal phase while a replica the Crew lists still holds a running record (I2);
- every uncertain status carries its reason and recovery text (I5).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from crewfence_operator.crewjob import machine as m
from crewfence_operator.crewjob.effects import EffectLog
from crewfence_operator.crewjob.machine import (
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
    Release,
    Wait,
)
from crewfence_operator.crewjob.replicas import Replica, ReplicaState
from crewfence_operator.crewjob.spec import JobSpec
from crewfence_operator.handlers.crewjob import merge_status
from crewfence_operator.sidecar_client import Admission, Lookup, SidecarFailure
from crewfence_sidecar.contract import FailureCategory, JobRecord, Status
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

SPEC_RAW = {"crewRef": {"name": "research"}, "operation": "run", "input": {"topic": "x"}}
TERMINAL = {"Succeeded", "Failed", "Cancelled"}
T0 = 1_800_000_000.0


@dataclass
class SimSidecar:
    ordinal: int
    journal: str
    records: dict[str, JobRecord] = field(default_factory=dict)
    up: bool = True
    state: ReplicaState = ReplicaState.ACTIVE

    @property
    def has_pod(self) -> bool:
        return self.state is not ReplicaState.RETAINED

    @property
    def answers(self) -> bool:
        return self.up and self.has_pod

    def replica(self) -> Replica:
        return Replica(ordinal=self.ordinal, pod=f"research-{self.ordinal}",
                       claim=f"state-{self.ordinal}",
                       address=f"10.0.0.{self.ordinal}:8090" if self.has_pod else None,
                       journal_id=self.journal,
                       ready=self.answers and self.state is ReplicaState.ACTIVE,
                       fenced=False, state=self.state)


REFUSED = SidecarFailure(FailureCategory.TRANSPORT, "transport_error", "refused", None)
LOST_INVOCATION = SidecarFailure(FailureCategory.TRANSPORT, "transport_error", "reset", None,
                                 uncertain=True)
LOST_READ = SidecarFailure(FailureCategory.TRANSPORT, "transport_error", "reset", None)


class CrewJobWorld(RuleBasedStateMachine):
    @initialize(replicas=st.integers(1, 3), name=st.sampled_from(["job-1", "job-3", "a", "b"]))
    def setup(self, replicas: int, name: str) -> None:
        self.now = T0
        self.sims: dict[int, SimSidecar] = {k: SimSidecar(k, f"j{k}") for k in range(replicas)}
        self.crew_exists = True
        self.admissions = 0
        # (names whose rendezvous choice differs: the action lands on a low or a high ordinal)
        self.spec = JobSpec.from_resource("team-a", name, SPEC_RAW)
        self.settings = m.MachineSettings()
        self.new_object()

    def new_object(self) -> None:
        self.status: dict[str, Any] = {}
        self.memory = Memory()
        self.cancel = False
        self.deleting = False
        self.gone = False

    # --- the operator -----------------------------------------------------------------------
    def observation(self) -> Observation:
        crew = (CrewView(tuple(s.replica() for s in self.sims.values()), True)
                if self.crew_exists else None)
        return Observation(namespace="team-a", name=self.spec.name, generation=1,
                           spec=replace(self.spec, cancel=self.cancel), status=self.status,
                           crew=crew, memory=self.memory, now=self.now,
                           deleting=self.deleting, settings=self.settings)

    def record_of(self, ordinal: int) -> JobRecord | None:
        return self.sims[ordinal].records.get(self.spec.action_id)

    def lookup(self, r: Replica, lose: bool) -> Lookup | SidecarFailure:
        sim = self.sims.get(r.ordinal)
        if sim is None or not sim.answers or not self.crew_exists:
            return REFUSED
        if lose:
            return LOST_READ
        return Lookup(record=self.record_of(r.ordinal), journal_id=sim.journal)

    def carry_out(self, d: Decision, lose: bool) -> None:
        self.memory = d.memory
        if d.patch is not None and not self.deleting:
            self.status = merge_status(self.status, d.patch)
        step = d.step
        if isinstance(step, Probe):
            probes = dict(self.memory.probes)
            probes.update({r.ordinal: self.lookup(r, lose) for r in step.replicas})
            self.memory = replace(self.memory, probes=probes)
        elif isinstance(step, Lookup_):
            self.memory = replace(self.memory, lookup=self.lookup(step.replica, lose))
        elif isinstance(step, Admit):
            self.memory = replace(self.memory, admission=self.admit(step.replica, lose))
        elif isinstance(step, Cancel):
            self.memory = replace(self.memory, cancel=self.cancel_on(step.replica, lose))
        elif isinstance(step, Follow):
            sim = self.sims.get(step.replica.ordinal)
            ok = sim is not None and sim.answers and self.crew_exists
            self.memory = replace(self.memory, stream=m.StreamEnded() if ok else LOST_READ)
        elif isinstance(step, m.ReadEffects):
            sim = self.sims.get(step.replica.ordinal)
            rec = self.record_of(step.replica.ordinal)
            read: EffectLog | SidecarFailure = LOST_READ
            if sim is not None and sim.answers and self.crew_exists and rec is not None:
                read = EffectLog(next_sequence=rec.event_count)
            self.memory = replace(self.memory, effects_read=read)
        elif isinstance(step, Wait):
            self.now += max(step.seconds, 0.001)
            self.memory = self.memory.fresh_round()
        elif isinstance(step, Release):
            if self.deleting:
                self.gone = True
        elif isinstance(step, Finish):
            pass

    def admit(self, r: Replica, lose: bool) -> Admission | SidecarFailure:
        sim = self.sims.get(r.ordinal)
        if sim is None or not sim.answers or not self.crew_exists:
            return REFUSED
        known = sim.records.get(self.spec.action_id)
        if known is None:
            if sim.state is not ReplicaState.ACTIVE:
                return SidecarFailure(FailureCategory.TEMPORARY, "draining", "draining", 503,
                                      uncertain=True)
            known = JobRecord(action_id=self.spec.action_id, crew_id="research",
                              operation="run", request_hash=self.spec.request_hash(),
                              status=Status.RUNNING, event_count=1,
                              created_at="2026-01-01T00:00:00Z",
                              updated_at="2026-01-01T00:00:00Z")
            sim.records[self.spec.action_id] = known
            self.admissions += 1
        if lose:
            return LOST_INVOCATION
        return Admission(202, known, sim.journal, 0.0)

    def cancel_on(self, r: Replica, lose: bool) -> JobRecord | SidecarFailure:
        sim = self.sims.get(r.ordinal)
        if sim is None or not sim.answers or not self.crew_exists:
            return REFUSED
        rec = sim.records.get(self.spec.action_id)
        if rec is None:
            return SidecarFailure(FailureCategory.PERMANENT, "unknown_job", "no", 404)
        if not rec.terminal:
            rec.status, rec.uncertain_outcome = Status.CANCELLED, True
            rec.error = {"code": "cancelled", "message": "cancelled on request"}
        return LOST_INVOCATION if lose else rec

    # --- rules ------------------------------------------------------------------------------
    @precondition(lambda self: not self.gone)
    @rule(lose=st.integers(0, 255), n=st.sampled_from([1, 2, 3, 5, 30]))
    def operator_steps(self, lose: int, n: int) -> None:
        """n decisions carried out; bit i of ``lose`` loses the answer of step i."""
        for i in range(n):
            if self.gone or (self.status.get("phase") in TERMINAL and not self.deleting):
                return
            self.carry_out(m.decide(self.observation()), bool(lose >> i & 1))

    @precondition(lambda self: not self.gone)
    @rule()
    def operator_killed_between_write_and_step(self) -> None:
        """SIGKILL after the status patch landed but before the step (e.g. the POST) left."""
        if self.status.get("phase") in TERMINAL and not self.deleting:
            return
        d = m.decide(self.observation())
        if d.patch is not None and not self.deleting:
            self.status = merge_status(self.status, d.patch)
        self.operator_restart()

    @rule()
    def operator_restart(self) -> None:
        self.memory = Memory(cursor=int(self.status.get("eventCursor") or 0))

    @rule(k=st.integers(0, 3))
    def sidecar_restart(self, k: int) -> None:
        sim = self.sims.get(k)
        if sim is None:
            return
        for rec in sim.records.values():
            if not rec.terminal:
                rec.status, rec.uncertain_outcome = Status.FAILED, True
                rec.error = {"code": "sidecar_restarted", "message": "restarted"}

    @rule(k=st.integers(0, 3), up=st.booleans())
    def sidecar_up_down(self, k: int, up: bool) -> None:
        if k in self.sims:
            self.sims[k].up = up

    @rule(k=st.integers(0, 3), how=st.sampled_from(["completed", "failed", "uncertain"]))
    def job_ends(self, k: int, how: str) -> None:
        rec = self.sims[k].records.get(self.spec.action_id) if k in self.sims else None
        if rec is None or rec.terminal:
            return
        if how == "completed":
            rec.status, rec.output = Status.COMPLETED, "out"
        else:
            rec.status = Status.FAILED
            rec.error = {"code": "execution_error", "message": "boom"}
            rec.uncertain_outcome = how == "uncertain"

    @rule(k=st.integers(0, 3), retire_pod=st.booleans())
    def scale_down(self, k: int, retire_pod: bool) -> None:
        """Replica k is scaled away (the machine does not care which ordinal is the top)."""
        active = [s for s in self.sims.values() if s.state is ReplicaState.ACTIVE]
        if len(active) <= 1 or k not in self.sims or self.sims[k] not in active:
            return
        self.sims[k].state = ReplicaState.RETAINED if retire_pod else ReplicaState.DRAINING

    @rule()
    def retire_draining_pod(self) -> None:
        for s in self.sims.values():
            if s.state is ReplicaState.DRAINING:
                s.state = ReplicaState.RETAINED

    @rule()
    def scale_up(self) -> None:
        waiting = sorted((s for s in self.sims.values() if s.state is not ReplicaState.ACTIVE),
                         key=lambda s: s.ordinal)
        if waiting:
            waiting[0].state = ReplicaState.ACTIVE
        elif len(self.sims) < 4:
            k = len(self.sims)
            self.sims[k] = SimSidecar(k, f"j{k}")

    @rule()
    def set_cancel(self) -> None:
        self.cancel = True

    @precondition(lambda self: not self.gone)
    @rule()
    def delete(self) -> None:
        if self.status.get("phase") in TERMINAL:
            self.gone = True
            return
        self.deleting = True

    @precondition(lambda self: self.gone)
    @rule()
    def reapply(self) -> None:
        self.new_object()

    @precondition(lambda self: not self.gone)
    @rule()
    def delete_and_reapply(self) -> None:
        """A GitOps prune and resync: the deletion runs its course, the same manifest returns."""
        self.delete()
        for _ in range(200):
            if self.gone:
                break
            self.carry_out(m.decide(self.observation()), False)
        assert self.gone, self.status
        self.new_object()

    @rule(seconds=st.sampled_from([1.0, 10.0, 60.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(dice=st.integers(0, 4))
    def crew_deleted(self, dice: int) -> None:
        if dice == 0:  # rarely: it ends every story
            self.crew_exists = False

    # --- invariants -------------------------------------------------------------------------
    @invariant()
    def never_two_admissions(self) -> None:
        assert getattr(self, "admissions", 0) <= 1

    @invariant()
    def never_terminal_while_a_listed_replica_holds_a_running_record(self) -> None:
        if not hasattr(self, "status") or self.status.get("phase") not in TERMINAL:
            return
        if not self.crew_exists:
            return
        running = [s.ordinal for s in self.sims.values()
                   if (rec := s.records.get(self.spec.action_id)) is not None
                   and not rec.terminal]
        assert not running, (self.status.get("reason"), self.status.get("message"), running)

    @invariant()
    def every_uncertain_status_has_reason_and_recovery(self) -> None:
        if not hasattr(self, "status") or not self.status.get("uncertainOutcome"):
            return
        assert self.status.get("recovery"), self.status
        cond = next(c for c in self.status["conditions"] if c["type"] == "OutcomeUncertain")
        assert cond["status"] == "True" and cond["reason"] not in ("", "OutcomeKnown")
        assert self.status.get("reason")


CrewJobWorld.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_crewjob_machine_world = CrewJobWorld.TestCase


def drive(world: CrewJobWorld, steps: int = 40) -> None:
    for _ in range(steps):
        world.operator_steps(lose=0, n=1)


def test_scenario_scale_down_then_delete_and_reapply_is_not_run_twice() -> None:
    """The issue's first case, spelled out: ran on replica 1, Crew scaled to 1 (claim retained,
    pod gone), CrewJob deleted and re-applied: replica 1's journal must be asked first."""
    world = CrewJobWorld()
    world.setup(replicas=2, name="job-3")  # rendezvous puts team-a/job-3 on replica 1
    drive(world, 6)
    assert world.status["assignment"]["ordinal"] == 1 and world.admissions == 1
    world.job_ends(1, "completed")
    drive(world, 6)
    assert world.status["phase"] == "Succeeded"
    world.scale_down(1, retire_pod=True)
    world.delete()
    world.reapply()
    drive(world, 20)
    assert world.admissions == 1
    assert world.status["phase"] == "Pending" and "retained" in world.status["message"]
    world.scale_up()  # the retained claim gets a pod again: the record is found
    drive(world, 10)
    assert world.admissions == 1
    assert (world.status["phase"], world.status["assignment"]["ordinal"]) == ("Succeeded", 1)
