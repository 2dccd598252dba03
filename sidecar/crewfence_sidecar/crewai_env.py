"""Keep crewai offline and quiet. Import this module before crewai (it does not import it).

``apply_offline_env()`` must run before the first ``import crewai`` (crewai reads some of
these variables at import time); the sidecar's entry point calls it first thing.
``decline_first_time_tracing()`` records "first execution done, no consent" in crewai's
storage dir, so crewai neither buffers trace events for a first-time upload offer nor
prints its tracing panels on stdout.
"""

from __future__ import annotations

import os
from typing import Final

OFFLINE_ENV: Final = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
}


def apply_offline_env() -> None:
    """Force telemetry and tracing off for this process (overrides inherited values)."""
    os.environ.update(OFFLINE_ENV)


def decline_first_time_tracing() -> None:
    from crewai.events.listeners.tracing.trace_listener import TraceCollectionListener
    from crewai.events.listeners.tracing.utils import mark_first_execution_done

    mark_first_execution_done(user_consented=False)
    # crewai decided "first time?" when it was imported; correct this process's decision.
    listener = getattr(TraceCollectionListener, "_instance", None)
    handler = getattr(listener, "first_time_handler", None)
    if handler is not None:
        handler.is_first_time = False
