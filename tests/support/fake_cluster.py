"""The cluster side of the CrewJob driver for component tests: one Crew, CrewJob statuses
(merge-patched like the API server does), ConfigMaps and Warning events, all in memory.

The sidecars the driver talks to are real HTTP servers (``faulty_sidecar.py``); only the
Kubernetes API is replaced here (the e2e tests use the real one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crewfence_operator.crewjob.machine import MachineSettings
from crewfence_operator.crewjob.output import ConfigMapFit, configmap_fit
from crewfence_operator.handlers.crewjob import merge_status
from crewfence_operator.runtime import RunnerSettings
from crewfence_operator.sidecar_client import Timeouts

FAST_RUNNER = RunnerSettings(
    machine=MachineSettings(retry_seconds=0.05, backoff_base_seconds=0.02,
                            backoff_cap_seconds=0.2, poll_seconds=0.05, settle_seconds=0.6,
                            gone_grace_seconds=0.3, deletion_wait_seconds=3.0,
                            full_retry_seconds=1.0),
    progress_seconds=0.0, idle_follow_seconds=0.02,
    timeouts=Timeouts(connect=0.5, read=0.5, follow_idle=2.0))
"""The driver's timings shrunk for tests against in-memory clusters and fake sidecars."""


@dataclass
class FakeCluster:
    crew: dict[str, Any] | None = None
    token: str | None = "test-token"
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    configmaps: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    claims: set[str] = field(default_factory=set)
    """State claims that exist (read only while the Crew does not serve the assigned one)."""

    async def read_crew(self, namespace: str, crew: str) -> tuple[Mapping[str, Any] | None,
                                                                  str | None]:
        return self.crew, self.token if self.crew is not None else None

    async def patch_status(self, namespace: str, name: str,
                           patch: Mapping[str, Any]) -> Mapping[str, Any] | None:
        self.patches.append((name, dict(patch)))
        self.statuses[name] = merge_status(self.statuses.get(name, {}), patch)
        return self.statuses[name]

    async def create_configmap(self, body: Mapping[str, Any]) -> bool:
        name = body["metadata"]["name"]
        existing = self.configmaps.get(name)
        fit = ConfigMapFit.REPLACE if existing is None else configmap_fit(existing, body)
        if fit is ConfigMapFit.FOREIGN:
            return False
        self.configmaps[name] = body
        return True

    async def endpoint_options(self, namespace: str, crew: str,
                               ordinal: int) -> dict[str, Any]:
        return {}  # plain HTTP: the double speaks no TLS

    async def claim_exists(self, namespace: str, name: str) -> bool | None:
        return name in self.claims

    def warn(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        self.warnings.append((reason, message))


def replica_entry(ordinal: int, address: str | None, journal_id: str | None, *,
                  ready: bool = True, state: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"ordinal": ordinal, "pod": f"research-{ordinal}",
                             "claim": f"state-research-{ordinal}", "ready": ready,
                             "fenced": False}
    if address:
        entry["address"] = address
    if journal_id:
        entry["journalId"] = journal_id
    if state:
        entry["state"] = state
    return entry


def crew_obj(*entries: dict[str, Any], desired: int | None = None,
             retained: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "research", "namespace": "team-a"},
            "spec": {"replicas": desired if desired is not None else len(entries)},
            "status": {"replicas": list(entries), "retainedClaims": retained or []}}


def crewjob_body(name: str = "job-1", *, cancel: bool = False, policy: str = "Cancel",
                 uid: str | None = None, status: dict[str, Any] | None = None,
                 ) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a", "uid": uid or f"uid-{name}",
                         "generation": 1},
            "spec": {"crewRef": {"name": "research"}, "operation": "run",
                     "input": {"topic": "x"}, "cancel": cancel, "deletionPolicy": policy},
            "status": status or {}}
