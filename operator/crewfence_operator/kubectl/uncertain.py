"""``kubectl crewfence uncertain [-A]``: unresolved uncertain CrewJobs, oldest first (age,
reason, assigned replica). Only reads CrewJobs."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator.crewjob import resolution as res
from crewfence_operator.kubectl.client import Kube, api_error, condition, emit

NAME = "uncertain"
HELP = "list unresolved uncertain CrewJobs (age, reason, replica)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-A", "--all-namespaces", action="store_true")


def _age(stamp: str | None, now: float) -> str:
    if not stamp:
        return "?"
    try:
        seconds = now - datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def uncertain_rows(items: Sequence[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """Unresolved uncertain CrewJobs, oldest first."""
    rows = []
    for obj in items:
        status = obj.get("status") or {}
        if status.get("uncertainOutcome") is not True or (status.get("resolution") or {}).get(
                "outcome"):
            continue
        cond = condition(status, res.UNCERTAIN_CONDITION)
        since = cond.get("lastTransitionTime") or status.get("finishedAt") or \
            (obj.get("metadata") or {}).get("creationTimestamp")
        assignment = status.get("assignment") or {}
        rows.append({
            "namespace": obj["metadata"]["namespace"], "name": obj["metadata"]["name"],
            "crew": ((obj.get("spec") or {}).get("crewRef") or {}).get("name"),
            "phase": status.get("phase"), "reason": cond.get("reason") or status.get("reason"),
            "replica": assignment.get("pod") or (f"ordinal {assignment['ordinal']}"
                                                 if assignment.get("ordinal") is not None
                                                 else "none"),
            "since": since, "age": _age(since, now),
        })
    rows.sort(key=lambda r: str(r["since"] or ""))
    return rows


def run(args: argparse.Namespace, kube: Kube) -> int:
    try:
        if args.all_namespaces:
            result = kube.api.list_cluster_custom_object(c.GROUP, c.VERSION, c.CREWJOB_PLURAL)
        else:
            result = kube.api.list_namespaced_custom_object(c.GROUP, c.VERSION, kube.namespace,
                                                            c.CREWJOB_PLURAL)
    except ApiException as exc:
        raise api_error(exc) from None
    rows = uncertain_rows(result.get("items") or [], time.time())
    header = f"{'NAMESPACE':<16} {'NAME':<32} {'CREW':<16} {'REASON':<20} {'REPLICA':<20} AGE"
    text = "\n".join([header] + [
        f"{r['namespace']:<16} {r['name']:<32} {r['crew']!s:<16} {r['reason']!s:<20} "
        f"{r['replica']:<20} {r['age']}" for r in rows]) if rows else \
        "No unresolved uncertain CrewJobs."
    emit(args, rows, text)
    return 0
