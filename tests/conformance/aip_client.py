"""A minimal AIP sidecar client, written from docs/aip-compatibility.md (not from the server).

Put on sys.path by conftest.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

STARTABLE = ["run", "batch_run", "replay", "train", "test", "knowledge_query", "memory_reset"]
CONTROL_OPERATIONS = ["cancel", "events", "status"]
RUN_OUTPUT_FIELDS = {"raw", "pydantic", "json_dict", "tasks_output", "token_usage"}
RECORD_FIELDS = {"action_id", "crew_id", "operation", "request_hash", "status", "event_count",
                 "output", "error", "uncertain_outcome", "created_at", "updated_at"}
TERMINAL_EVENTS = {"completed", "failed", "cancelled"}


def job_path(action_id: str, suffix: str = "") -> str:
    return f"/jobs/{quote(action_id, safe='')}{suffix}"


def new_action_id(prefix: str) -> str:
    return f"conformance/{prefix}-{uuid.uuid4().hex[:12]}"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def start_headers(token: str, key: str, action_id: str, **more: str) -> dict[str, str]:
    """What the AIP connector sends with a start request."""
    return {**auth(token), "Idempotency-Key": key, "X-AIP-Action-ID": action_id, **more}


def start_body(action_id: str, operation: str, input_: dict[str, Any], *,
               crew_id: str = "research", timeout_ms: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"crew_id": crew_id, "action_id": action_id,
                            "operation": operation, "input": input_}
    if timeout_ms is not None:
        body["timeout_ms"] = timeout_ms
    return body


@dataclass(frozen=True)
class Target:
    """One running sidecar: its base URL, token and training directory."""

    url: str
    token: str
    training_dir: Path


@dataclass
class Answer:
    status: int
    body: Any
    headers: Any


async def call(session: aiohttp.ClientSession, method: str, url: str, *,
               json_body: Any = None, headers: dict[str, str] | None = None) -> Answer:
    async with session.request(method, url, json=json_body, headers=headers) as resp:
        text = await resp.text()
        body = json.loads(text) if text else None
        return Answer(resp.status, body, resp.headers)


@dataclass
class SseEvent:
    name: str | None
    id: str | None
    data: Any


def parse_sse(text: str) -> list[SseEvent]:
    """SSE frames (blank-line separated); comment lines (``:``) are ignored."""
    events: list[SseEvent] = []
    for frame in text.replace("\r\n", "\n").split("\n\n"):
        name = event_id = None
        data_lines: list[str] = []
        for line in frame.split("\n"):
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data_lines.append(value)
            elif field == "id":
                event_id = value
        if name is None and not data_lines:
            continue
        events.append(SseEvent(name, event_id, json.loads("\n".join(data_lines))))
    return events


async def wait_record(session: aiohttp.ClientSession, base: str, token: str, action_id: str,
                      *, until: set[str], timeout: float = 120) -> dict[str, Any]:
    """Poll ``GET /jobs/{id}`` until the record exists with a status in ``until``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = await call(session, "GET", base + job_path(action_id), headers=auth(token))
        if got.status == 200 and got.body["status"] in until:
            return dict(got.body)
        assert loop.time() < deadline, f"{action_id} never reached {until}: {got.body}"
        await asyncio.sleep(0.05)


def assert_run_output(output: Any) -> None:
    """crewAI's CrewOutput in JSON mode, as the reference returns it."""
    assert isinstance(output, dict), output
    assert RUN_OUTPUT_FIELDS <= set(output), sorted(output)
    assert isinstance(output["raw"], str) and output["raw"]
    assert isinstance(output["token_usage"], dict)  # always present, {} when unknown
    assert output["json_dict"] is None or isinstance(output["json_dict"], dict)
    assert isinstance(output["tasks_output"], list) and output["tasks_output"]
    for task in output["tasks_output"]:
        assert isinstance(task, dict)
        assert {"description", "raw", "agent", "output_format"} <= set(task), sorted(task)
        assert isinstance(task["raw"], str)
    assert output["raw"] == output["tasks_output"][-1]["raw"]
    assert not (RECORD_FIELDS - {"output", "error"}) & set(output), "a record, not an output"
