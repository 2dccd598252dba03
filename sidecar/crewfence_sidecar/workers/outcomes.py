"""What the runtime learns from a worker besides its output (no crewai, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crewfence_sidecar.contract import WORKER_DIED_CODE
from crewfence_sidecar.workers.protocol import ExitStatus


@dataclass(frozen=True)
class StopReport:
    """The worker's process group was signalled and the worker reaped at ``stopped_at``.

    Invariant (stop before record): a StopReport exists only after the template reaped the
    worker, so a terminal record that carries one was written after the work stopped.
    """

    stopped_at: str
    """UTC ISO-8601 time at which the reap was reported."""
    exit: ExitStatus
    escalated: bool
    """True when SIGTERM did not end the worker within the grace and SIGKILL did."""

    def to_error_fields(self) -> dict[str, Any]:
        return {"work_stopped": True, "stopped_at": self.stopped_at,
                "stopped_by": "SIGKILL" if self.escalated else "SIGTERM"}


class WorkerDied(Exception):
    """The worker ended without a result (signal, ``os._exit``, memory limit, lost template)."""

    def __init__(self, exit: ExitStatus, stop: StopReport) -> None:
        super().__init__(f"the job's worker process {exit.describe()}")
        self.exit = exit
        self.stop = stop

    def error_fields(self) -> dict[str, Any]:
        return {"code": WORKER_DIED_CODE, "message": str(self), **self.exit.to_wire(),
                **self.stop.to_error_fields()}


class RemoteExecutionError(Exception):
    """The operation raised inside the worker; only the exception class crosses over."""

    def __init__(self, exception_name: str) -> None:
        super().__init__(f"the operation raised {exception_name}")
        self.exception_name = exception_name
