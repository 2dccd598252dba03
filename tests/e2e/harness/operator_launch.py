"""How the harness starts `crewfence-operator`: the one place to adjust its command line.

The operator reads its settings from CREWFENCE_OPERATOR_* variables (see
operator/crewfence_operator/config.py); ports are random so that parallel clusters do not
collide.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import net

VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class OperatorLaunch:
    kubeconfig: str
    state_dir: str
    liveness_port: int
    metrics_port: int
    webhook_port: int
    readiness_port: int = 0
    # Out of cluster the operator installs the chart's admission policies (the same files) and a
    # URL webhook configuration with the chart's matchConditions and namespace selector.
    webhook_mode: str = "managed"
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    extra_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def for_cluster(cls, kubeconfig: str, state_dir: Path, **kwargs: object) -> OperatorLaunch:
        return cls(
            kubeconfig=kubeconfig,
            state_dir=str(state_dir),
            liveness_port=net.free_port(),
            metrics_port=net.free_port(),
            webhook_port=net.free_port(),
            readiness_port=net.free_port(),
            **kwargs,  # type: ignore[arg-type]
        )

    @property
    def liveness_url(self) -> str:
        return f"http://127.0.0.1:{self.liveness_port}/healthz"

    @property
    def readiness_url(self) -> str:
        return f"http://127.0.0.1:{self.readiness_port}/readyz"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


def operator_command(launch: OperatorLaunch) -> list[str]:
    # Everything else comes from CREWFENCE_OPERATOR_* (operator_env); the metrics address has
    # only a flag.
    return [str(VENV_BIN / "crewfence-operator"), "--metrics-addr", "127.0.0.1"]


def operator_env(launch: OperatorLaunch) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "KUBECONFIG": launch.kubeconfig,
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
            "CREWFENCE_OPERATOR_STANDALONE": "true",
            "CREWFENCE_OPERATOR_ALL_NAMESPACES": "false" if launch.namespaces else "true",
            "CREWFENCE_OPERATOR_NAMESPACES": ",".join(launch.namespaces),
            "CREWFENCE_OPERATOR_LIVENESS_PORT": str(launch.liveness_port),
            "CREWFENCE_OPERATOR_READINESS_PORT": str(launch.readiness_port),
            "CREWFENCE_OPERATOR_METRICS_PORT": str(launch.metrics_port),
            "CREWFENCE_OPERATOR_WEBHOOK_MODE": launch.webhook_mode,
            "CREWFENCE_OPERATOR_WEBHOOK_ADDR": "127.0.0.1",
            "CREWFENCE_OPERATOR_WEBHOOK_PORT": str(launch.webhook_port),
            "CREWFENCE_OPERATOR_WEBHOOK_CERT_DIR": str(Path(launch.state_dir) / "webhook-certs"),
            # Faster loops than production so e2e waits stay short.
            "CREWFENCE_OPERATOR_STATUS_INTERVAL": "1",
            "CREWFENCE_OPERATOR_AUDIT_INTERVAL": "3",
        }
    )
    env.update(launch.extra_env)
    return env
