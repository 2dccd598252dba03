"""kopf glue for Kueue: the Workload watch (evictions) and finishing a finished CrewJob's
Workload. The decisions are in ``crewjob/kueue.py`` (K1-K4); the Workload I/O in
``workloads.py``; the hold before each decision reaches the machine through
``Runtime.hold``.

- An evicted Workload of a CrewJob is remembered in ``Runtime.evictions`` (no API call), so a
  CrewJob daemon that is following a running job's events stops at once and cancels it on the
  sidecar (machine I9).
- A finished, labelled CrewJob gets its Workload marked ``Finished`` (K4), retried on the
  CrewJob's next event when Kueue wrote the Workload in between (resourceVersion guard).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf

from crewfence_operator import constants as c
from crewfence_operator import workloads
from crewfence_operator.crewjob import kueue
from crewfence_operator.crewjob.outcome import TERMINAL_PHASES
from crewfence_operator.runtime import runtime_of


@kopf.on.event(kueue.GROUP, kueue.VERSION, kueue.PLURAL, id="kueue-workload-evictions",
               labels={"app.kubernetes.io/managed-by": "crewfence"})
async def workload_evictions(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    obj = event.get("object") or {}
    if event.get("type") == "DELETED" or not obj.get("metadata"):
        return
    found = workloads.evicted(obj)
    if found is not None:
        runtime_of(memo).evictions[found[0]] = found[1]
        runtime_of(memo).wake(found[0])


@kopf.on.event(c.GROUP, c.VERSION, c.CREWJOB_PLURAL, id="kueue-workload-finished",
               labels={kueue.QUEUE_LABEL: kopf.PRESENT})
async def workload_finished(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    done = runtime_of(memo).finished_workloads
    if event.get("type") == "DELETED":
        done.discard(uid)
        runtime_of(memo).evictions.pop(uid, None)
        return
    if uid in done or (obj.get("status") or {}).get("phase") not in {
            p.value for p in TERMINAL_PHASES}:
        return
    if await asyncio.to_thread(workloads.finish, obj):
        done.add(uid)
        runtime_of(memo).evictions.pop(uid, None)

