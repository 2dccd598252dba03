"""Carry out the admission set-up that ``admission.py`` describes (blocking; run in a thread).

- Out of cluster (webhook mode ``managed``): server-side apply the very policies and bindings
  the chart ships, and a URL webhook configuration with the chart's matchConditions and a
  namespace selector from the watched namespaces. kopf's own managed mode is not used: it
  writes ``failurePolicy: Fail`` and no matchConditions, so a killed operator blocked every pod.
- In cluster without cert-manager (the chart's default): keep the serving certificate in a
  Secret (created once, reused until 30 days before expiry) and inject its CA into the chart's
  webhook configuration, so the chart itself renders no certificate and ``helm template`` is
  deterministic.
"""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path
from typing import Any

from cryptography import x509
from kubernetes import client

from crewfence_operator import admission, config, kube
from crewfence_operator.transport import certs

FIELD_MANAGER = "crewfence-operator"
APPLY_PATCH = "application/apply-patch+yaml"
RENEW_BEFORE = dt.timedelta(days=30)
OUT_OF_CLUSTER_PREFIX = "crewfence"


def _api() -> client.AdmissionregistrationV1Api:
    return client.AdmissionregistrationV1Api(kube.api_client())


def apply(obj: dict[str, Any]) -> None:
    """Server-side apply one admissionregistration object (idempotent)."""
    api = _api()
    patch = {
        "ValidatingAdmissionPolicy": api.patch_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": api.patch_validating_admission_policy_binding,
        "ValidatingWebhookConfiguration": api.patch_validating_webhook_configuration,
    }[obj["kind"]]
    patch(name=obj["metadata"]["name"], body=obj, field_manager=FIELD_MANAGER, force=True,
          _content_type=APPLY_PATCH)


def install_policies(cfg: config.OperatorConfig) -> None:
    for obj in admission.policy_objects(OUT_OF_CLUSTER_PREFIX, cfg.namespaces):
        apply(obj)


def url_client_config(cfg: config.WebhookConfig, ca: bytes) -> Any:
    host = cfg.host or cfg.addr
    return lambda hook_id: {
        "url": f"https://{host}:{cfg.port}/{hook_id}",
        "caBundle": base64.b64encode(ca).decode("ascii"),
    }


def install_webhook_configuration(cfg: config.OperatorConfig, files: certs.CertFiles) -> None:
    settings = admission.WebhookSettings(
        name=cfg.webhook.config_name,
        client_config=url_client_config(cfg.webhook, files.ca_bytes()),
        namespace_selector=admission.namespace_selector(cfg.namespaces),
    )
    apply(admission.webhook_configuration(settings))


# --- the certificate the operator keeps (in cluster, no cert-manager) -------------------------

def service_dns_names(service: str, namespace: str) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]


def usable(data: dict[str, str], dns_names: list[str], now: dt.datetime) -> bool:
    """A kept certificate is reused while it covers the names and is not near expiry."""
    try:
        cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
        base64.b64decode(data["tls.key"])
        base64.b64decode(data["ca.crt"])
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (KeyError, ValueError, x509.ExtensionNotFound):
        return False
    names = set(san.get_values_for_type(x509.DNSName))
    return set(dns_names) <= names and cert.not_valid_after_utc - RENEW_BEFORE > now


def _write(directory: Path, data: dict[str, str]) -> certs.CertFiles:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = certs.CertFiles(cert=directory / "tls.crt", key=directory / "tls.key",
                            ca=directory / "ca.crt")
    for path, key in ((files.cert, "tls.crt"), (files.key, "tls.key"), (files.ca, "ca.crt")):
        path.write_bytes(base64.b64decode(data[key]))
        path.chmod(0o600)
    return files


def keep_certificate(cfg: config.WebhookConfig, directory: Path) -> certs.CertFiles:
    """The serving certificate from the Secret ``cfg.tls_secret`` (``namespace/name``), created
    or renewed when needed; its CA is then injected into ``cfg.configuration``."""
    if not cfg.tls_secret:
        raise ValueError("keep_certificate needs webhook.tls_secret")
    namespace, _, name = cfg.tls_secret.partition("/")
    service = cfg.service_name or name.removesuffix("-tls")
    dns_names = service_dns_names(service, namespace)
    core = kube.core()
    try:
        secret = kube.to_dict(core.read_namespaced_secret(name, namespace))
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        secret = None
    data = (secret or {}).get("data") or {}
    if not usable(data, dns_names, dt.datetime.now(dt.UTC)):
        fresh = certs.generate(directory, dns_names)
        data = {key: base64.b64encode(path.read_bytes()).decode("ascii") for key, path in
                (("tls.crt", fresh.cert), ("tls.key", fresh.key), ("ca.crt", fresh.ca))}
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/managed-by": "crewfence-operator"}},
                "data": data}
        if secret is None:
            try:
                core.create_namespaced_secret(namespace, body)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
                # Another operator replica won the race: use its certificate.
                data = kube.to_dict(core.read_namespaced_secret(name, namespace))["data"]
        else:
            body["metadata"]["resourceVersion"] = secret["metadata"]["resourceVersion"]
            core.replace_namespaced_secret(name, namespace, body)
    files = _write(directory, data)
    if cfg.configuration:
        inject_ca(cfg.configuration, files.ca_bytes())
    return files


def inject_ca(configuration: str, ca: bytes) -> None:
    """Set caBundle on every webhook of the chart's configuration (a JSON patch per entry, so
    nothing else in the object is touched)."""
    api = _api()
    current = kube.to_dict(api.read_validating_webhook_configuration(configuration))
    bundle = base64.b64encode(ca).decode("ascii")
    ops = [
        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
        for i, hook in enumerate(current.get("webhooks") or [])
        if (hook.get("clientConfig") or {}).get("caBundle") != bundle
    ]
    if ops:
        api.patch_validating_webhook_configuration(configuration, ops,
                                                   _content_type="application/json-patch+json")
