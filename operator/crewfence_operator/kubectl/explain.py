"""``kubectl crewfence explain JOB``: a CrewJob's evidence, in words (or ``-o json|yaml``):
its status, its assignment and, asked over the network, the assigned replica's own record
and events (``sidecar.py``; best effort: the pod network may be out of reach, and then the
note says why).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from crewfence_operator.crewjob import resolution as res
from crewfence_operator.crewjob import supersede
from crewfence_operator.kubectl.client import Kube, PluginError, condition, emit, get_job
from crewfence_operator.kubectl.sidecar import sidecar_evidence
from crewfence_operator.kubectl.timeline import event_line, in_doubt_lines
from crewfence_operator.kubectl.trajectory import side_by_side

NAME = "explain"
HELP = "print a CrewJob's evidence"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job")


def evidence(obj: Mapping[str, Any], record: Mapping[str, Any] | None,
             events: Sequence[Mapping[str, Any]] | None, sidecar_note: str) -> dict[str, Any]:
    status = obj.get("status") or {}
    return {
        "name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"],
        "actionId": supersede.effective_action_id(obj),
        "phase": status.get("phase"), "reason": status.get("reason"),
        "message": status.get("message"), "uncertainOutcome": status.get("uncertainOutcome"),
        "outcomeUncertain": dict(condition(status, res.UNCERTAIN_CONDITION)),
        "failure": status.get("failure"), "cancellation": status.get("cancellation"),
        "assignment": status.get("assignment"), "requestHash": status.get("requestHash"),
        "startedAt": status.get("startedAt"), "finishedAt": status.get("finishedAt"),
        "recovery": status.get("recovery"), "resolution": status.get("resolution"),
        "supersedes": status.get("supersedes"), "supersededBy": status.get("supersededBy"),
        "effects": status.get("effects"), "usage": status.get("usage"),
        "output": output_location(status.get("output")),
        "sidecar": {"record": record, "events": list(events or []), "note": sidecar_note},
    }


def output_location(output: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Where the whole output is: ``status.output.value`` when it fits (no ConfigMap is then
    written), else the ConfigMap status names (or why there is none)."""
    if not output:
        return None
    where: dict[str, Any] = {"sha256": output.get("sha256"), "size": output.get("size"),
                             "truncated": bool(output.get("truncated"))}
    cm = output.get("configMap") or {}
    if not where["truncated"]:
        where["in"] = "status.output.value"
    elif cm.get("name"):
        where["in"] = f"ConfigMap {cm['name']} (key {cm.get('key', 'output')})"
        where["configMapTruncated"] = bool(cm.get("truncated"))
    else:
        where["in"] = None
        where["note"] = output.get("configMapError") or "the full output is not stored"
    return where


def output_line(where: Mapping[str, Any]) -> str:
    head = f"  Output: {where['size']} bytes, sha256 {where['sha256']}"
    if where.get("in") is None:
        return f"{head}; only its start is in status.output.value ({where.get('note')})."
    cut = " (cut at 1 MiB)" if where.get("configMapTruncated") else ""
    return f"{head}, whole in {where['in']}{cut}."


def explain_text(ev: Mapping[str, Any]) -> str:
    lines = [f"CrewJob {ev['namespace']}/{ev['name']} (action id {ev['actionId']})",
             f"  phase {ev['phase']} ({ev['reason']}): {ev['message'] or ''}".rstrip()]
    cond = ev["outcomeUncertain"] or {}
    if ev["uncertainOutcome"]:
        lines.append(f"  The outcome is UNCERTAIN ({cond.get('reason')}): the crew may or may "
                     "not have had external effects; nothing will retry it.")
    else:
        lines.append("  The outcome is known.")
    assignment = ev["assignment"] or {}
    if assignment:
        lines.append(f"  It was assigned to replica {assignment.get('ordinal')} (pod "
                     f"{assignment.get('pod')}, claim {assignment.get('claim')}, journal id "
                     f"{assignment.get('journalId')}).")
    else:
        lines.append("  No replica was ever assigned: nothing was sent to a sidecar.")
    if ev["requestHash"]:
        lines.append(f"  Request hash {ev['requestHash']}; started {ev['startedAt']}, "
                     f"finished {ev['finishedAt']}.")
    failure = ev["failure"] or {}
    if failure:
        lines.append(f"  Failure: {failure.get('category')}/{failure.get('code')}: "
                     f"{failure.get('message')}")
    cancel = ev["cancellation"] or {}
    if cancel.get("requested"):
        lines.append(f"  Cancellation was requested; dispatched to the sidecar: "
                     f"{'yes' if cancel.get('dispatched') else 'no'}; the sidecar confirmed the "
                     f"stop: {'yes' if cancel.get('remoteStopConfirmed') else 'no'} (never proof "
                     "that the provider stopped). " + str(cancel.get("message") or ""))
    sidecar = ev["sidecar"]
    record = sidecar["record"]
    if record:
        lines.append(f"  The sidecar's record ({sidecar['note']}): status {record.get('status')}, "
                     f"uncertain_outcome "
                     f"{record.get('uncertain_outcome')}, error "
                     f"{(record.get('error') or {}).get('code')}, {record.get('event_count')} "
                     "events:")
        lines.extend(f"    {event_line(event)}" for event in sidecar["events"])
    else:
        lines.append(f"  The sidecar's record: {sidecar['note']}")
    lines.extend(in_doubt_lines({"effects": ev.get("effects")}))
    if ev.get("output"):
        lines.append(output_line(ev["output"]))
    if ev["recovery"]:
        lines.append(f"  Recovery advice: {ev['recovery']}")
    resolution = ev["resolution"] or {}
    if resolution:
        journal = resolution.get("journal") or {}
        seq = journal.get("sequence")
        where = f", event {seq}" if seq is not None else ""
        lines.append(f"  RESOLVED {resolution.get('outcome')} by {resolution.get('resolvedBy')} "
                     f"at {resolution.get('resolvedAt')}: {resolution.get('note')} (journal: "
                     f"{journal.get('state')}{where})")
    elif ev["uncertainOutcome"]:
        lines.append(f"  Next: check the effects, then `kubectl crewfence resolve {ev['name']} "
                     "--happened|--not-happened|--compensated --note ...`.")
    if ev["supersedes"]:
        lines.append(f"  Supersedes {ev['supersedes'].get('name')} "
                     f"({ev['supersedes'].get('outcome')}).")
    if ev["supersededBy"]:
        lines.append(f"  Superseded by {ev['supersededBy'].get('name')}.")
    resumed = ev.get("resumed")
    if resumed:
        lines.append(f"  Resumed from {resumed['predecessor']} ({resumed['note']}); the two "
                     "trajectories:")
        lines.extend(side_by_side(resumed["events"], ev["sidecar"]["events"]))
    return "\n".join(lines)


def run(args: argparse.Namespace, kube: Kube) -> int:
    obj = get_job(kube, args.job)
    record, events, note = sidecar_evidence(kube, obj)
    ev = evidence(obj, record, events, note)
    spec, links = obj.get("spec") or {}, (obj.get("status") or {}).get("supersedes") or {}
    if spec.get("resume") and spec.get("supersedes"):
        pred_events: Sequence[Mapping[str, Any]] | None
        try:
            pred = get_job(kube, str(spec["supersedes"]))
        except PluginError as exc:  # deleted meanwhile: the successor's side still shows
            pred_events, pred_note = [], str(exc)
        else:
            _, pred_events, pred_note = sidecar_evidence(kube, pred)
        ev["resumed"] = {"predecessor": links.get("name") or spec["supersedes"],
                         "note": pred_note, "events": list(pred_events or [])}
    emit(args, ev, explain_text(ev))
    return 0
