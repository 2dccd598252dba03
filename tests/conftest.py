"""Project-wide pytest configuration.

Every test runs with crewai's telemetry and tracing switched off and with
crewai's own storage in a throw-away folder: nothing may reach the network and
nothing may write into the user's home directory.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_OFFLINE_ENV = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_DISABLE_TRACKING": "true",
}

for _name, _value in _OFFLINE_ENV.items():
    os.environ[_name] = _value

# One folder per pytest process, so xdist workers never share crewai's
# `latest_kickoff_task_outputs.db` (what `replay` reads) or its memory stores; a
# CREWAI_STORAGE_DIR given from outside only chooses where these folders go.
_outer_storage = os.environ.get("CREWAI_STORAGE_DIR") or None
if _outer_storage is not None:
    _outer_storage = os.path.abspath(_outer_storage)
    os.makedirs(_outer_storage, exist_ok=True)
os.environ["CREWAI_STORAGE_DIR"] = tempfile.mkdtemp(
    prefix=f"crewfence-crewai-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-",
    dir=_outer_storage,
)


def _remove_storage(path: str, owner: int = os.getpid()) -> None:
    if os.getpid() == owner:  # never from a forked child (sidecar workers fork in-process)
        shutil.rmtree(path, ignore_errors=True)


atexit.register(_remove_storage, os.environ["CREWAI_STORAGE_DIR"])
