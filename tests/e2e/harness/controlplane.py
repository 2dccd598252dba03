"""Start and stop the local control plane: etcd, kube-apiserver, optional
kube-controller-manager, the pod runner and (optionally) the operator.

Everything runs on 127.0.0.1 with random free ports; state, certificates, logs and pidfiles
live in one state folder; `cluster.json` in it describes a running cluster.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from . import kubeconfig, net, pki, procs
from .operator_launch import OperatorLaunch, operator_command, operator_env

REPO = Path(__file__).resolve().parents[3]
E2E_DIR = REPO / "tests" / "e2e"
DEFAULT_STATE_DIR = REPO / ".e2e" / "cluster"
NODE_NAME = "crewfence-e2e-node"
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
# No kubelet, no scheduler, no PV binder: only the controllers whose absence would make
# the API behave unlike a cluster (namespace deletion, GC of owned objects, default SAs,
# the protection finalizers that admission adds to PVCs/PVs).
KCM_CONTROLLERS = (
    "namespace-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
)
ADMISSION_PLUGINS = (
    "NamespaceLifecycle,LimitRanger,ServiceAccount,NodeRestriction,DefaultStorageClass,"
    "DefaultTolerationSeconds,StorageObjectInUseProtection,PersistentVolumeClaimResize,"
    "RuntimeClass,PodSecurity,Priority,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
    "ValidatingAdmissionPolicy,ResourceQuota"
)


@dataclass
class ClusterInfo:
    state_dir: str
    kubeconfig: str
    kube_bin: str
    server: str
    etcd_url: str
    node_name: str
    controller_manager: bool
    pod_runner: bool
    operator: bool
    operator_liveness: str | None = None
    operator_metrics: str | None = None
    webhook_port: int | None = None

    @property
    def env_lines(self) -> str:
        return f"KUBECONFIG={self.kubeconfig}\nKUBE_BIN={self.kube_bin}"


def _info_path(state_dir: Path) -> Path:
    return state_dir / "cluster.json"


def _pidfile(state_dir: Path, name: str) -> Path:
    return state_dir / "pids" / f"{name}.pid"


def load(state_dir: Path) -> ClusterInfo | None:
    try:
        return ClusterInfo(**json.loads(_info_path(state_dir).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def is_running(state_dir: Path) -> bool:
    rec = procs.read_pidfile(_pidfile(state_dir, "kube-apiserver"))
    return rec is not None and procs.alive(rec)


def _admin_ssl(p: pki.Pki) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(p.ca_cert))
    ctx.load_cert_chain(str(p.admin_cert), str(p.admin_key))
    return ctx


def _died(state_dir: Path, name: str) -> str | None:
    rec = procs.read_pidfile(_pidfile(state_dir, name))
    if rec is None or procs.alive(rec):
        return None
    return f"{name} exited; see {state_dir / 'logs' / (name + '.log')}"


def _start(state_dir: Path, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    procs.spawn(
        name,
        argv,
        log=state_dir / "logs" / f"{name}.log",
        pidfile=_pidfile(state_dir, name),
        env=env,
        cwd=state_dir,
    )


def _start_etcd(state_dir: Path, kube_bin: Path) -> str:
    client, peer = net.free_port(), net.free_port()
    url = f"http://127.0.0.1:{client}"
    _start(
        state_dir,
        "etcd",
        [
            str(kube_bin / "etcd"),
            "--name=e2e",
            f"--data-dir={state_dir / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",  # throwaway test data; fsync on a shared CI disk is the bottleneck
            "--log-level=warn",
        ],
    )
    net.wait_for(
        lambda: '"health":"true"' in (net.http_ok(f"{url}/health") or ""),
        timeout=60,
        what="etcd /health",
        abort=lambda: _died(state_dir, "etcd"),
    )
    return url


def _start_apiserver(state_dir: Path, kube_bin: Path, p: pki.Pki, etcd_url: str) -> str:
    port = net.free_port()
    _start(
        state_dir,
        "kube-apiserver",
        [
            str(kube_bin / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={state_dir / 'apiserver'}",
            f"--tls-cert-file={p.serving_cert}",
            f"--tls-private-key-file={p.serving_key}",
            f"--client-ca-file={p.ca_cert}",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            f"--service-account-issuer={ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # `kubectl logs` reaches the pod runner's log endpoint on the Node's InternalIP.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-certificate-authority={p.ca_cert}",
            f"--enable-admission-plugins={ADMISSION_PLUGINS}",
            "--allow-privileged=true",
            # Endpoint validation rejects loopback addresses; nothing needs that Service here.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
        ],
    )
    server = f"https://127.0.0.1:{port}"
    ctx = _admin_ssl(p)
    net.wait_for(
        lambda: net.http_ok(f"{server}/readyz", ctx) == "ok",
        timeout=180,
        what="kube-apiserver /readyz",
        abort=lambda: _died(state_dir, "kube-apiserver"),
    )
    return server


def _start_controller_manager(state_dir: Path, kube_bin: Path, p: pki.Pki, kcfg: Path) -> None:
    _start(
        state_dir,
        "kube-controller-manager",
        [
            str(kube_bin / "kube-controller-manager"),
            f"--kubeconfig={kcfg}",
            "--leader-elect=false",
            "--secure-port=0",
            "--use-service-account-credentials=false",
            f"--controllers={','.join(KCM_CONTROLLERS)}",
            f"--root-ca-file={p.ca_cert}",
            f"--service-account-private-key-file={p.sa_key}",
            "--v=1",
        ],
    )


def kubectl(
    info: ClusterInfo, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(info.kube_bin) / "kubectl"), f"--kubeconfig={info.kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _must(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed: {result.stderr.strip()}")


def ensure_default_service_account(info: ClusterInfo, namespace: str) -> None:
    """The ServiceAccount admission plugin rejects pods until `default` exists; without
    kube-controller-manager nobody else creates it."""
    result = kubectl(info, "create", "serviceaccount", "default", "-n", namespace)
    if result.returncode != 0 and "already exists" not in result.stderr.lower():
        _must(result, f"creating serviceaccount default in {namespace}")


def install_crds(info: ClusterInfo, files: list[Path] | None = None) -> list[str]:
    """Server-side apply CRDs (default: crds/*.yaml) and wait until they are Established."""
    files = sorted((REPO / "crds").glob("*.yaml")) if files is None else files
    if not files:
        raise RuntimeError(f"no CRDs in {REPO / 'crds'}")
    args = ["apply", "--server-side", "--force-conflicts"]
    for f in files:
        args += ["-f", str(f)]
    _must(kubectl(info, *args, "-o", "name"), "installing CRDs")
    names = kubectl(info, "get", *[a for f in files for a in ("-f", str(f))], "-o", "name")
    _must(names, "listing CRDs")
    crds = names.stdout.split()
    _must(
        kubectl(info, "wait", "--for=condition=Established", "--timeout=60s", *crds),
        "waiting for CRDs",
    )
    return crds


def offline_llm_ledger(info: ClusterInfo) -> Path:
    """The file every pod's offline LLM appends its calls to (outside every state claim)."""
    return Path(info.state_dir) / "offline-llm-ledger.jsonl"


def python_tool_ledger(info: ClusterInfo) -> Path:
    """The file the Python tools of ``tests/support/ledger_tools.py`` append their calls to,
    with the idempotency key each got (``CREWFENCE_TEST_TOOL_LEDGER`` in every container)."""
    return Path(info.state_dir) / "test-tool-ledger.jsonl"


TEST_TOOLS_DIR = REPO / "tests" / "support"
"""On every container's PYTHONPATH, as if baked into the image: a Crew's
``spec.tools.python`` may name ``ledger_tools:lookup``."""


def start_pod_runner(info: ClusterInfo) -> None:
    state_dir = Path(info.state_dir)
    _start(
        state_dir,
        "pod-runner",
        [
            sys.executable,
            str(E2E_DIR / "podrunner.py"),
            f"--kubeconfig={info.kubeconfig}",
            f"--state-dir={state_dir / 'podrunner'}",
            f"--node-name={info.node_name}",
            f"--kubelet-port={net.free_port()}",
            f"--serving-cert={state_dir / 'pki' / 'kubelet.crt'}",
            f"--serving-key={state_dir / 'pki' / 'kubelet.key'}",
            f"--offline-llm-ledger={offline_llm_ledger(info)}",
            f"--image-env=PYTHONPATH={TEST_TOOLS_DIR}",
            f"--image-env=CREWFENCE_TEST_TOOL_LEDGER={python_tool_ledger(info)}",
        ],
    )
    ready = state_dir / "podrunner" / "ready"
    net.wait_for(
        ready.exists, timeout=60, what="pod runner", abort=lambda: _died(state_dir, "pod-runner")
    )


def start_operator(info: ClusterInfo, launch: OperatorLaunch) -> None:
    state_dir = Path(info.state_dir)
    _start(state_dir, "operator", operator_command(launch), env=operator_env(launch))
    net.wait_for(
        lambda: net.http_ok(launch.liveness_url) is not None,
        timeout=120,
        what="operator liveness",
        abort=lambda: _died(state_dir, "operator"),
    )


def stop_operator(info: ClusterInfo) -> None:
    rec = procs.read_pidfile(_pidfile(Path(info.state_dir), "operator"))
    if rec is not None:
        procs.stop(rec, grace=15)


def _add_operator(info: ClusterInfo) -> None:
    install_crds(info)
    launch = OperatorLaunch.for_cluster(info.kubeconfig, Path(info.state_dir))
    info.operator = True
    info.operator_liveness = launch.liveness_url
    info.operator_metrics = launch.metrics_url
    info.webhook_port = launch.webhook_port
    _save(info)
    start_operator(info, launch)


def _save(info: ClusterInfo) -> None:
    _info_path(Path(info.state_dir)).write_text(json.dumps(asdict(info), indent=2) + "\n")


def up(
    state_dir: Path,
    kube_bin: Path,
    *,
    with_operator: bool = False,
    pod_runner: bool = True,
    controller_manager: bool = True,
) -> ClusterInfo:
    state_dir = state_dir.resolve()
    existing = load(state_dir)
    if existing is not None and is_running(state_dir):
        operator_down = not existing.operator or _died(state_dir, "operator") is not None
        if with_operator and operator_down:
            _add_operator(existing)
        return existing
    down(state_dir)  # leftovers of a crashed run
    for sub in ("etcd", "pki", "pids", "podrunner", "apiserver"):
        shutil.rmtree(state_dir / sub, ignore_errors=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "etcd").mkdir(mode=0o700)
    p = pki.generate(state_dir / "pki")
    try:
        etcd_url = _start_etcd(state_dir, kube_bin)
        server = _start_apiserver(state_dir, kube_bin, p, etcd_url)
        kcfg = kubeconfig.write_admin(
            state_dir / "admin.kubeconfig",
            server=server,
            ca_cert=p.ca_cert,
            cert=p.admin_cert,
            key=p.admin_key,
        )
        kcm = controller_manager and (kube_bin / "kube-controller-manager").is_file()
        info = ClusterInfo(
            state_dir=str(state_dir),
            kubeconfig=str(kcfg),
            kube_bin=str(kube_bin),
            server=server,
            etcd_url=etcd_url,
            node_name=NODE_NAME,
            controller_manager=kcm,
            pod_runner=pod_runner or with_operator,
            operator=with_operator,
        )
        _save(info)
        if kcm:
            _start_controller_manager(state_dir, kube_bin, p, kcfg)
        ensure_default_service_account(info, "default")
        if info.pod_runner:
            start_pod_runner(info)
        if with_operator:
            _add_operator(info)
    except BaseException:
        down(state_dir)
        raise
    return info


def running_records(state_dir: Path) -> list[procs.ProcRecord]:
    """Every live process the harness started under state_dir (components and pod containers)."""
    found = []
    for pidfile in sorted(state_dir.glob("**/*.pid")):
        rec = procs.read_pidfile(pidfile)
        if rec is not None and procs.alive(rec):
            found.append(rec)
    return found


def down(state_dir: Path) -> list[str]:
    """Stop everything started under state_dir, in reverse dependency order."""
    state_dir = state_dir.resolve()
    stopped = []
    for name in ("operator", "pod-runner", "kube-controller-manager", "kube-apiserver", "etcd"):
        rec = procs.read_pidfile(_pidfile(state_dir, name))
        if rec is not None and procs.alive(rec):
            procs.stop(rec, grace=15)
            stopped.append(name)
    # Pod containers whose runner died without cleaning up.
    for rec in running_records(state_dir):
        procs.stop(rec, grace=2)
        stopped.append(rec.name)
    return stopped
