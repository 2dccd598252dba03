"""A real cert-manager for the e2e control plane: build (or find cached), install, run.

cert-manager's own ``cmd/controller`` module is not served by the Go module proxy, so
``tests/e2e/certmanagerbuild`` is a small main of ours that runs cert-manager's controllers
from the pinned ``github.com/cert-manager/cert-manager`` module (``pkg/controller``: the
Certificate lifecycle, the CertificateRequest approver, the CA and SelfSigned signers and the
Issuer controller) against a kubeconfig. Its CRDs come from the same module
(``deploy/crds``). Built lazily, only by the tests that need it, and cached per version in
its own entry next to the control plane's (never touching that one).
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import procs

CERT_MANAGER_MODULE = "github.com/cert-manager/cert-manager"
CERT_MANAGER_VERSION = "v1.21.2"
BUILD_REVISION = 1
BUILD_DIR = Path(__file__).resolve().parent.parent / "certmanagerbuild"
BINARY = "cert-manager-controller"
NAME = "cert-manager"


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "crewfence" / "cert-manager" / f"{CERT_MANAGER_VERSION}-b{BUILD_REVISION}"


def stamp_file() -> Path:
    return cache_dir() / "complete.stamp"


def crd_files(root: Path | None = None) -> list[Path]:
    return sorted(((root or cache_dir()) / "crds").glob("*.yaml"))


def cached() -> Path | None:
    """The cache folder if a complete build is there, else None (never builds)."""
    return cache_dir() if stamp_file().is_file() else None


def _check_pin() -> None:
    gomod = (BUILD_DIR / "go.mod").read_text()
    if f"{CERT_MANAGER_MODULE} {CERT_MANAGER_VERSION}" not in gomod:
        raise BuildError(f"certmanagerbuild/go.mod does not pin {CERT_MANAGER_MODULE} "
                         f"{CERT_MANAGER_VERSION}; keep harness/certmanager.py in step")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ensure_built(progress: bool = True) -> Path:
    """The cache folder with ``bin/cert-manager-controller`` and ``crds/``, built first when
    missing. Concurrent callers wait on a lock instead of building twice."""
    found = cached()
    if found is not None:
        return found
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / ".build.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print("another process is building cert-manager; waiting ...",
                      file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        found = cached()
        if found is not None:
            return found
        return _build(progress)


def _build(progress: bool) -> Path:
    if shutil.which("go") is None:
        raise BuildError("`go` is not on PATH; it is needed once to build cert-manager")
    _check_pin()
    out = cache_dir()
    (out / "bin").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOFLAGS="-mod=readonly -buildvcs=false")
    log = out / "build.log"
    tmp = out / "bin" / f".{BINARY}.tmp"
    cmd = ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), "."]
    if progress:
        print(f"building cert-manager {CERT_MANAGER_VERSION} ...", file=sys.stderr, flush=True)
    started, cpu_started, load = time.monotonic(), _cpu(), os.getloadavg()[0]
    with log.open("w") as log_file:
        result = subprocess.run(cmd, cwd=BUILD_DIR, env=env, stdout=log_file, stderr=log_file)
    if result.returncode != 0:
        raise BuildError(f"building cert-manager failed: {' '.join(cmd)} in {BUILD_DIR} "
                         f"(log: {log})")
    os.replace(tmp, out / "bin" / BINARY)
    wall, cpu = time.monotonic() - started, _cpu() - cpu_started
    module_dir = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", CERT_MANAGER_MODULE], cwd=BUILD_DIR, env=env,
        capture_output=True, text=True, check=True).stdout.strip()
    crds = out / "crds"
    crds.mkdir(exist_ok=True)
    for source in sorted((Path(module_dir) / "deploy" / "crds").glob("*.yaml")):
        shutil.copyfile(source, crds / source.name)
    if not crd_files(out):
        raise BuildError(f"no CRDs under {module_dir}/deploy/crds")
    stamp = {"cert-manager": CERT_MANAGER_VERSION, "cpus": os.cpu_count(),
             "build": {"wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
                       "load_at_start": round(load, 1)}}
    stamp_file().write_text(json.dumps(stamp, indent=2) + "\n")
    if progress:
        print(f"built cert-manager in {wall:.0f}s (cpu {cpu:.0f}s)", file=sys.stderr, flush=True)
    return out


@dataclass(frozen=True)
class CertManager:
    """A running cert-manager controller of one e2e cluster (its state folder)."""

    state_dir: Path

    @property
    def pidfile(self) -> Path:
        return self.state_dir / "pids" / f"{NAME}.pid"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "logs" / f"{NAME}.log"

    def alive(self) -> bool:
        rec = procs.read_pidfile(self.pidfile)
        return rec is not None and procs.alive(rec)

    def start(self, root: Path, kubeconfig: Path) -> None:
        if self.alive():
            return
        procs.spawn(NAME, [str(root / "bin" / BINARY), f"--kubeconfig={kubeconfig}",
                     "--enable-certificate-owner-ref=true", "-v=2"],
                    log=self.log_path, pidfile=self.pidfile, cwd=self.state_dir)

    def stop(self) -> None:
        rec = procs.read_pidfile(self.pidfile)
        if rec is not None:
            procs.stop(rec, grace=10)

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
