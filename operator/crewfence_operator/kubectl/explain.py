"""``kubectl-crewfence``: the kubectl plugin for closing the loop on an uncertain outcome.

    kubectl crewfence uncertain [-A]                 unresolved uncertain CrewJobs, oldest first
    kubectl crewfence explain JOB                    the evidence, in words
    kubectl crewfence resolve JOB --happened|--not-happened|--compensated --note TEXT
                                  [--evidence LINK]... [--no-wait]
    kubectl crewfence rerun JOB [--name NEW]         the linked successor (spec.supersedes)

kubectl plugin conventions: found as ``kubectl-crewfence`` on the PATH; ``--namespace/-n``,
``--context``, ``--kubeconfig`` (and ``KUBECONFIG``) as kubectl reads them; ``-o json|yaml``
for machine-readable output. It only reads CrewJobs and Crews, sets ``spec.resolution`` (field
manager ``kubectl-crewfence``, which the operator records as who resolved) and creates
successor CrewJobs; the API server's CEL rules and the operator enforce the rest.

``explain`` also asks the assigned replica's sidecar for its record, with the user's own kube
credentials reading what the operator itself uses: the Crew's token Secret and, with mutual
TLS (the default), the Crew's client-certificate Secret (a client certificate of the Crew's
CA and the trust bundle, never the CA's key), falling back to the CA Secret for an operator
that does not write that Secret yet.
Invariants: the replica's certificate is verified against the Crew's CA **and** the
replica's DNS name (never plain HTTP to a Crew that has TLS material); a Secret the user may
not read (403) is said in one line and the status-side evidence is shown without the
sidecar's record; no token or key is ever printed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import ssl
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crewjob import resolution as res
from crewfence_operator.crewjob import supersede
from crewfence_operator.transport import cert_manager_apply, pki
from crewfence_operator.transport.ca_rotation import CaState
from crewfence_operator.transport.token_roll import sending_token

FIELD_MANAGER = res.FIELD_MANAGER
RERUN_RE = re.compile(r"^(?P<base>.+)-rerun(?:-(?P<n>\d+))?$")


class PluginError(Exception):
    """One printable line; exit status 1."""


@dataclass
class Kube:
    api: client.CustomObjectsApi
    core: client.CoreV1Api
    namespace: str


def connect(args: argparse.Namespace) -> Kube:
    try:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)
        _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
        if args.context:
            contexts, _ = config.list_kube_config_contexts(config_file=args.kubeconfig)
            active = next((ctx for ctx in contexts if ctx["name"] == args.context), active)
    except (config.ConfigException, OSError) as exc:
        raise PluginError(f"cannot load the kubeconfig: {exc}") from None
    namespace = args.namespace or (active.get("context") or {}).get("namespace") or "default"
    api_client = client.ApiClient()
    return Kube(client.CustomObjectsApi(api_client), client.CoreV1Api(api_client), namespace)


def _api_error(exc: ApiException) -> PluginError:
    try:
        message = json.loads(exc.body or "{}").get("message") or exc.reason
    except ValueError:
        message = exc.reason
    return PluginError(f"the API server refused ({exc.status}): {message}")


def get_job(kube: Kube, name: str) -> dict[str, Any]:
    try:
        obj = kube.api.get_namespaced_custom_object(c.GROUP, c.VERSION, kube.namespace,
                                                    c.CREWJOB_PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            raise PluginError(f"CrewJob {name!r} not found in namespace {kube.namespace}") \
                from None
        raise _api_error(exc) from None
    assert isinstance(obj, dict)
    return obj


# --- pure views ------------------------------------------------------------------------------
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


def _condition(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    return next((cnd for cnd in status.get("conditions") or []
                 if isinstance(cnd, Mapping) and cnd.get("type") == ctype), {})


def uncertain_rows(items: Sequence[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """Unresolved uncertain CrewJobs, oldest first."""
    rows = []
    for obj in items:
        status = obj.get("status") or {}
        if status.get("uncertainOutcome") is not True or (status.get("resolution") or {}).get(
                "outcome"):
            continue
        cond = _condition(status, res.UNCERTAIN_CONDITION)
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


def evidence(obj: Mapping[str, Any], record: Mapping[str, Any] | None,
             events: Sequence[Mapping[str, Any]] | None, sidecar_note: str) -> dict[str, Any]:
    status = obj.get("status") or {}
    return {
        "name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"],
        "actionId": supersede.effective_action_id(obj),
        "phase": status.get("phase"), "reason": status.get("reason"),
        "message": status.get("message"), "uncertainOutcome": status.get("uncertainOutcome"),
        "outcomeUncertain": dict(_condition(status, res.UNCERTAIN_CONDITION)),
        "failure": status.get("failure"), "cancellation": status.get("cancellation"),
        "assignment": status.get("assignment"), "requestHash": status.get("requestHash"),
        "startedAt": status.get("startedAt"), "finishedAt": status.get("finishedAt"),
        "recovery": status.get("recovery"), "resolution": status.get("resolution"),
        "supersedes": status.get("supersedes"), "supersededBy": status.get("supersededBy"),
        "sidecar": {"record": record, "events": list(events or []), "note": sidecar_note},
    }


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
        for event in sidecar["events"]:
            data = event.get("data") or {}
            detail = ", ".join(f"{k}={data[k]}" for k in ("reason", "status", "outcome", "note")
                               if k in data)
            lines.append(f"    #{event.get('sequence')} {event.get('event')} {detail}".rstrip())
    else:
        lines.append(f"  The sidecar's record: {sidecar['note']}")
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
    return "\n".join(lines)


def successor_name(name: str) -> str:
    """``<job>-rerun``, then ``<job>-rerun-2`` for a rerun of that, ...: deterministic, so
    rerunning the same job twice collides (409) instead of creating a second successor."""
    match = RERUN_RE.match(name)
    if match is None:
        return f"{name}-rerun"
    return f"{match['base']}-rerun-{int(match['n'] or 1) + 1}"


def successor_body(pred: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The original spec under a new name and action id, linked by ``spec.supersedes``."""
    spec = pred.get("spec") or {}
    keep = ("crewRef", "operation", "input", "timeoutMs", "deletionPolicy")
    new_spec = {k: spec[k] for k in keep if k in spec}
    new_spec["supersedes"] = pred["metadata"]["name"]
    return {"apiVersion": c.API_VERSION, "kind": c.CREWJOB_KIND,
            "metadata": {"name": name, "namespace": pred["metadata"]["namespace"],
                         "labels": {"crewfence.dev/supersedes":
                                    pred["metadata"]["name"][:63].rstrip("-_.")}},
            "spec": new_spec}


# --- sidecar evidence (best effort: the pod network may be out of reach) ----------------------
class EvidenceUnavailable(Exception):
    """Why the sidecar was not asked: one line, shown as the sidecar's record note."""


@dataclass(frozen=True)
class SidecarAccess:
    """How to reach one replica the way the operator does. Never printed (keys, token)."""

    address: str
    token: str = field(repr=False)
    context: ssl.SSLContext | None = field(default=None, repr=False)
    """Trusts the Crew's CA(s) and presents a client certificate of it; None: plain HTTP."""
    server_name: str | None = None
    """The replica's DNS name its certificate must carry (checked on the connection)."""
    source: str = "plain HTTP (the Crew has no CA)"
    """Where the client certificate came from, in words."""


def secret_refused_note(namespace: str, secret: str, holds: str) -> str:
    """The one line ``explain`` shows when the user's RBAC does not allow reading a Secret."""
    return (f"not asked: you may not read Secret {namespace}/{secret} (403 Forbidden), which "
            f"holds {holds}; showing the CrewJob's own status only")


def _read_secret(kube: Kube, name: str, holds: str) -> dict[str, Any] | None:
    """The Secret's data as ``{"data": {key: base64}}``; None when it does not exist."""
    try:
        secret = kube.core.read_namespaced_secret(name, kube.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        if exc.status == 403:
            raise EvidenceUnavailable(secret_refused_note(kube.namespace, name, holds)) \
                from None
        raise EvidenceUnavailable(f"cannot read Secret {kube.namespace}/{name} "
                                  f"({exc.status})") from None
    return {"data": dict(secret.data or {})}


def client_tls(kube: Kube, crew: str) -> tuple[ssl.SSLContext | None, str]:
    """The client side of mutual TLS with the Crew's sidecars, from the operator's Secrets:
    the Crew's client-certificate Secret (``<crew>-crewfence-operator-client``: a client
    certificate of the Crew's CA and the trust bundle, no CA key; written by the operator or
    by cert-manager), else, from an operator that does not write it yet, the CA Secret
    (``<crew>-crewfence-ca``, from which a client certificate is made here); (None, ...) when
    the Crew has neither (plain HTTP, an operator run with ``CREWFENCE_OPERATOR_SIDECAR_TLS=0``).
    A Secret the user may not read is skipped while the other one can be used; when neither
    can, the first refusal is what ``EvidenceUnavailable`` says."""
    client_name = pki.operator_client_secret_name(crew)
    refused: list[EvidenceUnavailable] = []
    try:
        client_secret = _read_secret(kube, client_name,
                                     "the client certificate for the Crew's sidecars")
    except EvidenceUnavailable as exc:
        client_secret, refused = None, [exc]
    if client_secret is not None:
        issued = cert_manager_apply.client_tls_from_secret(client_secret)
        if issued is None:
            raise EvidenceUnavailable(f"not asked: Secret {kube.namespace}/{client_name} is "
                                      "not completely issued yet")
        return issued.context, "the Crew's client certificate"
    ca_name = pki.ca_secret_name(crew)
    try:
        ca_secret = _read_secret(kube, ca_name, "the Crew's CA (mutual TLS)")
    except EvidenceUnavailable as exc:
        raise (refused[0] if refused else exc) from None
    if ca_secret is not None:
        state = CaState.from_secret(ca_secret)
        if state is None:
            raise EvidenceUnavailable(f"not asked: Secret {kube.namespace}/{ca_name} holds no "
                                      "usable CA")
        material = pki.CrewClientTLS.for_ca(state.signing, state.trust)
        return material.context, "a client certificate of the Crew's CA"
    if refused:
        raise refused[0]
    return None, "plain HTTP (the Crew has no CA)"


def sidecar_access(kube: Kube, crew: Mapping[str, Any], ordinal: int) -> SidecarAccess:
    """The replica's address, the token the operator sends and, when the Crew has TLS
    material, the client context and the name to verify; raises ``EvidenceUnavailable``."""
    from crewfence_operator.crewjob.replicas import parse_replicas

    name = str(crew["metadata"]["name"])
    token_secret = _read_secret(kube, c.token_secret_name(name), "the Crew's bearer token")
    raw = ((token_secret or {}).get("data") or {}).get(c.TOKEN_SECRET_KEY)
    token = sending_token(base64.b64decode(raw).decode() if raw else None)
    if token is None:
        raise EvidenceUnavailable(f"not asked: Secret {kube.namespace}/"
                                  f"{c.token_secret_name(name)} holds no token")
    context, source = client_tls(kube, name)
    replica = next((r for r in parse_replicas(crew) if r.ordinal == ordinal), None)
    if replica is None or not replica.address:
        raise EvidenceUnavailable(f"replica {ordinal} has no address now")
    server_name = pki.replica_dns_name(CrewRef(name, kube.namespace, ""), ordinal) \
        if context is not None else None
    return SidecarAccess(replica.address, token, context, server_name, source)


def sidecar_evidence(kube: Kube, obj: Mapping[str, Any]) -> tuple[Any, Any, str]:
    status = obj.get("status") or {}
    assignment = status.get("assignment") or {}
    if assignment.get("ordinal") is None:
        return None, None, "no replica was assigned"
    crew_name = str(((obj.get("spec") or {}).get("crewRef") or {}).get("name") or "")
    try:
        crew = kube.api.get_namespaced_custom_object(c.GROUP, c.VERSION, kube.namespace,
                                                     c.CREW_PLURAL, crew_name)
    except ApiException as exc:
        return None, None, f"cannot read Crew {crew_name} ({exc.status})"
    try:
        access = sidecar_access(kube, crew, int(assignment["ordinal"]))
    except EvidenceUnavailable as exc:
        return None, None, str(exc)
    try:
        return asyncio.run(_fetch(access, supersede.effective_action_id(obj)))
    except Exception as exc:  # transport, TLS verification, a malformed answer: say which
        return None, None, f"the sidecar at {access.address} could not be asked: " \
                           f"{type(exc).__name__}"


async def _fetch(access: SidecarAccess, action_id: str) -> tuple[Any, Any, str]:
    import aiohttp

    from crewfence_operator.sidecar_client import Endpoint, SidecarClient
    endpoint = Endpoint(access.address, access.token, ssl_context=access.context,
                        server_name=access.server_name)
    async with aiohttp.ClientSession() as session:
        sidecar = SidecarClient(session, endpoint)
        lookup = await sidecar.get_job(action_id)
        if lookup.record is None:
            return None, None, ("archived (tombstone)" if lookup.tombstone
                                else "the sidecar does not know the action")
        page = await sidecar.events_page(action_id, 0)
        how = (f"over mutual TLS with {access.source}, verified as {access.server_name}"
               if access.context is not None else f"over {access.source}")
        return (lookup.record.to_wire(), [e.to_wire() for e in page.events],
                f"from {access.address} {how}")


# --- commands ----------------------------------------------------------------------------------
def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.output == "json":
        print(json.dumps(data, indent=2, ensure_ascii=False))
    elif args.output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    else:
        print(text)


def cmd_uncertain(args: argparse.Namespace, kube: Kube) -> int:
    try:
        if args.all_namespaces:
            result = kube.api.list_cluster_custom_object(c.GROUP, c.VERSION, c.CREWJOB_PLURAL)
        else:
            result = kube.api.list_namespaced_custom_object(c.GROUP, c.VERSION, kube.namespace,
                                                            c.CREWJOB_PLURAL)
    except ApiException as exc:
        raise _api_error(exc) from None
    rows = uncertain_rows(result.get("items") or [], time.time())
    header = f"{'NAMESPACE':<16} {'NAME':<32} {'CREW':<16} {'REASON':<20} {'REPLICA':<20} AGE"
    text = "\n".join([header] + [
        f"{r['namespace']:<16} {r['name']:<32} {r['crew']!s:<16} {r['reason']!s:<20} "
        f"{r['replica']:<20} {r['age']}" for r in rows]) if rows else \
        "No unresolved uncertain CrewJobs."
    emit(args, rows, text)
    return 0


def cmd_explain(args: argparse.Namespace, kube: Kube) -> int:
    obj = get_job(kube, args.job)
    record, events, note = sidecar_evidence(kube, obj)
    ev = evidence(obj, record, events, note)
    emit(args, ev, explain_text(ev))
    return 0


OUTCOME_FLAGS = {"happened": "Happened", "not_happened": "NotHappened",
                 "compensated": "Compensated"}


def cmd_resolve(args: argparse.Namespace, kube: Kube) -> int:
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
        raise _api_error(exc) from None
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


def cmd_rerun(args: argparse.Namespace, kube: Kube) -> int:
    pred = get_job(kube, args.job)
    name = args.name or successor_name(args.job)
    decision = supersede.decide(successor_name=name, successor_action_id=f"{kube.namespace}/"
                                f"{name}", predecessor=pred, predecessor_name=args.job)
    if not decision.proceed:
        raise PluginError(f"cannot rerun {args.job}: {decision.message}")
    body = successor_body(pred, name)
    try:
        created = kube.api.create_namespaced_custom_object(
            c.GROUP, c.VERSION, kube.namespace, c.CREWJOB_PLURAL, body,
            field_manager=FIELD_MANAGER)
    except ApiException as exc:
        if exc.status == 409:
            raise PluginError(f"CrewJob {name} already exists: {args.job} was rerun before "
                              "(one successor per uncertain outcome)") from None
        raise _api_error(exc) from None
    emit(args, created, f"crewjob/{name} created (supersedes {args.job})")
    return 0


def _common(*, top: bool) -> argparse.ArgumentParser:
    """kubectl's flags, accepted before and after the subcommand (after wins)."""
    common = argparse.ArgumentParser(add_help=False)
    default: Any = None if top else argparse.SUPPRESS
    common.add_argument("-n", "--namespace", default=default,
                        help="the namespace (default: the context's)")
    common.add_argument("--context", default=default, help="the kubeconfig context to use")
    common.add_argument("--kubeconfig", default=default, help="path to the kubeconfig file")
    common.add_argument("-o", "--output", choices=["json", "yaml"], default=default,
                        help="output format")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common(top=False)
    parser = argparse.ArgumentParser(
        prog="kubectl crewfence", parents=[_common(top=True)],
        description="Find, explain, resolve and rerun CrewJobs whose outcome is uncertain.")
    sub = parser.add_subparsers(dest="command", required=True)
    unc = sub.add_parser("uncertain", parents=[common],
                         help="list unresolved uncertain CrewJobs (age, reason, replica)")
    unc.add_argument("-A", "--all-namespaces", action="store_true")
    exp = sub.add_parser("explain", parents=[common], help="print a CrewJob's evidence")
    exp.add_argument("job")
    rsv = sub.add_parser("resolve", parents=[common], help="record what you found (once)")
    rsv.add_argument("job")
    which = rsv.add_mutually_exclusive_group(required=True)
    which.add_argument("--happened", action="store_true", help="the work took effect")
    which.add_argument("--not-happened", action="store_true", help="it did not")
    which.add_argument("--compensated", action="store_true",
                       help="its effects were undone by a separately authorized Action")
    rsv.add_argument("--note", required=True, help="what you checked and found")
    rsv.add_argument("--evidence", action="append", help="a link to evidence (repeatable)")
    rsv.add_argument("--no-wait", action="store_true",
                     help="do not wait for the operator to accept it")
    rsv.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (30)")
    rer = sub.add_parser("rerun", parents=[common],
                         help="create the linked successor of a resolved job")
    rer.add_argument("job")
    rer.add_argument("--name", help="the successor's name (default <job>-rerun)")
    return parser


COMMANDS = {"uncertain": cmd_uncertain, "explain": cmd_explain, "resolve": cmd_resolve,
            "rerun": cmd_rerun}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        kube = connect(args)
        return COMMANDS[args.command](args, kube)
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
