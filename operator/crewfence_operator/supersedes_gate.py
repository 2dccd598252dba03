"""The admission gate of a CrewJob that supersedes another (``spec.supersedes``): before the
successor's first admission, find the predecessor's record in its Crew's journals and claim
the one successor slot there (decisions are pure: ``crewjob/supersede.py``).

The CrewJob daemon calls it through ``Runtime.gate`` (``runtime.py``). Invariants:
- *the journal decides, never a status*: the predecessor's resolution and its one-successor
  claim are journal facts (``POST /jobs/{predecessor}/successor``, written once), so a
  predecessor deleted and re-applied (empty status, another ``spec.resolution``) cannot admit
  a second successor or one after ``Happened``; the predecessor's ``status.supersededBy`` and
  this job's ``status.supersedes`` are mirrors written after the journal's answer;
- *one successor per uncertain outcome*: two successors racing for one predecessor both ask
  the same journal, which takes one claim (one thread, one transaction); the other is
  refused ``already_superseded``.

Where the predecessor's record is: the replica in its ``status.assignment`` first, then every
other replica of the Crew. A predecessor whose CrewJob was deleted is still found by its
action id: ``status.supersedes.actionId`` once this job saw it, else ``<namespace>/<name>``
of ``spec.supersedes`` (a deleted predecessor that ran under a custom ``spec.actionId`` that
this job never saw is not found: the successor waits).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import kopf
from crewfence_sidecar.contract import SuccessorRequest

from crewfence_operator import kube
from crewfence_operator.crewjob import machine, outcome, supersede
from crewfence_operator.crewjob.replicas import asking_order, parse_replicas
from crewfence_operator.crewjob.spec import default_action_id
from crewfence_operator.crewjob.supersede import Answer, JournalAnswer
from crewfence_operator.sidecar_client import (
    Endpoint,
    SidecarClient,
    SidecarFailure,
    SuccessorAnswer,
)

if TYPE_CHECKING:
    from crewfence_operator.runtime import Runtime


def as_body(obj: Mapping[str, Any]) -> kopf.Body:
    """kopf posts Events for any object with apiVersion, kind and metadata (uid, name)."""
    return cast(kopf.Body, obj)


def predecessor_action_id(body: Mapping[str, Any], predecessor: Mapping[str, Any] | None,
                          predecessor_name: str) -> str:
    """The predecessor's action id: from its object, else from this job's status (seen
    before), else the default ``<namespace>/<name>``."""
    if predecessor is not None:
        return supersede.effective_action_id(predecessor)
    seen = ((body.get("status") or {}).get("supersedes") or {}).get("actionId")
    return str(seen or f"{body['metadata']['namespace']}/{predecessor_name}")


async def ask_journals(runtime: Runtime, namespace: str, crew_name: str,
                       request: SuccessorRequest, first: object
                       ) -> tuple[list[JournalAnswer], SuccessorAnswer | None]:
    """Ask the replicas (``first`` = the predecessor's assigned ordinal, first) to claim the
    successor slot; stop at the first answer that is not "unknown here"."""
    crew, token = await runtime.io.read_crew(namespace, crew_name)
    replicas = asking_order(parse_replicas(crew or {}), first)
    answers: list[JournalAnswer] = []
    for replica in replicas:
        if not replica.address or not token:
            answers.append(JournalAnswer(replica.ordinal, Answer.UNREACHABLE,
                                         message="no address or token yet"))
            continue
        options = await runtime.io.endpoint_options(namespace, crew_name, replica.ordinal)
        client = SidecarClient(runtime.session(), Endpoint(replica.address, token, **options),
                               runtime.settings.timeouts)
        try:
            claimed = await client.claim_successor(request)
        except SidecarFailure as exc:
            if exc.http_status == 404:
                answers.append(JournalAnswer(replica.ordinal, Answer.NOT_FOUND))
                continue
            if exc.http_status == 410:
                answers.append(JournalAnswer(replica.ordinal, Answer.ARCHIVED,
                                             message=exc.message))
                return answers, None
            if exc.http_status == 409:
                answers.append(JournalAnswer(replica.ordinal, Answer.REFUSED, code=exc.code,
                                             message=exc.message))
                return answers, None
            answers.append(JournalAnswer(replica.ordinal, Answer.UNREACHABLE,
                                         message=str(exc)))
            continue
        answers.append(JournalAnswer(replica.ordinal, Answer.CLAIMED,
                                     outcome=str(claimed.resolution.data.get("outcome"))))
        return answers, claimed
    return answers, None


async def supersedes_gate(body: Mapping[str, Any], action_id: str,
                          runtime: Runtime) -> supersede.GateDecision:
    """Called by the CrewJob runner before its first admission. Without ``spec.supersedes``
    it proceeds at once (no API call). With it: the journal of the predecessor's record
    claims the successor slot or says why not; the two CrewJobs' status mirror its answer."""
    spec, meta = body.get("spec") or {}, body["metadata"]
    predecessor_name = spec.get("supersedes")
    if not predecessor_name:
        return supersede.GateDecision(supersede.Gate.PROCEED, "no_predecessor", "")
    namespace, name = str(meta["namespace"]), str(meta["name"])
    predecessor = await asyncio.to_thread(kube.get_crewjob, namespace, str(predecessor_name))
    pred_action = predecessor_action_id(body, predecessor, str(predecessor_name))
    early = supersede.precheck(successor_name=name, successor_action_id=action_id,
                               predecessor=predecessor, predecessor_name=str(predecessor_name),
                               predecessor_action_id=pred_action)
    if early is not None:
        return early
    resume = bool(spec.get("resume"))
    if resume and pred_action != default_action_id(namespace, str(predecessor_name)):
        return supersede.GateDecision(
            supersede.Gate.REFUSE, "resume_mismatch",
            f"spec.resume continues action {default_action_id(namespace, predecessor_name)!r}, "
            f"but predecessor {predecessor_name!r} ran as {pred_action!r}")
    crew_name = str(((predecessor or body).get("spec") or {}).get("crewRef", {}).get("name")
                    or "")
    first = (((predecessor or {}).get("status") or {}).get("assignment") or {}).get("ordinal")
    answers, claimed = await ask_journals(
        runtime, namespace, crew_name,
        SuccessorRequest(crew_id=crew_name, action_id=pred_action,
                         successor_action_id=action_id, resume=resume), first)
    decision = supersede.from_journal(answers, predecessor_name=str(predecessor_name),
                                      predecessor_action_id=pred_action, crew=crew_name)
    if claimed is None:
        return decision
    if resume:
        # The trajectory is in the journal that took the claim: admitted there or nowhere.
        holder = next(a.ordinal for a in answers if a.answer is Answer.CLAIMED)
        crew, _ = await runtime.io.read_crew(namespace, crew_name)
        journal = next((r.journal_id for r in parse_replicas(crew or {})
                        if r.ordinal == holder), None)
        decision = replace(decision, pin=(holder, journal))
    if predecessor is not None:
        await asyncio.to_thread(kube.patch_crewjob_status_unless_gone, namespace,
                                str(predecessor_name),
                                {"supersededBy": {"name": name, "actionId": action_id}})
        if claimed.created:
            kopf.event(as_body(predecessor), type="Normal", reason="Superseded",
                       message=f"superseded by CrewJob {name} (action id {action_id}); the "
                               "claim is journaled")
    await asyncio.to_thread(kube.patch_crewjob_status_unless_gone, namespace, name, {
        "supersedes": {"name": str(predecessor_name), "actionId": pred_action,
                       "outcome": claimed.resolution.data.get("outcome")}})
    return decision


async def admission_gate(body: Mapping[str, Any], runtime: Runtime) -> machine.Gate:
    """:func:`supersedes_gate` as the state machine's :class:`machine.Gate` (the hook the
    CrewJob handler calls before the first admission: ``Runtime.gate``)."""
    return machine_gate(
        await supersedes_gate(body, supersede.effective_action_id(body), runtime))


def machine_gate(decision: supersede.GateDecision) -> machine.Gate:
    """A gate decision as the state machine's :class:`machine.Gate` (pure): proceed opens
    it, refuse finishes the job (invalid spec), wait keeps it Pending."""
    if decision.gate is supersede.Gate.PROCEED:
        if decision.pin is not None:  # spec.resume: only where the predecessor's journal is
            return machine.Gate(pin_ordinal=decision.pin[0], pin_journal=decision.pin[1])
        return machine.OPEN_GATE
    if decision.gate is supersede.Gate.REFUSE:
        return machine.Gate(open=False, message=decision.message,
                            refusal=outcome.invalid_spec(decision.code, decision.message))
    return machine.Gate(open=False, reason=supersede.WAIT_REASON, message=decision.message)
