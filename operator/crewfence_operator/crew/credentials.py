"""The replica's credentials as files: one projected volume, never environment variables.

Invariants kept here:

* **No secret in the pod spec's environment.** In this mode the bearer token, the LLM API
  key and the replica's TLS key reach the sidecar only as files of one projected volume
  (token Secret + the replica's TLS Secret + the Crew's ``llm.apiKeySecretRef``); the
  environment holds their paths. ``credential_files_env`` drops any ``CREWFENCE_TOKEN`` or
  ``secretKeyRef`` entry that a caller may have added.
* **Owner-only, as the kubelet really writes them.** ``defaultMode: 0400``. In a pod with an
  ``fsGroup`` (the journal's claim needs one) the kubelet makes every file of a Secret or
  projected volume ``root:<fsGroup>`` and ORs in ``0440``, so the files end up ``0440``
  root-owned: the non-root sidecar reads them through its group, nobody can write them, and
  other users (no "other" bits) cannot read them. The sidecar accepts exactly that shape
  (its ``credentials.secret_mode_ok``: owner-only, or root-owned with group-read at most)
  and refuses anything looser. No copy step is needed, so the kubelet's atomic updates of
  the volume (a rotated certificate or token) reach the running sidecar without a restart.
"""

from __future__ import annotations

from typing import Any, Final

from crewfence_operator import constants as c
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.resources import LLM_API_KEY_ENV
from crewfence_operator.crew.spec import CrewSpec
from crewfence_operator.transport import pki

VOLUME: Final = "credentials"
MOUNT: Final = "/etc/crewfence/credentials"
TOKEN_FILE: Final = f"{MOUNT}/token"
CERT_FILE: Final = f"{MOUNT}/{pki.TLS_CERT_KEY}"
KEY_FILE: Final = f"{MOUNT}/{pki.TLS_KEY_KEY}"
CA_FILE: Final = f"{MOUNT}/{pki.CA_CERT_KEY}"
LLM_KEY_PATH: Final = "llm-api-key"
DEFAULT_MODE: Final = 0o400


def credentials_volume(crew: CrewRef, spec: CrewSpec, ordinal: int) -> dict[str, Any]:
    sources: list[dict[str, Any]] = [
        {"secret": {"name": c.token_secret_name(crew.name),
                    "items": [{"key": c.TOKEN_SECRET_KEY, "path": "token"}]}},
        {"secret": {"name": pki.replica_tls_secret_name(crew.name, ordinal),
                    "items": [{"key": k, "path": k} for k in (pki.TLS_CERT_KEY,
                                                            pki.TLS_KEY_KEY,
                                                            pki.CA_CERT_KEY)]}},
    ]
    ref = spec.llm.api_key_secret_ref
    if ref is not None:
        sources.append({"secret": {"name": ref.name,
                                   "items": [{"key": ref.key, "path": LLM_KEY_PATH}]}})
    return {"name": VOLUME, "projected": {"defaultMode": DEFAULT_MODE, "sources": sources}}


def credentials_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": MOUNT, "readOnly": True}


def credential_files_env(env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``env`` without secrets, plus the paths of the credential files."""
    kept = [e for e in env
            if e.get("name") != "CREWFENCE_TOKEN"
            and "secretKeyRef" not in (e.get("valueFrom") or {})]
    return [
        *kept,
        {"name": "CREWFENCE_TOKEN_FILE", "value": TOKEN_FILE},
        {"name": "CREWFENCE_TLS_CERT_FILE", "value": CERT_FILE},
        {"name": "CREWFENCE_TLS_KEY_FILE", "value": KEY_FILE},
        {"name": "CREWFENCE_TLS_CLIENT_CA_FILE", "value": CA_FILE},
        # The crews file names the key's variable; the sidecar reads <variable>_FILE.
        {"name": f"{LLM_API_KEY_ENV}_FILE", "value": f"{MOUNT}/{LLM_KEY_PATH}"},
    ]
