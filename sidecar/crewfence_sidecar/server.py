"""Assemble and run one sidecar: fence -> journal restore -> crews -> bind -> serve."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from crewfence_sidecar.config import SidecarConfig
from crewfence_sidecar.credentials import CredentialError, TokenSource
from crewfence_sidecar.fencing import JournalLock, fence_journal
from crewfence_sidecar.http_api import ApiSettings, build_app, default_operations
from crewfence_sidecar.journal import Journal, JournalLimits
from crewfence_sidecar.metrics import SidecarMetrics
from crewfence_sidecar.runtime import CrewSet, Executor, JobContext, Runtime, RuntimeSettings
from crewfence_sidecar.tls import ReloadingServerTLS, TlsFiles
from crewfence_sidecar.tools.server_lists import ServerToolLists

if TYPE_CHECKING:
    from crewfence_sidecar.workers.executor import WorkerExecutor

log = logging.getLogger("crewfence.sidecar.server")

CREWAI_ENV = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_DISABLE_TRACKING": "true",
}


class StartupError(Exception):
    """Start-up refused; the message is the one line printed on stderr."""


def prepare_process_environment(config: SidecarConfig) -> None:
    """Must run before crewai is imported: telemetry off, storage and cwd in our places."""
    for key, value in CREWAI_ENV.items():
        os.environ[key] = value
    if config.state_file is not None and "CREWAI_STORAGE_DIR" not in os.environ:
        # Absolute: crewai joins it under its app-data dir, which an absolute path replaces.
        os.environ["CREWAI_STORAGE_DIR"] = str(config.state_file.parent / "crewai")
    if config.training_dir is not None:
        os.chdir(config.training_dir)  # crewai writes training files relative to cwd


def journal_limits(config: SidecarConfig) -> JournalLimits:
    return JournalLimits(max_retained_runs=config.max_retained_runs,
                         max_events_per_run=config.max_events_per_run,
                         max_event_bytes=config.max_event_bytes,
                         max_state_bytes=config.max_state_bytes,
                         tombstone_retention_seconds=config.tombstone_retention_seconds)


@dataclass
class OpenedJournal:
    journal: Journal
    lock: JournalLock | None

    def close(self) -> None:
        self.journal.close()
        if self.lock is not None:
            self.lock.release()


def open_journal(config: SidecarConfig) -> OpenedJournal:
    """File rules, flock, restore; raises FencingError / JournalError."""
    from crewfence_sidecar.fencing import FencingError
    from crewfence_sidecar.journal import JournalError

    if config.state_file is None:
        return OpenedJournal(Journal.open(None, journal_limits(config)), None)
    lock, _ = fence_journal(config.state_file)
    try:
        journal = Journal.open(config.state_file, journal_limits(config))
    except (JournalError, FencingError):
        lock.release()
        raise
    return OpenedJournal(journal, lock)


def load_catalog(config: SidecarConfig) -> Any:
    """Import crewai (slow) and load the crews; raises StartupError."""
    from crewfence_sidecar.crews import CatalogError, CrewCatalog

    try:
        return CrewCatalog.load(config.registry, config.crews_file)
    except CatalogError as exc:
        raise StartupError(f"crews: {exc}") from None


def crewai_executor(catalog: Any) -> Executor:
    from crewfence_sidecar import operations

    async def execute(ctx: JobContext) -> Any:
        return await operations.execute(catalog, ctx)

    return execute


@dataclass
class Sidecar:
    """A running sidecar (used by the CLI and by in-process tests)."""

    config: SidecarConfig
    opened: OpenedJournal
    runtime: Runtime
    app: web.Application
    runner: web.AppRunner | None = None
    bound: list[tuple[str, int]] = field(default_factory=list)
    tls: ReloadingServerTLS | None = None

    async def start(self) -> None:
        if self.runtime.tool_lists is not None:
            self.runtime.tool_lists.start()  # the cache fills in the background
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                    shutdown_timeout=5.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.config.host, self.config.port, backlog=512,
                           ssl_context=self.tls.context if self.tls is not None else None)
        try:
            await site.start()
        except OSError as exc:
            await self.runner.cleanup()
            raise StartupError(f"cannot bind {self.config.host}:{self.config.port}: "
                               f"{exc.strerror}") from None
        for sock_info in self.runner.addresses:
            host, port = sock_info[0], sock_info[1]
            self.bound.append((host, port))

    async def stop(self) -> None:
        await self.runtime.close()
        if self.runner is not None:
            await self.runner.cleanup()
        self.opened.close()


def server_tls(config: SidecarConfig) -> ReloadingServerTLS | None:
    """The listener's TLS (certificate, key, client CA re-read on change); StartupError."""
    if config.tls_cert_file is None or config.tls_key_file is None or \
            config.tls_client_ca_file is None:
        return None
    try:
        return ReloadingServerTLS(TlsFiles(cert=config.tls_cert_file, key=config.tls_key_file,
                                           client_ca=config.tls_client_ca_file))
    except CredentialError as exc:
        raise StartupError(str(exc)) from None


def token_source(config: SidecarConfig) -> TokenSource | None:
    """The token file (re-read on change, several lines accepted) or the fixed token."""
    try:
        if config.token_file is not None:
            return TokenSource.from_file(config.token_file)
    except CredentialError as exc:
        raise StartupError(str(exc)) from None
    return TokenSource.from_token(config.token) if config.token is not None else None


def build_sidecar(config: SidecarConfig, crews: CrewSet, executor: Executor,
                  opened: OpenedJournal) -> Sidecar:
    tls = server_tls(config)
    metrics = SidecarMetrics()
    listed = getattr(crews, "listed_tools", None)
    runtime = Runtime(opened.journal, crews,
                      RuntimeSettings(allowed_operations=config.allowed_operations,
                                      max_concurrency=config.max_concurrency,
                                      training_dir=config.training_dir,
                                      resume_material=config.resume_material),
                      executor, metrics,
                      tool_lists=ServerToolLists(listed, on_list=metrics.tool_list)
                      if listed else None)
    app = build_app(runtime, ApiSettings(
        token=config.token, crew_ids=tuple(crews.crew_ids()),
        operations=default_operations(config.allowed_operations),
        durable_journal=config.state_file is not None,
        max_retained_runs=config.max_retained_runs, max_state_bytes=config.max_state_bytes,
        tokens=token_source(config), client_certificate_required=tls is not None,
        pod_uid=config.pod_uid))
    return Sidecar(config=config, opened=opened, runtime=runtime, app=app, tls=tls)


def worker_execution(config: SidecarConfig, supervisor: Any) -> tuple[CrewSet, Executor]:
    """The crews the template loaded and the executor that forks one worker per job."""
    from crewfence_sidecar.workers.executor import WorkerCrews

    # Without its template no job can run: stop (as SIGTERM would), so the container restarts.
    supervisor.on_lost = lambda: os.kill(os.getpid(), signal.SIGTERM)
    supervisor.attach()
    executor = worker_executor(config, supervisor)
    executor.prime()
    return WorkerCrews(supervisor.info), executor


def worker_executor(config: SidecarConfig, supervisor: Any) -> WorkerExecutor:
    """The worker executor the sidecar's settings describe (not primed)."""
    from crewfence_sidecar.workers.executor import WorkerExecutor

    return WorkerExecutor(supervisor, stop_grace=config.worker_stop_grace_ms / 1000,
                          max_live=config.max_concurrency, spares=config.worker_spares,
                          max_jobs=config.worker_max_jobs,
                          max_rss_bytes=config.worker_max_rss_mb * 1024 * 1024)


async def serve(config: SidecarConfig, catalog: Any, opened: OpenedJournal,
                supervisor: Any = None) -> None:
    """Serve until SIGTERM/SIGINT. With a ``workers.supervisor.Supervisor`` (what the CLI
    passes) every job runs in its own worker process and ``catalog`` is unused; without one,
    jobs run in this process (in-process tests)."""
    if supervisor is not None:
        crews, executor = worker_execution(config, supervisor)
    else:
        crews, executor = catalog, crewai_executor(catalog)
    try:
        await _serve(config, build_sidecar(config, crews, executor, opened))
    finally:
        if supervisor is not None:
            with contextlib.suppress(Exception):
                await executor.close()  # type: ignore[attr-defined]
            await supervisor.close()


async def _serve(config: SidecarConfig, sidecar: Sidecar) -> None:
    opened = sidecar.opened
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await sidecar.start()
    report = opened.journal.restore_report
    for host, port in sidecar.bound:
        log.info("listening", extra={"host": host, "port": port,
                                     "tls": sidecar.tls is not None,
                                     "journal_id": opened.journal.journal_id,
                                     "records": report.records,
                                     "recovered": len(report.recovered_running),
                                     "seconds": round(report.seconds, 4)})
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        with contextlib.suppress(Exception):
            await sidecar.stop()


def state_dir_of(config: SidecarConfig) -> Path | None:
    return config.state_file.parent if config.state_file else None
