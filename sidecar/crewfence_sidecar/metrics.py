"""Prometheus metrics of one sidecar (own registry, so in-process test servers do not clash)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.context_managers import Timer
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class _OfflineLLMCalls(Collector):
    """crewfence_offline_llm_calls_total, read from the offline LLM when it is loaded."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        module = sys.modules.get("crewfence_sidecar.offline_llm")
        count = module.call_count() if module is not None else 0
        workers = sys.modules.get("crewfence_sidecar.workers.counters")
        count += workers.offline_llm_calls() if workers is not None else 0
        yield CounterMetricFamily("crewfence_offline_llm_calls",
                                  "Calls of the offline LLM crewfence/offline in this process "
                                  "and in its job workers",
                                  value=count)


class SidecarMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.admissions = Counter("crewfence_sidecar_admissions", "Admitted new jobs",
                                  ["operation"], registry=r)
        self.exact_repeats = Counter("crewfence_sidecar_exact_repeats",
                                     "Exact repeats answered with the existing record",
                                     registry=r)
        self.conflicts = Counter("crewfence_sidecar_conflicts",
                                 "Same action id with another request hash (409)", registry=r)
        self.rejections = Counter("crewfence_sidecar_rejections", "Refused requests by code",
                                  ["code"], registry=r)
        self.journal_records = Gauge("crewfence_sidecar_journal_records",
                                     "Records retained in the journal", registry=r)
        self.journal_bytes = Gauge("crewfence_sidecar_journal_bytes",
                                   "Bytes of the journal files", registry=r)
        self.persist_seconds = Histogram(
            "crewfence_sidecar_persist_seconds", "Durable journal transaction latency",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r)
        self.connections = Counter(
            "crewfence_sidecar_connections",
            "Client connections that sent a request (over TLS each began with a full "
            "handshake; a client that keeps its connections alive adds one per connection)",
            registry=r)
        self.active_runs = Gauge("crewfence_sidecar_active_runs", "Jobs executing now",
                                 registry=r)
        self.runs_finished = Counter("crewfence_sidecar_runs_finished",
                                     "Jobs that reached a terminal status",
                                     ["operation", "status"], registry=r)
        self.tool_lists = Counter(
            "crewfence_sidecar_tool_lists",
            "tools/list calls the main process made to MCP servers without allowedTools "
            "(admission's check), by outcome: answered | unanswered", ["outcome"], registry=r)
        r.register(_OfflineLLMCalls())
        self._admitted: dict[str, Counter] = {}

    def admission(self, operation: str) -> None:
        # the labelled child is looked up once per operation: ``labels()`` takes a lock and
        # builds a key tuple, on every admission otherwise
        child = self._admitted.get(operation)
        if child is None:
            child = self._admitted[operation] = self.admissions.labels(operation=operation)
        child.inc()

    def exact_repeat(self) -> None:
        self.exact_repeats.inc()

    def conflict(self) -> None:
        self.conflicts.inc()

    def rejection(self, code: str) -> None:
        self.rejections.labels(code=code).inc()

    def tool_list(self, outcome: str) -> None:
        self.tool_lists.labels(outcome=outcome).inc()

    def finished(self, operation: str, status: str) -> None:
        self.runs_finished.labels(operation=operation, status=status).inc()

    def watch_journal(self, records: Callable[[], int], size: Callable[[], int]) -> None:
        """Read the journal's record count and file bytes when scraped, not on every write
        (two ``stat`` calls per admission and completion otherwise sat on the job's path)."""
        self.journal_records.set_function(records)
        self.journal_bytes.set_function(size)

    def persist_timer(self) -> Timer:
        return self.persist_seconds.time()

    def render(self) -> bytes:
        return generate_latest(self.registry)
