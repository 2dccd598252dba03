"""Background processes with pidfiles, so that `down` can stop exactly what `up` started.

A pidfile records the pid and the process start time (from /proc), so a recycled pid is
never signalled. Every process runs in its own session; stopping signals the whole group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcRecord:
    name: str
    pid: int
    start_ticks: int


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a live pid, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def record_for(name: str, pid: int) -> ProcRecord:
    stat = _stat(pid)
    return ProcRecord(name=name, pid=pid, start_ticks=stat[1] if stat else -1)


def alive(rec: ProcRecord) -> bool:
    stat = _stat(rec.pid)
    return stat is not None and stat[1] == rec.start_ticks and stat[0] not in ("Z", "X")


def write_pidfile(path: Path, rec: ProcRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(rec)))
    os.replace(tmp, path)


def read_pidfile(path: Path) -> ProcRecord | None:
    try:
        return ProcRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def spawn(
    name: str,
    argv: list[str],
    *,
    log: Path,
    pidfile: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    write_pidfile(pidfile, record_for(name, proc.pid))
    return proc


def signal_group(rec: ProcRecord, sig: int) -> None:
    if not alive(rec):
        return
    try:
        os.killpg(rec.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(rec.pid, sig)


def wait_dead(rec: ProcRecord, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(rec):
            return True
        try:  # reap it if it is our child; harmless otherwise
            os.waitpid(rec.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return not alive(rec)


def stop(rec: ProcRecord, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `grace` seconds."""
    signal_group(rec, signal.SIGTERM)
    if not wait_dead(rec, grace):
        signal_group(rec, signal.SIGKILL)
        wait_dead(rec, 5.0)
    # Members of the group that outlived its leader.
    try:
        os.killpg(rec.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
