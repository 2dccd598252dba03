"""The ``ModelCredentials`` condition: decided from the Crew spec and the replicas' health."""

from __future__ import annotations

from typing import Any

import pytest
from crewfence_operator.crew.model_credentials import (
    REASON_MISSING,
    REASON_NOT_NEEDED,
    REASON_NOT_OBSERVED,
    REASON_PRESENT,
    decide,
    reported_states,
)
from crewfence_operator.crew.spec import parse_spec
from crewfence_operator.crew.status import CrewObservation, Health, crew_status

AGENTS = {"writer": {"role": "Writer", "goal": "Write about {topic}", "backstory": "Terse."}}
TASKS = [{"name": "write", "agent": "writer", "description": "Write about {topic}",
          "expected_output": "A paragraph"}]
SECRET_REF = {"name": "openai", "key": "api-key"}


def _spec(model: str, ref: dict[str, str] | None = None, declarative: bool = True) -> Any:
    llm: dict[str, Any] = {"model": model}
    if ref is not None:
        llm["apiKeySecretRef"] = ref
    raw: dict[str, Any] = {"llm": llm}
    if declarative:
        raw.update(agents=AGENTS, tasks=TASKS)
    else:
        raw["entrypoint"] = "mycrews:CREWS"
    return parse_spec(raw)


def test_hosted_model_without_secret_ref_is_missing_before_any_replica_answers() -> None:
    verdict = decide(_spec("openai/gpt-4o-mini"), {})
    assert verdict is not None
    assert (verdict.status, verdict.reason) == (False, REASON_MISSING)
    assert "openai/gpt-4o-mini" in verdict.message and "apiKeySecretRef" in verdict.message


def test_a_replica_that_found_no_key_makes_it_missing() -> None:
    verdict = decide(_spec("openai/gpt-4o-mini", SECRET_REF), {0: "present", 1: "missing"})
    assert verdict is not None and (verdict.status, verdict.reason) == (False, REASON_MISSING)
    assert "replica(s) 1" in verdict.message and "Secret openai" in verdict.message


def test_key_present_everywhere() -> None:
    verdict = decide(_spec("anthropic/claude-3-5-haiku", SECRET_REF), {0: "present"})
    assert verdict is not None and (verdict.status, verdict.reason) == (True, REASON_PRESENT)


def test_secret_ref_but_no_report_yet_is_unknown() -> None:
    verdict = decide(_spec("openai/gpt-4o-mini", SECRET_REF), {})
    assert verdict is not None and (verdict.status, verdict.reason) == (None, REASON_NOT_OBSERVED)


@pytest.mark.parametrize("reported", [{}, {0: "not_needed"}])
def test_offline_model_needs_nothing(reported: dict[int, str]) -> None:
    verdict = decide(_spec("crewfence/offline"), reported)
    assert verdict is not None and (verdict.status, verdict.reason) == (True, REASON_NOT_NEEDED)


def test_entrypoint_crew_gets_no_verdict() -> None:
    assert decide(_spec("openai/gpt-4o-mini", declarative=False), {}) is None


def test_reported_states_reads_only_this_crew_and_tolerates_garbage() -> None:
    reports: dict[int, Any] = {
        0: {"research": {"model": "openai/x", "hosted": True, "credentials": "missing"},
            "other": {"credentials": "present"}},
        1: None,
        2: {"research": "not-a-mapping"},
        3: {"other": {"credentials": "missing"}},
    }
    assert reported_states("research", reports) == {0: "missing"}


def test_health_carries_the_report_from_the_wire() -> None:
    body = {"status": "ready", "journal_id": "j",
            "model_credentials": {"research": {"model": "openai/x", "hosted": True,
                                               "credentials": "missing"}, "bad": 3},
            "model_credentials_missing": ["research"]}
    health = Health.from_wire(body)
    assert health.model_credentials == {"research": {"model": "openai/x", "hosted": True,
                                                     "credentials": "missing"}}
    assert Health.from_wire({"status": "ready"}).model_credentials is None


def _status(verdict: Any, previous: list[Any] | None = None, now: str = "T1") -> Any:
    obs = CrewObservation(generation=3, desired_replicas=0, replicas=[], retained_claims=[],
                          previous_conditions=previous or [], credentials=verdict)
    return crew_status(obs, now=now)


def test_status_carries_the_condition_and_never_a_key() -> None:
    verdict = decide(_spec("openai/gpt-4o-mini"), {})
    status = _status(verdict)
    (cond,) = [c for c in status["conditions"] if c["type"] == "ModelCredentials"]
    assert cond["status"] == "False" and cond["reason"] == REASON_MISSING
    assert cond["observedGeneration"] == 3 and cond["lastTransitionTime"] == "T1"
    # Unknown is a valid condition status; the transition time moves when the status flips.
    unknown = _status(decide(_spec("openai/gpt-4o-mini", SECRET_REF), {}),
                      previous=status["conditions"], now="T2")
    (cond2,) = [c for c in unknown["conditions"] if c["type"] == "ModelCredentials"]
    assert cond2["status"] == "Unknown" and cond2["lastTransitionTime"] == "T2"


def test_no_condition_without_verdict() -> None:
    status = _status(None)
    assert "ModelCredentials" not in {c["type"] for c in status["conditions"]}
