"""Fixtures for the e2e tests: a real kube-apiserver + etcd, the pod runner, the operator.

- `cluster` (session): a `harness.handles.Cluster` with `kubeconfig`, `kube_bin`, `api_url`,
  `kubectl(*args, input=None, as_sa=None)`, `get_json`, `apply`, `env()`.
- `pod_runner` (session): `harness.handles.PodRunner` (`kill`, `pid`, `logs`, `claim_dir`).
- `operator_process`: a running `crewfence-operator` (admin credentials); `operator_factory`
  starts one with other settings, e.g. `service_account="crewfence-system:crewfence-operator"`
  to run it with that ServiceAccount's real token so RBAC is exercised.
- `namespace`: a fresh namespace per test, deleted afterwards.

Under pytest-xdist (`scripts/test.sh` runs `-n 2 --dist loadfile`) every worker is its own
session with its own control plane in `.e2e/pytest-<pid>-<worker>/`; nothing in a cluster is
shared with another one (random ports, a flock-claimed 127.0.x.0/24 per pod runner).

Binaries missing: the tests skip with the reason locally and FAIL when `CI` is set. Set
CREWFENCE_E2E_BUILD=1 to build them from a test run; CREWFENCE_E2E_STATE_DIR=<dir> reuses a
cluster started with `python tests/e2e/cluster.py up --state-dir <dir>` (left running).
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import build, controlplane, procs, sessions
from harness.handles import Cluster, Operator, PodRunner
from harness.operator_launch import OperatorLaunch

E2E_ROOT = Path(__file__).resolve().parent
KEEP_STATE_DIRS = 6  # three runs of two xdist workers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_ROOT in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e)


_build_error: list[str] = []


def _wants_build() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("CREWFENCE_E2E_BUILD"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build missing binaries before any test starts, so the (cold, ~15 min) build does not
    count against a test's timeout."""
    selected = any(E2E_ROOT in Path(str(item.path)).parents for item in session.items)
    if not selected or os.environ.get("CREWFENCE_E2E_STATE_DIR") or not _wants_build():
        return
    if build.cached_bin_dir() is None:
        try:
            build.ensure_binaries()
        except build.BuildError as exc:
            _build_error.append(str(exc))


def _binaries() -> Path:
    cached = build.cached_bin_dir()
    if cached is not None:
        return cached
    if _build_error:
        pytest.fail(f"control-plane binaries could not be built: {_build_error[0]}", pytrace=False)
    if _wants_build():
        try:
            return build.ensure_binaries()
        except build.BuildError as exc:
            pytest.fail(f"control-plane binaries could not be built: {exc}", pytrace=False)
    pytest.skip(
        "control-plane binaries are not built (run `python tests/e2e/cluster.py bin`, "
        "or set CREWFENCE_E2E_BUILD=1); in CI this is a failure"
    )


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    reuse = os.environ.get("CREWFENCE_E2E_STATE_DIR")
    if reuse:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            # Two workers would start and stop one operator under each other's feet.
            pytest.fail(
                "CREWFENCE_E2E_STATE_DIR names one cluster: run without xdist (-n 0)",
                pytrace=False,
            )
        info = controlplane.load(Path(reuse))
        if info is None or not controlplane.is_running(Path(reuse)):
            pytest.fail(f"CREWFENCE_E2E_STATE_DIR={reuse} names no running cluster", pytrace=False)
        yield Cluster(info)
        return
    kube_bin = _binaries()
    root = controlplane.REPO / ".e2e"
    root.mkdir(exist_ok=True)
    sessions.prune(root, KEEP_STATE_DIRS)
    state_dir = root / sessions.state_dir_name()
    info = controlplane.up(state_dir, kube_bin, pod_runner=True)
    print(f"\ne2e cluster: {info.env_lines} (state and logs in {state_dir})")
    try:
        yield Cluster(info)
    finally:
        controlplane.down(state_dir)
        left = controlplane.running_records(state_dir)
        assert not left, f"processes outlived `down`: {left}"


@pytest.fixture(scope="session")
def pod_runner(cluster: Cluster) -> PodRunner:
    rec = procs.read_pidfile(cluster.state_dir / "pids" / "pod-runner.pid")
    if rec is None or not procs.alive(rec):
        controlplane.start_pod_runner(cluster.info)
    return PodRunner(cluster)


@pytest.fixture(scope="session")
def _operators(cluster: Cluster, pod_runner: PodRunner) -> Iterator[list[Operator]]:
    started: list[Operator] = []
    yield started
    for op in started:
        op.stop()


@pytest.fixture
def operator_factory(cluster: Cluster, _operators: list[Operator]) -> Callable[..., Operator]:
    """start(service_account=None, **OperatorLaunch fields) -> Operator; one at a time."""

    def start(service_account: str | None = None, **launch_fields: Any) -> Operator:
        for op in _operators:
            op.stop()
        _operators.clear()
        controlplane.install_crds(cluster.info)
        kubeconfig = str(cluster.kubeconfig)
        if service_account is not None:
            ns, _, name = service_account.replace("/", ":").partition(":")
            path = cluster.state_dir / f"operator-{ns}-{name}.kubeconfig"
            kubeconfig = str(cluster.service_account_kubeconfig(ns, name, path))
        launch = OperatorLaunch.for_cluster(kubeconfig, cluster.state_dir, **launch_fields)
        op = Operator(cluster, launch, service_account, customised=bool(launch_fields))
        _operators.append(op)
        op.start()
        return op

    return start


@pytest.fixture
def operator_process(
    operator_factory: Callable[..., Operator], _operators: list[Operator]
) -> Operator:
    """The shared operator (admin credentials, default launch), restarted if an earlier test
    stopped it or left one with other settings (a file's `webhook_mode="off"` operator must
    not serve the next file, whatever order the files run in)."""
    current = _operators[0] if _operators else None
    if (current is not None and current.service_account is None and not current.customised
            and current.alive()):
        return current
    return operator_factory()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"e2e-{slug}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name, check=True)
    controlplane.ensure_default_service_account(cluster.info, name)
    yield name
    if not cluster.info.controller_manager:
        # Nobody runs the namespace controller: stop the pods ourselves.
        cluster.kubectl("delete", "pods", "--all", "-n", name, "--wait=false")
    cluster.kubectl("delete", "namespace", name, "--wait=false")
