"""Build (or find cached) etcd, kube-apiserver, kubectl, helm and kube-controller-manager.

k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces the staging modules with
local paths), so tests/e2e/kubebuild is a module of ours that requires it and pins every
staging module to its published release; etcd is built from the same module with a tiny
main. Helm installs directly. Binaries go to a per-user cache keyed by the versions; a stamp
written after a complete build makes a warm lookup instant.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import versions


@dataclass(frozen=True)
class Target:
    name: str
    package: str  # a package of the kubebuild module, or an `@version` path for go install
    ldflags: str = ""


_KUBE_X = " ".join(
    f"-X k8s.io/component-base/version.{k}={v}"
    for k, v in (
        ("gitVersion", versions.KUBERNETES_VERSION),
        ("gitMajor", versions.KUBERNETES_VERSION.lstrip("v").split(".")[0]),
        ("gitMinor", versions.KUBERNETES_VERSION.split(".")[1]),
        ("gitTreeState", "clean"),
    )
)

TARGETS = (
    Target("etcd", "./etcd"),
    Target("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", _KUBE_X),
    Target("kubectl", "k8s.io/kubernetes/cmd/kubectl", _KUBE_X),
    Target(
        "helm",
        f"helm.sh/helm/v3/cmd/helm@{versions.HELM_VERSION}",
        " ".join(
            f"-X helm.sh/helm/v3/{var}={value}"
            for var, value in (
                ("internal/version.version", versions.HELM_VERSION),
                ("internal/version.metadata", ""),
                ("internal/version.gitTreeState", "clean"),
                # As helm's own release build (its Makefile) does: without these, helm assumes
                # Kubernetes v1.20 when no cluster is asked and refuses a chart's kubeVersion.
                ("pkg/lint/rules.k8sVersionMajor", versions.HELM_KUBE_MAJOR),
                ("pkg/lint/rules.k8sVersionMinor", versions.HELM_KUBE_MINOR),
                ("pkg/chartutil.k8sVersionMajor", versions.HELM_KUBE_MAJOR),
                ("pkg/chartutil.k8sVersionMinor", versions.HELM_KUBE_MINOR),
            )
        ),
    ),
    Target("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager", _KUBE_X),
)


# Built on demand by the tests that need them, into the same cache, outside the stamp: a
# cache built before a tool existed stays valid and only gains the tool.
TOOLS = (
    # The kubelet's volume code (AtomicWriter, fsGroup ownership pass) as a command.
    Target("kubelet-volume", "./kubeletvolume"),
)


class BuildError(RuntimeError):
    pass


def cached_bin_dir() -> Path | None:
    """The binary folder if a complete build is cached, else None (never builds)."""
    if versions.stamp_file().is_file():
        return versions.bin_dir()
    return None


def _check_pins() -> None:
    gomod = (versions.KUBEBUILD_DIR / "go.mod").read_text()
    for needle in (
        f"k8s.io/kubernetes {versions.KUBERNETES_VERSION}",
        f"go.etcd.io/etcd/server/v3 {versions.ETCD_VERSION}",
        f"k8s.io/api => k8s.io/api {versions.STAGING_VERSION}",
    ):
        if needle not in gomod:
            raise BuildError(f"kubebuild/go.mod does not pin {needle!r}; keep versions.py in step")


@dataclass(frozen=True)
class Timing:
    wall: float
    cpu: float  # user+system seconds of go and its compilers: comparable across machine load


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _build_one(target: Target, out: Path, log: Path) -> Timing:
    flags = f"-s -w {target.ldflags}".strip()
    env = dict(os.environ, GOFLAGS="-mod=readonly -buildvcs=false")
    started, cpu_started = time.monotonic(), _children_cpu()
    with log.open("w") as log_file:
        if "@" in target.package:
            with tempfile.TemporaryDirectory(dir=out) as gobin:
                env["GOBIN"] = gobin
                env["GOFLAGS"] = "-buildvcs=false"  # -mod is not allowed outside a module
                # go install pkg@version ignores the current module; run it outside ours.
                cmd = ["go", "install", "-trimpath", f"-ldflags={flags}", target.package]
                result = subprocess.run(cmd, cwd=gobin, env=env, stdout=log_file, stderr=log_file)
                if result.returncode == 0:
                    os.replace(Path(gobin) / target.name, out / target.name)
        else:
            tmp = out / f".{target.name}.tmp"
            cmd = ["go", "build", "-trimpath", f"-ldflags={flags}", "-o", str(tmp), target.package]
            result = subprocess.run(
                cmd, cwd=versions.KUBEBUILD_DIR, env=env, stdout=log_file, stderr=log_file
            )
            if result.returncode == 0:
                os.replace(tmp, out / target.name)
    if result.returncode != 0:
        raise BuildError(f"building {target.name} failed: {' '.join(cmd)} (log: {log})")
    return Timing(time.monotonic() - started, _children_cpu() - cpu_started)


def ensure_binaries(progress: bool = True) -> Path:
    """Return the folder with all binaries, building the missing ones first.

    Concurrent callers (parallel test sessions) wait on a lock instead of building twice."""
    cached = cached_bin_dir()
    if cached is not None:
        return cached
    versions.cache_dir().mkdir(parents=True, exist_ok=True)
    with (versions.cache_dir() / ".build.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print("another process is building; waiting ...", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        cached = cached_bin_dir()
        if cached is not None:
            return cached
        return _build_all(progress)


def _build_all(progress: bool) -> Path:
    if shutil.which("go") is None:
        raise BuildError("`go` is not on PATH; it is needed once to build the control plane")
    _check_pins()
    out = versions.bin_dir()
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, dict[str, float]] = {}
    for target in TARGETS:
        if (out / target.name).is_file():
            continue  # binaries are renamed into place only after a successful build
        if progress:
            print(f"building {target.name} ...", file=sys.stderr, flush=True)
        load = os.getloadavg()[0]
        timing = _build_one(target, out, versions.cache_dir() / f"build-{target.name}.log")
        timings[target.name] = {
            "wall_seconds": round(timing.wall, 1),
            "cpu_seconds": round(timing.cpu, 1),
            "load_at_start": round(load, 1),
        }
        if progress:
            print(
                f"built {target.name} in {timing.wall:.0f}s (cpu {timing.cpu:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
    stamp = {
        "kubernetes": versions.KUBERNETES_VERSION,
        "etcd": versions.ETCD_VERSION,
        "helm": versions.HELM_VERSION,
        "build": timings,
        "cpus": os.cpu_count(),
    }
    versions.stamp_file().write_text(json.dumps(stamp, indent=2) + "\n")
    return out


def ensure_tool(name: str) -> Path:
    """The path of a TOOLS binary, built into the cache first if missing (one builder at a
    time; the control-plane binaries' stamp is not touched)."""
    target = next(t for t in TOOLS if t.name == name)
    out = versions.bin_dir()
    if (out / name).is_file():
        return out / name
    if shutil.which("go") is None:
        raise BuildError(f"`go` is not on PATH; it is needed once to build {name}")
    out.mkdir(parents=True, exist_ok=True)
    with (versions.cache_dir() / f".build-{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / name).is_file():
            _build_one(target, out, versions.cache_dir() / f"build-{name}.log")
    return out / name
