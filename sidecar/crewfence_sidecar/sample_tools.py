"""A sample tool for demos and rehearsals, importable in the sidecar image.

``notify`` (``ref: crewfence_sidecar.sample_tools:notify``) stands for a tool with an external
effect (a message sent): it appends one JSON line to the file named by
``CREWFENCE_SAMPLE_NOTIFY_LOG`` (when set) with the call's idempotency key, then waits
``sleep`` seconds (at most 600) before it answers, so a crash while the effect is "in flight"
can be rehearsed (``examples/crewjob-slow.yaml``). It shows the recipe of docs/tools.md: the
key from :func:`crewfence_sidecar.tool_context.current_idempotency_key` is what a real
notification API would get as its ``Idempotency-Key``.
"""

from __future__ import annotations

import json
import os
import time

from crewai.tools import BaseTool

from crewfence_sidecar.tool_context import current_idempotency_key

LOG_ENV = "CREWFENCE_SAMPLE_NOTIFY_LOG"
MAX_SLEEP_SECONDS = 600.0


class NotifyTool(BaseTool):
    name: str = "notify"
    description: str = ("Send a short notification message to the team. Arguments: message "
                        "(text), sleep (seconds to wait before answering, optional).")

    def _run(self, message: str = "", sleep: float = 0) -> str:
        key = current_idempotency_key()
        path = os.environ.get(LOG_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps({"message": message, "idempotency_key": key}) + "\n")
        if sleep:
            time.sleep(min(float(sleep), MAX_SLEEP_SECONDS))
        return f"notification sent: {message}"


notify = NotifyTool()
