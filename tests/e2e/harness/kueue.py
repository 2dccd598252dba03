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
import ipaddress
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from . import gobuild, net, procs
from .gobuild import BuildError

KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_VERSION = "v0.17.0"
BUILD_REVISION = 1
BINARY = "kueue"
NAME = "kueue"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")

__all__ = ["BuildError", "Kueue", "cached", "crd_files", "ensure_built"]


def cache_dir() -> Path:
    return gobuild.cache_root() / "kueue" / f"{KUEUE_VERSION}-b{BUILD_REVISION}"


def stamp_file() -> Path:
    return cache_dir() / "complete.stamp"


def crd_files(root: Path | None = None) -> list[Path]:
    return sorted(((root or cache_dir()) / "crds").glob("*.yaml"))


def cached() -> Path | None:
    return cache_dir() if stamp_file().is_file() else None


def ensure_built(progress: bool = True) -> Path:
    """The cache folder with ``bin/kueue`` and ``crds/``, built first when missing (one
    builder at a time)."""
    found = cached()
    if found is not None:
        return found
    with gobuild.build_lock(cache_dir() / ".build.lock", "Kueue", progress=progress):
        return cached() or _build(progress)


def _build(progress: bool) -> Path:
    gobuild.require_go("Kueue")
    out = cache_dir()
    if progress:
        print(f"building Kueue {KUEUE_VERSION} ...", file=sys.stderr, flush=True)
    with gobuild.timed() as timing:
        gobuild.go_install(f"{KUEUE_MODULE}/cmd/kueue@{KUEUE_VERSION}",
                           binary=out / "bin" / BINARY, log=out / "build.log")
    source = (gobuild.module_dir(f"{KUEUE_MODULE}@{KUEUE_VERSION}")
              / "config" / "components" / "crd" / "bases")
    crds = out / "crds"
    crds.mkdir(exist_ok=True)
    for path in sorted(source.glob("*.yaml")):
        shutil.copyfile(path, crds / path.name)
    if not crd_files(out):
        raise BuildError(f"no CRDs under {source}")
    gobuild.write_stamp(stamp_file(), {"kueue": KUEUE_VERSION, "build": timing[0].as_stamp()})
    if progress:
        print(f"built Kueue in {timing[0].wall:.0f}s (cpu {timing[0].cpu:.0f}s)",
              file=sys.stderr, flush=True)
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
