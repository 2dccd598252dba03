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
    escalated: bool | None
    """True when SIGTERM did not end the worker within the grace and SIGKILL did; None when
    the sidecar sent no signal (the worker ended on its own: ``stopped_by`` is not said)."""

    def to_error_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"work_stopped": True, "stopped_at": self.stopped_at}
        if self.escalated is not None:
            fields["stopped_by"] = "SIGKILL" if self.escalated else "SIGTERM"
        return fields


class WorkerDied(Exception):
    """The worker ended without a result (signal, ``os._exit``, memory limit, lost template).

    ``job_started`` is False when the channel ended before the worker's ``started`` frame:
    a worker sends it before it runs anything of the job, so then nothing of it ran.
    """

    def __init__(self, exit: ExitStatus, stop: StopReport, *, job_started: bool = True) -> None:
        when = "" if job_started else " before the job started (nothing of it ran)"
        super().__init__(f"the job's worker process {exit.describe()}{when}")
        self.exit = exit
        self.stop = stop
        self.job_started = job_started

    def error_fields(self) -> dict[str, Any]:
        return {"code": WORKER_DIED_CODE, "message": str(self), **self.exit.to_wire(),
                **self.stop.to_error_fields(), "job_started": self.job_started}


class RemoteExecutionError(Exception):
    """The operation raised inside the worker; only the exception class crosses over."""

    def __init__(self, exception_name: str, tool_setup: str | None = None) -> None:
        super().__init__(f"the operation raised {exception_name}")
        self.exception_name = exception_name
        self.tool_setup = tool_setup
        """A ``contract.ToolSetupError``'s message (the one message that crosses over)."""
