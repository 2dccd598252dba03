"""Project-wide pytest configuration.

Every test runs with crewai's telemetry and tracing switched off and with
crewai's own storage in a throw-away folder: nothing may reach the network and
nothing may write into the user's home directory.
"""

from __future__ import annotations

import os
import tempfile

_OFFLINE_ENV = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_DISABLE_TRACKING": "true",
}

for _name, _value in _OFFLINE_ENV.items():
    os.environ[_name] = _value

if "CREWAI_STORAGE_DIR" not in os.environ:
    os.environ["CREWAI_STORAGE_DIR"] = tempfile.mkdtemp(prefix="crewfence-crewai-")
