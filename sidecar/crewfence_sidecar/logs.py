"""Structured JSON logs: one object per line on stderr.

Only whitelisted ``extra`` fields are emitted (ids, status, codes), so inputs, outputs and
tokens cannot slip into a log line through ``extra``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Final

ALLOWED_FIELDS: Final = frozenset({
    "action_id", "crew_id", "operation", "status", "uncertain_outcome", "code", "journal_id",
    "host", "port", "records", "recovered", "seconds", "method", "path", "http_status",
})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ALLOWED_FIELDS:
            if key in record.__dict__:
                entry[key] = record.__dict__[key]
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = record.exc_info[0].__name__  # class only, never the message
        return json.dumps(entry, ensure_ascii=False, default=str)


def setup_logging(level: str = "INFO") -> None:
    # the JSON lines name no thread or process: a record need not look them up (it did on
    # every line, an admission's among them)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("crewfence").setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
