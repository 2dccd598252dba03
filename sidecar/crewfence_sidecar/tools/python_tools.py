"""Python tools of a declarative crew: ``{name, ref: "module:attribute"}``.

``ref`` names, importable in the sidecar image, a crewai ``BaseTool`` instance, a
``BaseTool`` subclass (instantiated without arguments) or a plain callable (wrapped as a
crewai tool; its docstring is the description). The agent knows the tool by ``name``.

Invariant: every job gets its own tool object (an instance is copied), so usage counters
and state of one job never leak into another.
"""

from __future__ import annotations

import importlib
from typing import Any

from crewai.tools import BaseTool
from crewai.tools.base_tool import Tool

from crewfence_sidecar.contract import ToolSetupError

REF_SEPARATOR = ":"


class ToolReferenceError(ToolSetupError):
    """A ``ref`` that does not name an importable tool (the message names the ref)."""


def resolve_reference(ref: str) -> Any:
    """The object ``module:attribute`` names (attribute may be dotted)."""
    module_name, sep, attribute = ref.partition(REF_SEPARATOR)
    if not sep or not module_name or not attribute:
        raise ToolReferenceError(f"ref {ref!r} must look like module:attribute")
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ToolReferenceError(f"ref {ref!r}: cannot import {module_name}: {exc}") from None
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ToolReferenceError(f"ref {ref!r}: {module_name} has no {attribute}") from None
    if not (isinstance(value, BaseTool) or callable(value)):
        raise ToolReferenceError(f"ref {ref!r} is not a crewai tool or a callable")
    return value


def build_python_tool(name: str, ref: str) -> BaseTool:
    """A fresh crewai tool for one crew, known to the agent as ``name``."""
    target = resolve_reference(ref)
    tool: BaseTool
    if isinstance(target, BaseTool):
        tool = target.model_copy(deep=False)
    elif isinstance(target, type) and issubclass(target, BaseTool):
        tool = target()  # type: ignore[call-arg]  # a subclass declares its defaults
    else:
        description = (getattr(target, "__doc__", None) or f"Python tool {name}").strip()
        tool = Tool(name=name, description=description, func=target)
    tool.name = name
    return tool
