"""The offline deterministic LLM ``crewfence/offline`` and the declarative LLM resolver.

The answer is a pure function of the prompt: a digest of the whole prompt plus a short,
marker-free excerpt of the task, so different inputs give different outputs and the same
prompt always gives the same answer. Two markers are documented user features for
rehearsing cancellation and crash recovery:

- ``[[sleep:N]]`` (N seconds, decimals allowed, at most one hour) waits before answering
  (``asyncio.sleep`` in ``acall``, ``time.sleep`` in ``call``);
- ``[[fail]]`` raises :class:`OfflineLLMFailure`;
- ``[[tool:NAME {"json": "arguments"}]]`` (arguments optional, ``{}`` then) makes the agent
  call its tool NAME with those arguments before it answers. NAME is the tool as the agent
  knows it (``lookup``, ``tickets/create_ticket``; crewai's sanitised spelling
  ``tickets_create_ticket`` works too). Several markers in one prompt are called in order,
  each once: the answer is crewai's native tool call (the offline LLM supports function
  calling) for the first marker whose call is not in the conversation yet (counted by its
  ``tool`` messages), and the usual answer once all were called. Markers are read from the
  first message that carries any, so a marker repeated by a system prompt is not called twice.

Off by default, for tests that count executions outside every journal: with
``CREWFENCE_OFFLINE_LLM_LEDGER`` naming a file, every call appends one JSON line to it
(:func:`append_ledger`).

crewai 1.15 calls the sync ``call`` from worker threads even under ``akickoff`` (and, to
rewrite an agent's knowledge search query, on the event loop's own thread: the sidecar
runs such crews on a private loop, see ``operations``), so cancelling a job's asyncio task
does not stop a sleeping ``call``. A job may therefore bind
a :class:`threading.Event` with :func:`bind_cancel_event`; once it is set, a sleeping call
wakes at once and every call in that job raises :class:`OfflineLLMCancelled`, so the
offline LLM never keeps working for a cancelled job (a hosted model would).

Markers are never echoed into an answer, so a marker in one task does not leak into the
next task's context. When crewai asks for structured output (``response_model``, e.g. its
evaluators' ``TaskEvaluationPydanticOutput``) a schema-valid instance is returned.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import os
import re
import threading
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from crewai import LLM, BaseLLM
from crewai.llms.base_llm import llm_call_context
from crewai.utilities.types import LLMMessage
from pydantic import BaseModel

MODEL_NAME = "crewfence/offline"
MAX_SLEEP_SECONDS = 3600.0
_SLEEP_RE = re.compile(r"\[\[sleep:(\d+(?:\.\d+)?)\]\]")
_FAIL_MARKER = "[[fail]]"
_TOOL_RE = re.compile(r"\[\[tool:([^\s\]]+)(?:\s+(\{.*?\}))?\s*\]\]", re.S)
_ANY_MARKER_RE = re.compile(r"\[\[(?:sleep:[^\]]*|fail|tool:.*?)\]\]", re.S)
_TASK_RE = re.compile(r"Current Task:\s*(.+?)(?:\n\s*\n|\nThis is the expected|$)", re.S)
_EXCERPT_CHARS = 160
_CHUNK_CHARS = 24

_count_lock = threading.Lock()
_count = 0


def call_count() -> int:
    """Process-wide number of offline LLM calls attempted (including failing ones)."""
    with _count_lock:
        return _count


_call_observers: list[Callable[[], None]] = []


def observe_calls(callback: Callable[[], None]) -> None:
    """Call ``callback`` (from the calling thread) after each counted call; a job worker
    reports its calls to the sidecar this way."""
    _call_observers.append(callback)


def _count_call() -> None:
    global _count
    with _count_lock:
        _count += 1
    for observer in list(_call_observers):
        observer()


def _message_text(message: Any) -> str:
    content: Any = message.get("content", "") if isinstance(message, Mapping) else message
    if isinstance(content, list):
        content = "\n".join(str(part.get("text", "")) for part in content
                            if isinstance(part, Mapping))
    return "" if content is None else str(content)


def tool_markers(messages: str | list[LLMMessage]) -> list[tuple[str, dict[str, Any]]]:
    """The ``[[tool:NAME {args}]]`` markers of the first message that has any, in order."""
    import json

    texts = [messages] if isinstance(messages, str) else [_message_text(m) for m in messages]
    for text in texts:
        found = _TOOL_RE.findall(text)
        if found:
            markers = []
            for name, raw_args in found:
                try:
                    args = json.loads(raw_args) if raw_args else {}
                except ValueError:
                    args = {}
                markers.append((name, args if isinstance(args, dict) else {}))
            return markers
    return []


def calls_made(messages: str | list[LLMMessage]) -> int:
    """Tool results already in the conversation (crewai's native ``tool`` messages)."""
    if isinstance(messages, str):
        return 0
    return sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "tool")


def _tool_names(tools: list[dict[str, Any]]) -> list[str]:
    names = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else tool.get("name")
        if isinstance(name, str):
            names.append(name)
    return names


def next_tool_call(messages: str | list[LLMMessage],
                   tools: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The native tool call the markers ask for next, or None when all were called."""
    if not tools:
        return None
    markers = tool_markers(messages)
    done = calls_made(messages)
    if done >= len(markers):
        return None
    import json

    from crewai.utilities.string_utils import sanitize_tool_name

    name, args = markers[done]
    wanted = sanitize_tool_name(name)
    known = {sanitize_tool_name(n): n for n in _tool_names(tools)}
    digest = hashlib.sha256(f"{done}:{name}".encode()).hexdigest()[:12]
    return {"id": f"call_{digest}", "type": "function",
            "function": {"name": known.get(wanted, wanted), "arguments": json.dumps(args)}}


LEDGER_ENV = "CREWFENCE_OFFLINE_LLM_LEDGER"


def append_ledger(prompt: str) -> None:
    """With ``CREWFENCE_OFFLINE_LLM_LEDGER`` set (off by default), append one JSON line per
    call: ``{"t", "pid", "host", "task"}``, ``task`` being the marker-free excerpt of the
    current task (so a job whose input carries a unique token can be counted by it).

    Invariant: the ledger lives outside every state folder and is only ever appended to (one
    ``write`` of a line shorter than ``PIPE_BUF`` with ``O_APPEND``: lines from concurrent
    processes never interleave), so it counts model calls even when a journal is lost. A
    failure to write never fails the call.
    """
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    line = json.dumps({"t": round(time.time(), 3), "pid": os.getpid(),
                       "host": os.environ.get("HOSTNAME", ""), "task": _excerpt(prompt)})
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


class OfflineLLMFailure(RuntimeError):
    """Raised when a prompt carries the ``[[fail]]`` marker."""


class OfflineLLMCancelled(RuntimeError):
    """Raised by calls made for a job whose cancel event is set."""


_CANCEL_EVENT: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "crewfence_offline_cancel", default=None
)


def bind_cancel_event(event: threading.Event) -> contextvars.Token[threading.Event | None]:
    """Bind ``event`` to the current context (and the threads/tasks crewai derives from it)."""
    return _CANCEL_EVENT.set(event)


def unbind_cancel_event(token: contextvars.Token[threading.Event | None]) -> None:
    _CANCEL_EVENT.reset(token)


def _raise_if_cancelled(event: threading.Event | None) -> None:
    if event is not None and event.is_set():
        raise OfflineLLMCancelled("offline LLM: the job was cancelled")


def prompt_text(messages: str | list[LLMMessage]) -> str:
    """Flatten crewai messages into one string (role-tagged, text parts only)."""
    if isinstance(messages, str):
        return messages
    parts: list[str] = []
    for message in messages:
        content: Any = message.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                str(part.get("text", "")) for part in content if isinstance(part, Mapping)
            )
        parts.append(f"{message.get('role', 'user')}: {content}")
    return "\n".join(parts)


def sleep_seconds(prompt: str) -> float:
    """Seconds requested by the first ``[[sleep:N]]`` marker (0 when absent), capped."""
    match = _SLEEP_RE.search(prompt)
    return min(float(match.group(1)), MAX_SLEEP_SECONDS) if match else 0.0


def _excerpt(prompt: str) -> str:
    match = _TASK_RE.search(prompt)
    focus = match.group(1) if match else prompt[-4 * _EXCERPT_CHARS :]
    focus = " ".join(_ANY_MARKER_RE.sub("", focus).split())
    return focus[:_EXCERPT_CHARS]


@dataclass(frozen=True)
class OfflineAnswer:
    digest: str
    text: str

    @classmethod
    def for_prompt(cls, prompt: str) -> OfflineAnswer:
        digest = hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        return cls(digest, f"Offline answer {digest}: {_excerpt(prompt)}")

    def score(self, low: float, high: float) -> float:
        """A deterministic number in [low, high] derived from the digest."""
        fraction = int(self.digest[:4], 16) / 0xFFFF
        return round(low + (high - low) * fraction, 2)


def _bounds(metadata: list[Any], low: float, high: float) -> tuple[float, float]:
    for item in metadata:
        for attr, is_low in (("ge", True), ("gt", True), ("le", False), ("lt", False)):
            value = getattr(item, attr, None)
            if isinstance(value, int | float):
                if is_low:
                    low = float(value) + (1e-6 if attr == "gt" else 0.0)
                else:
                    high = float(value) - (1e-6 if attr == "lt" else 0.0)
    if low > high:
        high = low
    return low, high


def _value_for(annotation: Any, answer: OfflineAnswer, metadata: list[Any], depth: int) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _value_for(args[0], answer, [*metadata, *args[1:]], depth)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _value_for(options[0], answer, metadata, depth) if options else None
    if origin is typing.Literal:
        return args[0]
    if origin in (list, set, frozenset, tuple) or annotation in (list, set, tuple):
        item = args[0] if args else str
        return [] if depth > 3 else [_value_for(item, answer, [], depth + 1)]
    if origin is dict or annotation is dict:
        return {}
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return _instance_dict(annotation, answer, depth + 1)
        if issubclass(annotation, Enum):
            return next(iter(annotation)).value
        if issubclass(annotation, bool):
            return True
        if issubclass(annotation, int):
            low, high = _bounds(metadata, 1, 10)
            return round(answer.score(low, high))
        if issubclass(annotation, float):
            low, high = _bounds(metadata, 7.0, 9.9)
            return answer.score(low, high)
    return answer.text


def _instance_dict(model: type[BaseModel], answer: OfflineAnswer, depth: int) -> dict[str, Any]:
    return {
        name: _value_for(field.annotation, answer, list(field.metadata), depth)
        for name, field in model.model_fields.items()
        if field.is_required()
    }


def structured_answer(model: type[BaseModel], answer: OfflineAnswer) -> BaseModel:
    """A schema-valid instance of ``model`` derived deterministically from ``answer``."""
    return model.model_validate(_instance_dict(model, answer, 0))


class OfflineLLM(BaseLLM):
    """Deterministic, network-free LLM for demos, dry runs and tests (``crewfence/offline``)."""

    llm_type: str = "crewfence-offline"
    model: str = MODEL_NAME
    provider: str = "crewfence"

    def __init__(self, **data: Any) -> None:
        data.setdefault("model", MODEL_NAME)
        super().__init__(**data)

    def supports_function_calling(self) -> bool:
        # True makes crewai's converters pass ``response_model`` instead of free text.
        return True

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 128_000

    def get_input_tokens_count(
        self,
        messages: str | list[LLMMessage],
        tools: list[dict[str, Any]] | None = None,
        response_model: type[BaseModel] | None = None,
    ) -> int:
        # Same estimate as crewai's fallback (4 characters a token) without its warning.
        return (len(prompt_text(messages)) + 3) // 4

    def _prepare(
        self, messages: str | list[LLMMessage], from_task: Any, from_agent: Any, tools: Any
    ) -> tuple[str, float]:
        _count_call()
        self._emit_call_started_event(
            messages=messages, tools=tools, from_task=from_task, from_agent=from_agent
        )
        prompt = prompt_text(messages)
        append_ledger(prompt)
        return prompt, sleep_seconds(prompt)

    def _finish(
        self,
        messages: str | list[LLMMessage],
        prompt: str,
        tools: Any,
        from_task: Any,
        from_agent: Any,
        response_model: type[BaseModel] | None,
    ) -> str | BaseModel | list[dict[str, Any]]:
        if _FAIL_MARKER in prompt:
            error = "offline LLM: the prompt carries the [[fail]] marker"
            self._emit_call_failed_event(error=error, from_task=from_task, from_agent=from_agent)
            raise OfflineLLMFailure(error)
        tool_call = next_tool_call(messages, tools)
        if tool_call is not None and response_model is None:
            return self._finish_with_tool_call(messages, prompt, tool_call, from_task, from_agent)
        answer = OfflineAnswer.for_prompt(prompt)
        result: str | BaseModel
        if response_model is not None:
            result = structured_answer(response_model, answer)
            text = result.model_dump_json()
        elif not tools and "Final Answer:" in prompt:
            # The ReAct format crewai's text executor parses: one call finishes the task.
            text = f"Thought: I now know the final answer\nFinal Answer: {answer.text}"
            result = text
        else:
            text = answer.text
            result = text
        if self._effective_stream():
            for start in range(0, len(text), _CHUNK_CHARS):
                self._emit_stream_chunk_event(
                    text[start : start + _CHUNK_CHARS],
                    from_task=from_task,
                    from_agent=from_agent,
                    response_id=answer.digest,
                )
        prompt_tokens = (len(prompt) + 3) // 4
        completion_tokens = (len(text) + 3) // 4
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "successful_requests": 1,
        }
        self._track_token_usage_internal(usage)
        from crewai.events.types.llm_events import LLMCallType

        self._emit_call_completed_event(
            response=result,
            call_type=LLMCallType.LLM_CALL,
            from_task=from_task,
            from_agent=from_agent,
            messages=messages,
            usage=usage,
            finish_reason="stop",
            response_id=answer.digest,
        )
        return result

    def _finish_with_tool_call(self, messages: str | list[LLMMessage], prompt: str,
                               tool_call: dict[str, Any], from_task: Any,
                               from_agent: Any) -> list[dict[str, Any]]:
        from crewai.events.types.llm_events import LLMCallType

        text = str(tool_call["function"]["arguments"])
        prompt_tokens = (len(prompt) + 3) // 4
        completion_tokens = (len(text) + 3) // 4
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens, "successful_requests": 1}
        self._track_token_usage_internal(usage)
        self._emit_call_completed_event(
            response=[tool_call], call_type=LLMCallType.TOOL_CALL, from_task=from_task,
            from_agent=from_agent, messages=messages, usage=usage, finish_reason="tool_calls",
            response_id=str(tool_call["id"]))
        return [tool_call]

    @contextmanager
    def _failing_on_cancel(self, from_task: Any | None, from_agent: Any | None) -> Iterator[None]:
        """A cancellation raised inside is reported to crewai's event bus as a failed call."""
        try:
            yield
        except OfflineLLMCancelled as error:
            self._emit_call_failed_event(error=str(error), from_task=from_task,
                                         from_agent=from_agent)
            raise

    def call(
        self,
        messages: str | list[LLMMessage],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any | None = None,
        from_agent: Any | None = None,
        response_model: type[BaseModel] | None = None,
    ) -> str | Any:
        with llm_call_context():
            prompt, delay = self._prepare(messages, from_task, from_agent, tools)
            event = _CANCEL_EVENT.get()
            with self._failing_on_cancel(from_task, from_agent):
                _raise_if_cancelled(event)
                if delay:
                    if event is None:
                        time.sleep(delay)
                    else:
                        event.wait(delay)
                        _raise_if_cancelled(event)
            return self._finish(messages, prompt, tools, from_task, from_agent, response_model)

    async def acall(
        self,
        messages: str | list[LLMMessage],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any | None = None,
        from_agent: Any | None = None,
        response_model: type[BaseModel] | None = None,
    ) -> str | Any:
        with llm_call_context():
            prompt, delay = self._prepare(messages, from_task, from_agent, tools)
            with self._failing_on_cancel(from_task, from_agent):
                _raise_if_cancelled(_CANCEL_EVENT.get())
            if delay:
                await asyncio.sleep(delay)
            return self._finish(messages, prompt, tools, from_task, from_agent, response_model)


def resolve_llm(model: str, api_key_env: str | None = None, **params: Any) -> BaseLLM:
    """The LLM for a declarative ``llm {model, apiKeySecretRef}``.

    ``crewfence/offline`` is the offline LLM; any other model becomes ``crewai.LLM`` with
    its API key read from a file or from the environment variable ``api_key_env`` (never
    logged). The file is ``api_key_file``, or the file named by ``<api_key_env>_FILE`` (the
    ``_FILE`` convention: the pod's environment then holds a path, not the key). A key file
    obeys the owner-only rule and is read for every fresh crew, so a rotated key is used by
    the next job. ``params`` (e.g. ``base_url``, ``temperature``) go to the constructor.
    """
    key_file = params.pop("api_key_file", None)
    if model == MODEL_NAME:
        return OfflineLLM(**params)
    if key_file is None and api_key_env is not None and not os.environ.get(api_key_env):
        key_file = os.environ.get(f"{api_key_env}_FILE") or None
    if key_file is not None:
        from crewfence_sidecar.credentials import CredentialError, read_secret_file

        try:
            params["api_key"] = read_secret_file(Path(key_file), "the LLM API key file")
        except CredentialError as exc:
            raise ValueError(str(exc)) from None
    elif api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(f"environment variable {api_key_env} (the LLM API key) is not set")
        params["api_key"] = api_key
    return LLM(model=model, **params)
