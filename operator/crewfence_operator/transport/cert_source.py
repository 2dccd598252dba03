"""Which certificate source the operator uses for mutual TLS with a Crew's sidecars.

``operator`` (default): the operator's own CA per Crew (``transport/pki_apply.py``);
``cert-manager``: cert-manager's Issuers and Certificates (``transport/cert_manager_apply.py``).
Either way the pods mount the same Secret names and files, so only the two functions here
look at the setting. Invariant: with sidecar TLS off nothing is sent with TLS options.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from crewfence_operator import config
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.transport import cert_manager_apply, pki_apply
from crewfence_operator.transport.cert_manager import CertManagerSettings
from crewfence_operator.transport.cert_manager_apply import CertManagerUnavailable

EndpointOptions = Callable[[int], dict[str, Any]]

__all__ = ["CertManagerUnavailable", "endpoint_options_for", "ensure_replica_certificates"]


def ensure_replica_certificates(
    crew: CrewRef, ordinals: Iterable[int], pods: Mapping[int, Mapping[str, Any]],
    cert_manager: CertManagerSettings | None,
) -> list[str]:
    """Blocking: have each replica's TLS Secret issued by the configured source. Raises
    ``CertManagerUnavailable`` when cert-manager is the source but is not installed."""
    if cert_manager is not None:
        return cert_manager_apply.ensure(crew, ordinals, pods, cert_manager)
    return pki_apply.ensure_replica_secrets(crew, ordinals, pods)


async def endpoint_options_for(cfg: config.OperatorConfig, namespace: str,
                               crew: str) -> EndpointOptions:
    """Per ordinal, the ``sidecar_client.Endpoint`` TLS keyword arguments for this Crew."""
    if not cfg.sidecar_tls:
        return lambda _ordinal: {}
    if cfg.cert_manager_settings() is not None:
        cm_material = await cert_manager_apply.client_tls(namespace, crew)
        return lambda o: cert_manager_apply.endpoint_tls(cm_material, namespace, crew, o)
    material = await pki_apply.client_tls(namespace, crew)
    return lambda o: pki_apply.endpoint_tls(material, namespace, crew, o)
