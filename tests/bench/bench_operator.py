#!/usr/bin/env python3
"""Operator scale benchmark: N CrewJobs applied at once to a Crew of 2 replicas.

    python tests/bench/bench_operator.py [--jobs 500] [--state-dir DIR] [--keep]

Starts the local control plane with the operator (the e2e harness), applies
examples/crew-research.yaml, then N CrewJobs in one `kubectl create`, and measures:

- seconds until every CrewJob is terminal, and how many Succeeded;
- API writes per CrewJob: the delta of the API server's `apiserver_request_total` for the
  write verbs (POST, PUT, PATCH, DELETE, APPLY) over the run, divided by N (the user's own
  create included; writes of unrelated controllers, e.g. leases, are excluded);
- operator peak RSS (VmHWM of the operator process);
- sidecar admissions per second (sum of `crewfence_sidecar_admissions_total` over the run,
  divided by the time from the first create to the last admission observed);
- duplicates: offline LLM calls over the run compared with N x (calls of one probe job).

Bars (from the issue): at most 8 API writes per CrewJob, all N terminal, zero duplicates.
Prints one JSON object; exits non-zero when a bar is missed. Figures are ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

E2E = Path(__file__).resolve().parents[1] / "e2e"
sys.path.insert(0, str(E2E))

from crewjob_support import (  # noqa: E402
    EXAMPLES,
    TERMINAL,
    apply_file,
    crew_access,
    crew_replicas,
    crewjob_manifest,
    llm_calls,
    metric_total,
    sidecar_get,
    wait_crew_ready,
    wait_for,
    wait_phase,
)
from harness import build, controlplane, procs  # noqa: E402
from harness.handles import Cluster  # noqa: E402

WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
# Resources our operator (and the user) write for CrewJobs; leases/pods of others excluded.
COUNTED = ("crewjobs", "configmaps", "events")
NAMESPACE = "crewfence-bench"


def api_writes(cluster: Cluster) -> dict[str, float]:
    text = cluster.kubectl("get", "--raw", "/metrics", check=True).stdout
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        verb = re.search(r'verb="([^"]*)"', line)
        res = re.search(r'resource="([^"]*)"', line)
        if not verb or not res or verb.group(1) not in WRITE_VERBS:
            continue
        sub = re.search(r'subresource="([^"]*)"', line)
        key = f"{res.group(1)}{'/' + sub.group(1) if sub and sub.group(1) else ''} {verb.group(1)}"
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def admissions(cluster: Cluster, namespace: str) -> float:
    access = crew_access(cluster, namespace, "research")
    total = 0.0
    for rep in crew_replicas(cluster, namespace, "research"):
        if rep.get("address"):
            status, text = sidecar_get(rep, "/metrics", access)
            if status == 200:
                total += metric_total(text, "crewfence_sidecar_admissions_total")
    return total


def operator_peak_rss_kib(state_dir: Path) -> int | None:
    rec = procs.read_pidfile(state_dir / "pids" / "operator.pid")
    if rec is None:
        return None
    try:
        for line in Path(f"/proc/{rec.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def run(jobs: int, state_dir: Path) -> dict[str, Any]:
    kube_bin = build.ensure_binaries()
    info = controlplane.up(state_dir, kube_bin, with_operator=True)
    cluster = Cluster(info)
    cluster.kubectl("create", "namespace", NAMESPACE)
    controlplane.ensure_default_service_account(info, NAMESPACE)
    apply_file(cluster, EXAMPLES / "crew-research.yaml", NAMESPACE)
    wait_crew_ready(cluster, NAMESPACE, "research", 2, timeout=600)

    base = sum(llm_calls(cluster, NAMESPACE, "research").values())
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", check=True,
                    input=json.dumps(crewjob_manifest("probe", "run", {"topic": "probe"})))
    wait_phase(cluster, NAMESPACE, "probe", timeout=300)
    per_job = sum(llm_calls(cluster, NAMESPACE, "research").values()) - base

    names = [f"bench-{i:04d}" for i in range(jobs)]
    docs = "\n---\n".join(json.dumps(crewjob_manifest(n, "run", {"topic": f"bench {i}"}))
                          for i, n in enumerate(names))
    writes_before = api_writes(cluster)
    calls_before = sum(llm_calls(cluster, NAMESPACE, "research").values())
    adm_before = admissions(cluster, NAMESPACE)
    started = time.monotonic()
    cluster.kubectl("create", "-n", NAMESPACE, "-f", "-", input=docs, check=True, timeout=600)

    last_adm = [adm_before, started]

    def all_terminal() -> dict[str, Any] | None:
        adm = admissions(cluster, NAMESPACE)
        if adm > last_adm[0]:
            last_adm[:] = [adm, time.monotonic()]
        items = cluster.get_json("crewjobs", "-n", NAMESPACE)["items"]
        phases = {i["metadata"]["name"]: (i.get("status") or {}).get("phase") for i in items}
        done = {n: phases.get(n) for n in names}
        return done if all(p in TERMINAL for p in done.values()) else None

    phases = wait_for(all_terminal, timeout=3600, what=f"{jobs} CrewJobs terminal", interval=2)
    elapsed = time.monotonic() - started
    # let the last finalizer removals land before reading the counters
    time.sleep(3)
    writes_after = api_writes(cluster)
    delta = {k: writes_after.get(k, 0.0) - writes_before.get(k, 0.0) for k in writes_after}
    counted = {k: v for k, v in delta.items() if v and k.split("/")[0].split(" ")[0] in COUNTED}
    calls = sum(llm_calls(cluster, NAMESPACE, "research").values()) - calls_before
    adm_total = last_adm[0] - adm_before
    adm_window = max(last_adm[1] - started, 1e-9)
    return {
        "jobs": jobs,
        "succeeded": sum(p == "Succeeded" for p in phases.values()),
        "terminal": sum(p in TERMINAL for p in phases.values()),
        "seconds_to_all_terminal": round(elapsed, 1),
        "api_writes_per_crewjob": round(sum(counted.values()) / jobs, 2),
        "api_writes_by_kind": {k: int(v) for k, v in sorted(counted.items())},
        "operator_peak_rss_mib": round((operator_peak_rss_kib(state_dir) or 0) / 1024, 1),
        "sidecar_admissions": int(adm_total),
        "sidecar_admissions_per_second": round(adm_total / adm_window, 1),
        "llm_calls_per_job": per_job,
        "llm_calls": calls,
        "duplicate_executions": round((calls - jobs * per_job) / per_job, 2) if per_job else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--state-dir", type=Path, default=controlplane.REPO / ".e2e" / "bench")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)
    try:
        result = run(args.jobs, args.state_dir)
    finally:
        if not args.keep:
            controlplane.down(args.state_dir)
    print(json.dumps(result, indent=2))
    bars = (result["api_writes_per_crewjob"] <= 8 and result["terminal"] == args.jobs
            and result["duplicate_executions"] == 0)
    print("bars:", "met" if bars else "MISSED", file=sys.stderr)
    return 0 if bars else 1


if __name__ == "__main__":
    sys.exit(main())
