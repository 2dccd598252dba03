"""Rolling a Crew's bearer token without a moment where the operator cannot talk to a replica.

The token Secret's ``token`` value holds one token, or two during a roll, one per line. The
sidecars accept every line (their token file is re-read when the kubelet updates it); the
operator sends the FIRST line only (``sending_token``). A roll, asked for with the Crew
annotation ``crewfence.dev/rotate-token: <any new id>``, moves through three writes:

1. ``old\\nnew`` (phase ``adding``): the operator still sends ``old``; sidecars learn ``new``.
2. once EVERY replica that has a pod accepts ``new`` (a probe with it is not refused):
   ``new\\nold`` (phase ``switched``): the operator sends ``new``; both still accepted.
3. ``GRACE_SECONDS`` later (every cached copy of ``old`` in the operator has been re-read):
   ``new`` (phase ``done``).

Invariant: at every moment the token the operator sends is accepted by every replica that
has synced the Secret, and a replica that has not synced yet still holds the previous value,
in which that token is also present. ``decide`` is a pure function of the observed Secret, the
request and the probe result; ``pki_apply``-style carrying out is in ``advance``.
Only with credentials as files (sidecar TLS mode): an environment variable never changes in
a running container. Tokens are never logged.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from kubernetes.client.exceptions import ApiException

from crewfence_operator import constants as c
from crewfence_operator import kube
from crewfence_operator.sidecar_client import Endpoint, SidecarClient, SidecarFailure

ROTATE_ANNOTATION: Final = f"{c.GROUP}/rotate-token"
ROLL_ID_ANNOTATION: Final = f"{c.GROUP}/token-rotation"
PHASE_ANNOTATION: Final = f"{c.GROUP}/token-rotation-phase"
SWITCHED_AT_ANNOTATION: Final = f"{c.GROUP}/token-switched-at"
GRACE_SECONDS: Final = 20.0
PROBE_ACTION_ID: Final = "crewfence-token-probe"


def tokens_of(value: str | None) -> list[str]:
    return [line.strip() for line in (value or "").splitlines() if line.strip()]


def sending_token(value: str | None) -> str | None:
    """The token the operator sends: the first line of the Secret's value."""
    tokens = tokens_of(value)
    return tokens[0] if tokens else None


def new_token() -> str:
    """A fresh bearer token (256 bits, URL-safe): a new Crew's first one and each roll's next."""
    return secrets.token_urlsafe(32)

@dataclass(frozen=True)
class RollState:
    value: str
    roll_id: str | None = None
    phase: str | None = None
    switched_at: float | None = None

    @classmethod
    def from_secret(cls, secret: Mapping[str, Any]) -> RollState:
        raw = (secret.get("data") or {}).get(c.TOKEN_SECRET_KEY) or ""
        annotations = (secret.get("metadata") or {}).get("annotations") or {}
        switched = annotations.get(SWITCHED_AT_ANNOTATION)
        try:
            switched_at = float(switched) if switched else None
        except ValueError:
            switched_at = None
        return cls(value=base64.b64decode(raw).decode() if raw else "",
                   roll_id=annotations.get(ROLL_ID_ANNOTATION),
                   phase=annotations.get(PHASE_ANNOTATION), switched_at=switched_at)

    @property
    def pending(self) -> str | None:
        """The new token while it is being added (phase ``adding``)."""
        tokens = tokens_of(self.value)
        return tokens[1] if self.phase == "adding" and len(tokens) == 2 else None


@dataclass(frozen=True)
class RollStep:
    value: str = ""
    annotations: Mapping[str, str] | None = None
    phase: str = ""

    def __repr__(self) -> str:  # never the tokens
        return f"RollStep(phase={self.phase!r})"


def decide(state: RollState, requested: str | None, pending_accepted: bool, now: float,
           make_token: Callable[[], str] = new_token) -> RollStep | None:
    """The next write of the token Secret, or None (nothing to do, or wait)."""
    tokens = tokens_of(state.value)
    if state.phase == "adding" and len(tokens) == 2:
        if not pending_accepted:
            return None
        return RollStep(f"{tokens[1]}\n{tokens[0]}", {PHASE_ANNOTATION: "switched",
                                                      SWITCHED_AT_ANNOTATION: f"{now:.3f}"},
                        "switched")
    if state.phase == "switched" and len(tokens) == 2:
        if state.switched_at is not None and now - state.switched_at < GRACE_SECONDS:
            return None
        return RollStep(tokens[0], {PHASE_ANNOTATION: "done"}, "done")
    if requested and requested != state.roll_id and len(tokens) == 1:
        return RollStep(f"{tokens[0]}\n{make_token()}",
                        {ROLL_ID_ANNOTATION: requested, PHASE_ANNOTATION: "adding"}, "adding")
    return None


# --- carrying it out --------------------------------------------------------------------------
def _read(namespace: str, crew: str) -> dict[str, Any] | None:
    try:
        return kube.to_dict(kube.core().read_namespaced_secret(c.token_secret_name(crew),
                                                               namespace))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _write(namespace: str, crew: str, secret: dict[str, Any], step: RollStep) -> bool:
    meta = secret["metadata"]
    body = {"apiVersion": "v1", "kind": "Secret",
            "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}),
                                                  **(step.annotations or {})}},
            "type": secret.get("type") or "Opaque",
            "data": {**(secret.get("data") or {}),
                     c.TOKEN_SECRET_KEY: base64.b64encode(step.value.encode()).decode()}}
    try:
        kube.core().replace_namespaced_secret(meta["name"], namespace, body)
    except ApiException as exc:
        if exc.status == 409:
            return False  # changed meanwhile: decided again on the next pass
        raise
    return True


async def _accepts(session: aiohttp.ClientSession, address: str, token: str,
                   tls: Mapping[str, Any]) -> bool:
    client = SidecarClient(session, Endpoint(address, token, **tls))
    try:
        await client.get_job(PROBE_ACTION_ID)
    except SidecarFailure:
        return False
    return True


async def advance(namespace: str, crew: str, crew_annotations: Mapping[str, str],
                  session: aiohttp.ClientSession, addresses: Mapping[int, str],
                  tls_for: Callable[[int], dict[str, Any]]) -> str | None:
    """One step of a requested roll, if one is due; the phase written, else None."""
    secret = await asyncio.to_thread(_read, namespace, crew)
    if secret is None:
        return None
    state = RollState.from_secret(secret)
    requested = crew_annotations.get(ROTATE_ANNOTATION)
    if state.phase in (None, "done") and (not requested or requested == state.roll_id):
        return None
    accepted = False
    if state.pending is not None and addresses:
        answers = await asyncio.gather(*(_accepts(session, address, state.pending, tls_for(o))
                                         for o, address in addresses.items()))
        accepted = all(answers)
    step = decide(state, requested, accepted, time.time())
    if step is None:
        return None
    written = await asyncio.to_thread(_write, namespace, crew, secret, step)
    return step.phase if written else None
