"""Renewing a Crew's CA without a moment where the operator cannot talk to a replica.

The CA Secret (``<crew>-crewfence-ca``) says where a rotation stands; nothing else is needed
to carry on after an operator restart (the phase is read from which keys the Secret holds):

* ``stable``: ``ca.crt``/``ca.key`` (the signing CA, A). Trust bundle: [A].
* ``trusting``: plus ``next.crt``/``next.key`` (B). Signing CA: still A. Trust bundle: [A, B]
  (every replica's ``ca.crt`` and the operator's verification).
* ``switching``: ``ca.crt``/``ca.key`` = B, ``previous.crt`` = A (certificate only). Signing
  CA: B, so every replica's serving certificate and the operator's client certificate are
  re-issued by B. Trust bundle: still [A, B].
* back to ``stable`` with [B] only.

A rotation starts when the signing CA has less than a third of its lifetime left
(``tls.ca_renewal_reason``), or when asked for with the Crew annotation
``crewfence.dev/rotate-ca: <any new id>`` (the id is recorded on the CA Secret, so the same
request is carried out once, as ``token_roll.py`` does for the token).

Invariants (``decide`` keeps them; ``blockers`` names what each step waits for):

* **No window without mutual trust.** The operator presents a client certificate of B only
  after every replica's Secret carries [A, B] AND every replica with a pod proved it accepts
  a client certificate of B (a probe handshake with one); replicas serve certificates of B
  only after the operator itself verifies against [A, B]. Until then everything runs on A,
  which everyone trusts. The coordination is by observation (Secrets and handshakes), never
  by waiting a fixed time. A call that took the operator's material just before a step
  still gets through after it: the CA it presents and the CAs it verifies against stay
  trusted on both sides until the step after (each step needs a further daemon pass).
* **The old CA is dropped only when nothing it signed is in use.** [B] alone is written only
  when every replica's Secret holds a certificate of B, every replica with a pod proved it
  serves a certificate of B and accepts B's client certificate (a probe that trusts B
  alone), and the operator's own client certificate is of B. A pod not yet answering holds
  the rotation where it is (it never skips a check).
* **Restart-safe.** Every decision is a pure function of the CA Secret, the replicas' TLS
  Secrets, the probe answers and the operator's current material; each step is one write
  of the CA Secret, so an interrupted pass is decided again from what was written.
* **Keys never leave Secrets and memory.** ``CaStep`` and ``CaState`` repr phases and
  fingerprints only.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from crewfence_operator import constants as c
from crewfence_operator.transport import certs, pki

ROTATE_ANNOTATION: Final = f"{c.GROUP}/rotate-ca"
"""On the Crew: a new value asks for a CA rotation."""
ROTATION_ID_ANNOTATION: Final = f"{c.GROUP}/ca-rotation"
"""On the CA Secret: the last request carried out (or being carried out)."""
PHASE_ANNOTATION: Final = f"{c.GROUP}/ca-rotation-phase"
"""On the CA Secret, for people: ``trusting``, ``switching`` or ``done``."""
NEXT_CERT_KEY: Final = "next.crt"
NEXT_KEY_KEY: Final = "next.key"
PREVIOUS_CERT_KEY: Final = "previous.crt"

Phase = Literal["stable", "trusting", "switching"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class CaState:
    """What the CA Secret holds (see the module docstring for the phases)."""

    signing: certs.Issued
    next: certs.Issued | None = None
    previous: x509.Certificate | None = None
    rotation_id: str | None = None

    @classmethod
    def from_secret(cls, secret: Mapping[str, Any] | None) -> CaState | None:
        """None when the Secret is absent or its signing CA unreadable (a new CA, then)."""
        signing = pki.ca_from_secret(secret)
        if secret is None or signing is None:
            return None
        annotations = (secret.get("metadata") or {}).get("annotations") or {}
        previous_pem = pki.secret_bytes(secret, PREVIOUS_CERT_KEY)
        previous = None
        if previous_pem is not None:
            try:
                previous = x509.load_pem_x509_certificate(previous_pem)
            except ValueError:
                previous = None
        upcoming = pki.issued_from_pem(pki.secret_bytes(secret, NEXT_CERT_KEY),
                                            pki.secret_bytes(secret, NEXT_KEY_KEY))
        return cls(signing=signing, next=upcoming, previous=previous,
                   rotation_id=annotations.get(ROTATION_ID_ANNOTATION))

    @property
    def phase(self) -> Phase:
        if self.next is not None:
            return "trusting"
        if self.previous is not None:
            return "switching"
        return "stable"

    @property
    def trust(self) -> list[x509.Certificate]:
        """The trust bundle: the CAs whose certificates are accepted now, on both sides."""
        extra = [self.next.cert] if self.next is not None else []
        before = [self.previous] if self.previous is not None else []
        return [*before, self.signing.cert, *extra]

    @property
    def target(self) -> certs.Issued:
        """The CA the rotation moves to (the signing CA once it has switched)."""
        return self.next if self.next is not None else self.signing

    def data(self) -> dict[str, str]:
        """The CA Secret's ``data`` for this state."""
        data = {pki.CA_CERT_KEY: _b64(self.signing.cert_pem),
                pki.CA_KEY_KEY: _b64(self.signing.key_pem)}
        if self.next is not None:
            data[NEXT_CERT_KEY] = _b64(self.next.cert_pem)
            data[NEXT_KEY_KEY] = _b64(self.next.key_pem)
        if self.previous is not None:
            data[PREVIOUS_CERT_KEY] = _b64(
                self.previous.public_bytes(serialization.Encoding.PEM))
        return data

    def __repr__(self) -> str:  # never a key
        return (f"CaState(phase={self.phase!r}, signing="
                f"{pki.fingerprint(self.signing.cert)[:16]!r})")


@dataclass(frozen=True)
class ReplicaView:
    """One replica as observed.

    ``trust``: fingerprints in its TLS Secret's ``ca.crt``; ``leaf_issuer``: fingerprint of
    the CA (among the state's) that signed the Secret's certificate; ``probe``: None when the
    replica has no pod (it will start from its Secret as written), else whether the phase's
    probe handshake (``probe_plan``) and request succeeded.
    """

    trust: frozenset[str]
    leaf_issuer: str | None
    probe: bool | None


@dataclass(frozen=True)
class OperatorView:
    """The operator's current material for the Crew (what its calls use right now)."""

    client_issuer: str
    trusted: frozenset[str]


@dataclass(frozen=True)
class CaObservation:
    ca: CaState
    replicas: Mapping[int, ReplicaView]
    operator: OperatorView | None
    requested: str | None
    now: dt.datetime


@dataclass(frozen=True)
class ProbePlan:
    """The handshake that proves a replica is ready for the next step: verify the replica
    against ``verify`` and present a client certificate of ``client_ca``."""

    verify: tuple[x509.Certificate, ...]
    client_ca: certs.Issued
    what: str


def probe_plan(ca: CaState) -> ProbePlan | None:
    """``trusting``: does the replica accept a client certificate of the new CA (its
    certificate verified against the bundle)? ``switching``: does it speak the new CA only
    (serve a certificate of it and accept its client certificate)? None when stable."""
    if ca.next is not None:
        return ProbePlan(tuple(ca.trust), ca.next, "accepts a client certificate of the new CA")
    if ca.previous is not None:
        return ProbePlan((ca.signing.cert,), ca.signing, "speaks the new CA only")
    return None


@dataclass(frozen=True)
class CaStep:
    """One write of the CA Secret."""

    state: CaState
    phase: Literal["trusting", "switching", "done"]
    reason: str
    annotations: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # never a key
        return f"CaStep(phase={self.phase!r}, reason={self.reason!r})"


def rotation_due(ca: CaState, requested: str | None, now: dt.datetime) -> str | None:
    """Why a rotation should start now (``requested`` or ``expiring``), or None."""
    if ca.phase != "stable":
        return None
    if requested and requested != ca.rotation_id:
        return "requested"
    if pki.ca_renewal_reason(ca.signing, now) is not None:
        return "expiring"
    return None


def blockers(obs: CaObservation) -> list[str]:
    """What the next step of a rotation in progress waits for (empty: it may be taken)."""
    ca = obs.ca
    if ca.phase == "stable":
        return []
    target = pki.fingerprint(ca.target.cert)
    waiting: list[str] = []
    for ordinal, replica in sorted(obs.replicas.items()):
        if ca.phase == "trusting" and target not in replica.trust:
            waiting.append(f"replica {ordinal}: its Secret does not trust the new CA yet")
        if ca.phase == "switching" and replica.leaf_issuer != target:
            waiting.append(f"replica {ordinal}: its Secret holds no certificate of the new CA")
        if replica.probe is False:
            plan = probe_plan(ca)
            waiting.append(f"replica {ordinal}: not yet proved that it "
                           f"{plan.what if plan else 'answers'}")
    if obs.operator is None:
        waiting.append("the operator's own TLS material is not known")
    elif ca.phase == "trusting" and target not in obs.operator.trusted:
        waiting.append("the operator does not verify against the new CA yet")
    elif ca.phase == "switching" and obs.operator.client_issuer != target:
        waiting.append("the operator's client certificate is not of the new CA yet")
    return waiting


def decide(obs: CaObservation, make_ca: Callable[[], certs.Issued]) -> CaStep | None:
    """The next write of the CA Secret, or None (nothing to do, or waiting: ``blockers``)."""
    ca = obs.ca
    if ca.phase == "stable":
        reason = rotation_due(ca, obs.requested, obs.now)
        if reason is None:
            return None
        rotation_id = obs.requested if reason == "requested" else ca.rotation_id
        return CaStep(CaState(signing=ca.signing, next=make_ca(), rotation_id=rotation_id),
                      "trusting", reason, _annotations("trusting", rotation_id))
    if blockers(obs):
        return None
    if ca.phase == "trusting":
        assert ca.next is not None
        return CaStep(CaState(signing=ca.next, previous=ca.signing.cert,
                              rotation_id=ca.rotation_id),
                      "switching", "every replica trusts the new CA",
                      _annotations("switching", ca.rotation_id))
    return CaStep(CaState(signing=ca.signing, rotation_id=ca.rotation_id), "done",
                  "nothing signed by the old CA is in use", _annotations("done", ca.rotation_id))


def _annotations(phase: str, rotation_id: str | None) -> dict[str, str]:
    """The CA Secret's annotations for a step: the phase and the request being carried out
    (written with every step, so the request is never taken up twice)."""
    out = {PHASE_ANNOTATION: phase}
    if rotation_id:
        out[ROTATION_ID_ANNOTATION] = rotation_id
    return out
