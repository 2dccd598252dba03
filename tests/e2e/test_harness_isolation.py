"""What keeps parallel test sessions apart (`scripts/test.sh` runs two xdist workers, and other
sessions may run on the same machine): reserved ports, per-session state folders that are
never pruned under a live session, and crewai storage private to each pytest process.
(No cluster needed.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import net, sessions

E2E_DIR = Path(__file__).resolve().parent
ROOT_CONFTEST = E2E_DIR.parent / "conftest.py"


class _FirstBindGives:
    """A stand-in for socket.socket whose first bind(0) yields `port`; later ones are real."""

    calls = 0

    def __init__(self, port: int) -> None:
        self.port = port

    def __call__(self, *args: object) -> socket.socket | _FirstBindGives:
        type(self).calls += 1
        if type(self).calls == 1:
            return self
        return socket.socket(*args)  # type: ignore[arg-type]

    def __enter__(self) -> _FirstBindGives:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def bind(self, address: tuple[str, int]) -> None:
        return None

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def _offer_first(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    _FirstBindGives.calls = 0
    fake = SimpleNamespace(
        socket=_FirstBindGives(port), AF_INET=socket.AF_INET, SOCK_STREAM=socket.SOCK_STREAM
    )
    monkeypatch.setattr(net, "socket", fake)  # only the harness's view of the module


def test_a_port_handed_out_is_not_handed_out_again_in_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = net.free_port()
    _offer_first(monkeypatch, first)  # the kernel offers the same port again (nobody binds it)
    second = net.free_port()
    assert _FirstBindGives.calls == 2, "the offered port must have been looked at and refused"
    assert second != first


def test_a_port_reserved_by_another_session_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); from harness import net; "
            "print(net.free_port(), flush=True); sys.stdin.read()",
            str(E2E_DIR),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        theirs = int(holder.stdout.readline())
        _offer_first(monkeypatch, theirs)
        mine = net.free_port()
        assert _FirstBindGives.calls == 2
        assert mine != theirs
    finally:
        holder.communicate("", timeout=30)
    # Its reservation ends with the process that held it.
    _offer_first(monkeypatch, theirs)
    assert net.free_port() == theirs


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_prune_never_removes_the_folder_of_a_live_session(tmp_path: Path) -> None:
    live = tmp_path / f"pytest-{os.getpid()}-gw7"  # just created: no process started in it yet
    dead = tmp_path / f"pytest-{_dead_pid()}-gw0"
    for d in (live, dead):
        (d / "pids").mkdir(parents=True)
    removed = sessions.prune(tmp_path, keep=0)
    assert removed == [dead]
    assert live.is_dir() and not dead.exists()


def test_each_xdist_worker_gets_its_own_state_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    gw1 = sessions.state_dir_name()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert gw1 == f"pytest-{os.getpid()}-gw1" != sessions.state_dir_name()
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert sessions.state_dir_name() == f"pytest-{os.getpid()}"


def _storage_of_a_session(outer: Path, worker: str) -> tuple[str, bool]:
    """Load the root conftest in a fresh process as an xdist worker would; the storage folder
    it chose, and whether that folder existed while the process ran."""
    code = textwrap.dedent(
        """
        import json, os, runpy, sys
        runpy.run_path(sys.argv[1])
        path = os.environ["CREWAI_STORAGE_DIR"]
        print(json.dumps([path, os.path.isdir(path)]))
        """
    )
    env = dict(os.environ, CREWAI_STORAGE_DIR=str(outer), PYTEST_XDIST_WORKER=worker)
    out = subprocess.run([sys.executable, "-c", code, str(ROOT_CONFTEST)], env=env,
                         capture_output=True, text=True, check=True).stdout
    path, existed = json.loads(out)
    return path, existed


def test_crewai_storage_is_private_to_each_worker_even_when_given_from_outside(
    tmp_path: Path,
) -> None:
    """crewai keeps `latest_kickoff_task_outputs.db` (what `replay` reads) in its storage
    folder: two workers sharing it would replay each other's kickoffs."""
    gw0, gw0_existed = _storage_of_a_session(tmp_path, "gw0")
    gw1, gw1_existed = _storage_of_a_session(tmp_path, "gw1")
    assert gw0 != gw1
    assert gw0_existed and gw1_existed
    assert Path(gw0).parent == Path(gw1).parent == tmp_path
    assert not Path(gw0).exists() and not Path(gw1).exists(), "removed when the session ends"
