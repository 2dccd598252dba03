"""A journal that cannot persist answers 507, schedules nothing and keeps no record.

1. A really full filesystem: a small tmpfs mounted for the test (needs root / CAP_SYS_ADMIN;
   skipped with the reason otherwise).
2. Always: fault injection at the OS-call boundary — the real sidecar process runs with
   RLIMIT_FSIZE just above its journal's size, so the kernel fails its writes with EFBIG
   (Python ignores SIGXFSZ). Named as fault injection; nothing in the sidecar is mocked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from crewfence_sidecar.contract import job_path
from sidecar_helpers import AUTH, SidecarProcess, headers, llm_calls, sidecar_env, start_body
from sidecar_helpers import write_crews as write_crews_file


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                           str(where)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}); the RLIMIT_FSIZE "
                    "fault-injection test covers persistence failure")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory: Path) -> Path:
    """Write a filler file until the filesystem refuses (ENOSPC)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    block = b"\0" * 4096
    try:
        while True:
            os.write(fd, block)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


async def test_really_full_filesystem_gives_507(make_client: Any, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "fs", "4m") as fs:
        state = fs / "state"
        state.mkdir(mode=0o700)
        c = await make_client(CREWFENCE_STATE_FILE=str(state / "journal.db"))
        ok = await c.post("/jobs", json=start_body("before-full"), headers=headers("a"))
        assert ok.status == 200
        filler = fill(fs)
        calls = llm_calls()
        statuses = []
        for i in range(5):
            r = await c.post("/jobs", json=start_body(f"full-{i}", topic="x" * 20000),
                             headers=headers(f"k{i}", async_=True))
            statuses.append(r.status)
            if r.status == 507:
                body = await r.json()
                assert body["error"]["code"] == "journal_unavailable"
                assert (await c.get(job_path(f"full-{i}"), headers=AUTH)).status == 404
        assert 507 in statuses, statuses
        assert llm_calls() == calls  # nothing scheduled
        # space again: the same sidecar admits again, and the earlier record is intact
        filler.unlink()
        r = await c.post("/jobs", json=start_body("after-space"), headers=headers("b"))
        assert r.status == 200 and (await r.json())["raw"]  # blocking 200: completed output
        assert (await c.get(job_path("before-full"), headers=AUTH)).status == 200
        await c.sidecar.runtime.close()
        c.sidecar.opened.close()


def _limit_file_size(limit: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


async def test_file_size_limit_fault_injection_gives_507(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    journal = state / "journal.db"
    crews = write_crews_file(tmp_path)
    env = sidecar_env(journal, crews, CREWAI_STORAGE_DIR=str(tmp_path / "crewai"))
    # first start creates the journal; measure it, then restart with a limit just above it
    first = SidecarProcess([], env, tmp_path / "first.log").start().wait_listening()
    assert first.terminate() == 0
    limit = max(os.path.getsize(journal), 64 * 1024) + 8 * 1024
    proc = SidecarProcess([], env, tmp_path / "limited.log")
    proc.proc = subprocess.Popen([proc_bin(), *proc.args], env=env, stdout=subprocess.DEVNULL,
                                 stderr=proc.log_path.open("wb"),
                                 preexec_fn=_limit_file_size(limit))
    proc.wait_listening()
    try:
        async with aiohttp.ClientSession() as s:
            statuses = []
            for i in range(40):
                async with s.post(f"{proc.url}/jobs",
                                  json=start_body(f"lim-{i}", topic="y" * 4000),
                                  headers=headers(f"k{i}", async_=True)) as r:
                    statuses.append(r.status)
                    if r.status == 507:
                        async with s.get(f"{proc.url}{job_path(f'lim-{i}')}",
                                         headers=AUTH) as g:
                            assert g.status == 404
                        break
            assert statuses[-1] == 507, statuses
            async with s.get(f"{proc.url}/metrics") as m:
                text = await m.text()
            assert 'crewfence_sidecar_rejections_total{code="persist_failed"} 1.0' in text
    finally:
        proc.kill()


def proc_bin() -> str:
    from sidecar_helpers import SIDECAR_BIN

    return SIDECAR_BIN
