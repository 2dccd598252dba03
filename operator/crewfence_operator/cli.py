"""``crewfence-operator``: runs kopf with our handlers, identity, probes and metrics."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Sequence

import kopf

from crewfence_operator import config, metrics
from crewfence_operator.config import OperatorConfig, WebhookConfig, WebhookMode


def build_parser(defaults: OperatorConfig) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="crewfence-operator",
        description="Run the crewfence operator (kopf): Crew and CrewJob handlers, the "
                    "shared-state admission webhook and audit. Every flag also reads "
                    "CREWFENCE_OPERATOR_<NAME> from the environment.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", dest="namespaces", default=None,
                       help="watch this namespace (repeatable; glob patterns as kopf allows)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", default=None,
                       help="watch every namespace (cluster-wide)")
    peer = p.add_mutually_exclusive_group()
    peer.add_argument("--standalone", action="store_true", default=None,
                      help="no peering (a single operator replica; the default)")
    peer.add_argument("--peering", metavar="NAME", default=None,
                      help="coordinate with other operator replicas through this kopf peering")
    p.add_argument("--priority", type=int, default=None,
                   help="peering priority; replicas must differ (equal priorities all freeze)")
    p.add_argument("--liveness-port", type=int, default=None, help="kopf /healthz port (8080)")
    p.add_argument("--readiness-port", type=int, default=None,
                   help="/readyz port (8081): connected to the API server, admission serving")
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus port (9090)")
    p.add_argument("--metrics-addr", default=None, help="Prometheus bind address (0.0.0.0)")
    p.add_argument("--sidecar-image", default=None, help="image for Crews without spec.image")
    p.add_argument("--image-pull-policy", default=None, choices=["Always", "IfNotPresent", "Never"])
    p.add_argument("--status-interval", type=float, default=None,
                   help="seconds between replica status refreshes (5)")
    p.add_argument("--audit-interval", type=float, default=None,
                   help="seconds between shared-state audits (15)")
    p.add_argument("--webhook-mode", choices=[m.value for m in WebhookMode], default=None,
                   help="off; managed (out of cluster: the operator installs the admission "
                        "policies and a URL webhook configuration); service (in cluster: the "
                        "chart ships them)")
    p.add_argument("--webhook-addr", default=None, help="webhook listen address (127.0.0.1)")
    p.add_argument("--webhook-port", type=int, default=None, help="webhook port (9443)")
    p.add_argument("--webhook-host", default=None,
                   help="hostname the API server uses to reach the webhook (managed mode)")
    p.add_argument("--webhook-cert-dir", default=None,
                   help="tls.crt/tls.key/ca.crt to use (generated there when absent)")
    p.add_argument("--webhook-config-name", default=None,
                   help="name of the managed ValidatingWebhookConfiguration")
    p.add_argument("-v", "--verbose", action="store_true", default=None)
    return p


def parse_config(argv: Sequence[str] | None = None,
                 base: OperatorConfig | None = None) -> OperatorConfig:
    try:
        cfg = base or OperatorConfig.from_env()
    except ValueError as exc:  # a bad CREWFENCE_OPERATOR_* value: one line, no traceback
        raise SystemExit(f"crewfence-operator: {exc}") from None
    args = build_parser(cfg).parse_args(argv)

    def pick(value: object, current: object) -> object:
        return current if value is None else value

    webhook = WebhookConfig(
        mode=WebhookMode(args.webhook_mode) if args.webhook_mode else cfg.webhook.mode,
        addr=str(pick(args.webhook_addr, cfg.webhook.addr)),
        port=int(pick(args.webhook_port, cfg.webhook.port)),  # type: ignore[call-overload]
        host=args.webhook_host or cfg.webhook.host,
        cert_dir=args.webhook_cert_dir or cfg.webhook.cert_dir,
        config_name=str(pick(args.webhook_config_name, cfg.webhook.config_name)),
        tls_secret=cfg.webhook.tls_secret,
        configuration=cfg.webhook.configuration,
        service_name=cfg.webhook.service_name,
    )
    if webhook.config_name.count(".") < 1:
        raise SystemExit("crewfence-operator: --webhook-config-name must be a dotted name "
                         "(webhook names <id>.<config-name> need three DNS segments)")
    namespaces = tuple(args.namespaces) if args.namespaces else cfg.namespaces
    all_namespaces = bool(args.all_namespaces) or (not args.namespaces and cfg.all_namespaces)
    if args.namespaces:
        all_namespaces = False
    standalone = cfg.standalone
    peering_name = cfg.peering_name
    if args.peering:
        standalone, peering_name = False, args.peering
    elif args.standalone:
        standalone = True
    return dataclasses.replace(
        cfg,
        namespaces=namespaces,
        all_namespaces=all_namespaces or not namespaces,
        standalone=standalone,
        peering_name=peering_name,
        priority=args.priority if args.priority is not None else cfg.priority,
        liveness_port=args.liveness_port or cfg.liveness_port,
        readiness_port=args.readiness_port or cfg.readiness_port,
        metrics_port=args.metrics_port or cfg.metrics_port,
        metrics_addr=args.metrics_addr or cfg.metrics_addr,
        sidecar_image=args.sidecar_image or cfg.sidecar_image,
        image_pull_policy=args.image_pull_policy or cfg.image_pull_policy,
        status_interval=args.status_interval or cfg.status_interval,
        audit_interval=args.audit_interval or cfg.audit_interval,
        webhook=webhook,
        verbose=bool(args.verbose) or cfg.verbose,
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv)
    config.set_current(cfg)
    kopf.configure(verbose=cfg.verbose)
    try:
        metrics.serve(cfg.metrics_port, cfg.metrics_addr)
    except OSError as exc:
        print(f"crewfence-operator: cannot serve metrics on {cfg.metrics_addr}:"
              f"{cfg.metrics_port}: {exc.strerror}", file=sys.stderr)
        return 2
    importlib.import_module("crewfence_operator.main")  # registers the handlers
    kopf.run(
        standalone=cfg.standalone,
        priority=cfg.priority,
        # A peering name makes kopf's peering mandatory: pass it only when peering is wanted.
        peering_name=None if cfg.standalone else cfg.peering_name,
        liveness_endpoint=f"http://0.0.0.0:{cfg.liveness_port}/healthz",
        clusterwide=cfg.all_namespaces and not cfg.namespaces,
        namespaces=() if cfg.all_namespaces and not cfg.namespaces else cfg.namespaces,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
