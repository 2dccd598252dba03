#!/usr/bin/env python3
"""TEST-ONLY stand-in for the kubelet (and for the scheduler's binding step).

It binds unscheduled Pods to its Node, gives each Pod its own 127.0.x.y address, runs each
container's command as a real local process (no image, no namespaces: the command is looked
up on PATH with the venv's bin folder first, volumes are host folders), reports status
truthfully, restarts per restartPolicy, binds PVCs to host folders, and on deletion stops
processes with SIGTERM, then SIGKILL after the grace period, before removing the Pod.

Tests kill a container with SIGKILL through its pidfile:
    <state-dir>/pods/<namespace>_<pod>_<uid>/<container>.pid   (JSON: name, pid, start_ticks)
Container output goes to <pod dir>/logs/<container>.<restartCount>.log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import signal
import ssl
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
from aiohttp import web
from harness import kubeletlogs, procs
from harness.kubeapi import Api, ApiError, Obj
from harness.podspec import (
    ConfigError,
    Mount,
    PodContext,
    apply_fs_group,
    container_env,
    expand,
    materialise_volume,
    refresh_volume,
    resolve_command,
    rewrite,
)

VENV_BIN = Path(sys.executable).parent
BASE_PATH = f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_IP = "127.0.0.1"


def log(message: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
    print(f"{stamp} {message}", file=sys.stderr, flush=True)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Options:
    kubeconfig: Path
    state_dir: Path
    node_name: str
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    kubelet_port: int | None = None  # serve container logs to the API server (kubectl logs)
    serving_cert: Path | None = None
    serving_key: Path | None = None
    offline_llm_ledger: Path | None = None
    """Given to every container as ``CREWFENCE_OFFLINE_LLM_LEDGER`` (the offline LLM appends
    one line per call there): model calls counted outside every pod's state folder."""
    image_env: tuple[tuple[str, str], ...] = ()
    """The "image's" own environment (a Dockerfile's ``ENV``): given to every container as
    is (host paths, never rewritten) unless the Pod sets the same name. A ``PYTHONPATH``
    comes after the runner's own (see ``_launch``)."""
    volume_sync_seconds: float = 2.0
    """How often mounted Secret/ConfigMap content is synced, as the kubelet does (its sync
    period plus cache TTL is about a minute; shorter here so tests wait less)."""


class IpPool:
    """A /24 of 127.0.0.0/8 claimed with a flock, so parallel clusters never share addresses;
    the first cluster gets 127.0.0.10 onwards."""

    def __init__(self) -> None:
        lock_dir = Path(tempfile.gettempdir()) / "crewfence-e2e-subnets"
        lock_dir.mkdir(exist_ok=True)
        for third in range(256):
            handle = (lock_dir / f"127.0.{third}.lock").open("w")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            self._lock, self.prefix = handle, f"127.0.{third}."
            break
        else:
            raise RuntimeError("no free 127.0.x.0/24 for pod addresses")
        self._used: set[str] = set()
        self._next = 10

    def take(self, wanted: str | None = None) -> str:
        if wanted and wanted not in self._used:
            self._used.add(wanted)
            return wanted
        for _ in range(245):
            ip, self._next = f"{self.prefix}{self._next}", 10 + (self._next - 9) % 245
            if ip not in self._used:
                self._used.add(ip)
                return ip
        raise RuntimeError("pod address pool exhausted")

    def release(self, ip: str) -> None:
        self._used.discard(ip)


# --- containers ---------------------------------------------------------------------------------


@dataclass
class ContainerRun:
    spec: Obj
    restart_count: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    started_at: str | None = None
    proc: asyncio.subprocess.Process | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def status(self, pod_uid: str) -> Obj:
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": f"podrunner://{self.spec.get('image', '')}",
            "containerID": f"podrunner://{pod_uid}/{self.name}/{self.restart_count}",
            "ready": self.ready,
            "started": "running" in self.state,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }


def _terminated(returncode: int, started: str | None) -> Obj:
    if returncode < 0:  # killed by a signal: report like a container runtime, 128+signal
        sig = -returncode
        info: Obj = {"exitCode": 128 + sig, "signal": sig, "reason": "Error"}
    else:
        info = {"exitCode": returncode, "reason": "Completed" if returncode == 0 else "Error"}
    info.update({"startedAt": started or now(), "finishedAt": now()})
    return {"terminated": info}


# --- one pod ----------------------------------------------------------------------------------


class PodWorker:
    def __init__(self, runner: Runner, pod: Obj) -> None:
        self.runner, self.pod = runner, pod
        meta = pod["metadata"]
        self.uid, self.ns, self.name = meta["uid"], meta["namespace"], meta["name"]
        self.dir = runner.opts.state_dir / "pods" / f"{self.ns}_{self.name}_{self.uid}"
        previous = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}
        self.containers = [
            ContainerRun(spec=c, restart_count=previous.get(c["name"], {}).get("restartCount", 0))
            for c in pod["spec"]["containers"]
        ]
        self.ip = runner.pool.take((pod.get("status") or {}).get("podIP"))
        self.mounts_by_volume: dict[str, Path] = {}
        self.phase, self.message = "Pending", ""
        self.initialized = False
        self.start_time = (pod.get("status") or {}).get("startTime") or now()
        self.stopping = asyncio.Event()
        self.killed = asyncio.Event()  # SIGKILL now (force deletion)
        self.deleting = False  # the Pod is being deleted: remove the object once stopped
        self.dirty = asyncio.Event()
        self.tasks: list[asyncio.Task[Any]] = []
        self.main: asyncio.Task[None] | None = None

    # lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self.main = asyncio.create_task(self._run(), name=f"pod {self.ns}/{self.name}")

    def update(self, pod: Obj) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self.deleting = True
            self.stopping.set()

    def force_kill(self) -> None:
        self.deleting = True
        self.stopping.set()
        self.killed.set()

    async def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        updater = asyncio.create_task(self._status_loop())
        syncer: asyncio.Task[None] | None = None
        try:
            if await self._prepare():
                syncer = asyncio.create_task(self._volume_sync_loop())
                self.phase = "Running"
                self.tasks = [asyncio.create_task(self._container_loop(c)) for c in self.containers]
                self.dirty.set()
                await asyncio.gather(*self.tasks)
                if not self.stopping.is_set():
                    failed = any(
                        c.state.get("terminated", {}).get("exitCode") for c in self.containers
                    )
                    self.phase = "Failed" if failed else "Succeeded"
                    self.dirty.set()
                    await self.stopping.wait()
        except Exception:  # a bug here must be visible in the runner's log
            traceback.print_exc()
            raise
        finally:
            if self.deleting:
                await self._finalize_deletion()
            await asyncio.sleep(0)
            updater.cancel()
            if syncer is not None:
                syncer.cancel()
            self.runner.forget(self)

    async def _prepare(self) -> bool:
        """Volumes and init containers; False when the pod is deleted first."""
        while not self.stopping.is_set():
            try:
                await self._mount_volumes()
                break
            except (ConfigError, ApiError, aiohttp.ClientError, TimeoutError) as exc:
                self.message = str(exc)
                for c in self.containers:
                    c.state = {"waiting": {"reason": "ContainerCreating", "message": str(exc)}}
                self.dirty.set()
                await self._wait_stop(1.0)
        for init in self.pod["spec"].get("initContainers") or []:
            run = ContainerRun(spec=init)
            while not self.stopping.is_set():
                rc = await self._run_once(run, probes=False)
                if rc == 0:
                    break
                if self.pod["spec"].get("restartPolicy") == "Never":
                    self.phase = "Failed"
                    self.dirty.set()
                    await self.stopping.wait()
                    return False
                run.restart_count += 1
                await self._wait_stop(self.runner.opts.backoff_initial)
        self.initialized = True
        return not self.stopping.is_set()

    async def _volume_sync_loop(self) -> None:
        """Keep Secret/ConfigMap/projected volumes current while the pod runs (kubelet sync)."""
        while not self.stopping.is_set():
            await self._wait_stop(self.runner.opts.volume_sync_seconds)
            for volume in self.pod["spec"].get("volumes") or []:
                target = self.mounts_by_volume.get(volume["name"])
                if target is None or self.stopping.is_set():
                    continue
                try:
                    if await refresh_volume(self.runner.api, self._ctx(), volume, target):
                        log(f"{self.ns}/{self.name}: volume {volume['name']} updated")
                except (ConfigError, ApiError, aiohttp.ClientError, TimeoutError, OSError):
                    continue  # the kubelet keeps the old content and tries again

    async def _wait_stop(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _mount_volumes(self) -> None:
        ctx = self._ctx()
        for volume in self.pod["spec"].get("volumes") or []:
            name = volume["name"]
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                path = await self.runner.claim_path(self.ns, claim)
                security = self.pod["spec"].get("securityContext") or {}
                apply_fs_group(
                    path,
                    security.get("fsGroup"),
                    read_only=False,
                    change_policy=security.get("fsGroupChangePolicy"),
                )
                self.mounts_by_volume[name] = path
            elif "hostPath" in volume:
                self.mounts_by_volume[name] = Path(volume["hostPath"]["path"])
            elif name not in self.mounts_by_volume or "emptyDir" not in volume:
                target = self.dir / "volumes" / name
                await materialise_volume(self.runner.api, ctx, volume, target)
                self.mounts_by_volume[name] = target

    def _ctx(self) -> PodContext:
        return PodContext(pod=self.pod, pod_ip=self.ip, host_ip=HOST_IP, ca_pem=self.runner.ca_pem)

    def _mounts(self, spec: Obj) -> list[Mount]:
        mounts = []
        for m in spec.get("volumeMounts") or []:
            host = self.mounts_by_volume[m["name"]]
            if m.get("subPath"):
                host = host / m["subPath"]
                host.mkdir(parents=True, exist_ok=True)
            mounts.append(Mount(m["mountPath"], host, bool(m.get("readOnly"))))
        return mounts

    async def _launch(self, run: ContainerRun) -> asyncio.subprocess.Process:
        spec = run.spec
        mounts = self._mounts(spec)
        rootfs = self.dir / "rootfs"
        rootfs.mkdir(exist_ok=True)
        # Only the Pod's own values name in-pod paths; the runner's host paths (the venv on PATH,
        # the pod's rootfs) must never be rewritten, even when they live under a mount path
        # such as /tmp (a checkout in /tmp would otherwise lose its venv).
        env = {"HOSTNAME": self.name, "LANG": "C.UTF-8"}
        if any(m.mount_path.rstrip("/") == "/tmp" for m in mounts):
            env["TMPDIR"] = "/tmp"
        env.update(await container_env(self.runner.api, self._ctx(), spec))
        env = {k: rewrite(v, mounts) for k, v in env.items()}
        env.setdefault("HOME", str(rootfs))
        env["PATH"] = f"{VENV_BIN}:{env['PATH']}" if "PATH" in env else BASE_PATH
        for name, value in self.runner.opts.image_env:
            env.setdefault(name, value)  # the Pod's own value wins, as over an image's ENV
        # The "image" is this checkout: a second work tree sharing one virtualenv puts its
        # own sources first with PYTHONPATH, and its containers must run them too (before
        # the image's or the Pod's own PYTHONPATH, e.g. tests/support for the tools a Crew
        # names).
        python_path = [p for p in (os.environ.get("PYTHONPATH"), env.get("PYTHONPATH")) if p]
        if python_path:
            env["PYTHONPATH"] = os.pathsep.join(python_path)
        if self.runner.opts.offline_llm_ledger is not None:
            env["CREWFENCE_OFFLINE_LLM_LEDGER"] = str(self.runner.opts.offline_llm_ledger)
        argv = [expand(a, env) for a in (spec.get("command") or []) + (spec.get("args") or [])]
        argv = resolve_command(argv, env["PATH"], mounts)
        working_dir = spec.get("workingDir")
        cwd = Path(rewrite(working_dir, mounts)) if working_dir else rootfs
        if not cwd.is_relative_to(rootfs) and not any(
            cwd.is_relative_to(m.host_path) for m in mounts
        ):
            cwd = rootfs / str(cwd).lstrip("/")  # an image path: give it a private folder
        cwd.mkdir(parents=True, exist_ok=True)
        log = self.dir / "logs" / f"{run.name}.{run.restart_count}.log"
        log.parent.mkdir(exist_ok=True)
        with log.open("ab") as out:
            return await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )

    async def _run_once(self, run: ContainerRun, probes: bool) -> int | None:
        """Start the container once and wait for its exit; None if it could not start."""
        try:
            proc = await self._launch(run)
        except (ConfigError, OSError, ApiError) as exc:
            reason = (
                "CreateContainerConfigError"
                if isinstance(exc, ConfigError)
                else "RunContainerError"
            )
            run.state = {"waiting": {"reason": reason, "message": str(exc)}}
            self.dirty.set()
            return None
        run.proc, run.started_at = proc, now()
        log(f"{self.ns}/{self.name}/{run.name}: started pid {proc.pid} on {self.ip}")
        pidfile = self.dir / f"{run.name}.pid"
        procs.write_pidfile(pidfile, procs.record_for(run.name, proc.pid))
        run.state = {"running": {"startedAt": run.started_at}}
        run.ready = not probes or "readinessProbe" not in run.spec
        self.dirty.set()
        probe_tasks = []
        if probes:
            for kind in ("readinessProbe", "livenessProbe"):
                if kind in run.spec:
                    probe_tasks.append(asyncio.create_task(self._probe_loop(run, kind)))
        waiter = asyncio.create_task(proc.wait())
        stopper = asyncio.create_task(self.stopping.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            await self._terminate(proc, waiter)
        stopper.cancel()
        for task in probe_tasks:
            task.cancel()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the container left behind
        pidfile.unlink(missing_ok=True)
        rc = waiter.result()
        log(f"{self.ns}/{self.name}/{run.name}: pid {proc.pid} exited with {rc}")
        run.proc, run.ready = None, False
        run.state = _terminated(rc, run.started_at)
        self.dirty.set()
        return rc

    async def _terminate(self, proc: asyncio.subprocess.Process, waiter: asyncio.Task[int]) -> None:
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        if self.runner.shutting_down:
            grace = min(grace, 5)
        if not self.killed.is_set() and grace > 0:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            killed = asyncio.create_task(self.killed.wait())
            await asyncio.wait({waiter, killed}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
            killed.cancel()
        if not waiter.done():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        await waiter

    async def _container_loop(self, run: ContainerRun) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        backoff = self.runner.opts.backoff_initial
        while not self.stopping.is_set():
            started = time.monotonic()
            rc = await self._run_once(run, probes=True)
            if self.stopping.is_set():
                break
            if rc is not None and (policy == "Never" or (policy == "OnFailure" and rc == 0)):
                return
            if time.monotonic() - started > 2 * self.runner.opts.backoff_max:
                backoff = self.runner.opts.backoff_initial
            if rc is not None:
                run.last_state = run.state
                run.state = {"waiting": {"reason": "CrashLoopBackOff"}}
                self.dirty.set()
            await self._wait_stop(backoff)
            backoff = min(backoff * 2, self.runner.opts.backoff_max)
            if rc is not None and not self.stopping.is_set():
                run.restart_count += 1

    # probes ----------------------------------------------------------------------------------

    async def _probe_loop(self, run: ContainerRun, kind: str) -> None:
        probe = run.spec[kind]
        period = probe.get("periodSeconds", 10)
        success_needed = probe.get("successThreshold", 1)
        failure_limit = probe.get("failureThreshold", 3)
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        successes = failures = 0
        while True:
            ok = await self._probe_once(run, probe)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if kind == "readinessProbe":
                ready = run.ready
                if successes >= success_needed:
                    ready = True
                elif failures >= failure_limit:
                    ready = False
                if ready != run.ready:
                    run.ready = ready
                    self.dirty.set()
            elif failures >= failure_limit and run.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.proc.pid, signal.SIGKILL)
                return
            # Poll fast until the first success so readiness is not delayed by a whole period.
            await asyncio.sleep(
                period if successes or failures >= failure_limit else min(period, 0.5)
            )

    async def _probe_once(self, run: ContainerRun, probe: Obj) -> bool:
        timeout = probe.get("timeoutSeconds", 1)
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                port = self._port(run, get["port"])
                scheme = get.get("scheme", "HTTP").lower()
                url = f"{scheme}://{get.get('host') or self.ip}:{port}{get.get('path', '/')}"
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                ctx = ssl.create_default_context()
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                async with self.runner.probe_session.get(
                    url,
                    headers=headers,
                    ssl=ctx if scheme == "https" else True,
                    timeout=aiohttp.ClientTimeout(total=timeout),
                ) as resp:
                    return 200 <= resp.status < 400
            if "tcpSocket" in probe:
                port = self._port(run, probe["tcpSocket"]["port"])
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(probe["tcpSocket"].get("host") or self.ip, port),
                    timeout,
                )
                writer.close()
                return True
            if "exec" in probe:
                proc = await asyncio.create_subprocess_exec(
                    *probe["exec"]["command"],
                    cwd=self.dir,
                    env={"PATH": BASE_PATH},
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                return await asyncio.wait_for(proc.wait(), timeout) == 0
        except (OSError, TimeoutError, aiohttp.ClientError):
            return False
        return False  # grpc probes are not supported

    @staticmethod
    def _port(run: ContainerRun, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in run.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise OSError(f"no port named {port}")

    # status ----------------------------------------------------------------------------------

    def status(self) -> Obj:
        all_ready = self.phase == "Running" and all(c.ready for c in self.containers)
        stamp = now()

        def cond(kind: str, ok: bool) -> Obj:
            return {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": stamp}

        return {
            "phase": self.phase,
            "message": self.message or None,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "conditions": [
                cond("PodScheduled", True),
                cond("Initialized", self.initialized),
                cond("ContainersReady", all_ready),
                cond("Ready", all_ready),
            ],
            "containerStatuses": [c.status(self.uid) for c in self.containers],
        }

    async def _status_loop(self) -> None:
        last: Obj | None = None
        while True:
            await self.dirty.wait()
            self.dirty.clear()
            status = self.status()
            comparable = {k: v for k, v in status.items() if k != "conditions"}
            comparable["ready"] = [c["status"] for c in status["conditions"]]
            if comparable == last:
                continue
            try:
                answer = await self.runner.api.merge_patch(
                    f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status", {"status": status}
                )
            except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                log(f"status of {self.ns}/{self.name}: {exc}")
                await asyncio.sleep(0.5)
                self.dirty.set()
                continue
            if answer is None:
                return
            last = comparable

    async def _finalize_deletion(self) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError):
            await self.runner.api.delete(f"/api/v1/namespaces/{self.ns}/pods/{self.name}", body)


# --- the node ---------------------------------------------------------------------------------


class Runner:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.api = Api(opts.kubeconfig)
        self.pool = IpPool()
        self.workers: dict[str, PodWorker] = {}
        self.claims: dict[tuple[str, str], Obj] = {}
        # ReadWriteOncePod: which pod holds a claim, and pods waiting for one (scheduler's job).
        self.rwop_holders: dict[tuple[str, str], str] = {}
        self.unschedulable: dict[str, Obj] = {}
        self.shutting_down = False
        self.log_server: web.AppRunner | None = None
        self.ca_pem = b""
        self.probe_session = aiohttp.ClientSession()

    def forget(self, worker: PodWorker) -> None:
        if self.workers.get(worker.uid) is worker:
            del self.workers[worker.uid]
        self.pool.release(worker.ip)
        self._release_claims(worker.uid)

    def _release_claims(self, uid: str) -> None:
        held = [key for key, holder in self.rwop_holders.items() if holder == uid]
        for key in held:
            del self.rwop_holders[key]
        if held and self.unschedulable and not self.shutting_down:
            asyncio.get_running_loop().create_task(self._retry_unschedulable())

    async def _retry_unschedulable(self) -> None:
        for pod in list(self.unschedulable.values()):
            try:
                await self._bind(pod)
            except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                log(f"binding {pod['metadata']['name']}: {exc}")

    async def run(self) -> None:
        import base64

        import yaml

        config = yaml.safe_load(self.opts.kubeconfig.read_text())
        self.ca_pem = base64.b64decode(
            config["clusters"][0]["cluster"]["certificate-authority-data"]
        )
        self._kill_leftovers()
        if self.opts.kubelet_port and self.opts.serving_cert and self.opts.serving_key:
            self.log_server = await kubeletlogs.start(
                self.log_file,
                self.opts.kubelet_port,
                self.opts.serving_cert,
                self.opts.serving_key,
            )
        await self._register_node()
        watchers = [
            asyncio.create_task(self._watch_claims()),
            asyncio.create_task(self._watch_pods()),
        ]
        (self.opts.state_dir / "ready").write_text(f"{self.pool.prefix}0/24\n")
        await asyncio.gather(*watchers)

    def log_file(
        self, namespace: str, pod: str, container: str, previous: bool
    ) -> tuple[Path, bool] | None:
        worker = next(
            (w for w in self.workers.values() if (w.ns, w.name) == (namespace, pod)), None
        )
        run = next((c for c in worker.containers if c.name == container), None) if worker else None
        if worker is None or run is None:
            return None
        number = run.restart_count - 1 if previous else run.restart_count
        running = run.proc is not None and not previous
        return worker.dir / "logs" / f"{container}.{number}.log", running

    def _kill_leftovers(self) -> None:
        """Containers of a previous runner that died without stopping them."""
        for pidfile in (self.opts.state_dir / "pods").glob("*/*.pid"):
            rec = procs.read_pidfile(pidfile)
            if rec is not None:
                procs.stop(rec, grace=1)
            pidfile.unlink(missing_ok=True)

    async def shutdown(self) -> None:
        """Stop every container (SIGTERM, SIGKILL after 5 s); Pods stay, as with a kubelet."""
        self.shutting_down = True
        workers = list(self.workers.values())
        for worker in workers:
            worker.stopping.set()
        tasks = [w.main for w in workers if w.main is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5)
            if pending:
                for worker in workers:
                    worker.killed.set()
                await asyncio.wait(pending, timeout=5)
        await self.probe_session.close()
        await self.api.close()
        if self.log_server is not None:
            await self.log_server.cleanup()

    async def _register_node(self) -> None:
        name = self.opts.node_name
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            },
        }
        try:
            await self.api.create("/api/v1/nodes", node)
        except ApiError as exc:
            if exc.status != 409:
                raise
        capacity = {"cpu": str(os.cpu_count() or 1), "memory": "8Gi", "pods": "110"}
        await self.api.merge_patch(
            f"/api/v1/nodes/{name}/status",
            {
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "addresses": [
                        {"type": "InternalIP", "address": HOST_IP},
                        {"type": "Hostname", "address": name},
                    ],
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "PodRunnerReady",
                            "message": "test-only pod runner",
                            "lastHeartbeatTime": now(),
                            "lastTransitionTime": now(),
                        },
                    ],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": self.opts.kubelet_port or 0}},
                    "nodeInfo": {
                        "kubeletVersion": "podrunner",
                        "containerRuntimeVersion": "podrunner://0",
                        "operatingSystem": "linux",
                        "architecture": "amd64",
                        "machineID": "",
                        "systemUUID": "",
                        "bootID": "",
                        "kernelVersion": "",
                        "osImage": "",
                        "kubeProxyVersion": "",
                    },
                }
            },
        )

    # pods ------------------------------------------------------------------------------------

    async def _watch_pods(self) -> None:
        async for kind, pod in self.api.list_and_watch("/api/v1/pods"):
            try:
                await self._on_pod(kind, pod)
            except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                log(f"pod event {kind}: {exc}")
            except Exception:  # one odd object must not take every pod down with the runner
                traceback.print_exc()

    async def _on_pod(self, kind: str, pod: Obj) -> None:
        if kind == "SYNCED":
            alive = {p["metadata"]["uid"] for p in pod["items"]}
            for uid, running in list(self.workers.items()):
                if uid not in alive:
                    running.force_kill()
            return
        meta, spec = pod["metadata"], pod["spec"]
        worker: PodWorker | None = self.workers.get(meta["uid"])
        if kind == "DELETED":  # gone from the API (force deletion or our own finalisation)
            self.unschedulable.pop(meta["uid"], None)
            if worker is not None:
                worker.force_kill()
            else:
                self._release_claims(meta["uid"])
            return
        node = spec.get("nodeName")
        if not node:
            if spec.get(
                "schedulerName", "default-scheduler"
            ) == "default-scheduler" and not meta.get("deletionTimestamp"):
                await self._bind(pod)
            return
        if node != self.opts.node_name:
            return
        if worker is None:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed") and not meta.get("deletionTimestamp"):
                return
            worker = PodWorker(self, pod)
            self.workers[worker.uid] = worker
            worker.start()
        worker.update(pod)

    def _unschedulable_reason(self, pod: Obj) -> str | None:
        """Why the scheduler would not place this pod: a ReadWriteOncePod claim in use by
        another pod, or a claim that does not exist yet."""
        ns, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        for volume in pod["spec"].get("volumes") or []:
            name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if not name:
                continue
            claim = self.claims.get((ns, name))
            if claim is None:
                return f'persistentvolumeclaim "{name}" not found'
            holder = self.rwop_holders.get((ns, name))
            if "ReadWriteOncePod" in (claim["spec"].get("accessModes") or []) and holder not in (
                None,
                uid,
            ):
                return (
                    "0/1 nodes are available: 1 node has pod using PersistentVolumeClaim with "
                    "the same name and ReadWriteOncePod access mode."
                )
        return None

    async def _bind(self, pod: Obj) -> None:
        meta = pod["metadata"]
        reason = self._unschedulable_reason(pod)
        if reason is not None:
            if meta["uid"] not in self.unschedulable:
                condition = {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": reason,
                    "lastTransitionTime": now(),
                }
                await self.api.merge_patch(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                    {"status": {"conditions": [condition]}},
                )
            self.unschedulable[meta["uid"]] = pod
            return
        self.unschedulable.pop(meta["uid"], None)
        for volume in pod["spec"].get("volumes") or []:
            name = str((volume.get("persistentVolumeClaim") or {}).get("claimName") or "")
            claim = self.claims.get((meta["namespace"], name)) if name else None
            if claim and "ReadWriteOncePod" in (claim["spec"].get("accessModes") or []):
                self.rwop_holders[(meta["namespace"], name)] = meta["uid"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.opts.node_name},
        }
        try:
            await self.api.create(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", binding
            )
        except ApiError as exc:
            if exc.status != 409:  # already bound
                raise

    # claims ----------------------------------------------------------------------------------

    async def _watch_claims(self) -> None:
        async for kind, claim in self.api.list_and_watch("/api/v1/persistentvolumeclaims"):
            if kind == "SYNCED":
                continue
            key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
            if kind == "DELETED":
                self.claims.pop(key, None)
                continue
            self.claims[key] = claim
            if self.unschedulable:
                await self._retry_unschedulable()
            if (claim.get("status") or {}).get("phase") != "Bound" and not claim["metadata"].get(
                "deletionTimestamp"
            ):
                try:
                    await self._bind_claim(claim)
                except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                    log(f"binding claim {key}: {exc}")
                except Exception:
                    traceback.print_exc()

    def _claim_dir(self, claim: Obj) -> Path:
        meta = claim["metadata"]
        return self.opts.state_dir / "volumes" / meta["namespace"] / f"{meta['name']}-{meta['uid']}"

    async def _bind_claim(self, claim: Obj) -> None:
        """What a provisioner plus the PV controller would do: a PV on a host folder, bound."""
        meta, spec = claim["metadata"], claim["spec"]
        path = self._claim_dir(claim)
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o770)
        pv_name = f"pvc-{meta['uid']}"
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": pv_name,
                "annotations": {"pv.kubernetes.io/provisioned-by": "podrunner"},
            },
            "spec": {
                "capacity": {"storage": storage},
                "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": spec.get("storageClassName") or "",
                "volumeMode": "Filesystem",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "resourceVersion": meta["resourceVersion"],
                },
            },
        }
        try:
            await self.api.create("/api/v1/persistentvolumes", pv)
        except ApiError as exc:
            if exc.status != 409:
                raise
        await self.api.merge_patch(
            f"/api/v1/persistentvolumes/{pv_name}/status", {"status": {"phase": "Bound"}}
        )
        claim_path = f"/api/v1/namespaces/{meta['namespace']}/persistentvolumeclaims/{meta['name']}"
        if not spec.get("volumeName"):
            await self.api.merge_patch(
                claim_path,
                {
                    "metadata": {
                        "annotations": {
                            "pv.kubernetes.io/bind-completed": "yes",
                            "pv.kubernetes.io/bound-by-controller": "yes",
                        }
                    },
                    "spec": {"volumeName": pv_name},
                },
            )
        await self.api.merge_patch(
            claim_path + "/status",
            {
                "status": {
                    "phase": "Bound",
                    "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                    "capacity": {"storage": storage},
                }
            },
        )

    async def claim_path(self, namespace: str, name: str) -> Path:
        claim = self.claims.get((namespace, name))
        if claim is None:
            claim = await self.api.get(
                f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}"
            )
        if claim is None:
            raise ConfigError(f'persistentvolumeclaim "{name}" not found')
        if (claim.get("status") or {}).get("phase") != "Bound":
            raise ConfigError(f'persistentvolumeclaim "{name}" is not bound')
        pv = await self.api.get(f"/api/v1/persistentvolumes/{claim['spec'].get('volumeName')}")
        if pv is None or "hostPath" not in pv["spec"]:
            raise ConfigError(f'volume of claim "{name}" is not a pod-runner volume')
        return Path(pv["spec"]["hostPath"]["path"])


async def amain(opts: Options) -> None:
    opts.state_dir.mkdir(parents=True, exist_ok=True)
    runner = Runner(opts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    main = asyncio.create_task(runner.run())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({main, stopper}, return_when=asyncio.FIRST_COMPLETED)
    await runner.shutdown()
    if main.done():
        main.result()  # surface a crash
    main.cancel()


def _name_value(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not name or not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {item!r}")
    return name, value


def main() -> None:
    parser = argparse.ArgumentParser(description="test-only kubelet stand-in")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--node-name", default="crewfence-e2e-node")
    parser.add_argument("--backoff-initial", type=float, default=0.5)
    parser.add_argument("--backoff-max", type=float, default=10.0)
    parser.add_argument("--kubelet-port", type=int, help="serve /containerLogs here (TLS)")
    parser.add_argument("--serving-cert", type=Path)
    parser.add_argument("--serving-key", type=Path)
    parser.add_argument("--offline-llm-ledger", type=Path,
                        help="containers append offline LLM calls to this file")
    parser.add_argument("--image-env", action="append", default=[], metavar="NAME=VALUE",
                        type=_name_value,
                        help="the image's environment, given to every container (repeatable)")
    args = parser.parse_args()
    opts = Options(
        kubeconfig=args.kubeconfig,
        state_dir=args.state_dir.resolve(),
        node_name=args.node_name,
        backoff_initial=args.backoff_initial,
        backoff_max=args.backoff_max,
        kubelet_port=args.kubelet_port,
        serving_cert=args.serving_cert,
        serving_key=args.serving_key,
        offline_llm_ledger=args.offline_llm_ledger,
        image_env=tuple(args.image_env),
    )
    asyncio.run(amain(opts))
    log("stopped")


if __name__ == "__main__":
    main()
