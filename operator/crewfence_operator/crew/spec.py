"""The Crew spec as a typed value, with the CRD's defaults applied (kmock applies none)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crewfence_sidecar.config import BOUNDS
from crewfence_sidecar.contract import Operation

from crewfence_operator.crew.tools import ToolsSpec, parse_tools, unknown_agent_tools

ALL_OPERATIONS: tuple[str, ...] = tuple(op.value for op in Operation)
SINGLE_WRITER_MODES: frozenset[str] = frozenset({"ReadWriteOncePod", "ReadWriteOnce"})
SHARED_MODES: frozenset[str] = frozenset({"ReadWriteMany", "ReadOnlyMany"})
CLAIM_POLICIES: frozenset[str] = frozenset({"Retain", "Delete"})
_DURATION = re.compile(r"^(?:[0-9]+(?:d|h|m|s))+$")
_DURATION_PART = re.compile(r"([0-9]+)(d|h|m|s)")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


class SpecError(ValueError):
    """A Crew spec the operator cannot act on (the CRD schema should have caught it)."""


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class LLMSpec:
    model: str = "crewfence/offline"
    api_key_secret_ref: SecretKeyRef | None = None
    base_url: str | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class StorageSpec:
    size: str = "1Gi"
    storage_class_name: str | None = None
    access_mode: str = "ReadWriteOncePod"
    existing_claim: str | None = None
    when_scaled: str = "Retain"
    """What happens to a drained replica's claim once its journal holds no unarchived record:
    ``Retain`` (default) keeps it, ``Delete`` deletes it (like a StatefulSet's
    ``persistentVolumeClaimRetentionPolicy.whenScaled``)."""


@dataclass(frozen=True)
class WorkerLimits:
    """``spec.workerLimits``: setrlimit limits of each job's worker process."""

    memory_mib: int | None = None
    cpu_seconds: int | None = None
    max_jobs: int | None = None
    """Jobs one worker may run one after the other (the sidecar's default when None)."""
    nice: int | None = None
    """Nice levels each worker runs below the sidecar (the sidecar's default when None)."""
    spares: int | None = None
    """Idle workers forked ahead and warmed up (the sidecar's default when None)."""
    max_rss_mib: int | None = None
    """Resident memory at which a worker exits after its job instead of taking another."""


@dataclass(frozen=True)
class JournalBounds:
    max_retained_runs: int | None = None
    max_events_per_run: int | None = None
    max_event_bytes: int | None = None
    max_state_bytes: int | None = None
    max_concurrency: int | None = None
    resume_material: bool | None = None
    """``journal.resumeMaterial``: the sidecar journals resume material (full task outputs and
    tool results, bounded) so a CrewJob can be resumed (``spec.resume``)."""
    retention_seconds: int | None = None
    """``journal.retention``: terminal records older than this are archived on a schedule."""
    tombstone_retention_seconds: int | None = None
    """``journal.tombstoneRetention``: how long a tombstone keeps refusing to run its action
    again; None (the default): never expires."""


def parse_duration(text: str) -> int:
    """Seconds in a duration such as ``30s``, ``90m``, ``12h``, ``7d`` or ``1h30m``."""
    value = text.strip()
    if not _DURATION.match(value):
        raise SpecError(f"duration {text!r} is not like 30s, 90m, 12h, 7d or 1h30m")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))


@dataclass(frozen=True)
class KnowledgeSource:
    name: str
    content: str


@dataclass(frozen=True)
class CrewSpec:
    replicas: int = 1
    operations: tuple[str, ...] = ("run",)
    llm: LLMSpec = field(default_factory=LLMSpec)
    process: str = "sequential"
    agents: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tasks: tuple[Mapping[str, Any], ...] = ()
    knowledge: tuple[KnowledgeSource, ...] = ()
    entrypoint: str | None = None
    image: str | None = None
    image_pull_policy: str | None = None
    storage: StorageSpec = field(default_factory=StorageSpec)
    resources: Mapping[str, Any] = field(default_factory=dict)
    journal: JournalBounds = field(default_factory=JournalBounds)
    service_account_name: str | None = None
    worker_limits: WorkerLimits = field(default_factory=WorkerLimits)
    tools: ToolsSpec = field(default_factory=ToolsSpec)
    """``spec.tools``: MCP servers and Python tools (``crew/tools.py``)."""

    @property
    def declarative(self) -> bool:
        return bool(self.agents) and bool(self.tasks)

    @property
    def train_enabled(self) -> bool:
        return "train" in self.operations


def _opt_int(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    return None if value is None else int(value)


def misplaced_context(tasks: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a task's ``context`` would make the sidecar refuse the crew (None: it would not).

    CrewAI passes on only the outputs of tasks that already ran, so a context names EARLIER
    tasks. The API server's CEL budget cannot afford this check over 64 tasks; the operator
    makes it, and a refused spec reaches the Crew's status (Ready=False, naming the field)
    instead of a pod that would crash-loop.
    """
    seen: set[str] = set()
    for index, task in enumerate(tasks):
        for name in task.get("context") or ():
            if name not in seen:
                where = ("the task itself" if name == task.get("name")
                         else "a later task" if any(t.get("name") == name for t in tasks)
                         else "no task of spec.tasks")
                return (f"spec.tasks[{index}].context names {name!r}, which is {where}: a "
                        "context must name EARLIER tasks")
        seen.add(str(task.get("name")))
    return None


def parse_spec(raw: Mapping[str, Any] | None) -> CrewSpec:
    """Build a CrewSpec from ``.spec``; raises SpecError for what the schema should prevent."""
    raw = raw or {}
    ops = tuple(dict.fromkeys(str(o) for o in (raw.get("operations") or ["run"])))
    unknown = [o for o in ops if o not in ALL_OPERATIONS]
    if unknown:
        raise SpecError(f"unknown operations {unknown}; allowed: {list(ALL_OPERATIONS)}")

    llm_raw = raw.get("llm") or {}
    ref_raw = llm_raw.get("apiKeySecretRef")
    llm = LLMSpec(
        model=str(llm_raw.get("model") or "crewfence/offline"),
        api_key_secret_ref=(
            SecretKeyRef(name=str(ref_raw["name"]), key=str(ref_raw.get("key") or "api-key"))
            if ref_raw else None
        ),
        base_url=llm_raw.get("baseUrl"),
        temperature=llm_raw.get("temperature"),
    )

    st_raw = raw.get("storage") or {}
    storage = StorageSpec(
        size=str(st_raw.get("size") or "1Gi"),
        storage_class_name=st_raw.get("storageClassName"),
        access_mode=str(st_raw.get("accessMode") or "ReadWriteOncePod"),
        existing_claim=st_raw.get("existingClaim"),
        when_scaled=str(st_raw.get("whenScaled") or "Retain"),
    )
    if storage.when_scaled not in CLAIM_POLICIES:
        raise SpecError(f"storage.whenScaled {storage.when_scaled} must be Retain or Delete")
    if storage.access_mode not in SINGLE_WRITER_MODES:
        raise SpecError(
            f"storage.accessMode {storage.access_mode} would share the journal; "
            f"use ReadWriteOncePod or ReadWriteOnce"
        )

    j_raw = raw.get("journal") or {}
    journal = JournalBounds(
        max_retained_runs=_opt_int(j_raw, "maxRetainedRuns"),
        max_events_per_run=_opt_int(j_raw, "maxEventsPerRun"),
        max_event_bytes=_opt_int(j_raw, "maxEventBytes"),
        max_state_bytes=_opt_int(j_raw, "maxStateBytes"),
        max_concurrency=_opt_int(j_raw, "maxConcurrency"),
        resume_material=(None if j_raw.get("resumeMaterial") is None
                         else bool(j_raw.get("resumeMaterial"))),
        retention_seconds=(parse_duration(str(j_raw["retention"]))
                           if j_raw.get("retention") else None),
        tombstone_retention_seconds=(parse_duration(str(j_raw["tombstoneRetention"]))
                                     if j_raw.get("tombstoneRetention") else None),
    )
    tombstone_bound = BOUNDS["tombstone_retention_seconds"]
    if journal.tombstone_retention_seconds is not None and \
            journal.tombstone_retention_seconds < 1:
        raise SpecError("journal.tombstoneRetention must be at least one second")
    if (journal.tombstone_retention_seconds or 0) > tombstone_bound.maximum:
        # The sidecar refuses a longer window at start (a crash loop): name the field here.
        raise SpecError(f"journal.tombstoneRetention must be at most "
                        f"{tombstone_bound.maximum // 86400}d (leave it unset: never expire)")
    if journal.retention_seconds is not None and journal.retention_seconds < 1:
        raise SpecError("journal.retention must be at least one second")
    knowledge = tuple(
        KnowledgeSource(name=str(k.get("name") or f"source-{i}"), content=str(k["content"]))
        for i, k in enumerate(raw.get("knowledge") or [])
    )
    replicas = int(raw.get("replicas", 1))
    if storage.existing_claim and replicas > 1:
        raise SpecError("storage.existingClaim serves one replica only; set replicas to 0 or 1")
    w_raw = raw.get("workerLimits") or {}
    worker_limits = WorkerLimits(memory_mib=_opt_int(w_raw, "memoryMiB"),
                                 cpu_seconds=_opt_int(w_raw, "cpuSeconds"),
                                 max_jobs=_opt_int(w_raw, "maxJobs"),
                                 nice=_opt_int(w_raw, "nice"),
                                 spares=_opt_int(w_raw, "spares"),
                                 max_rss_mib=_opt_int(w_raw, "maxRssMiB"))
    try:
        tools = parse_tools(raw.get("tools"))
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"spec.tools is malformed: {exc}") from None
    agents = dict(raw.get("agents") or {})
    unresolved = unknown_agent_tools(tools, agents)
    if unresolved:
        named = "; ".join(f"agent {a} names {', '.join(t)}" for a, t in sorted(unresolved.items()))
        raise SpecError(f"unknown tool(s): {named}")
    tasks = tuple(raw.get("tasks") or ())
    context_error = misplaced_context(tasks)
    if context_error:
        raise SpecError(context_error)
    return CrewSpec(
        tools=tools,
        worker_limits=worker_limits,
        replicas=replicas,
        operations=ops,
        llm=llm,
        process=str(raw.get("process") or "sequential"),
        agents=agents,
        tasks=tasks,
        knowledge=knowledge,
        entrypoint=raw.get("entrypoint"),
        image=raw.get("image"),
        image_pull_policy=raw.get("imagePullPolicy"),
        storage=storage,
        resources=dict(raw.get("resources") or {}),
        journal=journal,
        service_account_name=raw.get("serviceAccountName"),
    )
