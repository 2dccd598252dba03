"""``kubectl crewfence resolve JOB --happened|--not-happened|--compensated --note TEXT``:
record what a person found about an uncertain outcome (``spec.resolution``, field manager
``kubectl-crewfence``) and wait until the operator accepted and journaled it.

Invariant: only a CrewJob whose outcome is uncertain is resolved here; the API server's CEL
rules make ``spec.resolution`` write-once and the operator decides whether it is accepted.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator.crewjob import resolution as res
from crewfence_operator.kubectl.client import (
    FIELD_MANAGER,
    Kube,
    PluginError,
    api_error,
    emit,
    get_job,
)

NAME = "resolve"
HELP = "record what you found (once)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--happened", action="store_true", help="the work took effect")
    which.add_argument("--not-happened", action="store_true", help="it did not")
    which.add_argument("--compensated", action="store_true",
                       help="its effects were undone by a separately authorized Action")
    parser.add_argument("--note", required=True, help="what you checked and found")
    parser.add_argument("--evidence", action="append", help="a link to evidence (repeatable)")
    parser.add_argument("--no-wait", action="store_true",
                        help="do not wait for the operator to accept it")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (30)")


OUTCOME_FLAGS = {"happened": "Happened", "not_happened": "NotHappened",
                 "compensated": "Compensated"}


def run(args: argparse.Namespace, kube: Kube) -> int:
    outcome = next(v for k, v in OUTCOME_FLAGS.items() if getattr(args, k))
    obj = get_job(kube, args.job)
    status = obj.get("status") or {}
    if status.get("uncertainOutcome") is not True:
        raise PluginError(f"CrewJob {args.job} has a known outcome "
                          f"({status.get('phase')}, {status.get('reason')}): nothing to resolve")
    resolution: dict[str, Any] = {"outcome": outcome, "note": args.note}
    if args.evidence:
        resolution["evidence"] = list(args.evidence)
    try:
        kube.api.patch_namespaced_custom_object(
            c.GROUP, c.VERSION, kube.namespace, c.CREWJOB_PLURAL, args.job,
            {"spec": {"resolution": resolution}}, field_manager=FIELD_MANAGER)
    except ApiException as exc:
        raise api_error(exc) from None
    obj = get_job(kube, args.job)
    deadline = time.monotonic() + args.timeout
    while not args.no_wait and time.monotonic() < deadline:
        accepted = (obj.get("status") or {}).get("resolution") or {}
        if accepted.get("outcome") and (accepted.get("journal") or {}).get("state") != \
                res.JournalState.PENDING.value:
            break
        time.sleep(0.5)
        obj = get_job(kube, args.job)
    accepted = (obj.get("status") or {}).get("resolution") or {}
    if accepted.get("outcome"):
        journal = accepted.get("journal") or {}
        text = (f"crewjob/{args.job} resolved {accepted['outcome']} (by "
                f"{accepted.get('resolvedBy')}); journal: {journal.get('state')}"
                + (f", event {journal['sequence']}" if journal.get("sequence") is not None
                   else ""))
    else:
        text = (f"crewjob/{args.job}: spec.resolution set to {outcome}; the operator has not "
                "accepted it yet (see `kubectl crewfence explain`)")
    emit(args, obj, text)
    return 0
