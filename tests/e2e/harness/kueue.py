"""A real Kueue for the e2e control plane: build (or find cached), install its CRDs, run it.

``sigs.k8s.io/kueue`` has no ``replace`` directives, so its controller manager installs from
the Go module proxy (``go install sigs.k8s.io/kueue/cmd/kueue@<pin>``); its CRDs come from the
same module (``config/components/crd/bases``, in the module cache after the install). Built
lazily, cached per version in its own entry (never touching the control plane's).

How it runs against the harness's apiserver (no scheduler, no kubelet: Kueue needs only the
API): leader election off, internal cert management off, and no webhook configuration is
registered, so the apiserver never calls Kueue's webhooks (a CrewJob's Workload is created
complete by the operator). Kueue still starts its webhook server and, with internal cert
management off, reads its metrics serving certificate from the fixed path
``/etc/kueue/metrics/certs``: both get a self-signed certificate for 127.0.0.1 generated here
(the metrics one is written only when missing).
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
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

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from . import net, procs

KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_VERSION = "v0.17.0"
BUILD_REVISION = 1
BINARY = "kueue"
NAME = "kueue"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "crewfence" / "kueue" / f"{KUEUE_VERSION}-b{BUILD_REVISION}"


def stamp_file() -> Path:
    return cache_dir() / "complete.stamp"


def crd_files(root: Path | None = None) -> list[Path]:
    return sorted(((root or cache_dir()) / "crds").glob("*.yaml"))


def cached() -> Path | None:
    return cache_dir() if stamp_file().is_file() else None


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ensure_built(progress: bool = True) -> Path:
    """The cache folder with ``bin/kueue`` and ``crds/``, built first when missing (one
    builder at a time)."""
    found = cached()
    if found is not None:
        return found
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / ".build.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print("another process is building Kueue; waiting ...", file=sys.stderr,
                      flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        found = cached()
        if found is not None:
            return found
        return _build(progress)


def _build(progress: bool) -> Path:
    if shutil.which("go") is None:
        raise BuildError("`go` is not on PATH; it is needed once to build Kueue")
    out = cache_dir()
    (out / "bin").mkdir(parents=True, exist_ok=True)
    log = out / "build.log"
    package = f"{KUEUE_MODULE}/cmd/kueue@{KUEUE_VERSION}"
    if progress:
        print(f"building Kueue {KUEUE_VERSION} ...", file=sys.stderr, flush=True)
    started, cpu_started, load = time.monotonic(), _cpu(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=out) as gobin, log.open("w") as log_file:
        env = dict(os.environ, GOBIN=gobin, GOFLAGS="-buildvcs=false")
        cmd = ["go", "install", "-trimpath", "-ldflags=-s -w", package]
        result = subprocess.run(cmd, cwd=gobin, env=env, stdout=log_file, stderr=log_file)
        if result.returncode != 0:
            raise BuildError(f"building Kueue failed: {' '.join(cmd)} (log: {log})")
        os.replace(Path(gobin) / BINARY, out / "bin" / BINARY)
        wall, cpu = time.monotonic() - started, _cpu() - cpu_started
        module_dir = subprocess.run(
            ["go", "mod", "download", "-json", f"{KUEUE_MODULE}@{KUEUE_VERSION}"], cwd=gobin,
            env=env, capture_output=True, text=True, check=True).stdout
    source = Path(json.loads(module_dir)["Dir"]) / "config" / "components" / "crd" / "bases"
    crds = out / "crds"
    crds.mkdir(exist_ok=True)
    for path in sorted(source.glob("*.yaml")):
        shutil.copyfile(path, crds / path.name)
    if not crd_files(out):
        raise BuildError(f"no CRDs under {source}")
    stamp = {"kueue": KUEUE_VERSION, "cpus": os.cpu_count(),
             "build": {"wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
                       "load_at_start": round(load, 1)}}
    stamp_file().write_text(json.dumps(stamp, indent=2) + "\n")
    if progress:
        print(f"built Kueue in {wall:.0f}s (cpu {cpu:.0f}s)", file=sys.stderr, flush=True)
    return out


def _self_signed(directory: Path) -> None:
    """tls.crt/tls.key for 127.0.0.1 (written to a temporary name, then renamed)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kueue-e2e")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .sign(key, hashes.SHA256()))
    for file_name, data in (
        ("tls.key", key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())),
        ("tls.crt", cert.public_bytes(serialization.Encoding.PEM)),
    ):
        tmp = directory / f".{file_name}.{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, directory / file_name)


@dataclass(frozen=True)
class Kueue:
    """A running Kueue controller manager of one e2e cluster (its state folder)."""

    state_dir: Path

    @property
    def pidfile(self) -> Path:
        return self.state_dir / "pids" / f"{NAME}.pid"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "logs" / f"{NAME}.log"

    @property
    def health_file(self) -> Path:
        return self.state_dir / "kueue" / "health-port"

    def alive(self) -> bool:
        rec = procs.read_pidfile(self.pidfile)
        return rec is not None and procs.alive(rec)

    def start(self, root: Path, kubeconfig: Path) -> None:
        if self.alive():
            return
        home = self.state_dir / "kueue"
        _self_signed(home / "webhook-certs")
        if not (METRICS_CERT_DIR / "tls.crt").is_file():
            _self_signed(METRICS_CERT_DIR)
        health = net.free_port()
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "metrics": {"bindAddress": f"127.0.0.1:{net.free_port()}"},
            "webhook": {"port": net.free_port(), "host": "127.0.0.1",
                        "certDir": str(home / "webhook-certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "integrations": {"frameworks": ["batch/job"]},
        }
        (home / "config.yaml").write_text(json.dumps(config, indent=2))
        self.health_file.write_text(str(health))
        procs.spawn(NAME, [str(root / "bin" / BINARY), f"--config={home / 'config.yaml'}",
                           f"--kubeconfig={kubeconfig}", "--zap-log-level=2",
                           # its visibility API server wants serving certs of its own
                           "--feature-gates=VisibilityOnDemand=false"],
                    log=self.log_path, pidfile=self.pidfile, cwd=home)

    def ready(self) -> bool:
        port = self.health_file.read_text().strip()
        return net.http_ok(f"http://127.0.0.1:{port}/readyz") is not None

    def stop(self) -> None:
        rec = procs.read_pidfile(self.pidfile)
        if rec is not None:
            procs.stop(rec, grace=10)

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
