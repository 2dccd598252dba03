"""A CrewJob as a Kueue workload, and what its Workload means for admission: pure functions.

The choice (documented in docs/kueue.md): no mutating webhook sets ``spec.suspend`` on a
labelled CrewJob; the operator treats a CrewJob labelled ``kueue.x-k8s.io/queue-name`` as held
until its Workload is admitted (:func:`hold_of`, the machine's :class:`machine.Hold` input).
Invariants kept here:

K1  One Workload per CrewJob: its name is derived from the CrewJob's name and uid, it is owned
    (controller) by the CrewJob, and it requests :data:`RESOURCE` ``1`` (one running CrewJob
    of the Crew) plus, when the Crew sets ``workerLimits.memoryMiB``, that much memory, so a
    ClusterQueue can cap how many CrewJobs a team runs at once.
K2  Held unless admitted: a labelled CrewJob without a Workload, or whose Workload is not
    ``Admitted``, or is ``Evicted``, or finished, is held (never dispatched).
K3  An eviction of an assigned job is a cancel (the machine's I9); an eviction before the
    assignment (nothing was sent) hands the quota back (:func:`requeue_status`), as Kueue's
    job integrations do, and the job waits to be admitted again.
K4  A finished CrewJob finishes its Workload (``Finished=True``), so its quota is released and
    Kueue never admits it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from crewfence_operator.crewjob.machine import NO_HOLD, Hold, HoldReason

GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
PLURAL: Final = "workloads"
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL: Final = "kueue.x-k8s.io/job-uid"
"""Kueue's label naming the source job's uid on its Workload (its troubleshooting guide)."""
PRIORITY_CLASS_LABEL: Final = "kueue.x-k8s.io/priority-class"
RESOURCE: Final = "crewfence.dev/crewjobs"
"""The resource one running CrewJob of a Crew stands for (quota it in a ClusterQueue)."""
POD_SET: Final = "crew"

ADMITTED: Final = "Admitted"
QUOTA_RESERVED: Final = "QuotaReserved"
EVICTED: Final = "Evicted"
FINISHED: Final = "Finished"


def queue_name(metadata: Mapping[str, Any]) -> str | None:
    value = (metadata.get("labels") or {}).get(QUEUE_LABEL)
    return str(value) if value else None


def workload_name(job_name: str, uid: str) -> str:
    """K1: stable for one CrewJob object, distinct for a re-created one (a new uid)."""
    digest = hashlib.sha256(uid.encode()).hexdigest()[:8]
    return f"crewjob-{job_name[:230].rstrip('-.')}-{digest}"


def _condition(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == ctype:
            return cond
    return None


def _true(obj: Mapping[str, Any], ctype: str) -> bool:
    cond = _condition(obj, ctype)
    return cond is not None and cond.get("status") == "True"


@dataclass(frozen=True)
class WorkloadView:
    name: str
    admitted: bool
    evicted: str | None
    """The Evicted condition's reason and message while it is True."""
    finished: bool
    quota_reserved: bool


def view_of(workload: Mapping[str, Any]) -> WorkloadView:
    evicted = _condition(workload, EVICTED)
    message = None
    if evicted is not None and evicted.get("status") == "True":
        message = f"{evicted.get('reason') or 'Evicted'}: {evicted.get('message') or ''}".strip()
    return WorkloadView(name=str(workload["metadata"]["name"]),
                        admitted=_true(workload, ADMITTED), evicted=message,
                        finished=_true(workload, FINISHED),
                        quota_reserved=_true(workload, QUOTA_RESERVED)
                        or bool((workload.get("status") or {}).get("admission")))


def hold_of(spec: Mapping[str, Any], metadata: Mapping[str, Any],
            workload: WorkloadView | None, *, assigned: bool) -> Hold:
    """The machine's hold input (K2, K3; ``spec.suspend`` for every CrewJob)."""
    queue = queue_name(metadata)
    evicted = workload.evicted if workload is not None and assigned else None
    if spec.get("suspend"):
        return Hold(held=True, reason=HoldReason.SUSPENDED, queued=queue is not None,
                    message="spec.suspend is true: nothing is admitted until it is false",
                    evicted=evicted)
    if queue is None:
        return NO_HOLD
    if workload is None:
        return Hold(held=True, reason=HoldReason.WAITING_FOR_WORKLOAD, queued=True,
                    message=f"waiting for its Kueue Workload in queue {queue!r}")
    if workload.evicted or workload.finished or not workload.admitted:
        why = (f"evicted ({workload.evicted}); waiting to be admitted again" if workload.evicted
               else "finished" if workload.finished else "not admitted yet")
        return Hold(held=True, reason=HoldReason.WAITING_FOR_WORKLOAD, queued=True,
                    message=f"Kueue Workload {workload.name} in queue {queue!r}: {why}",
                    evicted=evicted)
    return Hold(queued=True)


def requests(crew_spec: Mapping[str, Any] | None) -> dict[str, str]:
    """K1: what one running CrewJob of this Crew takes from a ClusterQueue."""
    out = {RESOURCE: "1"}
    memory = ((crew_spec or {}).get("workerLimits") or {}).get("memoryMiB")
    if isinstance(memory, int) and memory > 0:
        out["memory"] = f"{memory}Mi"
    return out


def workload_body(job: Mapping[str, Any], crew_spec: Mapping[str, Any] | None, *,
                  priority: int | None) -> dict[str, Any]:
    """K1: the Workload of a labelled CrewJob (complete: Kueue's webhooks need not run)."""
    meta = job["metadata"]
    queue = queue_name(meta)
    assert queue is not None
    labels = meta.get("labels") or {}
    spec: dict[str, Any] = {
        "queueName": queue,
        "active": True,
        "podSets": [{
            "name": POD_SET, "count": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "crewjob", "image": "crewfence.dev/crewjob",
                "resources": {"requests": requests(crew_spec)},
            }]}},
        }],
    }
    if labels.get(PRIORITY_CLASS_LABEL) and priority is not None:
        spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass",
                                    "name": str(labels[PRIORITY_CLASS_LABEL])}
        spec["priority"] = priority
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload",
        "metadata": {
            "name": workload_name(str(meta["name"]), str(meta["uid"])),
            "namespace": meta["namespace"],
            "labels": {"app.kubernetes.io/managed-by": "crewfence",
                       "crewfence.dev/crewjob": str(meta["name"])[:63].rstrip("-_."),
                       JOB_UID_LABEL: str(meta["uid"])},
            "ownerReferences": [{
                "apiVersion": str(job.get("apiVersion") or "crewfence.dev/v1alpha1"),
                "kind": "CrewJob", "name": meta["name"], "uid": meta["uid"],
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": spec,
    }


def _set(conditions: Sequence[Mapping[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    out = [dict(c) for c in conditions if c.get("type") != new["type"]]
    before = next((c for c in conditions if c.get("type") == new["type"]), None)
    if before is not None and before.get("status") == new["status"]:
        new["lastTransitionTime"] = before.get("lastTransitionTime") or new["lastTransitionTime"]
    out.append(new)
    return out


def finished_status(workload: Mapping[str, Any], phase: str, message: str,
                    now: str) -> dict[str, Any]:
    """K4: the status merge patch marking the Workload finished (conditions complete)."""
    conditions = (workload.get("status") or {}).get("conditions") or []
    reason = "Succeeded" if phase == "Succeeded" else "Failed"
    return {"conditions": _set(conditions, {
        "type": FINISHED, "status": "True", "reason": reason,
        "message": f"CrewJob {phase}: {message}"[:32768], "lastTransitionTime": now,
        "observedGeneration": int(workload["metadata"].get("generation") or 1)})}


def requeue_status(workload: Mapping[str, Any], message: str, now: str) -> dict[str, Any]:
    """K3: an evicted Workload whose job was never dispatched gives its quota back."""
    generation = int(workload["metadata"].get("generation") or 1)
    conditions = (workload.get("status") or {}).get("conditions") or []
    for ctype in (QUOTA_RESERVED, ADMITTED):
        conditions = _set(conditions, {
            "type": ctype, "status": "False", "reason": "Pending",
            "message": message[:32768], "lastTransitionTime": now,
            "observedGeneration": generation})
    return {"admission": None, "conditions": conditions}
