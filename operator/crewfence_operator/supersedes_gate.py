"""The admission gate of a CrewJob that supersedes another (``spec.supersedes``): before the
successor's first admission, read the predecessor, decide (pure: ``crewjob/supersede.py``),
claim the predecessor and link the successor.

The CrewJob daemon calls it through ``Runtime.gate`` (``runtime.py``). Invariant (one
successor per uncertain outcome): the claim on the predecessor (``status.supersededBy``) is
guarded by its resourceVersion, so of two successors racing for one predecessor only one
wins; the other waits (the predecessor changed) and then sees the claim and is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from crewfence_operator import kube
from crewfence_operator.crewjob import machine, outcome, supersede
from crewfence_operator.crewjob.spec import default_action_id


def as_body(obj: Mapping[str, Any]) -> kopf.Body:
    """kopf posts Events for any object with apiVersion, kind and metadata (uid, name)."""
    return cast(kopf.Body, obj)


async def supersedes_gate(body: Mapping[str, Any], action_id: str) -> supersede.GateDecision:
    """Called by the CrewJob runner before its first admission. Without ``spec.supersedes``
    it proceeds at once (no API call). With it: read the predecessor, decide, and on
    proceed claim the predecessor (``status.supersededBy``, guarded by its resourceVersion)
    and link this job (``status.supersedes``)."""
    spec, meta = body.get("spec") or {}, body["metadata"]
    predecessor_name = spec.get("supersedes")
    if not predecessor_name:
        return supersede.GateDecision(supersede.Gate.PROCEED, "no_predecessor", "")
    namespace, name = str(meta["namespace"]), str(meta["name"])
    predecessor = await asyncio.to_thread(kube.get_crewjob, namespace,
                                          str(predecessor_name))
    resume_from = (default_action_id(namespace, str(predecessor_name))
                   if spec.get("resume") else None)
    decision = supersede.decide(successor_name=name, successor_action_id=action_id,
                                predecessor=predecessor, predecessor_name=str(predecessor_name),
                                resume_from=resume_from)
    if not decision.proceed or predecessor is None:
        return decision
    if ((predecessor.get("status") or {}).get("supersededBy") or {}).get("name") != name:
        try:
            await asyncio.to_thread(
                kube.patch_crewjob_status, namespace, str(predecessor_name),
                supersede.claim_patch(predecessor, successor_name=name,
                                      successor_action_id=action_id))
        except ApiException as exc:
            if exc.status in (404, 409):  # deleted or changed meanwhile: decide again later
                return supersede.GateDecision(
                    supersede.Gate.WAIT, "predecessor_changed",
                    f"predecessor {predecessor_name!r} changed while it was being linked; "
                    "looking again")
            raise
        kopf.event(as_body(predecessor), type="Normal", reason="Superseded",
                   message=f"superseded by CrewJob {name} (action id {action_id})")
    await asyncio.to_thread(kube.patch_crewjob_status_unless_gone, namespace, name, {
        "supersedes": supersede.supersedes_status(predecessor, str(predecessor_name))})
    return decision


async def admission_gate(body: Mapping[str, Any]) -> machine.Gate:
    """:func:`supersedes_gate` as the state machine's :class:`machine.Gate` (the hook the
    CrewJob handler calls before the first admission: ``Runtime.gate``)."""
    decision = await supersedes_gate(body, supersede.effective_action_id(body))
    if decision.gate is supersede.Gate.PROCEED:
        if decision.pin is not None:  # spec.resume: only where the predecessor's journal is
            return machine.Gate(pin_ordinal=decision.pin[0], pin_journal=decision.pin[1])
        return machine.OPEN_GATE
    if decision.gate is supersede.Gate.REFUSE:
        return machine.Gate(open=False, message=decision.message,
                            refusal=outcome.invalid_spec(decision.code, decision.message))
    return machine.Gate(open=False, reason=supersede.WAIT_REASON, message=decision.message)
