"""The real ``crewfence-sidecar`` executable with workers: SIGKILL the sidecar while workers
run; the template and every worker die with it (no orphan keeps calling the model), and the
restarted sidecar marks the records failed + uncertain as any restart does."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sidecar_helpers import AUTH, SidecarProcess, headers, sidecar_env, start_body, wait_until
from worker_crews import STUCK_SECONDS
from worker_support import HERE, alive, children_of

pytestmark = pytest.mark.timeout(300)


def _call(url: str, method: str = "GET", body: dict[str, Any] | None = None,
          extra: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={**AUTH, "Content-Type": "application/json",
                                          **(extra or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _pids_of(effects: Path, tag: str) -> list[int]:
    if not effects.exists():
        return []
    return [int(line.split(" ")[1]) for line in effects.read_text().splitlines()
            if line.startswith("llm ") and line.endswith(tag)]


def _worker_registry_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A sidecar environment over the ``worker_crews`` registry (no YAML crews) and the file
    its workers log their model calls to."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    crews = tmp_path / "crews.yaml"
    crews.write_text("crews: {}\n")
    effects = tmp_path / "effects.log"
    env = sidecar_env(state / "journal.db", crews, CREWFENCE_REGISTRY="worker_crews:CREWS",
                      CREWFENCE_TEST_EFFECTS_LOG=str(effects),
                      PYTHONPATH=os.pathsep.join(
                          p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p))
    return env, effects


def test_sigkilled_sidecar_takes_its_workers_with_it(tmp_path: Path) -> None:
    env, effects = _worker_registry_env(tmp_path)
    first = SidecarProcess([], env, tmp_path / "first.log").start().wait_listening()
    try:
        assert first.proc is not None
        for n in (1, 2):
            status, _ = _call(f"{first.url}/jobs", "POST",
                              start_body(f"orphan-{n}", crew_id="stuck", topic=f"TAG-orphan-{n}"),
                              headers(f"orphan-{n}", async_=True))
            assert status == 202
        workers = [wait_until(lambda n=n: (_pids_of(effects, f"TAG-orphan-{n}") or [None])[0],
                              60, "a worker's model call") for n in (1, 2)]
        templates = [pid for pid, _ in children_of(first.proc.pid)]
        assert len(templates) == 1
        assert set(workers) <= {pid for pid, _ in children_of(templates[0])}
        everyone = [*templates, *(pid for pid, _ in children_of(templates[0]))]
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
        wait_until(lambda: not any(alive(p) for p in everyone), 30,
                   "the template and the workers to die with the sidecar")
        calls = effects.read_text()
        time.sleep(STUCK_SECONDS + 0.5)  # an orphan would make its next model call by now
        assert effects.read_text() == calls, "an orphaned worker kept calling the model"
    finally:
        first.kill()
    second = SidecarProcess([], env, tmp_path / "second.log").start().wait_listening()
    try:
        for n in (1, 2):
            status, record = _call(f"{second.url}/jobs/orphan-{n}")
            assert status == 200
            assert record["status"] == "failed" and record["uncertain_outcome"] is True
    finally:
        assert second.terminate() == 0
        assert second.proc is not None
        assert children_of(second.proc.pid) == []


def test_without_crewai_the_sidecar_names_the_extra_in_one_line(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "crewai"
    shadow.mkdir(parents=True)
    # what `import crewai` does when the `sidecar` extra was not installed
    (shadow / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'crewai\'", name="crewai")\n')
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    crews = tmp_path / "crews.yaml"
    crews.write_text("crews: {}\n")
    env = sidecar_env(state / "journal.db", crews, PYTHONPATH=str(shadow.parent))
    proc = SidecarProcess([], env, tmp_path / "log").start()
    assert proc.wait_exit(120) == 2
    lines = [line for line in proc.stderr_text().splitlines() if line.strip()]
    assert lines == ["crewfence-sidecar: error: crewai is not installed: install the sidecar "
                     "extra, pip install 'crewfence[sidecar]'"], lines


def test_a_lost_template_stops_the_sidecar_and_fails_its_jobs(tmp_path: Path) -> None:
    env, effects = _worker_registry_env(tmp_path)
    first = SidecarProcess([], env, tmp_path / "first.log").start().wait_listening()
    try:
        assert first.proc is not None
        status, _ = _call(f"{first.url}/jobs", "POST",
                          start_body("lost", crew_id="stuck", topic="TAG-lost"),
                          headers("lost", async_=True))
        assert status == 202
        worker = wait_until(lambda: (_pids_of(effects, "TAG-lost") or [None])[0], 60,
                            "the worker's model call")
        [template] = [pid for pid, _ in children_of(first.proc.pid)]
        os.kill(template, signal.SIGKILL)
        # a sidecar without its template could run nothing: it stops, the container restarts
        assert first.wait_exit(60) == 0
        assert "the worker template process is gone" in first.stderr_text()
        wait_until(lambda: not alive(worker), 30, "the worker to die with its template")
    finally:
        first.kill()
    second = SidecarProcess([], env, tmp_path / "second.log").start().wait_listening()
    try:
        status, record = _call(f"{second.url}/jobs/lost")
        assert status == 200
        assert record["status"] == "failed" and record["uncertain_outcome"] is True
        assert record["error"]["code"] in ("worker_died", "sidecar_stopped")
    finally:
        assert second.terminate() == 0
