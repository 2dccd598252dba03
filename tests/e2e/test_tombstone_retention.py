"""Tombstone retention on the real control plane (issue 19).

Invariant (``Journal.tombstone_cutoff``, a Crew's ``spec.journal.tombstoneRetention``, the
sidecar's ``CREWFENCE_TOMBSTONE_RETENTION_SECONDS``): once an action id was admitted, every
later attempt with it gets the archived answer until the explicit tombstone retention has
passed since the record was first archived; then, and only then, the action id is new again.

The test runs a CrewJob, archives its record (the sidecar's ``DELETE /jobs/{id}``, as a person
or the hand-over would), prunes and re-applies the manifest while the tombstone lives (it ends
``Archived``, no model call is made, nothing is admitted), awaits the tombstone's expiry (the
sidecar answers 404 for the action), and re-applies once more: the action is admitted anew
and runs once more. Model calls are counted outside every journal, in the offline LLM's
ledger (``controlplane.offline_llm_ledger``), by a token only this test's input carries.

It fails if the tombstone did not protect within the window (a model call, an admission, or a
phase other than ``Succeeded/Archived``) and if it never expired (the 404 is awaited with a
bound). The window must leave room for one re-apply on a loaded machine, so it is 30 s, not
the CRD's minimum of 1 s (``journal.tombstoneRetention must be at least one second``).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import quote

from crewfence_sidecar.contract import ARCHIVE_CONFIRMATION_HEADER
from crewjob_support import (
    SidecarAccess,
    apply_obj,
    condition,
    crew_access,
    crewjob_manifest,
    delete_job,
    ledger_calls,
    metric_total,
    research_crew,
    sidecar_get,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness.handles import Cluster, Operator

CREW = "research"
RETENTION_SECONDS = 30


def _admissions(replica: dict[str, Any], access: SidecarAccess) -> float:
    status, text = sidecar_get(replica, "/metrics", access)
    assert status == 200, text
    return metric_total(text, "crewfence_sidecar_admissions_total")


def _reasons(obj: dict[str, Any]) -> set[str]:
    return {str(c.get("reason")) for c in (obj.get("status") or {}).get("conditions") or []}


def test_a_tombstone_refuses_until_its_retention_then_the_action_is_new(
    cluster: Cluster, operator_process: Operator, namespace: str
) -> None:
    crew = research_crew(1)
    crew["spec"]["journal"] = {"tombstoneRetention": f"{RETENTION_SECONDS}s"}
    assert apply_obj(cluster, crew, namespace).returncode == 0
    replica = wait_crew_ready(cluster, namespace, CREW, 1)[0]
    access = crew_access(cluster, namespace, CREW)
    token = f"tomb{uuid.uuid4().hex[:10]}"
    name = "expiring"
    action = f"{namespace}/{name}"
    job = crewjob_manifest(name, "run", {"topic": f"{token} retention"})

    assert apply_obj(cluster, job, namespace).returncode == 0
    first = wait_phase(cluster, namespace, name)["status"]
    assert first["phase"] == "Succeeded" and not first["uncertainOutcome"], json.dumps(first)
    calls = ledger_calls(cluster, token)
    assert calls > 0, "the first run's model calls are in the ledger"
    admitted = _admissions(replica, access)

    # Archive the record: the tombstone's window starts now.
    delete_job(cluster, namespace, name)
    code, _, raw = access.exchange(replica, f"/jobs/{quote(action, safe='')}",
                                   method="DELETE", timeout=30,
                                   headers={ARCHIVE_CONFIRMATION_HEADER: action})
    assert code == 200, raw
    archived_at = time.monotonic()
    assert sidecar_get(replica, f"/jobs/{quote(action, safe='')}", access)[0] == 410

    # While it lives: the pruned manifest re-applied gets the archived answer, nothing runs.
    assert apply_obj(cluster, job, namespace).returncode == 0
    again = wait_phase(cluster, namespace, name)
    within = time.monotonic() - archived_at
    status = again["status"]
    assert status["phase"] == "Succeeded" and "Archived" in _reasons(again), \
        f"{within:.1f}s after the archive (window {RETENTION_SECONDS}s): {json.dumps(status)}"
    assert status["requestHash"] == first["requestHash"], json.dumps(status)
    assert not status.get("uncertainOutcome")
    assert ledger_calls(cluster, token) == calls, "the tombstone let the action run again"
    assert _admissions(replica, access) == admitted, "the tombstone let it be admitted again"
    delete_job(cluster, namespace, name)

    # The window passes: the sidecar no longer knows the action (an awaited fact, no sleep).
    wait_for(lambda: sidecar_get(replica, f"/jobs/{quote(action, safe='')}", access)[0] == 404,
             timeout=RETENTION_SECONDS + 90, what="the tombstone to expire")

    # After it: the same manifest is a new action, admitted and run once more.
    assert apply_obj(cluster, job, namespace).returncode == 0
    fresh = wait_phase(cluster, namespace, name)
    status = fresh["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)
    assert "Archived" not in _reasons(fresh), json.dumps(status)
    assert status["startedAt"] != first["startedAt"]
    assert status["output"]["sha256"], json.dumps(status)
    assert ledger_calls(cluster, token) == 2 * calls, "run once more, exactly"
    assert _admissions(replica, access) == admitted + 1
    assert condition(fresh, "OutcomeUncertain") is None or \
        condition(fresh, "OutcomeUncertain")["status"] == "False"
