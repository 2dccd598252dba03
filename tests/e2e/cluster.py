#!/usr/bin/env python3
"""The local Kubernetes control plane for e2e tests and the demo.

    python tests/e2e/cluster.py bin                   # build or find binaries (and the test
                                                      # tools, kubelet-volume); prints KUBE_BIN=
    python tests/e2e/cluster.py up [--with-operator]  # start in the background; prints
                                                      # KUBECONFIG= and KUBE_BIN=, then returns
    python tests/e2e/cluster.py down                  # stop everything `up` started
    python tests/e2e/cluster.py cert-manager          # build (or find cached) cert-manager for
                                                      # tests/e2e/test_mtls_cert_manager.py
    python tests/e2e/cluster.py kueue                 # build (or find cached) Kueue for
                                                      # tests/e2e/test_crewjob_kueue.py
    python tests/e2e/cluster.py kstatus               # build (or find cached) kstatus-verdict
                                                      # for tests/e2e/test_kstatus_verdicts.py

State (certificates, etcd data, logs, pidfiles) lives in .e2e/cluster/ of the repository
unless --state-dir says otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import build, certmanager, controlplane, kstatus, kueue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("bin", help="build (or find cached) etcd, kube-apiserver, kubectl, helm")
    sub.add_parser("cert-manager", help="build (or find cached) cert-manager's controllers")
    sub.add_parser("kueue", help="build (or find cached) Kueue's controller manager")
    sub.add_parser("kstatus", help="build (or find cached) the kstatus verdict program")
    up = sub.add_parser("up", help="start the control plane in the background")
    up.add_argument(
        "--with-operator", action="store_true", help="also install CRDs, start operator"
    )
    up.add_argument("--no-controller-manager", action="store_true")
    down = sub.add_parser("down", help="stop everything `up` started")
    for p in (up, down):
        p.add_argument("--state-dir", type=Path, default=controlplane.DEFAULT_STATE_DIR)
    args = parser.parse_args(argv)

    if args.command == "cert-manager":
        try:
            print(f"CERT_MANAGER={certmanager.ensure_built()}")
        except certmanager.BuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "kueue":
        try:
            print(f"KUEUE={kueue.ensure_built()}")
        except kueue.BuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "kstatus":
        try:
            print(f"KSTATUS={kstatus.ensure_built()}")
        except kstatus.BuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "down":
        stopped = controlplane.down(args.state_dir)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    try:
        kube_bin = build.ensure_binaries()
        if args.command == "bin":
            for tool in build.TOOLS:
                build.ensure_tool(tool.name)
    except build.BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.command == "bin":
        print(f"KUBE_BIN={kube_bin}")
        return 0
    try:
        info = controlplane.up(
            args.state_dir,
            kube_bin,
            with_operator=args.with_operator,
            controller_manager=not args.no_controller_manager,
        )
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(info.env_lines)
    print(f"# state and logs: {info.state_dir}", file=sys.stderr)
    if info.operator:
        print(f"# operator metrics: {info.operator_metrics}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
