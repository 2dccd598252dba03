#!/usr/bin/env python3
"""The long fault campaign (issue 19, part 2) on its own control plane.

    python tests/bench/bench_fault_campaign.py [--seed N] [--operations 150] [--state-dir DIR]
                                               [--keep]

Starts the local control plane (the e2e harness: etcd, kube-apiserver, controller manager, the
pod runner with the offline LLM ledger) and the operator, then runs the campaign of
``tests/e2e/campaign`` (seeded schedule of job operations and faults, the checker over the
whole history) against a Crew of two replicas. Prints every operation as it happens and one
JSON object at the end: seed, operations, faults injected by kind, anomalies. Exits non-zero
when the checker found anomalies not explained by a known gap (each is printed with the seed
to replay it). The history is kept as ``<state-dir>/campaign-<seed>.json``
(``tests/e2e/campaign/recheck.py`` checks it again). docs/reliability.md reports the runs.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

E2E = Path(__file__).resolve().parents[1] / "e2e"
sys.path.insert(0, str(E2E))

from campaign.checker import hard  # noqa: E402
from campaign.run import replay_hint, run_campaign  # noqa: E402
from harness import build, controlplane  # noqa: E402
from harness.handles import Cluster, Operator, PodRunner  # noqa: E402
from harness.operator_launch import OperatorLaunch  # noqa: E402
from plugin_support import plugin_dir  # noqa: E402

NAMESPACE = "crewfence-campaign"


def run(seed: int, operations: int, state_dir: Path) -> dict[str, object]:
    kube_bin = build.ensure_binaries()
    info = controlplane.up(state_dir, kube_bin, pod_runner=True)
    cluster = Cluster(info)
    controlplane.install_crds(info)
    operator = Operator(cluster, OperatorLaunch.for_cluster(str(cluster.kubeconfig),
                                                            cluster.state_dir))
    operator.start()
    namespace = f"{NAMESPACE}-{seed % 100000}"
    cluster.kubectl("create", "namespace", namespace, check=True)
    controlplane.ensure_default_service_account(info, namespace)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        history, anomalies = run_campaign(cluster, PodRunner(cluster), operator, namespace,
                                          plugin_dir(Path(tmp)), seed, operations,
                                          settle_timeout=300)
    operator.stop()
    saved = cluster.state_dir / f"campaign-{seed}.json"
    saved.write_text(history.to_json())
    summary = history.summary()
    return {**summary, "seconds": round(time.monotonic() - started, 1),
            "anomalies": [str(a) for a in hard(anomalies)],
            "known_gaps": [str(a) for a in anomalies if a.known_gap], "history": str(saved)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    parser.add_argument("--operations", type=int, default=150)
    parser.add_argument("--state-dir", type=Path,
                        default=controlplane.REPO / ".e2e" / "bench-campaign")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    try:
        result = run(seed, args.operations, args.state_dir)
    finally:
        if not args.keep:
            controlplane.down(args.state_dir)
    print(json.dumps(result, indent=2, sort_keys=True))
    if result["anomalies"]:
        print(replay_hint(seed, args.operations), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
