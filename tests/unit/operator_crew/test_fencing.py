"""Who may mount a state claim: webhook rule and audit rule."""

from __future__ import annotations

from typing import Any

from crewfence_operator.crew.fencing import (
    StateClaimOwner,
    foreign_mounts,
    pod_rejection,
    state_claim_owner,
)
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.pod import PodSettings, replica_pod
from crewfence_operator.crew.resources import state_claim
from crewfence_operator.crew.spec import parse_spec

SPEC = parse_spec({"entrypoint": "m:a", "replicas": 2})


def _foreign(name: str, claim: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **meta},
            "spec": {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
            "status": {"phase": "Running"}}


def test_claim_owner_from_labels(crew_ref: CrewRef) -> None:
    owner = state_claim_owner(state_claim(crew_ref, SPEC, 1))
    assert owner == StateClaimOwner(claim="research-state-1", crew="research", ordinal=1)
    assert state_claim_owner({"metadata": {"name": "x", "labels": {}}}) is None


def test_operator_pod_admitted(crew_ref: CrewRef) -> None:
    owner = state_claim_owner(state_claim(crew_ref, SPEC, 0))
    assert owner is not None
    assert pod_rejection(replica_pod(crew_ref, SPEC, 0, PodSettings()), [owner]) is None


def test_foreign_and_forged_pods_rejected(crew_ref: CrewRef) -> None:
    owner = state_claim_owner(state_claim(crew_ref, SPEC, 0))
    assert owner is not None
    message = pod_rejection(_foreign("debug", "research-state-0"), [owner])
    assert message is not None
    assert '"debug"' in message and '"research-state-0"' in message
    assert 'Crew "research"' in message and '"research-0"' in message
    # Labels copied from a replica pod, but no Crew owner reference: still foreign.
    forged = replica_pod(crew_ref, SPEC, 0, PodSettings())
    forged["metadata"].pop("ownerReferences")
    assert pod_rejection(forged, [owner]) is not None
    # The operator's pod of ANOTHER ordinal may not mount this claim either.
    other = replica_pod(crew_ref, SPEC, 1, PodSettings())
    assert pod_rejection(other, [owner]) is not None
    unnamed = _foreign("", "research-state-0", generateName="job-")
    unnamed["metadata"].pop("name")
    assert "job-<generated>" in (pod_rejection(unnamed, [owner]) or "")


def test_audit_finds_only_foreign_live_pods(crew_ref: CrewRef) -> None:
    claims = {0: "research-state-0", 1: "research-state-1"}
    pods = [
        replica_pod(crew_ref, SPEC, 0, PodSettings()),
        replica_pod(crew_ref, SPEC, 1, PodSettings()),
        _foreign("backup", "research-state-1"),
        _foreign("old", "research-state-0") | {"status": {"phase": "Succeeded"}},
        _foreign("unrelated", "other-claim"),
    ]
    mounts = foreign_mounts("research", claims, pods)
    assert [(m.claim, m.ordinal, m.pod) for m in mounts] == [("research-state-1", 1, "backup")]
    assert '"research-state-1"' in mounts[0].reason and '"backup"' in mounts[0].reason


def test_the_audit_does_not_fence_the_replicas_own_orphaned_pod(crew_ref: CrewRef) -> None:
    """A Crew deleted with --cascade=orphan and re-created: its pod has no controller until the
    adoption patch lands; the audit must not call it foreign meanwhile (CI, 2026-12-03: the
    re-created Crew showed replica 0 fenced after its job succeeded)."""
    claims = {0: "research-state-0", 1: "research-state-1"}
    orphan = replica_pod(crew_ref, SPEC, 0, PodSettings())
    orphan["metadata"].pop("ownerReferences")
    renamed = replica_pod(crew_ref, SPEC, 1, PodSettings())
    renamed["metadata"].pop("ownerReferences")
    renamed["metadata"]["name"] = "research-copy"
    taken = replica_pod(crew_ref, SPEC, 1, PodSettings())
    taken["metadata"]["name"] = "research-1"
    taken["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "x", "uid": "u", "controller": True}]
    leaving = replica_pod(crew_ref, SPEC, 0, PodSettings())
    leaving["metadata"].pop("ownerReferences")
    leaving["metadata"]["deletionTimestamp"] = "2026-12-03T00:00:00Z"

    assert foreign_mounts("research", claims, [orphan]) == []
    assert [m.pod for m in foreign_mounts("research", claims, [renamed, taken, leaving])] == [
        "research-0", "research-1", "research-copy"]
