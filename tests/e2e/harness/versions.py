"""Pinned versions of the control-plane binaries and where they are cached."""

from __future__ import annotations

from pathlib import Path

from . import gobuild

KUBERNETES_VERSION = "v1.36.3"
# Published staging modules (k8s.io/api, ...) carry the same release as v0.Y.Z.
STAGING_VERSION = "v0.36.3"
# The etcd release that k8s.io/kubernetes v1.36.3 itself requires (see its go.mod).
ETCD_VERSION = "v3.6.8"
HELM_VERSION = "v3.22.0"
# Helm's release build derives its default Kubernetes version from the client-go it requires
# (v0.37.0 for helm v3.22.0 -> 1.37); tests/e2e/test_helm_build.py checks it against go.mod.
HELM_KUBE_MAJOR = "1"
HELM_KUBE_MINOR = "37"
# Bumped when the way a binary is built changes, so a cache built the old way is not reused.
BUILD_REVISION = 2

KUBEBUILD_DIR = Path(__file__).resolve().parent.parent / "kubebuild"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kubectl", "helm")
OPTIONAL_BINARIES = ("kube-controller-manager",)


def cache_dir() -> Path:
    key = f"{KUBERNETES_VERSION}-{ETCD_VERSION}-{HELM_VERSION}-b{BUILD_REVISION}"
    return gobuild.cache_root() / "kube" / key


def bin_dir() -> Path:
    return cache_dir() / "bin"


def stamp_file() -> Path:
    return cache_dir() / "complete.stamp"
