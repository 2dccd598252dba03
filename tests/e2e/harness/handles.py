"""What the pytest fixtures hand to tests: the cluster, the pod runner, the operator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import controlplane, kubeconfig, procs
from .controlplane import ClusterInfo
from .operator_launch import OperatorLaunch


@dataclass
class Cluster:
    info: ClusterInfo

    @property
    def kubeconfig(self) -> Path:
        return Path(self.info.kubeconfig)

    @property
    def kube_bin(self) -> Path:
        return Path(self.info.kube_bin)

    @property
    def api_url(self) -> str:
        return self.info.server

    @property
    def state_dir(self) -> Path:
        return Path(self.info.state_dir)

    def env(self) -> dict[str, str]:
        """Environment for tools run against this cluster (kubectl and helm on PATH)."""
        return dict(
            os.environ,
            KUBECONFIG=str(self.kubeconfig),
            PATH=f"{self.kube_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        )

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        as_sa: str | None = None,
        check: bool = False,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl; `as_sa="namespace:name"` (or "namespace/name") impersonates that
        ServiceAccount, so RBAC is evaluated for it (the admin may impersonate anybody)."""
        argv = [str(self.kube_bin / "kubectl"), f"--kubeconfig={self.kubeconfig}"]
        if as_sa is not None:
            ns, _, name = as_sa.replace("/", ":").partition(":")
            argv.append(f"--as=system:serviceaccount:{ns}:{name}")
        result = subprocess.run(
            [*argv, *args], input=input, capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def helm(
        self, *args: str, check: bool = False, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run the built helm against this cluster (its caches stay in the state folder)."""
        home = self.state_dir / "helm"
        env = dict(
            self.env(),
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_CONFIG_HOME=str(home / "config"),
            HELM_DATA_HOME=str(home / "data"),
        )
        result = subprocess.run(
            [str(self.kube_bin / "helm"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def get_json(self, *args: str, as_sa: str | None = None) -> Any:
        """`kubectl get ... -o json`, decoded; None when not found."""
        result = self.kubectl("get", *args, "-o", "json", as_sa=as_sa)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(f"kubectl get {' '.join(args)}: {result.stderr.strip()}")
        return json.loads(result.stdout)

    def apply(self, manifest: dict[str, Any] | str, *, as_sa: str | None = None) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", "-f", "-", input=text, as_sa=as_sa, check=True)

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path) -> Path:
        """A kubeconfig holding a real token of the ServiceAccount (TokenRequest API)."""
        token = self.kubectl(
            "create", "token", name, "-n", namespace, "--duration=24h", check=True
        ).stdout.strip()
        p = self.state_dir / "pki"
        return kubeconfig.write_token(
            path,
            server=self.api_url,
            ca_cert=p / "ca.crt",
            token=token,
            user_name=f"{namespace}-{name}",
        )


def wait_until(
    condition: Callable[[], Any],
    *,
    timeout: float = 60,
    what: str = "condition",
    interval: float = 0.2,
) -> Any:
    """Poll until `condition()` returns something truthy, and return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class PodRunner:
    """Access to the pod runner's containers: pids, logs, host folders of claims."""

    cluster: Cluster

    @property
    def state_dir(self) -> Path:
        return self.cluster.state_dir / "podrunner"

    def pod_dir(self, namespace: str, pod: str) -> Path:
        obj = self.cluster.get_json("pod", pod, "-n", namespace)
        if obj is None:
            raise AssertionError(f"pod {namespace}/{pod} does not exist")
        return self.state_dir / "pods" / f"{namespace}_{pod}_{obj['metadata']['uid']}"

    def pid(self, namespace: str, pod: str, container: str | None = None) -> int | None:
        """The pid of the container's running process, or None if it is not running."""
        obj = self.cluster.get_json("pod", pod, "-n", namespace)
        if obj is None:
            return None
        name = container or obj["spec"]["containers"][0]["name"]
        path = self.state_dir / "pods" / f"{namespace}_{pod}_{obj['metadata']['uid']}"
        rec = procs.read_pidfile(path / f"{name}.pid")
        return rec.pid if rec is not None and procs.alive(rec) else None

    def kill(
        self, namespace: str, pod: str, container: str | None = None, sig: int = signal.SIGKILL
    ) -> int:
        """Send `sig` (default SIGKILL) to the container's process; returns its pid."""
        pid = self.pid(namespace, pod, container)
        if pid is None:
            raise AssertionError(f"no running container process in {namespace}/{pod}")
        os.kill(pid, sig)
        return pid

    def logs(
        self, namespace: str, pod: str, container: str | None = None, previous: bool = False
    ) -> str:
        """Container output (kubectl logs does not work: there is no kubelet API)."""
        obj = self.cluster.get_json("pod", pod, "-n", namespace)
        if obj is None:
            raise AssertionError(f"pod {namespace}/{pod} does not exist")
        name = container or obj["spec"]["containers"][0]["name"]
        statuses = (obj.get("status") or {}).get("containerStatuses") or []
        count = next((s["restartCount"] for s in statuses if s["name"] == name), 0)
        if previous:
            count -= 1
        path = self.pod_dir(namespace, pod) / "logs" / f"{name}.{count}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """The host folder that backs a bound PVC."""
        pvc = self.cluster.get_json("pvc", claim, "-n", namespace)
        if pvc is None or not pvc["spec"].get("volumeName"):
            raise AssertionError(f"claim {namespace}/{claim} is not bound")
        pv = self.cluster.get_json("pv", pvc["spec"]["volumeName"])
        return Path(pv["spec"]["hostPath"]["path"])


@dataclass
class Operator:
    """A running `crewfence-operator` process."""

    cluster: Cluster
    launch: OperatorLaunch
    service_account: str | None = None
    # Started with non-default launch fields (e.g. webhook_mode="off"): never the shared one.
    customised: bool = False

    @property
    def log_path(self) -> Path:
        return self.cluster.state_dir / "logs" / "operator.log"

    @property
    def metrics_url(self) -> str:
        return self.launch.metrics_url

    @property
    def record(self) -> procs.ProcRecord | None:
        return procs.read_pidfile(self.cluster.state_dir / "pids" / "operator.pid")

    def alive(self) -> bool:
        rec = self.record
        return rec is not None and procs.alive(rec)

    def start(self) -> None:
        controlplane.start_operator(self.cluster.info, self.launch)

    def stop(self) -> None:
        controlplane.stop_operator(self.cluster.info)

    def kill(self) -> None:
        """SIGKILL the operator (no cleanup), e.g. to test re-attachment after a crash."""
        rec = self.record
        if rec is not None:
            procs.signal_group(rec, signal.SIGKILL)
            procs.wait_dead(rec, 10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
