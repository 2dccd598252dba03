"""The Crew's ``ModelCredentials`` condition: does its hosted model have an API key?

Pure: decided from the Crew spec and from what the replicas' ``GET /health`` said
(``model_credentials``, per declarative crew: ``present`` / ``missing`` / ``not_needed``).

Invariant (a Crew that cannot call its model says so before any job fails): a declarative
Crew whose model is hosted gets ``ModelCredentials=False`` (reason
``MissingModelCredentials``) when its spec names no ``llm.apiKeySecretRef`` (known before any
pod answers) or when any replica reports the key missing. The message names the model and
the fix, never a key or a Secret's content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from crewfence_operator.crew.spec import CrewSpec

OFFLINE_MODEL: Final = "crewfence/offline"
"""The one model that needs no credentials (the sidecar's offline LLM)."""

REASON_MISSING: Final = "MissingModelCredentials"
REASON_PRESENT: Final = "CredentialsPresent"
REASON_NOT_NEEDED: Final = "NotNeeded"
REASON_NOT_OBSERVED: Final = "NotObserved"


@dataclass(frozen=True)
class CredentialsVerdict:
    """The condition's content; ``status`` None is ``Unknown``."""

    status: bool | None
    reason: str
    message: str


def is_hosted(model: str) -> bool:
    return model != OFFLINE_MODEL


def reported_states(
    crew_name: str, reports: Mapping[int, Mapping[str, Mapping[str, Any]] | None],
) -> dict[int, str]:
    """Replica ordinal -> what it said about this crew's credentials (replicas that said)."""
    out: dict[int, str] = {}
    for ordinal, report in reports.items():
        entry = (report or {}).get(crew_name)
        state = entry.get("credentials") if isinstance(entry, Mapping) else None
        if isinstance(state, str):
            out[ordinal] = state
    return out


def decide(spec: CrewSpec, reported: Mapping[int, str]) -> CredentialsVerdict | None:
    """The verdict for a Crew, or None when crewfence cannot know (an ``entrypoint`` crew
    builds its model in code, so neither its spec nor the sidecar's report describes it)."""
    if not spec.declarative:
        return None
    model = spec.llm.model
    if not is_hosted(model):
        return CredentialsVerdict(True, REASON_NOT_NEEDED,
                                  f"model {model} runs offline and needs no credentials")
    missing = sorted(o for o, state in reported.items() if state == "missing")
    if spec.llm.api_key_secret_ref is None:
        return CredentialsVerdict(
            False, REASON_MISSING,
            f"model {model} is hosted but spec.llm.apiKeySecretRef is not set: every job "
            "would fail; reference a Secret key holding the API key")
    if missing:
        return CredentialsVerdict(
            False, REASON_MISSING,
            f"model {model}: replica(s) {_ordinals(missing)} found no API key in "
            f"Secret {spec.llm.api_key_secret_ref.name} (key "
            f"{spec.llm.api_key_secret_ref.key}): every job there would fail")
    present = sorted(o for o, state in reported.items() if state == "present")
    if present:
        return CredentialsVerdict(
            True, REASON_PRESENT,
            f"model {model}: API key present on replica(s) {_ordinals(present)}")
    return CredentialsVerdict(
        None, REASON_NOT_OBSERVED,
        f"model {model}: spec.llm.apiKeySecretRef is set; no replica has reported yet")


def _ordinals(ordinals: Sequence[int]) -> str:
    return ", ".join(str(o) for o in ordinals)
