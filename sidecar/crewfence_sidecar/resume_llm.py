"""Model calls through the effect ledger: their request hash, their response as resume
material, and a resumed job's matched calls answered from the journal (no second bill).

crewai's before-model-call hook can only let a call go or abort it, never answer it, so the
LLM classes' own ``call``/``acall`` are wrapped (:func:`wrap_llm_class`, once per class and
process). The wrapper asks the job's ledger (``tools.ledger.current()``): with no ledger, or
one that neither keeps material nor replays, it is a plain call.

| the request of the call at (task, model index)  | the wrapper                             |
|-------------------------------------------------|-----------------------------------------|
| matches the predecessor's, response journaled,  | returns the journaled response; the LLM |
| no earlier model call of the task ran live      | is not called (``model_call_reused``)   |
| anything else                                    | calls the LLM (``model_call``, with the |
|                                                 | request hash and, material on, the      |
|                                                 | response)                               |

The request hash covers the messages, the model, the tools offered and the structured-output
schema (:func:`request_sha256`). Only responses that come back as they went are material:
text, a list of tool calls (as JSON objects, which crewai's native tool path reads like the
provider's own objects), or an instance of the requested ``response_model``.

Invariant: a nested call (an LLM subclass whose ``call`` calls its parent's) passes through
the inner wrapper untouched, so one model call is one ledger entry.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("crewfence_in_model_call",
                                                               default=False)


def _canonical(value: Any) -> str:
    return json.dumps(to_jsonable_python(value, fallback=str), sort_keys=True,
                      ensure_ascii=False, separators=(",", ":"))


def request_sha256(model: str, messages: Any, tools: Any,
                   response_model: type[BaseModel] | None) -> str:
    """The hash a model call's request is matched by on resume."""
    schema = (None if response_model is None
              else [response_model.__name__, response_model.model_json_schema()])
    material = _canonical({"model": model, "messages": messages, "tools": tools,
                           "response_model": schema})
    return hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()


def encode_response(response: Any) -> str | None:
    """The response as resume material (JSON text), or None when it would not come back as
    it went (then the call cannot be answered from the journal)."""
    try:
        return _encode(response)
    except Exception:  # journaling material never fails the call it describes
        return None


def _encode(response: Any) -> str | None:
    if isinstance(response, str):
        return _canonical({"kind": "text", "text": response})
    if isinstance(response, BaseModel):
        return _canonical({"kind": "structured", "model": type(response).__name__,
                           "json": response.model_dump_json()})
    if isinstance(response, list) and response:
        calls = to_jsonable_python(response, fallback=str)
        if all(isinstance(c, dict) for c in calls):
            return _canonical({"kind": "tool_calls", "calls": calls})
    return None


def decode_response(encoded: str, response_model: type[BaseModel] | None) -> Any:
    """The response :func:`encode_response` journaled; ValueError when it cannot be given
    back for this call (then the call runs live)."""
    data = json.loads(encoded)
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "text" and isinstance(data.get("text"), str):
        return data["text"]
    if kind == "tool_calls" and isinstance(data.get("calls"), list):
        return data["calls"]
    if (kind == "structured" and response_model is not None
            and data.get("model") == response_model.__name__):
        return response_model.model_validate_json(str(data.get("json")))
    raise ValueError("the journaled response does not fit this call")


def _ledger() -> Any:
    from crewfence_sidecar.tools import ledger

    job_ledger = ledger.current()
    if job_ledger is None or not job_ledger.tracks_models():
        return None
    return job_ledger


def _call_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(messages, tools, from_task, response_model) of ``call(messages, tools, callbacks,
    available_functions, from_task, from_agent, response_model)``."""
    names = ("messages", "tools", "callbacks", "available_functions", "from_task",
             "from_agent", "response_model")
    bound = dict(zip(names, args, strict=False)) | kwargs
    return (bound.get("messages"), bound.get("tools"), bound.get("from_task"),
            bound.get("response_model"))


def _before(llm: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, bool,
                                                                             Any]:
    """(ledger, task, answered, answer): ``answered`` when the journal answers the call."""
    job_ledger = _ledger()
    if job_ledger is None:
        return None, None, False, None
    messages, tools, task, response_model = _call_args(args, kwargs)
    try:
        sha = request_sha256(str(getattr(llm, "model", "") or ""), messages, tools,
                             response_model)
    except Exception:  # a request that cannot be hashed is never matched: a plain call
        return None, None, False, None
    encoded = job_ledger.model_request(task, sha)
    if encoded is not None:
        try:
            answer = decode_response(encoded, response_model)
        except ValueError:
            job_ledger.model_not_replayed(task)
        else:
            return job_ledger, task, True, answer
    return job_ledger, task, False, None


@contextlib.contextmanager
def _making_call() -> Iterator[None]:
    """The live call runs inside: an LLM that calls another wrapped one is journaled once."""
    token = _INSIDE.set(True)
    try:
        yield
    finally:
        _INSIDE.reset(token)


def _after(job_ledger: Any, task: Any, response: Any) -> Any:
    """Hand the live call's response to the ledger (as material), and return it."""
    if job_ledger is not None:
        job_ledger.model_response(task, encode_response(response))
    return response


def _wrap_sync(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _INSIDE.get():
            return call(self, *args, **kwargs)
        job_ledger, task, answered, answer = _before(self, args, kwargs)
        if answered:
            return answer
        with _making_call():
            response = call(self, *args, **kwargs)
        return _after(job_ledger, task, response)

    wrapper.__crewfence_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def _wrap_async(acall: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(acall)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _INSIDE.get():
            return await acall(self, *args, **kwargs)
        job_ledger, task, answered, answer = _before(self, args, kwargs)
        if answered:
            return answer
        with _making_call():
            response = await acall(self, *args, **kwargs)
        return _after(job_ledger, task, response)

    wrapper.__crewfence_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def wrap_llm_class(cls: type) -> None:
    """Wrap ``cls.call``/``cls.acall`` where ``cls`` defines them (idempotent)."""
    for name, wrap in (("call", _wrap_sync), ("acall", _wrap_async)):
        method = cls.__dict__.get(name)
        if callable(method) and not getattr(method, "__crewfence_wrapped__", False):
            setattr(cls, name, wrap(method))


def wrap_crew_llms(crew: Any) -> None:
    """Wrap the classes of the LLMs the agents of ``crew`` call (and their bases)."""
    from crewai import BaseLLM

    for agent in getattr(crew, "agents", None) or []:
        llm = getattr(agent, "llm", None)
        if isinstance(llm, BaseLLM):
            for cls in type(llm).__mro__:
                if issubclass(cls, BaseLLM):
                    wrap_llm_class(cls)
