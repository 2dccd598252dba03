"""A loopback server speaking the OpenAI chat-completions protocol, for tests of the
hosted-model path (``model: openai/...`` with ``base_url`` pointing here).

- ``POST /v1/chat/completions``: non-streaming (one ``chat.completion`` object) and
  streaming (``chat.completion.chunk`` SSE events, then ``data: [DONE]``), as the real API
  answers; the reply is a ReAct final answer naming a digest of the last user message.
- Every request is recorded (:class:`Recorded`): path, model, stream flag, the messages,
  whether a bearer key came (and which), and how it ended: ``completed``, or ``dropped``
  when the client closed the connection before the answer was complete.
- Native tool calling: when the request offers ``tools`` and its user messages hold
  ``[[tool:NAME {"json": "arguments"}]]`` markers (the offline LLM's marker), the answer is an
  assistant message with ``tool_calls`` for the next marker whose call has no ``tool``
  result in the messages yet (``finish_reason: tool_calls``; streamed as ``tool_calls``
  deltas), and the final answer once every marker has its result. NAME is matched against
  the offered function names as given or with what is not ``[A-Za-z0-9_-]`` as ``_``.
- Every answer has a unique id (``chatcmpl-fixture-N``), also sent as ``x-request-id``;
  :attr:`Recorded.response_id` is it, :attr:`Recorded.tool_calls` what it asked for.
- A last user message containing :data:`SLOW_MARKER` is answered only after
  :attr:`OpenAIFixture.slow_seconds` (streaming: the first chunk at once, the rest after), so
  a test can cancel during a slow completion and watch the connection drop here.

It runs on its own event loop in a daemon thread, so it outlives any test's loop and serves
other processes (the sidecar's workers) as well.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

SLOW_MARKER = "SLOWREPLY"
TOOL_MARKER = re.compile(r"\[\[tool:([^\s\]]+)\s*(\{.*?\})?\]\]", re.DOTALL)
_ids = itertools.count(1)
_POLL_SECONDS = 0.02


@dataclass
class Recorded:
    path: str
    model: str | None
    stream: bool
    messages: list[dict[str, Any]]
    api_key: str | None
    tools: list[str] = field(default_factory=list)
    """The function names the request offered."""
    response_id: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """The calls this answer asked for (``{id, name, arguments}``)."""
    started: float = field(default_factory=time.monotonic)
    completed: bool = False
    dropped: bool = False

    @property
    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, list):
                    return " ".join(str(p.get("text", "")) for p in content
                                    if isinstance(p, dict))
                return str(content)
        return ""

    @property
    def user_texts(self) -> str:
        parts = []
        for message in self.messages:
            if message.get("role") == "user":
                content = message.get("content")
                parts.append(" ".join(str(p.get("text", "")) for p in content
                                      if isinstance(p, dict))
                             if isinstance(content, list) else str(content))
        return "\n".join(parts)

    @property
    def tool_results(self) -> int:
        return sum(1 for m in self.messages if m.get("role") == "tool")

    @property
    def in_flight(self) -> bool:
        return not self.completed and not self.dropped


def _answer(record: Recorded) -> str:
    digest = hashlib.sha256(record.last_user_text.encode()).hexdigest()[:12]
    return f"Thought: I know it now.\nFinal Answer: fixture answer {digest}"


def _function_name(marker: str, offered: list[str]) -> str | None:
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", marker)
    return next((n for n in offered if n in (marker, safe)), None)


def _next_tool_call(record: Recorded) -> dict[str, Any] | None:
    """The call this request's answer asks for: the first marker without a tool result."""
    if not record.tools:
        return None
    markers = TOOL_MARKER.findall(record.user_texts)
    if record.tool_results >= len(markers):
        return None
    marker, arguments = markers[record.tool_results]
    name = _function_name(marker, record.tools)
    if name is None:
        return None
    return {"id": f"call_{record.response_id}", "name": name,
            "arguments": arguments or "{}"}


def _usage(text: str, record: Recorded) -> dict[str, int]:
    prompt = max(1, len(json.dumps(record.messages)) // 4)
    completion = max(1, len(text) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class OpenAIFixture:
    def __init__(self, slow_seconds: float = 30.0) -> None:
        self.slow_seconds = slow_seconds
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="openai-fixture")
        self.port = 0

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> OpenAIFixture:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def snapshot(self) -> list[Recorded]:
        with self._lock:
            return list(self.requests)

    # --- the protocol -----------------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        auth = request.headers.get("Authorization", "")
        record = Recorded(path=request.path, model=body.get("model"),
                          stream=bool(body.get("stream")), messages=list(body["messages"]),
                          api_key=auth[7:] if auth.startswith("Bearer ") else None,
                          tools=[str(t.get("function", {}).get("name"))
                                 for t in body.get("tools") or []],
                          response_id=f"chatcmpl-fixture-{next(_ids)}")
        with self._lock:
            self.requests.append(record)
        call = _next_tool_call(record)
        if call is not None:
            record.tool_calls.append(call)
        text = "" if call is not None else _answer(record)
        slow = SLOW_MARKER in record.last_user_text
        if record.stream:
            return await self._stream(request, record, text, slow, call)
        if slow and not await self._wait_connected(request, record):
            return web.Response(status=499)
        record.completed = True
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if call is not None:
            message["tool_calls"] = [{"id": call["id"], "type": "function", "function": {
                "name": call["name"], "arguments": call["arguments"]}}]
        return web.json_response({
            "id": record.response_id, "object": "chat.completion",
            "created": int(time.time()), "model": record.model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if call is not None else "stop"}],
            "usage": _usage(text or json.dumps(call), record)},
            headers={"x-request-id": record.response_id})

    async def _wait_connected(self, request: web.Request, record: Recorded) -> bool:
        """Hold the request for ``slow_seconds``; False (and ``dropped``) if the client left."""
        deadline = time.monotonic() + self.slow_seconds
        while time.monotonic() < deadline:
            transport = request.transport
            if transport is None or transport.is_closing():
                record.dropped = True
                return False
            await asyncio.sleep(_POLL_SECONDS)
        return True

    async def _stream(self, request: web.Request, record: Recorded, text: str,
                      slow: bool, call: dict[str, Any] | None) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "x-request-id": record.response_id})
        await response.prepare(request)
        base = {"id": record.response_id, "object": "chat.completion.chunk",
                "created": int(time.time()), "model": record.model}
        pieces: list[dict[str, Any]] = [{"content": text[i:i + 16]}
                                        for i in range(0, len(text), 16)]
        if call is not None:
            args = call["arguments"]
            pieces = [{"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                       "function": {"name": call["name"], "arguments": ""}}]}]
            pieces += [{"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 8]}}]}
                       for i in range(0, len(args), 8)]
        try:
            for n, piece in enumerate(pieces):
                delta: dict[str, Any] = dict(piece)
                if n == 0:
                    delta["role"] = "assistant"
                chunk = {**base, "choices": [{"index": 0, "delta": delta,
                                              "finish_reason": None}]}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if n == 0 and slow and not await self._wait_connected(request, record):
                    return response
            final = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason":
                                          "tool_calls" if call is not None else "stop"}],
                     "usage": _usage(text or json.dumps(call), record)}
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            record.dropped = True
            return response
        record.completed = True
        return response
