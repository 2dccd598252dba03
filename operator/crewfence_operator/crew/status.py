"""The Crew's status from what the operator observed: pure, so it can be tested in isolation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from crewfence_operator import constants as c
from crewfence_operator.crew.journal_room import BoundReport, journal_room, reports_from_wire
from crewfence_operator.crew.model_credentials import CredentialsVerdict
from crewfence_operator.crew.pod import mounted_state_claim
from crewfence_operator.crew.tool_servers import ToolsVerdict


class ReplicaState(StrEnum):
    """A listed replica's role, as CrewJob dispatch reads it from ``status.replicas[].state``.

    Invariant: only ``Active`` replicas (ordinal below ``spec.replicas``) may be ``ready``, so
    only they receive new jobs; ``Draining`` and ``Retained`` ones are listed because their
    journal may hold an action that a CrewJob must find before admitting it anywhere.
    """

    ACTIVE = "Active"
    DRAINING = "Draining"
    """Above spec.replicas with a pod: answers lookups, refuses admissions, running jobs end."""
    RETAINED = "Retained"
    """Above spec.replicas, a claim that may hold records but no pod answering for it (yet)."""


@dataclass(frozen=True)
class Health:
    """What a replica's ``GET /health`` said (only the fields the operator uses)."""

    status: str
    journal_id: str | None
    retained_runs: int | None
    active_runs: int | None
    draining: bool | None = None
    """None: the sidecar did not say (a sidecar without draining mode)."""
    unarchived_records: int | None = None
    tombstones: int | None = None
    """Tombstones in the journal; None: the sidecar did not say (it cannot hand them over)."""
    model_credentials: Mapping[str, Mapping[str, Any]] | None = None
    """Per declarative crew id: ``{model, hosted, credentials: present|missing|not_needed}``;
    None: the sidecar did not say."""
    over_bounds: tuple[BoundReport, ...] | None = None
    """``journal_over_bounds``: the journal bounds it is at or over; None: did not say."""
    pod_uid: str | None = None
    """The uid of the pod that answered; None: the sidecar did not say."""

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> Health:
        def opt_int(key: str) -> int | None:
            value = body.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        journal_id = body.get("journal_id")
        pod_uid = body.get("pod_uid")
        draining = body.get("draining")
        credentials = body.get("model_credentials")
        return cls(
            status=str(body.get("status", "")),
            journal_id=str(journal_id) if journal_id else None,
            retained_runs=opt_int("retained_runs"),
            active_runs=opt_int("active_runs"),
            draining=draining if isinstance(draining, bool) else None,
            unarchived_records=opt_int("unarchived_records"),
            tombstones=opt_int("tombstones"),
            model_credentials=(
                {str(k): v for k, v in credentials.items() if isinstance(v, Mapping)}
                if isinstance(credentials, Mapping) else None),
            over_bounds=reports_from_wire(body.get("journal_over_bounds")),
            pod_uid=str(pod_uid) if pod_uid else None,
        )


@dataclass(frozen=True)
class ReplicaObservation:
    ordinal: int
    pod_name: str
    claim: str
    pod: Mapping[str, Any] | None
    health: Health | None
    fence_reason: str | None = None
    message: str | None = None
    state: ReplicaState = ReplicaState.ACTIVE

    @property
    def serving(self) -> bool:
        """Only an Active replica takes new jobs (a scaling-down one is never ready)."""
        return self.state is ReplicaState.ACTIVE


@dataclass(frozen=True)
class RetainedClaim:
    ordinal: int
    claim: str
    retained_runs: int | None
    reason: str


def health_of_pod(pod: Mapping[str, Any] | None, health: Health | None) -> Health | None:
    """The health answered at ``pod``'s address, if that pod answered it (else None).

    Invariant (a replica's facts are one pod's facts): the Crew's entry pairs the claim the
    pod object mounts with the journal id its health names, and every scale-down decision
    reads them together. An address can reach another pod than the object the operator's pod
    index still holds (a replaced pod given the same IP before the index sees the change);
    its answer names another uid and is dropped, as if the replica had not answered. A
    sidecar that names no pod is taken at its address (an older sidecar).
    """
    if health is None or health.pod_uid is None:
        return health
    uid = ((pod or {}).get("metadata") or {}).get("uid")
    return health if uid is None or uid == health.pod_uid else None


def pod_is_ready(pod: Mapping[str, Any] | None) -> bool:
    if not pod or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def pod_address(pod: Mapping[str, Any] | None, port: int) -> str | None:
    if not pod or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    ip = (pod.get("status") or {}).get("podIP")
    return f"{ip}:{port}" if ip else None


def replica_status(obs: ReplicaObservation, port: int) -> dict[str, Any]:
    """One ``status.replicas`` entry.

    Invariant (a listed journal id belongs to the listed claim): ``journalId`` is what the
    replica's pod answered, so ``claim`` is the claim that pod mounts, not the one the spec now
    asks for. After ``storage.existingClaim`` changes, the old pod serves the old claim until it
    is rolled; listing the new claim with the old journal's id would make a CrewJob assigned to
    the new claim read "journal changed" and end JournalLost while its record is intact. A pod
    whose claim is not the desired one is about to be replaced: never ready for new work.
    """
    healthy = (obs.health is not None and obs.health.status == "ready"
               and obs.health.draining is not True)
    mounted = mounted_state_claim(obs.pod)
    rolling = mounted is not None and mounted != obs.claim
    entry: dict[str, Any] = {
        "ordinal": obs.ordinal,
        "pod": obs.pod_name,
        "claim": mounted or obs.claim,
        "state": obs.state.value,
        "address": pod_address(obs.pod, port),
        "journalId": obs.health.journal_id if obs.health else None,
        "ready": obs.serving and pod_is_ready(obs.pod) and healthy and not rolling,
        "fenced": obs.fence_reason is not None,
        "fenceReason": obs.fence_reason,
    }
    if obs.health is not None:
        entry["retainedRuns"] = obs.health.retained_runs
        entry["activeRuns"] = obs.health.active_runs
        entry["draining"] = obs.health.draining
        entry["unarchivedRecords"] = obs.health.unarchived_records
    if obs.message:
        entry["message"] = obs.message
    elif rolling:
        entry["message"] = (f"the pod mounts claim {mounted}; it is replaced to mount "
                            f"{obs.claim}")
    return _without_nulls(entry)


def _without_nulls(entry: dict[str, Any]) -> dict[str, Any]:
    """Status is written with a merge patch, where null means "delete": an absent key IS null.
    Dropping them keeps the written status equal to what is read back (no needless writes)."""
    return {k: v for k, v in entry.items() if v is not None}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    previous: Sequence[Mapping[str, Any]], ctype: str, status: bool | None, reason: str,
    message: str, generation: int | None, now: str | None = None,
) -> dict[str, Any]:
    """A standard condition (``status`` None is Unknown); lastTransitionTime moves only when
    the status flips."""
    value = "Unknown" if status is None else "True" if status else "False"
    old = next((p for p in previous if p.get("type") == ctype), None)
    changed = old is None or old.get("status") != value
    return _without_nulls({
        "type": ctype,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": (
            (now or _now()) if changed or old is None else old.get("lastTransitionTime")
        ),
    })


@dataclass(frozen=True)
class CrewObservation:
    generation: int | None
    desired_replicas: int
    replicas: Sequence[ReplicaObservation]
    retained_claims: Sequence[RetainedClaim]
    previous_conditions: Sequence[Mapping[str, Any]]
    port: int = c.SIDECAR_PORT
    error: str | None = None
    credentials: CredentialsVerdict | None = None
    """The ``ModelCredentials`` condition's content (``crew/model_credentials.py``); None:
    no such condition (an entrypoint crew, or a spec that did not parse)."""
    tools: ToolsVerdict | None = None
    """The ``ToolsReady`` condition's content (``crew/tool_servers.py``); None: no such
    condition (a spec that did not parse)."""


def crew_status(obs: CrewObservation, now: str | None = None) -> dict[str, Any]:
    replicas = [replica_status(r, obs.port) for r in sorted(obs.replicas, key=lambda r: r.ordinal)]
    serving = [r for r in replicas if r["ordinal"] < obs.desired_replicas]
    ready = sum(1 for r in serving if r["ready"] and not r["fenced"])
    fenced = [r for r in replicas if r["fenced"]]
    prev = obs.previous_conditions

    if obs.error:
        ready_cond = condition(prev, c.COND_READY, False, "ReconcileError", obs.error,
                               obs.generation, now)
    elif fenced:
        ready_cond = condition(
            prev, c.COND_READY, False, "ReplicaFenced",
            f"{len(fenced)} replica(s) fenced: " + "; ".join(str(r["fenceReason"]) for r in fenced),
            obs.generation, now)
    elif ready < obs.desired_replicas:
        ready_cond = condition(prev, c.COND_READY, False, "ReplicasNotReady",
                               f"{ready}/{obs.desired_replicas} replicas ready",
                               obs.generation, now)
    else:
        ready_cond = condition(prev, c.COND_READY, True, "ReplicasReady",
                               f"{ready}/{obs.desired_replicas} replicas ready",
                               obs.generation, now)

    if fenced:
        shared = condition(
            prev, c.COND_STATE_SHARED, True, "ForeignPodMountsState",
            "; ".join(str(r["fenceReason"]) for r in fenced), obs.generation, now)
    else:
        shared = condition(prev, c.COND_STATE_SHARED, False, "NotShared",
                           "no foreign pod mounts a state claim", obs.generation, now)

    if obs.retained_claims:
        holding = any(r.retained_runs != 0 for r in obs.retained_claims)
        retained = condition(
            prev, c.COND_CLAIMS_RETAINED, True,
            "UnarchivedRecords" if holding else "RetainedBySetting",
            "; ".join(
                f"claim {r.claim} (replica {r.ordinal}) kept: {r.reason}"
                for r in obs.retained_claims
            ), obs.generation, now)
    else:
        retained = condition(prev, c.COND_CLAIMS_RETAINED, False, "NoneRetained",
                             "no state claim is kept beyond spec.replicas", obs.generation, now)

    # kstatus (tests/e2e/test_kstatus_verdicts.py): what needs a person is Stalled (Failed),
    # as the documented health says: a fenced replica, a shared state claim, a hosted model
    # without its key. Not-yet-ready replicas are only Ready=False (InProgress).
    if fenced:
        stalled = condition(prev, c.COND_STALLED, True, "ReplicaFenced",
                            str(ready_cond["message"]), obs.generation, now)
    elif obs.credentials is not None and obs.credentials.status is False:
        stalled = condition(prev, c.COND_STALLED, True, obs.credentials.reason,
                            obs.credentials.message, obs.generation, now)
    else:
        stalled = condition(prev, c.COND_STALLED, False, "NotStalled",
                            "nothing needs a person", obs.generation, now)
    room = journal_room({r.ordinal: r.health.over_bounds for r in obs.replicas
                         if r.health is not None and r.health.over_bounds})
    conditions = [ready_cond, shared, retained, stalled,
                  condition(prev, c.COND_JOURNAL_FULL, room.status, room.reason, room.message,
                            obs.generation, now)]
    if obs.credentials is not None:
        conditions.append(condition(prev, c.COND_MODEL_CREDENTIALS, obs.credentials.status,
                                    obs.credentials.reason, obs.credentials.message,
                                    obs.generation, now))
    if obs.tools is not None:
        conditions.append(condition(prev, c.COND_TOOLS_READY, obs.tools.status,
                                    obs.tools.reason, obs.tools.message, obs.generation, now))
    return {
        "observedGeneration": obs.generation,
        "replicas": replicas,
        "readyReplicas": ready,
        "fencedReplicas": len(fenced),
        "retainedClaims": [
            _without_nulls({"ordinal": r.ordinal, "claim": r.claim,
                            "retainedRuns": r.retained_runs, "reason": r.reason})
            for r in obs.retained_claims
        ],
        "conditions": conditions,
    }
