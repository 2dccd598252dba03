"""The template process: imports crewai and the crews once, then forks the job workers (a
worker runs one job, or several in turn when it is reused: ``workers.reuse``).

It is started early (forked by ``crewfence-sidecar`` before it opens the journal or starts
any thread, or spawned as a fresh interpreter with ``python -m``) and stays single-threaded,
so every ``fork`` copies a process without other threads or an event loop.

Invariants kept here:

- Single-threaded fork: the template never starts a thread or an event loop; workers are
  forked from its only thread.
- Reaped means gone: the template reaps each worker (whether it ran one job or several),
  then SIGKILLs what is left of its process group, and only then reports ``exited``;
  signal requests for a pid it has reaped are ignored (no signal can reach a recycled pid).
- Nothing of a job outlives its worker's ``exited``: the template is the subreaper of the
  workers' descendants, so a process a job left outside its process group (``setsid`` and a
  double fork) is re-parented to the template when its worker dies; before reporting
  ``exited`` the template SIGKILLs and reaps every such leftover, so a record that says
  ``work_stopped`` never has a descendant of its job still running.
- crewai's file locks are waited for without 0.25 s polls (``crewai_locks``), and its
  kickoff-outputs table is created once per file, not at every crew build
  (``crewai_outputs_table``): both installed before the warm-up, inherited by every worker.
- Dies with the sidecar: PR_SET_PDEATHSIG (SIGTERM) and the end of the control socket both
  make it SIGKILL every worker group it started, reap them and exit.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import os
import re
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from crewfence_sidecar.workers.protocol import ExitStatus, recv_control, send_control
from crewfence_sidecar.workers.reuse import live_children
from crewfence_sidecar.workers.settings import (
    TemplateSettings,
    become_subreaper,
    die_with_parent,
)

SIDECAR_EXTRA_HINT = ("crewai is not installed: install the sidecar extra, "
                      "pip install 'crewfence[sidecar]'")
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_\-]*)\}")


class _ParentGone(Exception):
    pass


def _on_parent_gone(signum: int, frame: Any) -> None:
    raise _ParentGone


def _placeholders(catalog_source: Any) -> dict[str, list[str]]:
    """``{name}`` placeholders each declarative crew's templates use (admission checks them)."""
    out: dict[str, list[str]] = {}
    for crew_id, definition in catalog_source.items():
        texts: list[str] = []
        for agent in definition.agents:
            texts += [agent.role, agent.goal, agent.backstory]
        for task in definition.tasks:
            texts += [task.description, task.expected_output]
        out[crew_id] = sorted({m for text in texts for m in _PLACEHOLDER_RE.findall(text)})
    return out


def _credentials(definitions: Any) -> dict[str, dict[str, Any]]:
    """Per declarative crew: its model, whether it is hosted, and whether the model's
    credentials are present (``present`` / ``missing`` / ``not_needed``). Never the key."""
    from crewfence_sidecar.offline_llm import MODEL_NAME

    out: dict[str, dict[str, Any]] = {}
    for crew_id, definition in definitions.items():
        llm = definition.llm
        hosted = llm.model != MODEL_NAME
        if not hosted:
            state = "not_needed"
        elif llm.api_key_file is not None:
            try:
                key = Path(llm.api_key_file).read_text(encoding="utf-8").strip()
                state = "present" if key else "missing"
            except (OSError, UnicodeDecodeError):
                state = "missing"
        else:
            provider = llm.model.split("/", 1)[0].upper().replace("-", "_")
            env_name = llm.api_key_env or f"{provider}_API_KEY"
            key_file = os.environ.get(f"{env_name}_FILE")  # the _FILE convention (resolve_llm)
            state = "present" if os.environ.get(env_name) or _non_empty(key_file) else "missing"
        out[crew_id] = {"model": llm.model, "hosted": hosted, "credentials": state}
    return out


def _non_empty(path: str | None) -> bool:
    """True when ``path`` names a readable file holding a non-blank key."""
    if not path:
        return False
    try:
        return bool(Path(path).read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError):
        return False


def load(settings: TemplateSettings) -> tuple[Any, dict[str, Any]]:
    """Import crewai, load the catalog; the ready message or a startup error message."""
    try:
        import crewai  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "crewai":
            return None, {"type": "startup_error", "message": SIDECAR_EXTRA_HINT}
        raise
    from crewfence_sidecar import operations  # noqa: F401 - warm the operations' imports
    from crewfence_sidecar.crews import CatalogError, CrewCatalog
    from crewfence_sidecar.declarative import DefinitionError, load_crews_file
    from crewfence_sidecar.tools.server_lists import listed_tool_refs

    crews_file = Path(settings.crews_file) if settings.crews_file else None
    try:
        catalog = CrewCatalog.load(settings.registry, crews_file)
        definitions = load_crews_file(crews_file) if crews_file is not None else {}
    except (CatalogError, DefinitionError) as exc:
        return None, {"type": "startup_error", "message": f"crews: {exc}"}
    from crewfence_sidecar.workers import (
        crewai_locks,
        crewai_outputs_connection,
        crewai_outputs_table,
    )
    from crewfence_sidecar.workers.warmup import warm_up

    crewai_locks.install()  # workers inherit it: no 0.25 s polls when their kickoffs collide
    crewai_outputs_table.install()  # and this: no table creation at every crew build
    crewai_outputs_connection.install()  # a worker keeps its connection (keep_in_this_process)
    warm_up()
    gc.freeze()  # the collector never writes to the template's objects in a worker (COW)
    return catalog, {"type": "ready", "crew_ids": catalog.crew_ids(),
                     "placeholders": _placeholders(definitions),
                     "model_credentials": _credentials(definitions),
                     "listed_tools": listed_tool_refs(definitions)}


class Template:
    def __init__(self, control: socket.socket, catalog: Any, settings: TemplateSettings) -> None:
        self.control = control
        self.catalog = catalog
        self.settings = settings
        self.live: set[int] = set()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.subreaper = become_subreaper()

    def serve(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self._wake_w)
        try:
            while True:
                control_fd = self.control.fileno()
                readable, _, _ = select.select([control_fd, self._wake_r], [], [])
                if self._wake_r in readable:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    self._reap()
                if control_fd in readable:
                    received = recv_control(self.control)
                    if received is None:
                        return
                    self._handle(*received)
        except _ParentGone:
            return
        finally:
            self.shutdown()

    def _handle(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        if op == "fork" and len(fds) == 1:
            self._fork(int(message["id"]), fds.pop(), spare=bool(message.get("spare")))
        elif op == "signal":
            self._signal(int(message["pid"]), int(message["sig"]))
        for fd in fds:  # anything not handed to a worker
            os.close(fd)

    def _fork(self, request_id: int, channel_fd: int, spare: bool) -> None:
        from crewfence_sidecar.workers import worker

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        fork_ns = time.monotonic_ns()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(channel_fd)
            send_control(self.control, {"type": "fork_failed", "id": request_id,
                                        "message": exc.strerror or "fork failed"})
            return
        if pid == 0:
            worker.run(channel_fd, [self.control.fileno(), self._wake_r, self._wake_w],
                       self.catalog, self.settings, template_pid=os.getppid(), spare=spare)
        with contextlib.suppress(OSError):  # the child may have done it already
            os.setpgid(pid, pid)
        os.close(channel_fd)
        self.live.add(pid)
        send_control(self.control, {"type": "forked", "id": request_id, "pid": pid,
                                    "fork_ns": fork_ns})

    def _signal(self, pid: int, sig: int) -> None:
        if pid not in self.live:
            return  # already reaped: the pid may belong to someone else now
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid not in self.live:
                continue
            self.live.discard(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # whatever the job left in its group
            self._kill_leftovers()
            exit_status = ExitStatus.from_wait_status(status)
            cpu = round(usage.ru_utime + usage.ru_stime, 6)
            with contextlib.suppress(OSError):
                send_control(self.control, {"type": "exited", "pid": pid, "cpu_seconds": cpu,
                                            "max_rss_kib": usage.ru_maxrss,
                                            **exit_status.to_control()})

    def _kill_leftovers(self) -> None:
        """SIGKILL and reap the template's children that are not live workers: descendants of
        a dead worker that left its process group, re-parented here (the template is their
        subreaper). Killing one re-parents its own children here too: repeat until none."""
        if not self.subreaper:
            return
        for _ in range(64):
            leftovers = [p for p in (live_children() or []) if p not in self.live]
            if not leftovers:
                return
            for pid in leftovers:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            for pid in leftovers:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)

    def shutdown(self) -> None:
        """SIGKILL every worker group, reap them all (the sidecar is gone or stopping)."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for pid in list(self.live):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for pid in list(self.live):
            while True:
                try:
                    os.waitpid(pid, 0)
                    break
                except ChildProcessError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EINTR:
                        break
            self.live.discard(pid)


def main_in_process(control: socket.socket, settings: TemplateSettings,
                    parent_pid: int) -> NoReturn:
    """The template's whole life, in a process that was just forked or spawned."""
    code = 0
    try:
        signal.signal(signal.SIGTERM, _on_parent_gone)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the sidecar's
        die_with_parent(signal.SIGTERM, parent_pid)
        catalog, hello = load(settings)
        send_control(control, hello)
        if catalog is not None:
            Template(control, catalog, settings).serve()
    except _ParentGone:
        code = 0
    except BaseException as exc:
        with contextlib.suppress(Exception):
            send_control(control, {"type": "startup_error",
                                   "message": f"worker template failed: {type(exc).__name__}"})
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> NoReturn:
    """``python -m crewfence_sidecar.workers.template --fd N --settings JSON``."""
    parser = argparse.ArgumentParser(prog="crewfence-worker-template")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--settings", required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    from crewfence_sidecar.crewai_env import apply_offline_env

    apply_offline_env()
    control = socket.socket(fileno=args.fd)
    control.setblocking(True)
    main_in_process(control, TemplateSettings.from_json(args.settings), args.parent)


if __name__ == "__main__":
    main()
