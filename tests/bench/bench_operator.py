#!/usr/bin/env python3
"""Operator scale benchmark: bursts of CrewJobs, and many CrewJobs running at once.

    python tests/bench/bench_operator.py [--jobs 500[,5000,...]] [--replicas 2]
        [--running 0] [--sleep 900] [--window 120] [--concurrency 8] [--json out.json]
        [--state-dir DIR] [--keep]

One control plane with the operator and the pod runner (the e2e harness), one Crew
(`examples/crew-research.yaml`, `--replicas` replicas, every replica's journal bound sized
for all the CrewJobs of the run, so that rendezvous placement never fills one: the figure
measures the operator, not `maxRetainedRuns`). Then, in this order, in the same operator
process, so that every ratio comes from one run:

1. one burst per `--jobs` size: that many `run` CrewJobs in one `kubectl create`, until every
   one is terminal (the bench makes no API request while it waits: it reads the operator's
   phase gauge, which comes from the watch, and `/proc`). Per size: seconds until all are
   terminal and per CrewJob; operator CPU seconds (utime+stime of the operator process) and
   RSS growth per 1,000 CrewJobs; API writes and reads per CrewJob by resource and verb (the
   delta of the API server's `apiserver_request_total`, the user's own create included);
   sidecar admissions; duplicate executions (offline LLM calls vs. N x the calls of one
   probe job; must be 0).
2. with `--running R`: a second Crew (`hold`, same replicas, `maxConcurrency` R/replicas)
   and R CrewJobs whose model calls sleep `--sleep` seconds (`[[sleep:N]]` of the offline
   LLM), so that all R are running at once. Once every one is admitted and Running, a quiet
   `--window` of seconds in which the bench itself sends no API request: operator MiB per
   1,000 running CrewJobs (RSS now minus before they were created), operator CPU per running
   job per minute, and requests per running job per minute against the API server (all
   verbs, by resource) and against the sidecars (the operator's
   `crewfence_operator_sidecar_requests_total`, by route). Duplicates: admissions vs. R.

The ratios "largest size vs. smallest size" for time and CPU per CrewJob are printed too.
Prints one JSON object; exits non-zero when a bar is missed: every CrewJob terminal, zero
duplicates, at most 6 API writes per CrewJob.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

E2E = Path(__file__).resolve().parents[1] / "e2e"
sys.path.insert(0, str(E2E))

from crewjob_support import (  # noqa: E402
    EXAMPLES,
    TERMINAL,
    apply_obj,
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
READ_VERBS = ("GET", "LIST", "WATCH")
# Resources our operator (and the user) write for CrewJobs; leases/pods of others excluded.
COUNTED_WRITES = ("crewjobs", "configmaps", "events")
NAMESPACE = "crewfence-bench"
WRITES_BAR = 6.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
SCRAPE_ATTEMPTS = 30


# --- what the API server counted ---------------------------------------------------------------
def api_requests(cluster: Cluster) -> dict[str, float]:
    """``apiserver_request_total`` by "resource[/subresource] VERB" (resource requests only:
    discovery and /metrics have no resource)."""
    text = cluster.kubectl("get", "--raw", "/metrics", check=True).stdout
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        verb = re.search(r'verb="([^"]*)"', line)
        res = re.search(r'resource="([^"]*)"', line)
        if not verb or not res or not res.group(1):
            continue
        sub = re.search(r'subresource="([^"]*)"', line)
        key = f"{res.group(1)}{'/' + sub.group(1) if sub and sub.group(1) else ''} {verb.group(1)}"
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def of_verbs(counts: dict[str, float], verbs: tuple[str, ...],
             resources: tuple[str, ...] | None = None) -> dict[str, float]:
    return {k: v for k, v in counts.items() if k.rsplit(" ", 1)[1] in verbs
            and (resources is None or k.split("/")[0].split(" ")[0] in resources)}


def per(counts: dict[str, float], n: float) -> dict[str, float]:
    return {k: round(v / n, 3) for k, v in sorted(counts.items())}


# --- the operator process ----------------------------------------------------------------------
class OperatorProc:
    def __init__(self, state_dir: Path, metrics_url: str) -> None:
        rec = procs.read_pidfile(state_dir / "pids" / "operator.pid")
        assert rec is not None, "the operator is not running"
        self.pid = rec.pid
        self.metrics_url = metrics_url
        self.scrape_max_seconds = 0.0
        self.scrape_timeouts = 0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime

    def _status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def rss_mib(self) -> float:
        return self._status_kib("VmRSS") / 1024

    def hwm_mib(self) -> float:
        return self._status_kib("VmHWM") / 1024

    def metrics(self) -> str:
        """One scrape of the operator's /metrics, as a dashboard would: a scrape that takes
        longer than 10 s is counted (``scrape_timeouts``, reported) and tried again, so a
        saturated operator shows in the figures instead of ending the bench."""
        for _ in range(SCRAPE_ATTEMPTS):
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.metrics_url, timeout=10) as resp:
                    body = resp.read().decode()
            except TimeoutError:
                self.scrape_timeouts += 1
                continue
            finally:
                self.scrape_max_seconds = max(self.scrape_max_seconds,
                                              time.monotonic() - started)
            return body
        raise TimeoutError(f"{SCRAPE_ATTEMPTS} scrapes of {self.metrics_url} timed out")

    def phases(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in re.finditer(r'^crewfence_operator_crewjobs\{phase="([^"]*)"\}\s+(\S+)$',
                             self.metrics(), re.M):
            out[m.group(1)] = float(m.group(2))
        return out

    def sidecar_requests(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in re.finditer(
                r'^crewfence_operator_sidecar_requests_total\{route="([^"]*)"\}\s+(\S+)$',
                self.metrics(), re.M):
            out[m.group(1)] = float(m.group(2))
        return out


def terminal_count(op: OperatorProc) -> float:
    phases = op.phases()
    return sum(phases.get(p, 0.0) for p in TERMINAL)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --- the sidecars ------------------------------------------------------------------------------
def sidecar_total(cluster: Cluster, crew: str, metric: str) -> float:
    """``metric`` summed over the Crew's replicas (their /metrics, as the operator reaches
    them: this reads the Crew and its Secrets from the API server)."""
    access = crew_access(cluster, NAMESPACE, crew)
    total = 0.0
    for rep in crew_replicas(cluster, NAMESPACE, crew):
        if rep.get("address"):
            status, text = sidecar_get(rep, "/metrics", access)
            if status == 200:
                total += metric_total(text, metric)
    return total


def admissions(cluster: Cluster, crew: str) -> float:
    return sidecar_total(cluster, crew, "crewfence_sidecar_admissions_total")


def crew_body(name: str, replicas: int, retained: int, concurrency: int) -> dict[str, Any]:
    crew: dict[str, Any] = yaml.safe_load((EXAMPLES / "crew-research.yaml").read_text())
    crew["metadata"]["name"] = name
    crew["spec"]["replicas"] = replicas
    # Each replica can hold every record of the run: placement is by rendezvous hash, so one
    # replica may get more than its share (issue 24 saw 1,024 of 2,001 on one of two).
    crew["spec"]["journal"]["maxRetainedRuns"] = retained
    crew["spec"]["journal"]["maxConcurrency"] = concurrency
    return crew


def create_jobs(cluster: Cluster, names: list[str], crew: str, topic: str) -> None:
    for start in range(0, len(names), 1000):  # kubectl create of 1,000 at a time
        docs = "\n---\n".join(
            json.dumps(crewjob_manifest(n, "run", {"topic": f"{topic} {n}"}, crew=crew))
            for n in names[start:start + 1000])
        cluster.kubectl("create", "-n", NAMESPACE, "-f", "-", input=docs, check=True,
                        timeout=900)


def settle_writes(cluster: Cluster) -> dict[str, float]:
    """The API counters once the operator's last writes (finalizer removals) have landed:
    two reads 2 s apart that agree on the CrewJob writes."""
    last = api_requests(cluster)
    for _ in range(30):
        time.sleep(2)
        now = api_requests(cluster)
        if of_verbs(now, WRITE_VERBS, COUNTED_WRITES) == of_verbs(last, WRITE_VERBS,
                                                                  COUNTED_WRITES):
            return now
        last = now
    return last


# --- 1. bursts ---------------------------------------------------------------------------------
def burst(cluster: Cluster, op: OperatorProc, size: int, per_job_calls: float,
          timeout: float) -> dict[str, Any]:
    names = [f"b{size}-{i:05d}" for i in range(size)]
    calls_before = sum(llm_calls(cluster, NAMESPACE, "research").values())
    adm_before = admissions(cluster, "research")
    api_before = api_requests(cluster)  # from here on the bench reads no API resource
    done_before = terminal_count(op)
    cpu_before, rss_before = op.cpu_seconds(), op.rss_mib()
    load_before = loadavg()
    op.scrape_max_seconds, op.scrape_timeouts = 0.0, 0
    started = time.monotonic()
    create_jobs(cluster, names, "research", "bench")
    created = time.monotonic() - started
    peak = rss_before

    def all_terminal() -> bool | None:
        nonlocal peak
        peak = max(peak, op.rss_mib())
        return True if terminal_count(op) >= done_before + size else None

    timed_out = False
    try:
        wait_for(all_terminal, timeout=timeout, what=f"{size} CrewJobs terminal", interval=1)
    except AssertionError:
        timed_out = True
    elapsed = time.monotonic() - started
    cpu = op.cpu_seconds() - cpu_before
    load_after = loadavg()
    api_after = settle_writes(cluster)
    # Only now does the bench read the CrewJobs (one LIST, outside the counted window).
    items = cluster.get_json("crewjobs", "-n", NAMESPACE)["items"]
    phases = {i["metadata"]["name"]: (i.get("status") or {}).get("phase") for i in items}
    mine = {n: phases.get(n) for n in names}
    not_done = {n: p for n, p in mine.items() if p not in TERMINAL}
    reasons: dict[str, int] = {}
    for i in items:
        if i["metadata"]["name"] in not_done:
            key = f"{(i.get('status') or {}).get('phase')}/{(i.get('status') or {}).get('reason')}"
            reasons[key] = reasons.get(key, 0) + 1
    counts = delta(api_after, api_before)
    writes = of_verbs(counts, WRITE_VERBS, COUNTED_WRITES)
    reads = of_verbs(counts, READ_VERBS)
    calls = sum(llm_calls(cluster, NAMESPACE, "research").values()) - calls_before
    adm = admissions(cluster, "research") - adm_before
    return {
        "jobs": size,
        "terminal": sum(p in TERMINAL for p in mine.values()),
        "succeeded": sum(p == "Succeeded" for p in mine.values()),
        "not_terminal_by_phase_reason": reasons,
        "timed_out": timed_out,
        "seconds_to_create": round(created, 1),
        "seconds_to_all_terminal": round(elapsed, 1),
        "seconds_per_crewjob": round(elapsed / size, 4),
        "operator_cpu_seconds": round(cpu, 1),
        "operator_cpu_seconds_per_1000": round(cpu / size * 1000, 1),
        "operator_rss_before_mib": round(rss_before, 1),
        "operator_peak_rss_mib": round(peak, 1),
        "operator_rss_growth_mib_per_1000": round((peak - rss_before) / size * 1000, 1),
        "api_writes_per_crewjob": round(sum(writes.values()) / size, 3),
        "api_writes_per_crewjob_by_kind": per(writes, size),
        "api_reads_per_crewjob": round(sum(reads.values()) / size, 3),
        "api_reads_per_crewjob_by_kind": per(reads, size),
        "operator_metrics_scrape_max_seconds": round(op.scrape_max_seconds, 2),
        "operator_metrics_scrape_timeouts": op.scrape_timeouts,
        "sidecar_admissions": int(adm),
        "sidecar_admissions_per_second": round(adm / elapsed, 1),
        "llm_calls": calls,
        "duplicate_executions": round((calls - size * per_job_calls) / per_job_calls, 2)
        if per_job_calls else None,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }


# --- 2. many running at once -------------------------------------------------------------------
def running(cluster: Cluster, op: OperatorProc, count: int, replicas: int, sleep: float,
            window: float, retained: int, concurrency: int | None) -> dict[str, Any]:
    """``concurrency`` (per replica) below count/replicas leaves the rest admitted and
    waiting for a slot in the sidecar: live for the operator (a daemon, an open stream), not
    executing (one worker process each); the figures say how many executed."""
    concurrency = concurrency or min(1024, math.ceil(count / replicas) + 2)
    assert apply_obj(cluster, crew_body("hold", replicas, retained, concurrency),
                     NAMESPACE).returncode == 0
    wait_crew_ready(cluster, NAMESPACE, "hold", replicas, timeout=900)
    adm_before = admissions(cluster, "hold")
    # What the operator does with no CrewJob running (the Crews' reconcile passes, leases):
    # the same measurement without the jobs, subtracted below.
    idle = quiet_window(cluster, op, window / 2)
    rss_before, cpu_before = op.rss_mib(), op.cpu_seconds()
    names = [f"run-{i:05d}" for i in range(count)]
    started = time.monotonic()
    create_jobs(cluster, names, "hold", f"hold [[sleep:{sleep:g}]]")

    def all_running() -> bool | None:
        return True if op.phases().get("Running", 0.0) >= count else None

    wait_for(all_running, timeout=max(600.0, count * 1.0), what=f"{count} running", interval=2)

    def all_admitted() -> bool | None:
        return True if admissions(cluster, "hold") - adm_before >= count else None

    wait_for(all_admitted, timeout=max(600.0, count * 1.0), what=f"{count} admitted",
             interval=5)
    to_running = time.monotonic() - started
    # These read the Crew and its Secrets: before the window.
    admitted = admissions(cluster, "hold") - adm_before
    executing = sidecar_total(cluster, "hold", "crewfence_sidecar_active_runs")
    cpu_w0 = op.cpu_seconds()
    load_before = loadavg()
    busy = quiet_window(cluster, op, window)
    minutes, cpu_w, rss_peak = busy["minutes"], busy["cpu"], busy["rss_peak"]
    api, side = busy["api"], busy["sidecar"]
    still = op.phases().get("Running", 0.0)
    by_phase = op.phases()

    def above_idle_per_job_minute(key: str) -> float:
        rate = sum(busy[key].values()) / busy["minutes"]
        idle_rate = sum(idle[key].values()) / idle["minutes"]
        return round((rate - idle_rate) / count, 4)
    return {
        "running": count, "crew_max_concurrency": concurrency, "sleep_seconds": sleep,
        "executing_in_sidecars": executing,
        "seconds_until_all_running": round(to_running, 1),
        "running_during_window": still,
        "phases_after_window": by_phase,
        "window_seconds": round(minutes * 60, 1),
        "operator_rss_before_mib": round(rss_before, 1),
        "operator_rss_running_mib": round(rss_peak, 1),
        "operator_mib_per_1000_running": round((rss_peak - rss_before) / count * 1000, 1),
        "operator_cpu_seconds_to_start_them": round(cpu_w0 - cpu_before, 1),
        "operator_cpu_seconds_per_running_job_per_minute": round(cpu_w / count / minutes, 5),
        "operator_cpu_seconds_per_running_job_per_minute_above_idle": round(
            (cpu_w / minutes - idle["cpu"] / idle["minutes"]) / count, 5),
        "api_requests_per_running_job_per_minute": round(
            sum(api.values()) / count / minutes, 4),
        "api_requests_per_running_job_per_minute_above_idle": above_idle_per_job_minute("api"),
        "api_requests_in_window_by_kind": {k: int(v) for k, v in sorted(api.items())},
        "api_requests_in_idle_window_by_kind": {k: int(v) for k, v in sorted(
            idle["api"].items())},
        "idle_window_seconds": round(idle["minutes"] * 60, 1),
        "sidecar_requests_per_running_job_per_minute": round(
            sum(side.values()) / count / minutes, 4),
        "sidecar_requests_per_running_job_per_minute_above_idle": above_idle_per_job_minute(
            "sidecar"),
        "sidecar_requests_in_window_by_route": {k: int(v) for k, v in sorted(side.items())},
        "sidecar_admissions": int(admitted),
        "duplicate_admissions": int(admitted - count),
        "loadavg_before": load_before, "loadavg_after": loadavg(),
    }


def quiet_window(cluster: Cluster, op: OperatorProc, seconds: float) -> dict[str, Any]:
    """``seconds`` in which the bench sends no API request (only /metrics, not a resource):
    API requests by kind, the operator's sidecar requests by route, its CPU and peak RSS."""
    api_before, side_before = api_requests(cluster), op.sidecar_requests()
    cpu0, t0 = op.cpu_seconds(), time.monotonic()
    rss_peak = op.rss_mib()
    while time.monotonic() - t0 < seconds:
        time.sleep(min(5.0, max(0.1, seconds - (time.monotonic() - t0))))
        rss_peak = max(rss_peak, op.rss_mib())
    minutes = (time.monotonic() - t0) / 60
    return {"minutes": minutes, "cpu": op.cpu_seconds() - cpu0, "rss_peak": rss_peak,
            "api": delta(api_requests(cluster), api_before),
            "sidecar": delta(op.sidecar_requests(), side_before)}


def run(sizes: list[int], replicas: int, running_count: int, sleep: float, window: float,
        concurrency: int, running_concurrency: int | None, state_dir: Path) -> dict[str, Any]:
    kube_bin = build.ensure_binaries()
    info = controlplane.up(state_dir, kube_bin, with_operator=True)
    cluster = Cluster(info)
    assert info.operator_metrics, "the harness started no operator metrics endpoint"
    op = OperatorProc(state_dir, info.operator_metrics)
    cluster.kubectl("create", "namespace", NAMESPACE)
    controlplane.ensure_default_service_account(info, NAMESPACE)
    retained = sum(sizes) + running_count + 100
    assert apply_obj(cluster, crew_body("research", replicas, retained, concurrency),
                     NAMESPACE).returncode == 0
    wait_crew_ready(cluster, NAMESPACE, "research", replicas, timeout=900)

    base = sum(llm_calls(cluster, NAMESPACE, "research").values())
    assert apply_obj(cluster, crewjob_manifest("probe", "run", {"topic": "probe"}),
                     NAMESPACE).returncode == 0
    wait_phase(cluster, NAMESPACE, "probe", timeout=300)
    per_job = sum(llm_calls(cluster, NAMESPACE, "research").values()) - base

    result: dict[str, Any] = {
        "replicas": replicas, "crew_max_concurrency": concurrency,
        "crew_max_retained_runs": retained, "llm_calls_per_job": per_job,
        "operator_pid": op.pid, "bursts": [],
    }
    for size in sizes:
        one = burst(cluster, op, size, per_job, timeout=max(900.0, size * 1.5))
        result["bursts"].append(one)
        print(json.dumps(one), file=sys.stderr, flush=True)
    if len(sizes) > 1:
        small, large = result["bursts"][0], result["bursts"][-1]
        result["growth"] = {
            "sizes": f"{large['jobs']} vs {small['jobs']}",
            "seconds_per_crewjob": round(
                large["seconds_per_crewjob"] / small["seconds_per_crewjob"], 2),
            "operator_cpu_per_crewjob": round(
                large["operator_cpu_seconds_per_1000"] / small["operator_cpu_seconds_per_1000"],
                2),
            "api_reads_per_crewjob": round(
                large["api_reads_per_crewjob"] / max(small["api_reads_per_crewjob"], 1e-9), 2),
        }
    if running_count:
        result["running"] = running(cluster, op, running_count, replicas, sleep, window,
                                    retained, running_concurrency)
    result["operator_vmhwm_mib"] = round(op.hwm_mib(), 1)
    return result


def bars_met(result: dict[str, Any]) -> bool:
    ok = all(b["terminal"] == b["jobs"] and b["duplicate_executions"] == 0
             and b["api_writes_per_crewjob"] <= WRITES_BAR for b in result["bursts"])
    if "running" in result:
        ok = ok and result["running"]["duplicate_admissions"] == 0
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", default="500",
                        help="burst sizes, comma-separated, run in order (e.g. 500,5000)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8,
                        help="maxConcurrency of each replica for the bursts")
    parser.add_argument("--running", type=int, default=0,
                        help="CrewJobs running at once after the bursts (0: skip)")
    parser.add_argument("--running-concurrency", type=int, default=None,
                        help="maxConcurrency per replica of the running Crew (default: all "
                             "execute; lower leaves the rest admitted, waiting for a slot)")
    parser.add_argument("--sleep", type=float, default=900.0,
                        help="seconds each model call of a running job sleeps")
    parser.add_argument("--window", type=float, default=120.0,
                        help="seconds of the quiet measurement while they run")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--state-dir", type=Path, default=controlplane.REPO / ".e2e" / "bench")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in str(args.jobs).split(",") if s.strip()]
    try:
        result = run(sizes, args.replicas, args.running, args.sleep, args.window,
                     args.concurrency, args.running_concurrency, args.state_dir)
    finally:
        if not args.keep:
            controlplane.down(args.state_dir)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = bars_met(result)
    print("bars:", "met" if ok else "MISSED", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
