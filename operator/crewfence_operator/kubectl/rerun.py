"""``kubectl crewfence rerun JOB [--name NEW]``: create the linked successor of a resolved
CrewJob (``spec.supersedes``), the one way an uncertain outcome's work runs again.

Invariant (one successor per uncertain outcome): the successor's default name is derived
from the job's (``successor_name``), so rerunning the same job twice collides (409) instead
of creating a second successor; the operator's gate refuses any other successor too.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator.crewjob import supersede
from crewfence_operator.kubectl.client import (
    FIELD_MANAGER,
    Kube,
    PluginError,
    api_error,
    emit,
    get_job,
)

NAME = "rerun"
HELP = "create the linked successor of a resolved job"
RERUN_RE = re.compile(r"^(?P<base>.+)-rerun(?:-(?P<n>\d+))?$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job")
    parser.add_argument("--name", help="the successor's name (default <job>-rerun)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the job's journaled trajectory (spec.resume): finished "
                        "tasks and tool calls are not run again")


def successor_name(name: str) -> str:
    """``<job>-rerun``, then ``<job>-rerun-2`` for a rerun of that, ...: deterministic, so
    rerunning the same job twice collides (409) instead of creating a second successor."""
    match = RERUN_RE.match(name)
    if match is None:
        return f"{name}-rerun"
    return f"{match['base']}-rerun-{int(match['n'] or 1) + 1}"


def successor_body(pred: Mapping[str, Any], name: str, *, resume: bool = False
                   ) -> dict[str, Any]:
    """The original spec under a new name and action id, linked by ``spec.supersedes``
    (and ``spec.resume: true`` with ``resume``)."""
    spec = pred.get("spec") or {}
    keep = ("crewRef", "operation", "input", "timeoutMs", "deletionPolicy")
    new_spec = {k: spec[k] for k in keep if k in spec}
    new_spec["supersedes"] = pred["metadata"]["name"]
    if resume:
        new_spec["resume"] = True
    return {"apiVersion": c.API_VERSION, "kind": c.CREWJOB_KIND,
            "metadata": {"name": name, "namespace": pred["metadata"]["namespace"],
                         "labels": {"crewfence.dev/supersedes":
                                    pred["metadata"]["name"][:63].rstrip("-_.")}},
            "spec": new_spec}


def run(args: argparse.Namespace, kube: Kube) -> int:
    pred = get_job(kube, args.job)
    name = args.name or successor_name(args.job)
    resume_from = f"{kube.namespace}/{args.job}" if args.resume else None
    decision = supersede.decide(successor_name=name, successor_action_id=f"{kube.namespace}/"
                                f"{name}", predecessor=pred, predecessor_name=args.job,
                                resume_from=resume_from)
    # the operator journals the resolution on the sidecar soon: the resume waits for it
    waits_for_journal = decision.code == "predecessor_resolution_not_journaled"
    if not decision.proceed and not waits_for_journal:
        raise PluginError(f"cannot rerun {args.job}: {decision.message}")
    body = successor_body(pred, name, resume=args.resume)
    try:
        created = kube.api.create_namespaced_custom_object(
            c.GROUP, c.VERSION, kube.namespace, c.CREWJOB_PLURAL, body,
            field_manager=FIELD_MANAGER)
    except ApiException as exc:
        if exc.status == 409:
            raise PluginError(f"CrewJob {name} already exists: {args.job} was rerun before "
                              "(one successor per uncertain outcome)") from None
        raise api_error(exc) from None
    emit(args, created, f"crewjob/{name} created (supersedes {args.job})")
    return 0
