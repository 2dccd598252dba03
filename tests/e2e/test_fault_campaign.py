"""A short fault campaign on the real control plane (issue 19, part 2): a seeded, randomized
schedule of job operations and faults (operator SIGKILL, sidecar SIGKILL, pod force-delete,
SIGSTOP, scaling, retention, Crew delete --cascade=orphan and re-create) against a live Crew,
then the checker over the whole history must find no anomaly.

The seed comes from CREWFENCE_CAMPAIGN_SEED (else random) and is printed, with the replay
command on failure; CREWFENCE_CAMPAIGN_OPS sets the number of operations. One test, so
xdist's loadfile keeps it on one worker. The long campaign: tests/bench/bench_fault_campaign.py.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from campaign.checker import hard
from campaign.run import replay_hint, run_campaign
from harness.handles import Cluster, Operator, PodRunner
from plugin_support import plugin_dir

pytestmark = pytest.mark.slow

SHORT_OPERATIONS = 30


def test_short_fault_campaign_finds_no_anomaly(cluster: Cluster, pod_runner: PodRunner,
                                                operator_process: Operator, namespace: str,
                                                tmp_path: Path) -> None:
    seed = int(os.environ.get("CREWFENCE_CAMPAIGN_SEED") or random.randrange(1 << 32))
    operations = int(os.environ.get("CREWFENCE_CAMPAIGN_OPS") or SHORT_OPERATIONS)
    history, anomalies = run_campaign(cluster, pod_runner, operator_process, namespace,
                                      plugin_dir(tmp_path), seed, operations,
                                      settle_timeout=120)
    saved = cluster.state_dir / f"campaign-{seed}.json"
    saved.write_text(history.to_json())
    print(f"history: {saved}")
    summary = history.summary()
    assert summary["faults_total"] > 0, f"seed {seed}: no fault landed: {summary}"
    assert history.ledger, f"seed {seed}: the offline LLM ledger saw no call of this campaign"
    # Anomalies explained by a known, open gap are printed (above) but do not fail the build.
    failing = hard(anomalies)
    assert not failing, (
        f"seed {seed}: {len(failing)} anomalies:\n" + "\n".join(map(str, anomalies))
        + f"\n{replay_hint(seed, operations)}\nsummary: {json.dumps(summary)}\n"
        + "\n".join(history.log_lines()))
