"""The Kueue Workload of a labelled CrewJob: the I/O that ``crewjob/kueue.py`` decides.

Called by the CrewJob daemon through ``Runtime.hold`` (before each decision: the machine's
:class:`~crewfence_operator.crewjob.machine.Hold` input) and by ``handlers/kueue.py`` (a
finished CrewJob finishes its Workload). Invariants K1-K4 are in ``crewjob/kueue.py``; here:
the Workload is created at most once per CrewJob object (its name is derived from the uid, a
409 means it exists), and every status write is guarded by the Workload's resourceVersion, so
a concurrent write by Kueue is never overwritten (the next round reads again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from crewfence_operator import kube
from crewfence_operator.crewjob import kueue
from crewfence_operator.crewjob.machine import Hold
from crewfence_operator.crewjob.status import now_iso

log = logging.getLogger(__name__)


def _get(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj = kube.custom().get_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, namespace, kueue.PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(obj)


def _create(body: dict[str, Any]) -> None:
    try:
        kube.custom().create_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, body["metadata"]["namespace"], kueue.PLURAL, body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def _patch_status(workload: Mapping[str, Any], status: dict[str, Any]) -> bool:
    """Merge patch of the status, guarded by resourceVersion; False on a conflict."""
    meta = workload["metadata"]
    body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
    try:
        kube.custom().patch_namespaced_custom_object_status(
            kueue.GROUP, kueue.VERSION, meta["namespace"], kueue.PLURAL, meta["name"], body)
    except ApiException as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


def _priority(labels: Mapping[str, Any]) -> int | None:
    name = labels.get(kueue.PRIORITY_CLASS_LABEL)
    if not name:
        return None
    try:
        obj = kube.custom().get_cluster_custom_object(
            kueue.GROUP, kueue.VERSION, "workloadpriorityclasses", str(name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    value = obj.get("value")
    return int(value) if isinstance(value, int) else None


def _ensure(body: Mapping[str, Any]) -> dict[str, Any] | None:
    meta = body["metadata"]
    name = kueue.workload_name(str(meta["name"]), str(meta["uid"]))
    found = _get(str(meta["namespace"]), name)
    if found is not None:
        return found
    spec = body.get("spec") or {}
    crew = kube.get_crew(str(meta["namespace"]), str((spec.get("crewRef") or {}).get("name")))
    _create(kueue.workload_body(body, (crew or {}).get("spec"),
                                priority=_priority(meta.get("labels") or {})))
    return _get(str(meta["namespace"]), name)


async def hold(body: Mapping[str, Any], status: Mapping[str, Any]) -> Hold:
    """The hold of this CrewJob now (K2); creates its Workload when labelled (K1) and hands
    the quota of an evicted, never dispatched job back (K3). API errors hold the job."""
    meta, spec = body["metadata"], body.get("spec") or {}
    assigned = bool(status.get("assignment"))
    if kueue.queue_name(meta) is None:
        return kueue.hold_of(spec, meta, None, assigned=assigned)
    try:
        workload = await asyncio.to_thread(_ensure, body)
    except ApiException as exc:
        log.warning("crewjob %s/%s: Workload not readable (%s)", meta["namespace"],
                    meta["name"], exc.status)
        workload = None
    view = kueue.view_of(workload) if workload is not None else None
    if (workload is not None and view is not None and view.evicted and not assigned
            and view.quota_reserved and not view.finished):
        await asyncio.to_thread(_patch_status, workload, kueue.requeue_status(
            workload, f"the CrewJob was not dispatched when evicted ({view.evicted})",
            now_iso()))
    return kueue.hold_of(spec, meta, view, assigned=assigned)


def finish(job: Mapping[str, Any]) -> bool:
    """K4: mark the finished CrewJob's Workload Finished; True once it is (or is gone)."""
    meta, status = job["metadata"], job.get("status") or {}
    workload = _get(str(meta["namespace"]),
                    kueue.workload_name(str(meta["name"]), str(meta["uid"])))
    if workload is None or kueue.view_of(workload).finished:
        return True
    return _patch_status(workload, kueue.finished_status(
        workload, str(status.get("phase")), str(status.get("reason") or ""), now_iso()))


def evicted(workload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(CrewJob uid, eviction message) when this Workload of a CrewJob is evicted."""
    view = kueue.view_of(workload)
    if not view.evicted:
        return None
    owner = next((o for o in workload["metadata"].get("ownerReferences") or []
                  if o.get("kind") == "CrewJob" and o.get("controller")), None)
    return (str(owner["uid"]), view.evicted) if owner else None
