"""The replica Pod: one sidecar container on its own state claim."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crewfence_operator import constants as c
from crewfence_operator.crew.credentials import (
    credential_files_env,
    credentials_mount,
    credentials_volume,
)
from crewfence_operator.crew.identity import CrewRef, object_meta, replica_labels
from crewfence_operator.crew.resources import LLM_API_KEY_ENV, claim_for_ordinal
from crewfence_operator.crew.spec import CrewSpec, JournalBounds
from crewfence_operator.crew.tools import header_mounts, header_volumes
from crewfence_operator.transport.cert_manager import CertManagerSettings


@dataclass(frozen=True)
class PodSettings:
    """Operator-wide inputs to a pod manifest (from OperatorConfig)."""

    default_image: str = c.DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    port: int = c.SIDECAR_PORT
    journal_defaults: JournalBounds = field(default_factory=JournalBounds)
    """Bounds for Crews that do not set them (operator-wide, e.g. from the chart's values)."""
    sidecar_tls: bool = False
    """Mutual TLS and credentials as files (``crew/credentials.py``): the token, the LLM API
    key and the replica's certificate come from one projected volume, never the environment."""
    cert_manager: CertManagerSettings | None = None
    """cert-manager issues the replica's TLS Secret (same name and files as the operator's own
    source, so the pod manifest does not change); None: the operator's CA."""


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


PLAINTEXT_ENV = "CREWFENCE_INSECURE_PLAINTEXT"


def sidecar_env(
    crew: CrewRef, spec: CrewSpec, port: int, defaults: JournalBounds | None = None,
    *, files: bool = False,
) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "CREWFENCE_HOST",
         "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
        # /health names the pod, so an answer at a reused address is never taken for this one
        {"name": "CREWFENCE_POD_UID",
         "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}},
        _env("CREWFENCE_PORT", str(port)),
        _env("CREWFENCE_STATE_FILE", c.STATE_FILE),
        # The bearer token comes from the Secret as an environment variable, not as a Secret
        # volume file: the kubelet adds group-read to Secret volume files whenever the pod has
        # an fsGroup (which the journal's claim needs), and the sidecar insists on mode 0600.
        {"name": "CREWFENCE_TOKEN",
         "valueFrom": {"secretKeyRef": {"name": c.token_secret_name(crew.name),
                                        "key": c.TOKEN_SECRET_KEY}}},
        _env("CREWFENCE_ALLOWED_OPERATIONS", ",".join(spec.operations)),
        _env("CREWAI_STORAGE_DIR", f"{c.SCRATCH_MOUNT}/crewai"),
        _env("HOME", c.SCRATCH_MOUNT),
        _env("CREWAI_DISABLE_TELEMETRY", "true"),
        _env("CREWAI_TRACING_ENABLED", "false"),
        _env("OTEL_SDK_DISABLED", "true"),
        _env("PYTHONUNBUFFERED", "1"),
    ]
    if spec.declarative:
        env.append(_env("CREWFENCE_CREWS_FILE", c.CREWS_FILE))
    if spec.entrypoint:
        env.append(_env("CREWFENCE_REGISTRY", spec.entrypoint))
    if spec.train_enabled:
        env.append(_env("CREWFENCE_TRAINING_DIR", c.TRAINING_DIR))
    j, d = spec.journal, defaults or JournalBounds()
    bounds = {
        "CREWFENCE_MAX_RETAINED_RUNS": _first(j.max_retained_runs, d.max_retained_runs),
        "CREWFENCE_MAX_EVENTS_PER_RUN": _first(j.max_events_per_run, d.max_events_per_run),
        "CREWFENCE_MAX_EVENT_BYTES": _first(j.max_event_bytes, d.max_event_bytes),
        "CREWFENCE_MAX_STATE_BYTES": _first(j.max_state_bytes, d.max_state_bytes),
        "CREWFENCE_MAX_CONCURRENCY": _first(j.max_concurrency, d.max_concurrency),
        "CREWFENCE_TOMBSTONE_RETENTION_SECONDS": j.tombstone_retention_seconds,
        "CREWFENCE_WORKER_MEMORY_MB": spec.worker_limits.memory_mib,
        "CREWFENCE_WORKER_CPU_SECONDS": spec.worker_limits.cpu_seconds,
        "CREWFENCE_WORKER_MAX_JOBS": spec.worker_limits.max_jobs,
        "CREWFENCE_WORKER_NICE": spec.worker_limits.nice,
        "CREWFENCE_WORKER_SPARES": spec.worker_limits.spares,
        "CREWFENCE_WORKER_MAX_RSS_MB": spec.worker_limits.max_rss_mib,
    }
    env.extend(_env(name, str(value)) for name, value in bounds.items() if value is not None)
    if j.resume_material:
        env.append(_env("CREWFENCE_RESUME_MATERIAL", "1"))
    ref = spec.llm.api_key_secret_ref
    if files:
        return credential_files_env(env)
    if ref is not None:
        env.append({"name": LLM_API_KEY_ENV,
                    "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    # The operator was told to speak plain HTTP (CREWFENCE_OPERATOR_SIDECAR_TLS=0): the
    # sidecar, listening on the pod IP, must be told too or it refuses to start.
    env.append(_env(PLAINTEXT_ENV, "1"))
    return env


def _first(value: int | None, default: int | None) -> int | None:
    return value if value is not None else default


def _volumes(crew: CrewRef, spec: CrewSpec, ordinal: int,
             files: bool = False) -> list[dict[str, Any]]:
    extra = [credentials_volume(crew, spec, ordinal)] if files else []
    return [
        *extra,
        {"name": c.STATE_VOLUME,
         "persistentVolumeClaim": {"claimName": claim_for_ordinal(crew, spec, ordinal)}},
        {"name": "crews",
         "configMap": {"name": c.crews_configmap_name(crew.name), "defaultMode": 0o444}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        *header_volumes(spec.tools),
    ]


def _mounts(spec: CrewSpec, files: bool = False) -> list[dict[str, Any]]:
    extra = [credentials_mount()] if files else []
    return [
        *extra,
        {"name": c.STATE_VOLUME, "mountPath": c.STATE_MOUNT},
        {"name": "crews", "mountPath": c.CREWS_MOUNT, "readOnly": True},
        {"name": "scratch", "mountPath": c.SCRATCH_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - a private emptyDir, not a shared /tmp
        *header_mounts(spec.tools),
    ]


def replica_pod(
    crew: CrewRef, spec: CrewSpec, ordinal: int, settings: PodSettings
) -> dict[str, Any]:
    name = c.pod_name(crew.name, ordinal)
    container: dict[str, Any] = {
        "name": c.SIDECAR_CONTAINER,
        "image": spec.image or settings.default_image,
        "imagePullPolicy": spec.image_pull_policy or settings.image_pull_policy,
        "command": [c.SIDECAR_COMMAND],
        "workingDir": c.SCRATCH_MOUNT,
        "env": sidecar_env(crew, spec, settings.port, settings.journal_defaults,
                           files=settings.sidecar_tls),
        "ports": [{"name": c.SIDECAR_PORT_NAME, "containerPort": settings.port,
                   "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": c.SIDECAR_PORT_NAME},
            "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3,
        },
        "volumeMounts": _mounts(spec, settings.sidecar_tls),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if spec.resources:
        container["resources"] = dict(spec.resources)
    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": c.service_name(crew.name),
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": c.RUN_AS_USER,
            "runAsGroup": c.FS_GROUP,
            "fsGroup": c.FS_GROUP,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": _volumes(crew, spec, ordinal, settings.sidecar_tls),
    }
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    if settings.sidecar_tls:
        container["readinessProbe"]["httpGet"]["scheme"] = "HTTPS"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": object_meta(crew, name, replica_labels(crew, ordinal)),
        "spec": pod_spec,
    }


def mounted_state_claim(pod: Mapping[str, Any] | None) -> str | None:
    """The claim a pod object mounts as its state volume (None without a pod or that volume)."""
    for volume in ((pod or {}).get("spec") or {}).get("volumes") or ():
        if isinstance(volume, Mapping) and volume.get("name") == c.STATE_VOLUME:
            name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            return str(name) if name else None
    return None


def pod_claims(pod: dict[str, Any]) -> list[str]:
    """Names of the PVCs a pod manifest or object mounts."""
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return [
        v["persistentVolumeClaim"]["claimName"]
        for v in volumes
        if isinstance(v, dict) and v.get("persistentVolumeClaim", {}).get("claimName")
    ]
