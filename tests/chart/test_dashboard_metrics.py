"""Every metric the Grafana dashboard queries exists in a live scrape.

Sidecar: a real `crewfence-sidecar` process (offline sample crews, ephemeral, loopback) runs one
job, answers one exact repeat, one conflict and one rejection, and its /metrics must carry a
sample of every sidecar metric the dashboard names.
Operator: the operator's own metrics endpoint (crewfence_operator.metrics.serve, in this process)
must declare every operator metric the dashboard names. The live operator run against the real
control plane is scraped in tests/e2e/test_chart_install.py, after a CrewJob completed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chart_helpers import CHART
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = CHART / "files" / "dashboards" / "crewfence.json"
VENV_BIN = Path(sys.executable).parent
TOKEN = "dashboard-test-token"

# The metric names fixed by the team brief (histograms are queried as _bucket/_sum/_count).
SIDECAR_METRICS = {
    "crewfence_sidecar_admissions_total",
    "crewfence_sidecar_exact_repeats_total",
    "crewfence_sidecar_conflicts_total",
    "crewfence_sidecar_rejections_total",
    "crewfence_sidecar_journal_records",
    "crewfence_sidecar_journal_bytes",
    "crewfence_sidecar_persist_seconds",
    "crewfence_sidecar_active_runs",
    "crewfence_sidecar_runs_finished_total",
    "crewfence_offline_llm_calls_total",
}
OPERATOR_METRICS = {
    "crewfence_operator_crewjobs",
    "crewfence_operator_uncertain_outcomes_total",
    "crewfence_operator_admission_seconds",
    "crewfence_operator_sidecar_failures_total",
    "crewfence_operator_fenced_replicas",
    "crewfence_operator_unresolved_uncertain_crewjobs",
    "crewfence_operator_oldest_unresolved_uncertain_seconds",
    "crewfence_operator_tool_calls_total",
    "crewfence_operator_tool_calls_in_doubt_total",
    "crewfence_operator_model_calls_total",
    "crewfence_operator_prompt_tokens_total",
    "crewfence_operator_completion_tokens_total",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def dashboard_exprs() -> list[str]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            yield from (t["expr"] for t in panel.get("targets", []))
            yield from walk(panel.get("panels", []))

    return list(walk(json.loads(DASHBOARD.read_text())["panels"]))


def dashboard_metrics() -> set[str]:
    return {m for e in dashboard_exprs() for m in re.findall(r"\bcrewfence_[a-z0-9_]+\b", e)}


def base_name(metric: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if metric.endswith(suffix):
            return metric[: -len(suffix)]
    return metric


def test_dashboard_uses_every_brief_metric_and_no_other() -> None:
    used = {base_name(m) for m in dashboard_metrics()}
    assert used == SIDECAR_METRICS | OPERATOR_METRICS
    for histogram in ("crewfence_sidecar_persist_seconds", "crewfence_operator_admission_seconds"):
        assert f"{histogram}_bucket" in dashboard_metrics()


def sample_names(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def declared_names(text: str) -> set[str]:
    """Names a family exposes even before its first labelled sample (HELP/TYPE only)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{s}" for s in HISTOGRAM_SUFFIXES)
        else:
            names.add(family.name)
    return names | sample_names(text)


def listening_port(log: Path) -> int | None:
    """The port from the sidecar's JSON ``"msg": "listening"`` log line, once written."""
    for line in log.read_text(errors="replace").split("\n")[:-1]:  # complete lines only
        try:
            entry = json.loads(line) if line.startswith("{") else None
        except json.JSONDecodeError:  # stdout shares the file
            continue
        if isinstance(entry, dict) and entry.get("msg") == "listening":
            return int(entry["port"])
    return None


@dataclass(frozen=True)
class Sidecar:
    base: str

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {TOKEN}",
                "Content-Type": "application/json",
                **(headers or {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        text = raw.decode()
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text


def wait_until(
    what: str, check: Any, timeout: float, proc: subprocess.Popen[str] | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"sidecar exited with {proc.returncode} while waiting for {what}")
        value = check()
        if value:
            return value
        time.sleep(0.1)  # polling interval of a condition with a deadline, not synchronisation
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    home = tmp_path_factory.mktemp("sidecar-home")
    env = {
        **os.environ,
        "HOME": str(home),
        "CREWAI_STORAGE_DIR": str(home / "crewai"),
        "CREWAI_DISABLE_TELEMETRY": "true",
        "CREWAI_TRACING_ENABLED": "false",
        "OTEL_SDK_DISABLED": "true",
        "CREWFENCE_REGISTRY": "crewfence_sidecar.samples:SAMPLE_CREWS",
        "CREWFENCE_EPHEMERAL": "1",
        "CREWFENCE_HOST": "127.0.0.1",
        # port 0: the sidecar binds a port the kernel chooses and logs it (a port probed free
        # here and bound by the child later could be taken by another process between)
        "CREWFENCE_PORT": "0",
        "CREWFENCE_TOKEN": TOKEN,
    }
    env.pop("CREWFENCE_STATE_FILE", None)
    log_file = home / "sidecar.log"
    log = log_file.open("w")
    proc = subprocess.Popen(
        [str(VENV_BIN / "crewfence-sidecar")],
        env=env,
        cwd=home,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def healthy(client: Sidecar) -> bool:
        try:
            return client.call("GET", "/health")[0] == 200
        except OSError:
            return False

    try:
        port = wait_until("the sidecar to listen", lambda: listening_port(log_file), 120, proc)
        client = Sidecar(base=f"http://127.0.0.1:{port}")
        wait_until("the sidecar's /health", lambda: healthy(client), 120, proc)
        yield client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_sidecar_scrape_has_every_dashboard_metric(sidecar: Sidecar) -> None:
    start = {
        "crew_id": "single",
        "action_id": "dashboard/one",
        "operation": "run",
        "input": {"topic": "dashboards"},
    }
    key = {"Idempotency-Key": "dashboard-one", "Prefer": "respond-async"}
    status, record = sidecar.call("POST", "/jobs", start, key)
    assert status in (200, 201, 202), record
    assert sidecar.call("POST", "/jobs", start, key)[0] in (200, 201, 202)  # exact repeat
    changed = {**start, "input": {"topic": "something else"}}
    assert sidecar.call("POST", "/jobs", changed, key)[0] == 409
    assert sidecar.call("POST", "/jobs", start, {"Prefer": "respond-async"})[0] == 428

    def finished() -> Any:
        code, body = sidecar.call("GET", "/jobs/dashboard%2Fone")
        return body if code == 200 and body["status"] != "running" else None

    final = wait_until("the job to finish", finished, 180)
    assert final["status"] == "completed", final

    status, text = sidecar.call("GET", "/metrics")
    assert status == 200
    present = sample_names(text)
    wanted = {m for m in dashboard_metrics() if not m.startswith("crewfence_operator_")}
    assert wanted, "the dashboard queries sidecar metrics"
    assert wanted <= present, f"missing from the sidecar scrape: {sorted(wanted - present)}"


def test_operator_endpoint_declares_every_dashboard_metric() -> None:
    from crewfence_operator import metrics

    # metrics.serve keeps the server it starts to itself, so it cannot be given port 0 and
    # asked which port it got: the port is held bound (SO_REUSEADDR, never listening) until
    # the endpoint listens on it; its HTTPServer binds with SO_REUSEADDR, which Linux allows
    # beside a socket that does not listen, and no other process is handed the port between
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        port = int(held.getsockname()[1])
        metrics.serve(port, addr="127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = {m for m in dashboard_metrics() if m.startswith("crewfence_operator_")}
    assert wanted, "the dashboard queries operator metrics"
    present = declared_names(text)
    assert wanted <= present, f"missing from the operator endpoint: {sorted(wanted - present)}"
