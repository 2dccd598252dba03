"""kstatus's verdict on objects, from the real library: build (or find cached) and run
``tests/e2e/kstatusbuild`` (a tiny main over ``sigs.k8s.io/cli-utils/pkg/kstatus/status``,
pinned in its go.mod), which reads a JSON array of objects on stdin and prints one verdict a
line. Cached per version in its own entry, like the other binaries."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import gobuild
from .gobuild import BuildError

CLI_UTILS_MODULE = "sigs.k8s.io/cli-utils"
CLI_UTILS_VERSION = "v0.37.2"
BUILD_REVISION = 1
BUILD_DIR = Path(__file__).resolve().parent.parent / "kstatusbuild"
BINARY = "kstatus-verdict"

__all__ = ["BuildError", "binary", "cache_dir", "ensure_built", "verdicts"]


def cache_dir() -> Path:
    return gobuild.cache_root() / "kstatus" / f"{CLI_UTILS_VERSION}-b{BUILD_REVISION}"


def binary() -> Path:
    return cache_dir() / "bin" / BINARY


def ensure_built(progress: bool = True) -> Path:
    """The kstatus-verdict binary, built first when missing (one builder at a time)."""
    if binary().is_file():
        return binary()
    gobuild.check_pin(BUILD_DIR / "go.mod", f"{CLI_UTILS_MODULE} {CLI_UTILS_VERSION}",
                      "harness/kstatus.py")
    gobuild.require_go("kstatus-verdict")
    (cache_dir() / "bin").mkdir(parents=True, exist_ok=True)
    with gobuild.build_lock(cache_dir() / ".build.lock", "kstatus-verdict", progress=progress):
        if binary().is_file():
            return binary()
        if progress:
            print(f"building kstatus-verdict ({CLI_UTILS_VERSION}) ...", file=sys.stderr,
                  flush=True)
        with gobuild.timed() as timing:
            gobuild.go_build(".", module_dir=BUILD_DIR, binary=binary(),
                             log=cache_dir() / "build.log")
        gobuild.write_stamp(cache_dir() / "complete.stamp",
                            {"cli-utils": CLI_UTILS_VERSION, "build": timing[0].as_stamp()})
    return binary()


def verdicts(objects: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """kstatus's ``status.Compute`` on each object: ``{"status", "message"[, "error"]}``."""
    result = subprocess.run([str(ensure_built())], input=json.dumps(list(objects)),
                            capture_output=True, text=True, timeout=60, check=True)
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
