"""How the harness builds and caches its Go programs (control plane, cert-manager, Kueue,
kstatus): one place for the cache root, the one-builder-at-a-time lock, `go build` and
`go install pkg@version` into a binary that appears only when complete, and the stamp that
makes a warm lookup instant and records what the cold build cost."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class BuildError(RuntimeError):
    pass


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/crewfence`` (or ``~/.cache/crewfence``): every entry lives under it."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "crewfence"


@dataclass(frozen=True)
class Timing:
    wall: float
    cpu: float  # user+system seconds of go and its compilers: comparable across machine load
    load_at_start: float

    def as_stamp(self) -> dict[str, float]:
        return {"wall_seconds": round(self.wall, 1), "cpu_seconds": round(self.cpu, 1),
                "load_at_start": round(self.load_at_start, 1)}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def timed() -> Iterator[list[Timing]]:
    """Measures the block; the one-element list holds its Timing afterwards."""
    result: list[Timing] = []
    started, cpu_started, load = time.monotonic(), _children_cpu(), os.getloadavg()[0]
    yield result
    result.append(Timing(time.monotonic() - started, _children_cpu() - cpu_started, load))


@contextlib.contextmanager
def build_lock(lock_file: Path, what: str, *, progress: bool = True) -> Iterator[None]:
    """Held while building: concurrent callers (parallel test sessions) wait instead of
    building twice; they must look for the finished build again once they hold it."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"another process is building {what}; waiting ...", file=sys.stderr,
                      flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def require_go(what: str) -> None:
    if shutil.which("go") is None:
        raise BuildError(f"`go` is not on PATH; it is needed once to build {what}")


def check_pin(go_mod: Path, needle: str, keep_in_step: str) -> None:
    """Refuses to build when ``go.mod`` no longer pins what the Python side says it does."""
    if needle not in go_mod.read_text():
        raise BuildError(f"{go_mod.parent.name}/go.mod does not pin {needle!r}; "
                         f"keep {keep_in_step} in step")


def _run_logged(cmd: list[str], *, cwd: Path, env: Mapping[str, str], log: Path) -> None:
    with log.open("w") as log_file:
        result = subprocess.run(cmd, cwd=cwd, env=dict(env), stdout=log_file, stderr=log_file)
    if result.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed in {cwd} (log: {log})")


def go_build(package: str, *, module_dir: Path, binary: Path, log: Path,
             ldflags: str = "") -> None:
    """``go build`` of a package of a module of ours; ``binary`` appears only when complete."""
    tmp = binary.with_name(f".{binary.name}.tmp")
    env = dict(os.environ, GOFLAGS="-mod=readonly -buildvcs=false")
    _run_logged(["go", "build", "-trimpath", f"-ldflags={f'-s -w {ldflags}'.strip()}",
                 "-o", str(tmp), package], cwd=module_dir, env=env, log=log)
    os.replace(tmp, binary)


def go_install(package_at_version: str, *, binary: Path, log: Path, ldflags: str = "") -> None:
    """``go install pkg@version`` (it ignores the current module, so it runs outside ours);
    ``binary`` appears only when complete."""
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=binary.parent) as gobin:
        # -mod is not allowed outside a module
        env = dict(os.environ, GOBIN=gobin, GOFLAGS="-buildvcs=false")
        _run_logged(["go", "install", "-trimpath", f"-ldflags={f'-s -w {ldflags}'.strip()}",
                     package_at_version], cwd=Path(gobin), env=env, log=log)
        built = Path(gobin) / package_at_version.split("@")[0].rsplit("/", 1)[-1]
        os.replace(built, binary)


def module_dir(module_at_version: str) -> Path:
    """Where the Go module cache holds a module (downloaded if it is not there yet)."""
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run(["go", "mod", "download", "-json", module_at_version], cwd=cwd,
                             env=dict(os.environ, GOFLAGS="-buildvcs=false"),
                             capture_output=True, text=True, check=True).stdout
    return Path(json.loads(out)["Dir"])


def write_stamp(stamp_file: Path, fields: Mapping[str, Any]) -> None:
    """The stamp that marks a cache entry complete (written last)."""
    stamp = dict(fields, cpus=os.cpu_count())
    stamp_file.write_text(json.dumps(stamp, indent=2) + "\n")
