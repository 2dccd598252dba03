"""The per-operator state of the CrewJob handlers (kopf ``memo``): one :class:`Runtime`.

Both CrewJob handler modules use it: ``handlers/crewjob.py`` (the daemon driving each job) and
``handlers/resolution.py`` (the resolution journaling, over the same HTTP session). It lives
here, outside ``handlers/``, so that neither handler module imports the other. It holds the
cluster side as the driver needs it (:class:`ClusterIO`, the real one :class:`KubeIO`), the
runner's settings, and the admission gate (``spec.supersedes``, ``supersedes_gate.py``).

Invariant: one Runtime per operator process, never module globals: ``runtime_of`` puts it in
the operator-wide memo the first time, so every object's copy of the memo shares it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import kopf
from kubernetes.client.exceptions import ApiException

from crewfence_operator import config, kube
from crewfence_operator import constants as c
from crewfence_operator.crewjob.machine import Gate, Hold, MachineSettings, Memory
from crewfence_operator.crewjob.output import ConfigMapFit, configmap_fit
from crewfence_operator.sidecar_client import Timeouts
from crewfence_operator.supersedes_gate import admission_gate
from crewfence_operator.transport import cert_source
from crewfence_operator.transport.token_roll import sending_token
from crewfence_operator.workloads import hold as workload_hold

MEMO_KEY = "crewjob_runtime"


@dataclass(frozen=True)
class RunnerSettings:
    machine: MachineSettings = field(default_factory=MachineSettings)
    progress_seconds: float = 30.0
    """At most one progress write (eventCursor, progress) per this many seconds."""
    crew_cache_seconds: float = 1.0
    """Many CrewJobs of one Crew start together: one read of the Crew and its token serves
    them all for a moment (the machine checks replicas and journal ids again later)."""
    idle_follow_seconds: float = 1.0
    """A stream that closed without news is not reopened sooner than this (no spinning)."""
    timeouts: Timeouts = field(default_factory=Timeouts)



# --- the cluster side, as the driver needs it (a fake in tests) ----------------------------------
class ClusterIO(Protocol):
    async def read_crew(self, namespace: str, crew: str) -> tuple[Mapping[str, Any] | None,
                                                                  str | None]: ...

    async def patch_status(self, namespace: str, name: str,
                           patch: Mapping[str, Any]) -> Mapping[str, Any] | None: ...
    """Merge-patch the status; the status as written (None when the API gave none back)."""

    async def create_configmap(self, body: Mapping[str, Any]) -> bool: ...
    """Store the output ConfigMap (``crewjob/output.configmap_fit``); False when a foreign
    ConfigMap of that name exists (left alone)."""

    async def endpoint_options(self, namespace: str, crew: str,
                               ordinal: int) -> dict[str, Any]: ...
    """Extra ``Endpoint`` arguments (HTTPS context and the replica name to verify)."""

    def warn(self, body: Mapping[str, Any], reason: str, message: str) -> None: ...

    async def claim_exists(self, namespace: str, name: str) -> bool | None: ...
    """Whether a PersistentVolumeClaim exists; None when the API could not tell."""


class ObjectGone(Exception):
    """The CrewJob disappeared while we worked on it."""


def _store_configmap(body: dict[str, Any]) -> bool:
    """Create the output ConfigMap, or take over an earlier one (see ``configmap_fit``)."""
    meta = body["metadata"]
    for _ in range(5):  # each turn is a create or a guarded replace that lost a race
        if kube.create_if_absent(body):
            return True
        existing = kube.get_configmap(meta["namespace"], meta["name"])
        if existing is None:
            continue  # garbage-collected between the two calls
        fit = configmap_fit(existing, body)
        if fit is ConfigMapFit.OURS:
            return True
        if fit is ConfigMapFit.FOREIGN:
            return False
        version = (existing.get("metadata") or {}).get("resourceVersion")
        if version and kube.replace_configmap(body, str(version)):
            return True
    raise kopf.TemporaryError(f"ConfigMap {meta['name']} kept changing under us", delay=1)


class KubeIO:
    """The real cluster: blocking client calls in threads, a short per-Crew cache."""

    def __init__(self, cache_seconds: float = 1.0) -> None:
        self.cache_seconds = cache_seconds
        self._cache: dict[tuple[str, str], tuple[float, Mapping[str, Any] | None, str | None]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def read_crew(self, namespace: str, crew: str) -> tuple[Mapping[str, Any] | None,
                                                                  str | None]:
        key = (namespace, crew)
        async with self._locks.setdefault(key, asyncio.Lock()):
            cached = self._cache.get(key)
            if cached is not None and cached[0] > time.monotonic():
                return cached[1], cached[2]
            obj = await asyncio.to_thread(kube.get_crew, namespace, crew)
            token = None
            if obj is not None:
                token = await asyncio.to_thread(kube.read_secret_value, namespace,
                                                c.token_secret_name(crew), c.TOKEN_SECRET_KEY)
                # During a token roll the Secret holds two lines: send the first one.
                token = sending_token(token)
            self._cache[key] = (time.monotonic() + self.cache_seconds, obj, token)
            return obj, token

    async def patch_status(self, namespace: str, name: str,
                           patch: Mapping[str, Any]) -> Mapping[str, Any] | None:
        try:
            obj = await asyncio.to_thread(kube.patch_crewjob_status, namespace, name,
                                          {"status": dict(patch)})
        except ApiException as exc:
            if exc.status == 404:
                raise ObjectGone(name) from None
            raise
        return (obj or {}).get("status") if isinstance(obj, Mapping) else None

    async def create_configmap(self, body: Mapping[str, Any]) -> bool:
        return await asyncio.to_thread(_store_configmap, dict(body))

    async def claim_exists(self, namespace: str, name: str) -> bool | None:
        try:
            return await asyncio.to_thread(kube.get_claim, namespace, name) is not None
        except ApiException:
            return None

    async def endpoint_options(self, namespace: str, crew: str,
                               ordinal: int) -> dict[str, Any]:
        options = await cert_source.endpoint_options_for(config.current(), namespace, crew)
        return options(ordinal)

    def warn(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        kopf.warn(body, reason=reason, message=message)  # type: ignore[arg-type]


# --- per-operator state (kopf memo) --------------------------------------------------------------
@dataclass
class Runtime:
    settings: RunnerSettings = field(default_factory=RunnerSettings)
    io: ClusterIO = field(default_factory=KubeIO)
    memories: dict[str, Memory] = field(default_factory=dict)
    """The sidecar's last answers per CrewJob uid (kept across a deletion stop)."""
    daemon_uids: set[str] = field(default_factory=set)
    phases: dict[tuple[str, str], str] = field(default_factory=dict)
    gate: Callable[[Mapping[str, Any], Runtime], Awaitable[Gate]] | None = None
    """The admission gate (``spec.supersedes``): the one place it plugs in."""
    resolution_locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    """One resolution step at a time per CrewJob (its event and its retry timer); a lock
    exists only for a CrewJob that had a resolution step, and goes when the CrewJob does."""
    hold: Callable[[Mapping[str, Any], Mapping[str, Any]], Awaitable[Hold]] | None = None
    """The machine's Hold input (``spec.suspend``, a Kueue Workload): ``workloads.hold``."""
    evictions: dict[str, str] = field(default_factory=dict)
    """CrewJob uid -> eviction message, from the Workload watch (``handlers/kueue.py``)."""
    finished_workloads: set[str] = field(default_factory=set)
    """CrewJob uids whose Workload this process marked Finished (``handlers/kueue.py``)."""
    ttl_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """CrewJob uid -> its sleeping TTL deletion (``handlers/ttl.py``)."""
    wakers: dict[str, asyncio.Event] = field(default_factory=dict)
    """CrewJob uid -> the event its driver waits on (set by a watch event of the CrewJob or
    an eviction): a waiting driver costs nothing until then (see ``JobDriver.pause``)."""
    _session: aiohttp.ClientSession | None = None

    def resolution_lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self.resolution_locks.setdefault((namespace, name), asyncio.Lock())

    def wake(self, uid: str) -> None:
        """Something about this CrewJob changed (its object, an eviction): its driver looks."""
        waker = self.wakers.get(uid)
        if waker is not None:
            waker.set()

    def forget_resolution_lock(self, namespace: str, name: str) -> None:
        """The CrewJob is gone: its lock goes too (the locks never outnumber the CrewJobs
        that had a resolution step)."""
        lock = self.resolution_locks.get((namespace, name))
        if lock is not None and not lock.locked():
            del self.resolution_locks[(namespace, name)]

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=0))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def runtime_of(memo: Any) -> Runtime:
    rt = memo.get(MEMO_KEY) if isinstance(memo, Mapping) else getattr(memo, MEMO_KEY, None)
    if rt is None:
        rt = Runtime(gate=admission_gate, hold=workload_hold)
        memo[MEMO_KEY] = rt
    return rt




async def read_crew_and_token(namespace: str, crew: str) -> tuple[Mapping[str, Any] | None,
                                                                  str | None]:
    """The Crew and its token, uncached (for handlers outside the CrewJob daemon)."""
    return await KubeIO(cache_seconds=0.0).read_crew(namespace, crew)

