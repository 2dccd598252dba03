"""Running ``kubectl crewfence`` the way a user does: kubectl finds ``kubectl-crewfence`` on
the PATH (shared by the resolution e2e tests and the demo)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from harness.handles import Cluster

ENTRY_MODULE = "crewfence_operator.kubectl"
"""The plugin's package: ``-m`` runs it, the console script imports ``main`` from it."""


def plugin_dir(tmp: Path) -> Path:
    """A PATH folder holding ``kubectl-crewfence``: the installed console script when the venv
    has it for this code's entry point, else a shim running the same package (the entry point
    is the same function). A script installed for an older entry point is not used."""
    installed = Path(sys.executable).with_name("kubectl-crewfence")
    folder = tmp / "plugin-bin"
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "kubectl-crewfence"
    if shim.exists() or shim.is_symlink():
        shim.unlink()
    if installed.exists() and f"from {ENTRY_MODULE}." in installed.read_text(errors="replace"):
        shim.symlink_to(installed)
    else:
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m {ENTRY_MODULE} "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def kubectl_plugin(cluster: Cluster, folder: Path, *args: str,
                   kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``kubectl crewfence ...`` through kubectl's own plugin lookup on the PATH, as the
    cluster's admin or as the user of ``kubeconfig`` (e.g. a ServiceAccount's token)."""
    env = dict(os.environ, KUBECONFIG=str(kubeconfig or cluster.kubeconfig),
               PATH=f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([str(cluster.kube_bin / "kubectl"), "crewfence", *args],
                          capture_output=True, text=True, timeout=120, env=env)
