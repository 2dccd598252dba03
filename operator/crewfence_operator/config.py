"""Operator configuration: one dataclass, filled from the environment and overridden by flags."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from crewfence_operator import constants as c
from crewfence_operator.crew.spec import JournalBounds
from crewfence_operator.transport.cert_manager import CertManagerSettings, CertSource, IssuerRef

ENV_PREFIX = "CREWFENCE_OPERATOR_"


class WebhookMode(StrEnum):
    OFF = "off"
    """No admission server (the audit and the operator's own rules still fence)."""
    MANAGED = "managed"
    """Out of cluster: the operator installs the chart's admission policies and a URL
    ValidatingWebhookConfiguration scoped like the chart's (admission_install.py)."""
    SERVICE = "service"
    """In cluster: serve only; the chart ships a Service-based configuration."""


@dataclass(frozen=True)
class WebhookConfig:
    mode: WebhookMode = WebhookMode.OFF
    addr: str = "127.0.0.1"
    port: int = 9443
    host: str | None = None
    """Hostname put into the URL client config (managed mode); defaults to ``addr``."""
    cert_dir: str | None = None
    """Where to write (or find) ``tls.crt``/``tls.key``/``ca.crt``; a temp dir when unset."""
    config_name: str = c.WEBHOOK_CONFIG_NAME
    """Name of the ValidatingWebhookConfiguration the operator writes (managed mode)."""
    tls_secret: str | None = None
    """``namespace/name`` of the Secret where the operator keeps its serving certificate (in
    cluster without cert-manager); unset: mounted files or a per-process certificate."""
    configuration: str | None = None
    """The chart's ValidatingWebhookConfiguration, whose caBundle the operator keeps current."""
    service_name: str | None = None
    """The webhook Service (the kept certificate's DNS names); default: the Secret's name
    without ``-tls``."""


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_sidecar_tls(value: str | None) -> bool:
    """``CREWFENCE_OPERATOR_SIDECAR_TLS``: unset -> True (mutual TLS); only an explicit false
    word selects plain HTTP (local development); anything else is a configuration error."""
    if value is None or value.strip() == "":
        return True
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{ENV_PREFIX}SIDECAR_TLS={value!r}: use 1/true/yes/on (mutual TLS, the "
                     "default) or 0/false/no/off (plain HTTP, local development only)")


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    standalone: bool = True
    peering_name: str = c.PEERING_DEFAULT_NAME
    priority: int = 0
    liveness_port: int = 8080
    readiness_port: int = 8081
    metrics_port: int = 9090
    metrics_addr: str = "0.0.0.0"  # noqa: S104 - scraped by Prometheus from outside the pod
    sidecar_image: str = c.DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    sidecar_port: int = c.SIDECAR_PORT
    sidecar_tls: bool = True
    """Operator <-> sidecar over mutual TLS with a CA per Crew; the token, keys and the LLM
    API key as files (``transport/pki.py``, ``crew/credentials.py``). On by default, for a bare
    ``crewfence-operator`` as in the chart. Invariant (plaintext only when asked for):
    ``CREWFENCE_OPERATOR_SIDECAR_TLS`` turns it off only with an explicit false word
    (``0``/``false``/``no``/``off``); an unset or empty value keeps TLS and any other value
    is refused (``parse_sidecar_tls``), so a typo never downgrades to plain HTTP."""
    cert_source: CertSource = CertSource.OPERATOR
    """Who issues the mutual-TLS certificates (``CREWFENCE_OPERATOR_CERT_SOURCE``): the
    operator's own CA per Crew (``transport/pki.py``) or cert-manager
    (``transport/cert_manager.py``; the chart's ``certManager.enabled``). Same Secret names and
    files either way."""
    cert_manager_issuer: str | None = None
    """``CREWFENCE_OPERATOR_CERT_MANAGER_ISSUER``: an existing ``NAME``, ``Issuer/NAME`` or
    ``ClusterIssuer/NAME`` to sign with instead of a CA per Crew (cert-manager source only)."""
    status_interval: float = 5.0
    """Seconds between replica status refreshes (per Crew daemon)."""
    audit_interval: float = 15.0
    """Seconds between shared-state audits (per Crew)."""
    health_timeout: float = 3.0
    """Seconds to wait for a replica's /health."""
    ca_lifetime_seconds: float = 3650 * 86400.0
    """Lifetime of a Crew's CA (``CA_LIFETIME_SECONDS``); it is renewed, with a trust overlap,
    once a third of it is left (``transport/ca_rotation.py``). Short values are for tests."""
    leaf_lifetime_seconds: float = 90 * 86400.0
    """Lifetime of serving and client certificates (``LEAF_LIFETIME_SECONDS``), cut at their
    CA's expiry; re-issued once a third of it is left."""
    webhook: WebhookConfig = field(default_factory=WebhookConfig)
    journal_defaults: JournalBounds = field(default_factory=JournalBounds)
    """Journal bounds for Crews that do not set spec.journal (the sidecar's own otherwise)."""
    verbose: bool = False

    def cert_manager_settings(self) -> CertManagerSettings | None:
        """The cert-manager choices when it is the certificate source, else None."""
        if self.cert_source is not CertSource.CERT_MANAGER:
            return None
        issuer = IssuerRef.parse(self.cert_manager_issuer) if self.cert_manager_issuer else None
        return CertManagerSettings(issuer=issuer)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        e = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = e.get(ENV_PREFIX + name)
            return value if value not in (None, "") else None

        def get_int(name: str, default: int) -> int:
            value = get(name)
            return default if value is None else int(value)

        def get_float(name: str, default: float) -> float:
            value = get(name)
            return default if value is None else float(value)

        def get_opt_int(name: str) -> int | None:
            value = get(name)
            return None if value is None else int(value)

        def get_bool(name: str, default: bool) -> bool:
            value = get(name)
            return default if value is None else value.lower() in ("1", "true", "yes", "on")

        namespaces = tuple(n.strip() for n in (get("NAMESPACES") or "").split(",") if n.strip())
        webhook = WebhookConfig(
            mode=WebhookMode(get("WEBHOOK_MODE") or WebhookMode.OFF),
            addr=get("WEBHOOK_ADDR") or "127.0.0.1",
            port=get_int("WEBHOOK_PORT", 9443),
            host=get("WEBHOOK_HOST"),
            cert_dir=get("WEBHOOK_CERT_DIR"),
            config_name=get("WEBHOOK_CONFIG_NAME") or c.WEBHOOK_CONFIG_NAME,
            tls_secret=get("WEBHOOK_TLS_SECRET"),
            configuration=get("WEBHOOK_CONFIGURATION"),
            service_name=get("WEBHOOK_SERVICE"),
        )
        return cls(
            namespaces=namespaces,
            all_namespaces=get_bool("ALL_NAMESPACES", not namespaces),
            standalone=get_bool("STANDALONE", True),
            peering_name=get("PEERING") or c.PEERING_DEFAULT_NAME,
            priority=get_int("PRIORITY", 0),
            liveness_port=get_int("LIVENESS_PORT", 8080),
            readiness_port=get_int("READINESS_PORT", 8081),
            metrics_port=get_int("METRICS_PORT", 9090),
            sidecar_image=get("SIDECAR_IMAGE") or c.DEFAULT_IMAGE,
            image_pull_policy=get("IMAGE_PULL_POLICY") or "IfNotPresent",
            sidecar_tls=parse_sidecar_tls(get("SIDECAR_TLS")),
            cert_source=CertSource(get("CERT_SOURCE") or CertSource.OPERATOR),
            cert_manager_issuer=_checked_issuer(get("CERT_MANAGER_ISSUER")),
            status_interval=get_float("STATUS_INTERVAL", 5.0),
            audit_interval=get_float("AUDIT_INTERVAL", 15.0),
            health_timeout=get_float("HEALTH_TIMEOUT", 3.0),
            ca_lifetime_seconds=get_float("CA_LIFETIME_SECONDS", 3650 * 86400.0),
            leaf_lifetime_seconds=get_float("LEAF_LIFETIME_SECONDS", 90 * 86400.0),
            webhook=webhook,
            journal_defaults=JournalBounds(
                max_retained_runs=get_opt_int("SIDECAR_MAX_RETAINED_RUNS"),
                max_events_per_run=get_opt_int("SIDECAR_MAX_EVENTS_PER_RUN"),
                max_event_bytes=get_opt_int("SIDECAR_MAX_EVENT_BYTES"),
                max_state_bytes=get_opt_int("SIDECAR_MAX_STATE_BYTES"),
                max_concurrency=get_opt_int("SIDECAR_MAX_CONCURRENCY"),
            ),
            verbose=get_bool("VERBOSE", False),
        )


def _checked_issuer(value: str | None) -> str | None:
    """Refuse a malformed issuer reference at start-up rather than on the first Crew."""
    if value is not None:
        IssuerRef.parse(value)
    return value


_current: OperatorConfig | None = None


def set_current(config: OperatorConfig) -> None:
    global _current
    _current = config


def current() -> OperatorConfig:
    """The configuration the CLI started with (from the environment when run another way)."""
    global _current
    if _current is None:
        _current = OperatorConfig.from_env()
    return _current
