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

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from . import gobuild, procs
from .gobuild import BuildError

CERT_MANAGER_MODULE = "github.com/cert-manager/cert-manager"
CERT_MANAGER_VERSION = "v1.21.2"
BUILD_REVISION = 1
BUILD_DIR = Path(__file__).resolve().parent.parent / "certmanagerbuild"
BINARY = "cert-manager-controller"
NAME = "cert-manager"

__all__ = ["BuildError", "CertManager", "cached", "crd_files", "ensure_built"]


def cache_dir() -> Path:
    return gobuild.cache_root() / "cert-manager" / f"{CERT_MANAGER_VERSION}-b{BUILD_REVISION}"


def stamp_file() -> Path:
    return cache_dir() / "complete.stamp"


def crd_files(root: Path | None = None) -> list[Path]:
    return sorted(((root or cache_dir()) / "crds").glob("*.yaml"))


def cached() -> Path | None:
    """The cache folder if a complete build is there, else None (never builds)."""
    return cache_dir() if stamp_file().is_file() else None


def ensure_built(progress: bool = True) -> Path:
    """The cache folder with ``bin/cert-manager-controller`` and ``crds/``, built first when
    missing. Concurrent callers wait on a lock instead of building twice."""
    found = cached()
    if found is not None:
        return found
    with gobuild.build_lock(cache_dir() / ".build.lock", "cert-manager", progress=progress):
        return cached() or _build(progress)


def _build(progress: bool) -> Path:
    gobuild.require_go("cert-manager")
    gobuild.check_pin(BUILD_DIR / "go.mod", f"{CERT_MANAGER_MODULE} {CERT_MANAGER_VERSION}",
                      "harness/certmanager.py")
    out = cache_dir()
    (out / "bin").mkdir(parents=True, exist_ok=True)
    if progress:
        print(f"building cert-manager {CERT_MANAGER_VERSION} ...", file=sys.stderr, flush=True)
    with gobuild.timed() as timing:
        gobuild.go_build(".", module_dir=BUILD_DIR, binary=out / "bin" / BINARY,
                         log=out / "build.log")
    source = gobuild.module_dir(f"{CERT_MANAGER_MODULE}@{CERT_MANAGER_VERSION}") / "deploy" / "crds"
    crds = out / "crds"
    crds.mkdir(exist_ok=True)
    for path in sorted(source.glob("*.yaml")):
        shutil.copyfile(path, crds / path.name)
    if not crd_files(out):
        raise BuildError(f"no CRDs under {source}")
    gobuild.write_stamp(stamp_file(), {"cert-manager": CERT_MANAGER_VERSION,
                                       "build": timing[0].as_stamp()})
    if progress:
        print(f"built cert-manager in {timing[0].wall:.0f}s (cpu {timing[0].cpu:.0f}s)",
              file=sys.stderr, flush=True)
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
