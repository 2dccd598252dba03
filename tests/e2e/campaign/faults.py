"""The campaign's hands: each schedule operation carried out against a live cluster (kubectl as
a user would, ``kubectl crewfence`` through kubectl's plugin lookup, signals to container
processes through the pod runner, the operator handle), with every observation recorded in
the ``History``.

Invariant: the campaign never reads operator internals; what the checker sees is what a user
could see (objects, Events, /metrics, the sidecar's API) plus the offline LLM's ledger.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from crewfence_operator.kubectl.rerun import successor_name
from crewjob_support import SidecarAccess, crew_access, crewjob_manifest, research_crew
from harness import controlplane
from harness.handles import Cluster, Operator, PodRunner
from plugin_support import kubectl_plugin

from campaign.history import EventSample, History, JobSample, OpRecord, RecordSample
from campaign.schedule import Op

CREW = "research"
GATE_WAIT_PREFIX = "Predecessor"
RECORD_PROBES = 4
"""How many times a certain verdict's record is read (until seen terminal) after it."""
GAUGE = "crewfence_operator_unresolved_uncertain_crewjobs"


class Skip(Exception):
    """The operation had no eligible target (recorded as ``skipped``)."""


@dataclass
class Campaign:
    cluster: Cluster
    runner: PodRunner
    operator: Operator
    namespace: str
    plugin: Path
    seed: int
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    history: History = field(init=False)
    crew: dict[str, Any] = field(init=False)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    last: dict[str, JobSample] = field(default_factory=dict)
    stopped: dict[int, threading.Timer] = field(default_factory=dict)
    probes: dict[str, int] = field(default_factory=dict)
    _access: SidecarAccess | None = None
    _t0: float = field(default_factory=time.monotonic)
    _serial: int = 0

    def __post_init__(self) -> None:
        self.history = History(self.seed, self.namespace)
        self.crew = research_crew(2)
        self.crew["spec"].setdefault("journal", {})

    # --- plumbing -----------------------------------------------------------------------------
    def now(self) -> float:
        return round(time.monotonic() - self._t0, 2)

    def kubectl(self, *args: str, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, "-n", self.namespace, input=input, timeout=timeout)

    def _apply(self, obj: dict[str, Any]) -> str:
        result = self.kubectl("apply", "-f", "-", input=json.dumps(obj))
        return "done" if result.returncode == 0 else f"rejected: {_first_line(result.stderr)}"

    def replicas(self) -> list[dict[str, Any]]:
        obj = self.cluster.get_json("crew", CREW, "-n", self.namespace) or {}
        return list((obj.get("status") or {}).get("replicas") or [])

    def access(self) -> SidecarAccess:
        if self._access is None:
            self._access = crew_access(self.cluster, self.namespace, CREW)
        return self._access

    # --- setup and the run --------------------------------------------------------------------
    def setup(self, ready: Callable[[], object]) -> None:
        result = self._apply(self.crew)
        assert result == "done", result
        ready()

    def run(self, ops: list[Op], on_op: Callable[[OpRecord], None] | None = None) -> None:
        for op in ops:
            try:
                target, outcome = self.do(op)
            except Skip as why:
                target, outcome = "", f"skipped: {why}"
            except (AssertionError, subprocess.SubprocessError, OSError) as exc:
                target, outcome = "", f"error: {_first_line(str(exc))}"
            record = OpRecord(self.now(), op, outcome, target)
            self.history.ops.append(record)
            if on_op is not None:
                on_op(record)
            self.observe()
            time.sleep(op.gap)  # the schedule's pace: time for the jobs to move

    def do(self, op: Op) -> tuple[str, str]:
        handler: Callable[[Op], tuple[str, str]] = getattr(self, f"op_{op.kind}")
        return handler(op)

    # --- observations -------------------------------------------------------------------------
    def observe(self) -> list[JobSample]:
        listing = self.cluster.get_json("crewjobs", "-n", self.namespace) or {}
        t = self.now()
        samples = [JobSample.from_object(t, obj) for obj in listing.get("items") or []]
        self.history.jobs.extend(samples)
        self.last = {s.name: s for s in samples}
        self._probe_records(samples)
        return samples

    def _probe_records(self, samples: list[JobSample]) -> None:
        """Read the record of every certain verdict a few times after it was sampled."""
        wanted = [s for s in samples if s.terminal and not s.uncertain and s.ordinal is not None
                  and self.probes.get(s.uid, 0) < RECORD_PROBES]
        if not wanted:
            return
        by_ordinal = {int(r["ordinal"]): r for r in self.replicas() if r.get("address")}
        for job in wanted:
            rep = by_ordinal.get(int(job.ordinal or 0))
            if rep is None:
                continue
            self.probes[job.uid] = self.probes.get(job.uid, 0) + 1
            try:
                code, text = self.access().request(
                    rep, f"/jobs/{quote(job.action_id, safe='')}", timeout=3)
            except (OSError, ValueError):
                self._access = None
                continue
            status = {404: "absent", 410: "archived"}.get(code, "")
            if code == 200:
                status = str(json.loads(text).get("status"))
            if status:
                self.history.records.append(
                    RecordSample(self.now(), job.action_id, int(job.ordinal or 0), status))
                if status != "running":
                    self.probes[job.uid] = RECORD_PROBES

    def _pending(self) -> list[JobSample]:
        return [s for s in self.last.values() if not s.terminal
                and not (s.phase == "Pending" and s.reason.startswith(GATE_WAIT_PREFIX))]

    def settle(self, timeout: float) -> None:
        """Undo what is still in force (stopped containers, a dead operator, a missing Crew),
        then observe until every job is terminal or waits at its gate, at most ``timeout``."""
        for pgid, timer in list(self.stopped.items()):
            timer.cancel()
            self._cont(pgid)
        if not self.operator.alive():
            self.operator.start()
        if self.cluster.get_json("crew", CREW, "-n", self.namespace) is None:
            self._apply(self.crew)
        deadline = time.monotonic() + timeout
        while True:
            self.observe()
            if not self._pending():
                break
            if time.monotonic() > deadline:
                self.history.settled = False
                break
            time.sleep(2)

    def final(self, gauge_timeout: float = 45) -> History:
        """The final observations: objects, Events, the gauge (until it agrees with the
        objects or ``gauge_timeout`` passed: the operator's watch may lag), the ledger."""
        h = self.history
        deadline = time.monotonic() + gauge_timeout
        while True:
            listing = self.cluster.get_json("crewjobs", "-n", self.namespace) or {}
            t = self.now()
            h.final_jobs = [JobSample.from_object(t, o) for o in listing.get("items") or []]
            h.unresolved_gauge = self._gauge()
            unresolved = sum(j.uncertain and not j.resolution for j in h.final_jobs)
            if sum(h.unresolved_gauge.values()) == unresolved or time.monotonic() > deadline:
                break
            time.sleep(2)
        events = self.cluster.get_json("events", "-n", self.namespace) or {}
        h.events = [EventSample(str((e.get("involvedObject") or {}).get("uid", "")),
                                str((e.get("involvedObject") or {}).get("name", "")),
                                str(e.get("type", "")), str(e.get("reason", "")))
                    for e in events.get("items") or []]
        marker = f"cf{self.run_id}-"
        path = controlplane.offline_llm_ledger(self.cluster.info)
        lines = path.read_text().splitlines() if path.exists() else []
        h.ledger = [task for task in (str(json.loads(x).get("task", "")) for x in lines if x)
                    if marker in task]
        return h

    def _gauge(self) -> dict[str, float]:
        try:
            with urllib.request.urlopen(self.operator.metrics_url, timeout=10) as resp:
                text = resp.read().decode()
        except OSError:
            return {"<unreachable>": -1.0}
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(rf"^{GAUGE}\{{([^}}]*)\}}\s+(\S+)$", line)
            if m and f'namespace="{self.namespace}"' in m.group(1):
                reason = re.search(r'reason="([^"]*)"', m.group(1))
                key = reason.group(1) if reason else ""
                out[key] = out.get(key, 0.0) + float(m.group(2))
        return out

    # --- choosing targets ---------------------------------------------------------------------
    def _choose(self, names: list[str], pick: int, why: str) -> str:
        if not names:
            raise Skip(why)
        return sorted(names)[pick % len(names)]

    def _uncertain(self, resolved: bool | None = None) -> list[str]:
        return [s.name for s in self.last.values() if s.uncertain and s.terminal
                and (resolved is None or bool(s.resolution) == resolved)]

    # --- job operations -----------------------------------------------------------------------
    def _new_job(self, name: str, token: str, sleep: int, policy: str,
                 supersedes: str = "") -> dict[str, Any]:
        spec: dict[str, Any] = {"deletionPolicy": policy}
        if supersedes:
            spec["supersedes"] = supersedes
        manifest = crewjob_manifest(name, "run", {"topic": f"[[sleep:{sleep}]] {token} campaign"},
                                    **spec)
        self.manifests[name] = manifest
        self.history.tokens[name] = token
        return manifest

    def op_apply(self, op: Op) -> tuple[str, str]:
        self._serial += 1
        name = f"j{self._serial:03d}"
        manifest = self._new_job(name, f"cf{self.run_id}-{name}", op.sleep, op.policy)
        return name, self._apply(manifest)

    def op_reapply(self, op: Op) -> tuple[str, str]:
        name = self._choose(list(self.manifests), op.pick, "no job yet")
        return name, self._apply(self.manifests[name])

    def op_cancel(self, op: Op) -> tuple[str, str]:
        name = self._choose([s.name for s in self.last.values() if not s.terminal], op.pick,
                            "nothing in flight")
        self.manifests[name]["spec"]["cancel"] = True
        result = self.kubectl("patch", "crewjob", name, "--type=merge",
                              "-p", json.dumps({"spec": {"cancel": True}}))
        return name, "done" if result.returncode == 0 else f"rejected: {_first_line(result.stderr)}"

    def op_delete(self, op: Op) -> tuple[str, str]:
        name = self._choose(list(self.last), op.pick, "no job exists")
        result = self.kubectl("delete", "crewjob", name, "--wait=false")
        return name, "done" if result.returncode == 0 else f"rejected: {_first_line(result.stderr)}"

    def op_delete_reapply(self, op: Op) -> tuple[str, str]:
        name = self._choose(list(self.last), op.pick, "no job exists")
        resolution = self.last[name].resolution
        result = self.kubectl("delete", "crewjob", name, "--wait=true", "--timeout=60s",
                              timeout=90)
        if result.returncode != 0:
            return name, f"rejected: {_first_line(result.stderr)}"
        manifest = copy.deepcopy(self.manifests[name])
        if op.with_cancel:
            manifest["spec"]["cancel"] = True
        if op.with_resolution and resolution:
            manifest["spec"]["resolution"] = {"outcome": resolution, "note": "campaign re-apply"}
        tags = "+cancel" * op.with_cancel + "+resolution" * bool(op.with_resolution and resolution)
        return name + tags, self._apply(manifest)

    def op_resolve(self, op: Op) -> tuple[str, str]:
        name = self._choose(self._uncertain(resolved=False), op.pick, "nothing to resolve")
        flag = {"Happened": "--happened", "NotHappened": "--not-happened",
                "Compensated": "--compensated"}[op.outcome]
        result = kubectl_plugin(self.cluster, self.plugin, "resolve", name, "-n",
                                self.namespace, flag, "--note", "fault campaign",
                                "--timeout", "20")
        outcome = "done" if result.returncode == 0 else \
            f"rejected: {_first_line(result.stderr or result.stdout)}"
        return f"{name}={op.outcome}", outcome

    def op_rerun(self, op: Op) -> tuple[str, str]:
        name = self._choose(self._uncertain(), op.pick, "nothing uncertain")
        successor = successor_name(name)
        result = kubectl_plugin(self.cluster, self.plugin, "rerun", name, "-n", self.namespace)
        if result.returncode == 0:
            manifest = copy.deepcopy(self.manifests[name])
            manifest["metadata"]["name"] = successor
            manifest["spec"].pop("cancel", None)
            manifest["spec"].pop("resolution", None)
            manifest["spec"]["supersedes"] = name
            self.manifests[successor] = manifest
            self.history.tokens[successor] = self.history.tokens[name]
            return f"{name}->{successor}", "done"
        return f"{name}->{successor}", f"rejected: {_first_line(result.stderr or result.stdout)}"

    def op_successor(self, op: Op) -> tuple[str, str]:
        pred = self._choose(self._uncertain(), op.pick, "nothing uncertain")
        self._serial += 1
        name = f"{pred}-alt{self._serial:03d}"
        manifest = self._new_job(name, f"cf{self.run_id}-{name}", 1, "Cancel", supersedes=pred)
        return f"{pred}->{name}", self._apply(manifest)

    # --- faults -------------------------------------------------------------------------------
    def _patch_crew(self, spec: dict[str, Any]) -> str:
        result = self.kubectl("patch", "crew", CREW, "--type=merge",
                              "-p", json.dumps({"spec": spec}))
        return "done" if result.returncode == 0 else f"rejected: {_first_line(result.stderr)}"

    def op_scale(self, op: Op) -> tuple[str, str]:
        self.crew["spec"]["replicas"] = op.replicas
        return str(op.replicas), self._patch_crew({"replicas": op.replicas})

    def op_retention(self, op: Op) -> tuple[str, str]:
        journal = self.crew["spec"]["journal"]
        if op.retention:
            journal["retention"] = op.retention
        else:
            journal.pop("retention", None)
        return op.retention or "off", self._patch_crew({"journal": {"retention":
                                                                    op.retention or None}})

    def op_operator_kill(self, op: Op) -> tuple[str, str]:
        if not self.operator.alive():
            self.operator.start()
        self.operator.kill()
        time.sleep(op.sleep)  # the operator stays down this long (the fault), not a wait
        self.operator.start()
        return f"down {op.sleep}s", "done"

    def _pod(self, op: Op) -> tuple[str, int]:
        pods = [r for r in self.replicas() if r.get("pod")]
        pod = self._choose([str(r["pod"]) for r in pods], op.pick, "no replica pod")
        pid = self.runner.pid(self.namespace, pod)
        if pid is None:
            raise Skip(f"{pod} is not running")
        return pod, pid

    def op_sidecar_kill(self, op: Op) -> tuple[str, str]:
        pod, pid = self._pod(op)
        os.kill(pid, signal.SIGKILL)
        return pod, "done"

    def op_pod_delete(self, op: Op) -> tuple[str, str]:
        pods = [str(r["pod"]) for r in self.replicas() if r.get("pod")]
        pod = self._choose(pods, op.pick, "no replica pod")
        result = self.kubectl("delete", "pod", pod, "--force", "--grace-period=0")
        return pod, "done" if result.returncode == 0 else f"rejected: {_first_line(result.stderr)}"

    def _cont(self, pgid: int) -> None:
        self.stopped.pop(pgid, None)
        try:
            os.killpg(pgid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def op_sigstop(self, op: Op) -> tuple[str, str]:
        pod, pid = self._pod(op)
        if pid in self.stopped:
            raise Skip(f"{pod} is already stopped")
        os.killpg(pid, signal.SIGSTOP)  # the container's process group (its own session)
        timer = threading.Timer(op.sleep, self._cont, (pid,))
        timer.daemon = True
        self.stopped[pid] = timer
        timer.start()
        return f"{pod} for {op.sleep}s", "done"

    def op_crew_orphan(self, op: Op) -> tuple[str, str]:
        result = self.kubectl("delete", "crew", CREW, "--cascade=orphan", "--wait=true",
                              "--timeout=60s", timeout=90)
        if result.returncode != 0:
            return CREW, f"rejected: {_first_line(result.stderr)}"
        return CREW, self._apply(self.crew)

    def op_pause(self, op: Op) -> tuple[str, str]:
        time.sleep(op.sleep)  # let the jobs run this long: the pause is the operation
        return f"{op.sleep}s", "done"


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0][:200] if text else "(no message)"
