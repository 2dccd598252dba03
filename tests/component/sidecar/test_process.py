"""The real `crewfence-sidecar` executable: fencing and refusals before the port is bound."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from sidecar_helpers import SidecarProcess, sidecar_env, write_crews


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_is_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def crews(tmp_path: Path) -> Path:
    return write_crews(tmp_path)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


def _refused(tmp_path: Path, env: dict[str, str], *args: str) -> str:
    """Run the sidecar expecting a refusal: exit 2, one stderr line, port never bound."""
    port = _free_port()
    proc = SidecarProcess(list(args), {**env, "CREWFENCE_PORT": str(port)},
                          tmp_path / f"refused-{port}.log").start()
    assert proc.wait_exit(60) == 2
    assert _port_is_closed(port)
    lines = proc.stderr_text().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("crewfence-sidecar: error: ")
    return lines[0]


def test_second_process_on_the_same_journal_exits_non_zero(
        tmp_path: Path, crews: Path, state: Path) -> None:
    journal = state / "journal.db"
    first = SidecarProcess([], sidecar_env(journal, crews), tmp_path / "first.log").start()
    try:
        first.wait_listening()
        line = _refused(tmp_path, sidecar_env(journal, crews))
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
    line = _refused(tmp_path, sidecar_env(journal, crews))
    assert "journal" in line


def test_restore_bound_violation_refuses_start_up(
        tmp_path: Path, crews: Path, state: Path) -> None:
    from crewfence_sidecar.contract import JobRecord, Status
    from crewfence_sidecar.journal import Journal, JournalLimits, utc_now

    journal = state / "journal.db"
    j = Journal.open(journal, JournalLimits())
    for i in range(3):
        now = utc_now()
        j.admit(JobRecord(f"a{i}", "research", "run", "h", Status.RUNNING, 0, now, now), {})
    j.close()
    line = _refused(tmp_path, sidecar_env(journal, crews, CREWFENCE_MAX_RETAINED_RUNS="2"))
    assert "CREWFENCE_MAX_RETAINED_RUNS" in line


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
    line = _refused(tmp_path, sidecar_env(state / "journal.db", crews, **env))
    assert fragment in line
    assert "test-token" not in line


def test_bad_crews_file_refuses_before_bind(tmp_path: Path, state: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("crews:\n  x: {agents: {}, tasks: []}\n")
    line = _refused(tmp_path, sidecar_env(state / "journal.db", bad))
    assert "crews" in line
