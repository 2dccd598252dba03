"""Mutual TLS certificates from cert-manager: which Issuers and Certificates a Crew needs.

The other certificate source (``transport/pki.py``) has the operator sign everything itself. With
cert-manager (operator setting ``CREWFENCE_OPERATOR_CERT_SOURCE=cert-manager``, chart value
``certManager.enabled``) the operator only declares cert-manager resources and cert-manager
writes the Secrets. Pure functions over observed objects; ``transport/cert_manager_apply.py``
carries out what they decide. Invariants kept here:

* **The same files on disk.** Each replica's Certificate writes the Secret the pod already
  mounts (``pki.replica_tls_secret_name``) with the keys ``tls.crt``, ``tls.key`` and
  ``ca.crt`` that cert-manager writes for a CA issuer, so the pod spec and the sidecar's code
  path do not depend on the certificate source (``desired_objects``).
* **One CA per Crew.** Without an issuer reference the operator declares, per Crew, a
  self-signed bootstrap Issuer, a CA Certificate signed by it and a CA Issuer that signs every
  replica's serving certificate and the operator's client certificate; a certificate of
  another Crew's CA opens nothing.
* **A renewed CA keeps its key.** The CA Certificate has ``privateKey.rotationPolicy: Never``
  and a long lifetime: when cert-manager renews it, the certificates it already signed still
  verify, so a replica and the operator never disagree about the CA.
* **The name is checked, not just the CA.** Each replica's certificate names the pod's DNS
  name under the headless Service (``pki.replica_dns_name``, what the operator verifies
  on every call) and, once known, its IP.
* **Owned by the Crew.** Every Issuer and Certificate carries the Crew's owner reference and
  labels (the Secrets carry the labels through ``secretTemplate``), so they go with it.
* **Never overwritten blindly.** An existing object is updated only where the fields the
  operator sets differ (``spec_drift``); cert-manager's status and other fields are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from crewfence_operator.crew.identity import CrewRef, crew_labels, object_meta, replica_labels
from crewfence_operator.transport import pki

GROUP: Final = "cert-manager.io"
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
ISSUER_PLURAL: Final = "issuers"
CERTIFICATE_PLURAL: Final = "certificates"
PLURALS: Final = {"Issuer": ISSUER_PLURAL, "Certificate": CERTIFICATE_PLURAL}

CA_DURATION: Final = "87600h"  # ten years, as the operator's own CA (transport/pki.py)
CA_RENEW_BEFORE: Final = "29200h"  # a third left
LEAF_DURATION: Final = "2160h"  # 90 days, as transport/pki.py
LEAF_RENEW_BEFORE: Final = "720h"  # a third left
MAX_COMMON_NAME: Final = 64
KEY: Final = {"algorithm": "ECDSA", "size": 256}


class CertSource(StrEnum):
    OPERATOR = "operator"
    """The operator signs with a CA it keeps per Crew (``transport/pki.py``)."""
    CERT_MANAGER = "cert-manager"
    """cert-manager signs; the operator declares Issuers and Certificates (this module)."""


@dataclass(frozen=True)
class IssuerRef:
    """An issuer the user already runs (``Issuer`` in the Crew's namespace, or a
    ``ClusterIssuer``). It must fill ``ca.crt`` in the Secrets it writes (cert-manager's CA
    and Vault issuers do): the replicas trust client certificates of that CA."""

    name: str
    kind: str = "Issuer"
    group: str = GROUP

    @classmethod
    def parse(cls, text: str) -> IssuerRef:
        """``name``, ``Issuer/name`` or ``ClusterIssuer/name``."""
        kind, sep, name = text.strip().rpartition("/")
        if not sep:
            kind = "Issuer"
        if kind not in ("Issuer", "ClusterIssuer") or not name:
            raise ValueError(f"issuer reference {text!r}: expected NAME, Issuer/NAME or "
                             "ClusterIssuer/NAME")
        return cls(name=name, kind=kind)

    def as_spec(self) -> dict[str, str]:
        return {"name": self.name, "kind": self.kind, "group": self.group}


@dataclass(frozen=True)
class CertManagerSettings:
    """Operator-wide cert-manager choices (from OperatorConfig)."""

    issuer: IssuerRef | None = None
    """An existing issuer for the replicas' and the operator's certificates; None: a CA per
    Crew declared by the operator."""
    leaf_duration: str = LEAF_DURATION
    leaf_renew_before: str = LEAF_RENEW_BEFORE


# --- names ---------------------------------------------------------------------------------------
def bootstrap_issuer_name(crew: str) -> str:
    return f"{crew}-crewfence-bootstrap"


def ca_name(crew: str) -> str:
    """The CA Certificate, its Secret and the CA Issuer that reads that Secret."""
    return f"{crew}-crewfence-cm-ca"


def replica_certificate_name(crew: str, ordinal: int) -> str:
    """Named like the Secret it writes: the one the pod mounts in either source."""
    return pki.replica_tls_secret_name(crew, ordinal)


def operator_client_name(crew: str) -> str:
    """The operator's client Certificate and its Secret."""
    return pki.operator_client_secret_name(crew)


def leaf_issuer(crew: str, settings: CertManagerSettings) -> dict[str, str]:
    if settings.issuer is not None:
        return settings.issuer.as_spec()
    return IssuerRef(ca_name(crew)).as_spec()


# --- manifests -----------------------------------------------------------------------------------
def _obj(crew: CrewRef, kind: str, name: str, labels: Mapping[str, str],
         spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind,
            "metadata": object_meta(crew, name, labels), "spec": spec}


def _common_name(text: str) -> str:
    return text[:MAX_COMMON_NAME]


def ca_objects(crew: CrewRef) -> list[dict[str, Any]]:
    """Bootstrap Issuer -> CA Certificate -> CA Issuer, in the order they are needed."""
    labels = crew_labels(crew)
    name = ca_name(crew.name)
    return [
        _obj(crew, "Issuer", bootstrap_issuer_name(crew.name), labels, {"selfSigned": {}}),
        _obj(crew, "Certificate", name, labels, {
            "isCA": True,
            "commonName": _common_name(f"crewfence {crew.namespace}/{crew.name}"),
            "secretName": name,
            "secretTemplate": {"labels": labels},
            "duration": CA_DURATION,
            "renewBefore": CA_RENEW_BEFORE,
            "privateKey": {**KEY, "rotationPolicy": "Never"},
            "issuerRef": IssuerRef(bootstrap_issuer_name(crew.name)).as_spec(),
        }),
        _obj(crew, "Issuer", name, labels, {"ca": {"secretName": name}}),
    ]


def replica_certificate(crew: CrewRef, ordinal: int, pod_ip: str | None,
                        settings: CertManagerSettings) -> dict[str, Any]:
    labels = replica_labels(crew, ordinal)
    spec: dict[str, Any] = {
        "secretName": pki.replica_tls_secret_name(crew.name, ordinal),
        "secretTemplate": {"labels": labels},
        "dnsNames": [pki.replica_dns_name(crew, ordinal)],
        "duration": settings.leaf_duration,
        "renewBefore": settings.leaf_renew_before,
        "privateKey": {**KEY, "rotationPolicy": "Always"},
        "usages": ["digital signature", "server auth"],
        "issuerRef": leaf_issuer(crew.name, settings),
    }
    if pod_ip:
        spec["ipAddresses"] = [pod_ip]
    return _obj(crew, "Certificate", replica_certificate_name(crew.name, ordinal), labels, spec)


def operator_client_certificate(crew: CrewRef, settings: CertManagerSettings) -> dict[str, Any]:
    labels = crew_labels(crew)
    name = operator_client_name(crew.name)
    return _obj(crew, "Certificate", name, labels, {
        "secretName": name,
        "secretTemplate": {"labels": labels},
        "commonName": pki.OPERATOR_CLIENT_NAME,
        "duration": settings.leaf_duration,
        "renewBefore": settings.leaf_renew_before,
        "privateKey": {**KEY, "rotationPolicy": "Always"},
        "usages": ["digital signature", "client auth"],
        "issuerRef": leaf_issuer(crew.name, settings),
    })


def desired_objects(crew: CrewRef, ordinals: Iterable[int],
                    pod_ips: Mapping[int, str | None],
                    settings: CertManagerSettings) -> list[dict[str, Any]]:
    """Every cert-manager object the Crew needs, in creation order: the CA chain (unless an
    issuer is given), the operator's client Certificate, one Certificate per replica."""
    objs = [] if settings.issuer is not None else ca_objects(crew)
    objs.append(operator_client_certificate(crew, settings))
    objs.extend(replica_certificate(crew, o, pod_ips.get(o), settings)
                for o in sorted(set(ordinals)))
    return objs


# --- decisions -----------------------------------------------------------------------------------
def spec_drift(existing: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> str | None:
    """What to do with one object: ``create`` (absent), ``update`` (a field the operator sets
    differs; fields it does not set are kept) or None (as wanted)."""
    if existing is None:
        return "create"
    have = existing.get("spec") or {}
    want = desired.get("spec") or {}
    if any(have.get(key) != value for key, value in want.items()):
        return "update"
    return None


def merged_spec(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The existing spec with the operator's fields set as desired (for a replace)."""
    spec = dict(existing.get("spec") or {})
    spec.update(desired.get("spec") or {})
    return spec


def certificate_ready(cert: Mapping[str, Any] | None) -> bool:
    """cert-manager's ``Ready`` condition is True (the Secret holds a valid certificate)."""
    for cond in ((cert or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False
