"""kstatus's verdict on objects, from the real library: build (or find cached) and run
``tests/e2e/kstatusbuild`` (a tiny main over ``sigs.k8s.io/cli-utils/pkg/kstatus/status``,
pinned in its go.mod), which reads a JSON array of objects on stdin and prints one verdict a
line. Cached per version in its own entry, like the other binaries."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CLI_UTILS_MODULE = "sigs.k8s.io/cli-utils"
CLI_UTILS_VERSION = "v0.37.2"
BUILD_REVISION = 1
BUILD_DIR = Path(__file__).resolve().parent.parent / "kstatusbuild"
BINARY = "kstatus-verdict"


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "crewfence" / "kstatus" / f"{CLI_UTILS_VERSION}-b{BUILD_REVISION}"


def binary() -> Path:
    return cache_dir() / "bin" / BINARY


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ensure_built(progress: bool = True) -> Path:
    """The kstatus-verdict binary, built first when missing (one builder at a time)."""
    if binary().is_file():
        return binary()
    if f"{CLI_UTILS_MODULE} {CLI_UTILS_VERSION}" not in (BUILD_DIR / "go.mod").read_text():
        raise BuildError(f"kstatusbuild/go.mod does not pin {CLI_UTILS_MODULE} "
                         f"{CLI_UTILS_VERSION}; keep harness/kstatus.py in step")
    if shutil.which("go") is None:
        raise BuildError("`go` is not on PATH; it is needed once to build kstatus-verdict")
    (cache_dir() / "bin").mkdir(parents=True, exist_ok=True)
    with (cache_dir() / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary().is_file():
            return binary()
        tmp = binary().with_name(f".{BINARY}.tmp")
        cmd = ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), "."]
        env = dict(os.environ, GOFLAGS="-mod=readonly -buildvcs=false")
        if progress:
            print(f"building kstatus-verdict ({CLI_UTILS_VERSION}) ...", file=sys.stderr,
                  flush=True)
        started, cpu_started = time.monotonic(), _cpu()
        log = cache_dir() / "build.log"
        with log.open("w") as log_file:
            result = subprocess.run(cmd, cwd=BUILD_DIR, env=env, stdout=log_file,
                                    stderr=log_file)
        if result.returncode != 0:
            raise BuildError(f"building kstatus-verdict failed (log: {log})")
        os.replace(tmp, binary())
        (cache_dir() / "complete.stamp").write_text(json.dumps({
            "cli-utils": CLI_UTILS_VERSION, "cpus": os.cpu_count(),
            "build": {"wall_seconds": round(time.monotonic() - started, 1),
                      "cpu_seconds": round(_cpu() - cpu_started, 1)}}, indent=2) + "\n")
    return binary()


def verdicts(objects: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """kstatus's ``status.Compute`` on each object: ``{"status", "message"[, "error"]}``."""
    result = subprocess.run([str(ensure_built())], input=json.dumps(list(objects)),
                            capture_output=True, text=True, timeout=60, check=True)
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
