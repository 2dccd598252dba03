"""The real `crewfence-sidecar` executable: fencing and refusals before the port is bound."""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.error
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest
from crewfence_sidecar.contract import job_path
from crewfence_sidecar.crewai_outputs_holder import OUTPUTS_FILE
from sidecar_helpers import (
    AUTH,
    SidecarProcess,
    json_call,
    refused_start,
    sidecar_env,
    start_body,
    write_crews,
)
from worker_support import children_of


@pytest.fixture
def crews(tmp_path: Path) -> Path:
    return write_crews(tmp_path)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


def test_second_process_on_the_same_journal_exits_non_zero(
        tmp_path: Path, crews: Path, state: Path) -> None:
    journal = state / "journal.db"
    first = SidecarProcess([], sidecar_env(journal, crews), tmp_path / "first.log").start()
    try:
        first.wait_listening()
        line = refused_start(tmp_path, sidecar_env(journal, crews))
        assert "owned by another running process" in line
    finally:
        assert first.terminate() == 0


@pytest.mark.parametrize("violation", [
    "journal_symlink", "journal_not_regular", "journal_mode_0644", "journal_mode_0400",
    "parent_group_writable", "parent_world_writable", "parent_symlink", "lock_symlink",
    "lock_not_regular", "wal_symlink", "not_a_database",
])
def test_each_file_rule_violation_refuses_start_up(
        tmp_path: Path, crews: Path, state: Path, violation: str) -> None:
    journal = state / "journal.db"
    other = tmp_path / "other"
    other.write_text("")
    other.chmod(0o600)
    if violation == "journal_symlink":
        journal.symlink_to(other)
    elif violation == "journal_not_regular":
        journal.mkdir()
    elif violation.startswith("journal_mode_"):
        journal.write_text("")
        journal.chmod(int(violation[-4:], 8))
    elif violation == "parent_group_writable":
        os.chmod(state, 0o770)
    elif violation == "parent_world_writable":
        os.chmod(state, 0o703)
    elif violation == "parent_symlink":
        link = tmp_path / "link"
        link.symlink_to(state)
        journal = link / "journal.db"
    elif violation == "lock_symlink":
        (state / "journal.db.lock").symlink_to(other)
    elif violation == "lock_not_regular":
        (state / "journal.db.lock").mkdir()
    elif violation == "wal_symlink":
        (state / "journal.db-wal").symlink_to(other)
    elif violation == "not_a_database":
        journal.write_bytes(b"not sqlite" * 500)
        journal.chmod(0o600)
    line = refused_start(tmp_path, sidecar_env(journal, crews))
    assert "journal" in line


def test_a_journal_over_a_lowered_bound_serves_and_refuses_only_new_admissions(
        tmp_path: Path, crews: Path, state: Path) -> None:
    """Invariant (Journal.over_bounds): lowered journal bounds never brick a journal. The
    real executable starts on a journal holding more records than CREWFENCE_MAX_RETAINED_RUNS,
    says so in /health, answers what it holds (the exact repeat too) and refuses a new action
    with 507 journal_full."""
    from crewfence_sidecar.contract import JobRecord, Status
    from crewfence_sidecar.journal import Journal, JournalLimits, utc_now

    journal = state / "journal.db"
    j = Journal.open(journal, JournalLimits())
    for i in range(3):
        now = utc_now()
        j.admit(JobRecord(f"ns/a{i}", "research", "run", "h", Status.RUNNING, 0, now, now), {})
    j.close()
    env = sidecar_env(journal, crews, CREWFENCE_MAX_RETAINED_RUNS="2",
                      CREWAI_STORAGE_DIR=str(tmp_path / "crewai"))
    proc = SidecarProcess([], env, tmp_path / "over.log").start().wait_listening()

    def call(path: str, body: dict[str, object] | None = None) -> tuple[int, dict[str, object]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{proc.url}{path}", data=data,
                                     headers={**AUTH, "Idempotency-Key": "k"},
                                     method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    try:
        _, health = call("/health")
        assert health["journal_over_bounds"] == [
            {"bound": "max_retained_runs", "held": 3, "limit": 2}], health
        status, rec = call(job_path("ns/a1"))
        assert status == 200 and rec["status"] == "failed" and rec["uncertain_outcome"] is True
        status, refused = call("/jobs", start_body("ns/new"))
        assert status == 507 and refused["error"]["code"] == "journal_full", refused  # type: ignore[index]
        status, _ = call(job_path("ns/new"))
        assert status == 404
    finally:
        assert proc.terminate() == 0


@pytest.mark.parametrize("env, fragment", [
    ({"CREWFENCE_STATE_FILE": ""}, "CREWFENCE_STATE_FILE is required"),
    ({"CREWFENCE_HOST": "0.0.0.0", "CREWFENCE_EPHEMERAL": "1", "CREWFENCE_STATE_FILE": ""},
     "refused off loopback"),
    ({"CREWFENCE_HOST": "0.0.0.0", "CREWFENCE_TOKEN": "",
      "CREWFENCE_ALLOW_UNAUTHENTICATED": "1"}, "refused off loopback"),
    ({"CREWFENCE_MAX_CONCURRENCY": "0"}, "CREWFENCE_MAX_CONCURRENCY"),
    ({"CREWFENCE_TOKEN_FILE": "/etc/hostname"}, "exclusive"),
])
def test_bad_configuration_is_one_line_and_no_bind(
        tmp_path: Path, crews: Path, state: Path, env: dict[str, str], fragment: str) -> None:
    line = refused_start(tmp_path, sidecar_env(state / "journal.db", crews, **env))
    assert fragment in line
    assert "test-token" not in line


def test_bad_crews_file_refuses_before_bind(tmp_path: Path, state: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("crews:\n  x: {agents: {}, tasks: []}\n")
    line = refused_start(tmp_path, sidecar_env(state / "journal.db", bad))
    assert "crews" in line


REGISTRY_MODULE = """
import os
from pathlib import Path

from crewai import Agent, Crew, Task
from crewfence_sidecar.offline_llm import OfflineLLM


def _crew():
    agent = Agent(role="R", goal="Research {topic}", backstory="B", llm=OfflineLLM())
    return Crew(agents=[agent], tasks=[Task(description="Research {topic}",
                                            expected_output="A summary", agent=agent)])


def crews():
    with Path(os.environ["CF_REGISTRY_CALLS"]).open("a") as calls:
        calls.write(f"{os.getpid()}\\n")
    return {"made": _crew}


def broken():
    raise RuntimeError("the registry backend is down")


def not_a_mapping():
    return ["made"]
"""


def _registry_env(tmp_path: Path, state: Path, attribute: str) -> dict[str, str]:
    """A sidecar whose only crews come from ``cf_reg_process:<attribute>`` (no crews file)."""
    (tmp_path / "cf_reg_process.py").write_text(REGISTRY_MODULE)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    return sidecar_env(state / "journal.db", tmp_path / "unused.yaml", CREWFENCE_CREWS_FILE="",
                       CREWFENCE_REGISTRY=f"cf_reg_process:{attribute}", PYTHONPATH=path,
                       CF_REGISTRY_CALLS=str(tmp_path / "calls"),
                       CREWAI_STORAGE_DIR=str(tmp_path / "crewai"))


def test_a_registry_callable_is_called_once_and_its_crews_serve(
        tmp_path: Path, state: Path) -> None:
    """The reference sidecar's form: ``CREWFENCE_REGISTRY`` names a callable returning the
    ``crew_id -> factory`` mapping; the real executable calls it once at start and runs it."""
    proc = SidecarProcess([], _registry_env(tmp_path, state, "crews"),
                          tmp_path / "sidecar.log").start()
    try:
        proc.wait_listening()
        with urllib.request.urlopen(urllib.request.Request(f"{proc.url}/health", headers=AUTH),
                                    timeout=30) as resp:
            assert json.loads(resp.read())["crews"] == ["made"]
        req = urllib.request.Request(
            f"{proc.url}/jobs", data=json.dumps(start_body("ns/made", crew_id="made")).encode(),
            headers={**AUTH, "Idempotency-Key": "k", "Content-Type": "application/json"},
            method="POST")
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(urllib.request.Request(
                f"{proc.url}{job_path('ns/made')}", headers=AUTH), timeout=30) as resp:
            assert json.loads(resp.read())["status"] == "completed"
        assert len((tmp_path / "calls").read_text().splitlines()) == 1
    finally:
        assert proc.terminate() == 0


@pytest.mark.parametrize("attribute, fragment", [
    ("broken", "calling it raised RuntimeError: the registry backend is down"),
    ("not_a_mapping", "is a callable that must return a mapping crew_id -> factory, not list"),
])
def test_a_registry_callable_that_fails_refuses_start_up(
        tmp_path: Path, state: Path, attribute: str, fragment: str) -> None:
    line = refused_start(tmp_path, _registry_env(tmp_path, state, attribute))
    assert fragment in line and "cf_reg_process" in line


def test_sigkill_mid_job_then_restart_reports_failed_and_uncertain(
        tmp_path: Path, crews: Path, state: Path) -> None:
    """The production start path (real executable, no zygote) across a SIGKILL."""
    journal = state / "journal.db"
    env = sidecar_env(journal, crews, CREWAI_STORAGE_DIR=str(tmp_path / "crewai"))

    def call(url: str, body: dict[str, object] | None = None,
             extra: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, headers={**AUTH, **(extra or {})},
                                     method="POST" if body is not None else "GET")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())

    first = SidecarProcess([], env, tmp_path / "first.log").start().wait_listening()
    _, health = call(f"{first.url}/health")
    status, rec = call(f"{first.url}/jobs", start_body("ns/slow", topic="[[sleep:60]] x"),
                       {"Idempotency-Key": "k", "Prefer": "respond-async"})
    assert status == 202 and rec["status"] == "running"
    first.kill()

    second = SidecarProcess([], env, tmp_path / "second.log").start().wait_listening()
    try:
        _, health2 = call(f"{second.url}/health")
        assert health2["journal_id"] == health["journal_id"]
        _, after = call(f"{second.url}{job_path('ns/slow')}")
        assert after["status"] == "failed" and after["uncertain_outcome"] is True
        assert after["error"]["code"] == "sidecar_restarted"  # type: ignore[index]
        # the exact repeat answers with that record and does not run the job again
        status, repeat = call(f"{second.url}/jobs", start_body("ns/slow", topic="[[sleep:60]] x"),
                              {"Idempotency-Key": "k", "Prefer": "respond-async"})
        assert status == 200 and repeat == after
    finally:
        assert second.terminate() == 0


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = [child for child, _ in children_of(todo.pop())]
        found += kids
        todo += kids
    return found


def _holds(pid: int, path: Path) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    return any(os.readlink(fds / fd) == str(path) for fd in os.listdir(fds))


def test_no_connection_to_crewais_outputs_file_crosses_a_fork_and_a_run_keeps_its_wal(
        tmp_path: Path, crews: Path, state: Path) -> None:
    """Invariants (crewai_outputs_holder, crewai_outputs_connection): the sidecar keeps
    crewai's kickoff-outputs file open, opened after its worker template was forked, and the
    template never opens it, so no worker inherits a connection to it; the worker that ran the
    job writes through a connection of its own (kept after its fork). A run's writes leave
    the WAL in place (no close is the file's last) and crewai's outputs are in the file."""
    storage = tmp_path / "crewai"
    proc = SidecarProcess([], sidecar_env(state / "journal.db", crews,
                                          CREWAI_STORAGE_DIR=str(storage)),
                          tmp_path / "sidecar.log").start()
    try:
        proc.wait_listening()
        assert proc.proc is not None
        status, body = json_call(f"{proc.url}/jobs", "POST", start_body("held-1"),
                                 {"Idempotency-Key": "held-1"})
        assert status == 200, body
        outputs = storage / OUTPUTS_FILE
        assert _holds(proc.proc.pid, outputs)
        templates = [child for child, _ in children_of(proc.proc.pid)]
        assert templates  # the worker template
        assert not [pid for pid in templates if _holds(pid, outputs)]
        workers = [pid for pid in _descendants(proc.proc.pid) if pid not in templates]
        assert [pid for pid in workers if _holds(pid, outputs)]  # its own, after its fork
        assert outputs.with_name(OUTPUTS_FILE + "-wal").exists()
        with closing(sqlite3.connect(outputs)) as conn:
            rows = conn.execute("SELECT count(*) FROM latest_kickoff_task_outputs").fetchone()
        assert rows[0] >= 1
    finally:
        assert proc.terminate() == 0
