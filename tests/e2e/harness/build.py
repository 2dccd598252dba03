"""Build (or find cached) etcd, kube-apiserver, kubectl, helm and kube-controller-manager.

k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces the staging modules with
local paths), so tests/e2e/kubebuild is a module of ours that requires it and pins every
staging module to its published release; etcd is built from the same module with a tiny
main. Helm installs directly. Binaries go to a per-user cache keyed by the versions; a stamp
written after a complete build makes a warm lookup instant.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from . import gobuild, versions
from .gobuild import BuildError

__all__ = ["TARGETS", "TOOLS", "BuildError", "cached_bin_dir", "ensure_binaries", "ensure_tool"]


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


def cached_bin_dir() -> Path | None:
    """The binary folder if a complete build is cached, else None (never builds)."""
    if versions.stamp_file().is_file():
        return versions.bin_dir()
    return None


def _check_pins() -> None:
    for needle in (
        f"k8s.io/kubernetes {versions.KUBERNETES_VERSION}",
        f"go.etcd.io/etcd/server/v3 {versions.ETCD_VERSION}",
        f"k8s.io/api => k8s.io/api {versions.STAGING_VERSION}",
    ):
        gobuild.check_pin(versions.KUBEBUILD_DIR / "go.mod", needle, "versions.py")


def _build_one(target: Target, out: Path, log: Path) -> gobuild.Timing:
    with gobuild.timed() as timing:
        if "@" in target.package:
            gobuild.go_install(target.package, binary=out / target.name, log=log,
                               ldflags=target.ldflags)
        else:
            gobuild.go_build(target.package, module_dir=versions.KUBEBUILD_DIR,
                             binary=out / target.name, log=log, ldflags=target.ldflags)
    return timing[0]


def ensure_binaries(progress: bool = True) -> Path:
    """Return the folder with all binaries, building the missing ones first.

    Concurrent callers (parallel test sessions) wait on a lock instead of building twice."""
    cached = cached_bin_dir()
    if cached is not None:
        return cached
    with gobuild.build_lock(versions.cache_dir() / ".build.lock", "the control plane",
                            progress=progress):
        return cached_bin_dir() or _build_all(progress)


def _build_all(progress: bool) -> Path:
    gobuild.require_go("the control plane")
    _check_pins()
    out = versions.bin_dir()
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, dict[str, float]] = {}
    for target in TARGETS:
        if (out / target.name).is_file():
            continue  # binaries are renamed into place only after a successful build
        if progress:
            print(f"building {target.name} ...", file=sys.stderr, flush=True)
        timing = _build_one(target, out, versions.cache_dir() / f"build-{target.name}.log")
        timings[target.name] = timing.as_stamp()
        if progress:
            print(f"built {target.name} in {timing.wall:.0f}s (cpu {timing.cpu:.0f}s)",
                  file=sys.stderr, flush=True)
    gobuild.write_stamp(versions.stamp_file(), {
        "kubernetes": versions.KUBERNETES_VERSION,
        "etcd": versions.ETCD_VERSION,
        "helm": versions.HELM_VERSION,
        "build": timings,
    })
    return out


def ensure_tool(name: str) -> Path:
    """The path of a TOOLS binary, built into the cache first if missing (one builder at a
    time; the control-plane binaries' stamp is not touched)."""
    target = next(t for t in TOOLS if t.name == name)
    out = versions.bin_dir()
    if (out / name).is_file():
        return out / name
    gobuild.require_go(name)
    out.mkdir(parents=True, exist_ok=True)
    with gobuild.build_lock(versions.cache_dir() / f".build-{name}.lock", name):
        if not (out / name).is_file():
            _build_one(target, out, versions.cache_dir() / f"build-{name}.log")
    return out / name
