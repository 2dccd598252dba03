"""Operator metrics (prometheus-client), served on ``--metrics-port``.

Both handler halves record through the ``observe_*`` helpers here so the names stay in one place.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from crewfence_sidecar.contract import EffectSummary

REGISTRY = CollectorRegistry(auto_describe=True)

CREWJOBS = Gauge(
    "crewfence_operator_crewjobs", "CrewJobs seen by this operator, by phase.",
    ["phase"], registry=REGISTRY,
)
UNCERTAIN_OUTCOMES = Counter(
    "crewfence_operator_uncertain_outcomes_total",
    "CrewJobs whose outcome became uncertain, by reason.", ["reason"], registry=REGISTRY,
)
ADMISSION_SECONDS = Histogram(
    "crewfence_operator_admission_seconds",
    "Time from dispatching a CrewJob to the sidecar's admission answer.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
SIDECAR_FAILURES = Counter(
    "crewfence_operator_sidecar_failures_total",
    "Failed sidecar calls, by failure category.", ["category"], registry=REGISTRY,
)
SIDECAR_REQUESTS = Counter(
    "crewfence_operator_sidecar_requests_total",
    "Requests the CrewJob side sent to sidecars, by route (a followed event stream counts "
    "once when it is opened).", ["route"], registry=REGISTRY,
)
FENCED_REPLICAS = Gauge(
    "crewfence_operator_fenced_replicas",
    "Crew replicas fenced because their state claim is mounted by a foreign pod.",
    registry=REGISTRY,
)

_fenced_by_crew: dict[str, int] = {}


def observe_crewjobs_by_phase(counts: Mapping[str, int]) -> None:
    """Set the gauge for every phase given (phases missing from ``counts`` keep their value)."""
    for phase, count in counts.items():
        CREWJOBS.labels(phase=phase).set(count)


def observe_crewjob_phase_change(old: str | None, new: str | None) -> None:
    """Move one CrewJob from ``old`` phase to ``new`` phase (either may be None)."""
    if old:
        CREWJOBS.labels(phase=old).dec()
    if new:
        CREWJOBS.labels(phase=new).inc()


def observe_uncertain_outcome(reason: str) -> None:
    UNCERTAIN_OUTCOMES.labels(reason=reason).inc()


def observe_admission_seconds(seconds: float) -> None:
    ADMISSION_SECONDS.observe(seconds)


def observe_sidecar_failure(category: str) -> None:
    SIDECAR_FAILURES.labels(category=category).inc()


def observe_sidecar_request(route: str) -> None:
    SIDECAR_REQUESTS.labels(route=route).inc()


def observe_fenced_replicas(crew_key: str, fenced: int) -> None:
    """Record how many replicas of one Crew (``ns/name``) are fenced; the gauge is the sum."""
    if fenced:
        _fenced_by_crew[crew_key] = fenced
    else:
        _fenced_by_crew.pop(crew_key, None)
    FENCED_REPLICAS.set(sum(_fenced_by_crew.values()))


ADMISSION_REQUESTS = Counter(
    "crewfence_operator_admission_requests_total",
    "Admission reviews that reached the operator's webhook, by resource (pods that mount no "
    "claim never do: the webhook's matchConditions keep them away).",
    ["resource"], registry=REGISTRY,
)


def observe_admission_request(resource: str) -> None:
    ADMISSION_REQUESTS.labels(resource=resource).inc()


# --- effects of finished CrewJobs, per Crew (from the record's events, crewjob/effects.py) ----
_CREW_LABELS = ["namespace", "crew"]
TOOL_CALLS = Counter(
    "crewfence_operator_tool_calls_total",
    "Tool calls started by finished CrewJobs (tool_call_started events), per Crew.",
    _CREW_LABELS, registry=REGISTRY,
)
TOOL_CALLS_IN_DOUBT = Counter(
    "crewfence_operator_tool_calls_in_doubt_total",
    "Tool calls of finished CrewJobs that started and never finished (in doubt), per Crew.",
    _CREW_LABELS, registry=REGISTRY,
)
MODEL_CALLS = Counter(
    "crewfence_operator_model_calls_total",
    "Model calls made by finished CrewJobs (model_call events), per Crew.",
    _CREW_LABELS, registry=REGISTRY,
)
PROMPT_TOKENS = Counter(
    "crewfence_operator_prompt_tokens_total",
    "Prompt tokens the model reported for finished CrewJobs, per Crew.",
    _CREW_LABELS, registry=REGISTRY,
)
COMPLETION_TOKENS = Counter(
    "crewfence_operator_completion_tokens_total",
    "Completion tokens the model reported for finished CrewJobs, per Crew.",
    _CREW_LABELS, registry=REGISTRY,
)


def observe_job_effects(namespace: str, crew: str, effects: EffectSummary) -> None:
    """Count one finished CrewJob's effects (once: when its terminal status is decided)."""
    labels = {"namespace": namespace, "crew": crew}
    TOOL_CALLS.labels(**labels).inc(effects.tool_calls)
    TOOL_CALLS_IN_DOUBT.labels(**labels).inc(len(effects.in_doubt))
    MODEL_CALLS.labels(**labels).inc(effects.model_calls)
    PROMPT_TOKENS.labels(**labels).inc(effects.prompt_tokens)
    COMPLETION_TOKENS.labels(**labels).inc(effects.completion_tokens)


CREWCRONJOB_TICKS = Counter(
    "crewfence_operator_crewcronjob_ticks_total",
    "CrewCronJob ticks by outcome: run (a child created), skipped (by a policy: Forbid, "
    "Replace, BufferOne, Suspended, Paused) or missed (older than the catch-up window).",
    ["outcome", "reason"], registry=REGISTRY,
)


def observe_crewcronjob_ticks(outcome: str, reason: str, count: int = 1) -> None:
    CREWCRONJOB_TICKS.labels(outcome=outcome, reason=reason).inc(count)


def serve(port: int, addr: str = "0.0.0.0") -> None:  # noqa: S104 - scraped from outside the pod
    """Serve /metrics on a background thread (prometheus-client's own server)."""
    start_http_server(port, addr=addr, registry=REGISTRY)


# --- unresolved uncertain outcomes (computed at scrape time from the watch stream) -----------
class _UnresolvedUncertain:
    """Gauges of CrewJobs whose uncertain outcome nobody has resolved yet.

    Fed by the CrewJob watch (no API calls); the oldest age is computed when scraped, so an
    alert on it needs no writes while a job waits for a person.
    """

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], tuple[str, str, float]] = {}

    def collect(self) -> Iterator[Metric]:
        counts: dict[tuple[str, str, str], int] = {}
        oldest: dict[str, float] = {}
        for (namespace, _name), (crew, reason, since) in self.jobs.items():
            key = (namespace, crew, reason)
            counts[key] = counts.get(key, 0) + 1
            oldest[namespace] = min(since, oldest.get(namespace, since))
        jobs = GaugeMetricFamily(
            "crewfence_operator_unresolved_uncertain_crewjobs",
            "CrewJobs with an uncertain outcome and no accepted resolution.",
            labels=["namespace", "crew", "reason"])
        for (namespace, crew, reason), count in sorted(counts.items()):
            jobs.add_metric([namespace, crew, reason], count)
        yield jobs
        age = GaugeMetricFamily(
            "crewfence_operator_oldest_unresolved_uncertain_seconds",
            "Age of the oldest unresolved uncertain outcome (since it became uncertain).",
            labels=["namespace"])
        now = time.time()
        for namespace, since in sorted(oldest.items()):
            age.add_metric([namespace], max(0.0, now - since))
        yield age


UNRESOLVED_UNCERTAIN = _UnresolvedUncertain()
REGISTRY.register(UNRESOLVED_UNCERTAIN)


def observe_unresolved_uncertain(namespace: str, name: str,
                                 entry: tuple[str, str, float] | None) -> None:
    """Track one CrewJob: ``(crew, reason, since_epoch_seconds)`` while it is uncertain and
    unresolved, None otherwise (resolved, certain, deleted)."""
    if entry is None:
        UNRESOLVED_UNCERTAIN.jobs.pop((namespace, name), None)
    else:
        UNRESOLVED_UNCERTAIN.jobs[(namespace, name)] = entry
