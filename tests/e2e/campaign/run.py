"""One campaign from start to verdict, shared by the e2e test and the long benchmark."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from crewjob_support import wait_crew_ready
from harness.handles import Cluster, Operator, PodRunner

from campaign import checker, schedule
from campaign.faults import Campaign
from campaign.history import History, OpRecord


def replay_hint(seed: int, operations: int) -> str:
    return (f"replay: CREWFENCE_CAMPAIGN_SEED={seed} CREWFENCE_CAMPAIGN_OPS={operations} "
            "pytest tests/e2e/test_fault_campaign.py  (or tests/bench/bench_fault_campaign.py "
            f"--seed {seed} --operations {operations})")


def run_campaign(cluster: Cluster, runner: PodRunner, operator: Operator, namespace: str,
                 plugin: Path, seed: int, operations: int, *, settle_timeout: float = 180,
                 log: Callable[[str], None] = print) -> tuple[History, list[checker.Anomaly]]:
    """Generate the schedule for ``seed``, run it against the Crew ``research`` in
    ``namespace``, settle, observe the end state and check the history."""
    ops = schedule.generate(seed, operations)
    log(f"fault campaign: seed {seed}, {operations} operations in {namespace}")
    camp = Campaign(cluster, runner, operator, namespace, plugin, seed)

    def ready() -> object:
        return wait_crew_ready(cluster, namespace, "research", 2)

    def on_op(record: OpRecord) -> None:
        log(f"{record.t:7.1f}s #{record.op.index:<3} {record.op.kind:<15} {record.target:<24} "
            f"{record.outcome}")

    try:
        camp.setup(ready)
        camp.run(ops, on_op)
    finally:
        camp.settle(settle_timeout)
    history = camp.final()
    anomalies = checker.check(history)
    log("summary: " + json.dumps(history.summary(), sort_keys=True))
    for anomaly in anomalies:
        log(f"{'KNOWN GAP' if anomaly.known_gap else 'ANOMALY'} {anomaly}")
    if anomalies:
        log(replay_hint(seed, operations))
    return history, anomalies
