"""Python tools for the effect-ledger tests (importable as ``ledger_tools`` with tests/support
on the path). Each appends one JSON line to ``$CREWFENCE_TEST_TOOL_LEDGER`` (a file outside
the sidecar's state dir) with the idempotency key it saw, so a test can compare what ran with
what the journal holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

from crewai.tools import BaseTool
from crewfence_sidecar.tool_context import current_idempotency_key


def _record(tool: str, **fields: object) -> None:
    target = os.environ.get("CREWFENCE_TEST_TOOL_LEDGER")
    if not target:
        return
    line = json.dumps({"tool": tool, "key": current_idempotency_key(), "pid": os.getpid(),
                       **fields})
    with Path(target).open("a", encoding="utf-8") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def lookup(term: str) -> str:
    """Look a term up in the offline glossary."""
    _record("lookup", term=term)
    return f"glossary: {term} is a term"


def noop() -> str:
    """Do nothing (the benchmark's tool)."""
    return "ok"


class ExplodingTool(BaseTool):
    name: str = "explode"
    description: str = "Always raises."

    def _run(self, reason: str = "") -> str:
        _record("explode", reason=reason)
        raise LookupError("the tool failed on purpose")


def registry_desk() -> object:
    """A registry (image) crew whose agent has a Python tool: the ledger covers it too."""
    from crewai import Agent, Crew, Task
    from crewai.tools import tool
    from crewfence_sidecar.offline_llm import OfflineLLM

    @tool("stamp")
    def stamp(note: str) -> str:
        """Stamp a note."""
        _record("stamp", note=note)
        return f"stamped {note}"

    agent = Agent(role="Stamper", goal="Stamp notes", backstory="Stamps.", llm=OfflineLLM(),
                  tools=[stamp], max_retry_limit=0)
    task = Task(name="stamp-it", description="Stamp: {request}", expected_output="a stamp",
                agent=agent)
    return Crew(name="registry-desk", agents=[agent], tasks=[task])


def registry_mcp_desk() -> object:
    """A registry crew using crewai's own MCP DSL (``Agent(mcps=[MCPServerHTTP(...)])``) on
    ``$CREWFENCE_TEST_MCP_URL``: its calls are journaled and carry the key in ``_meta``."""
    from crewai import Agent, Crew, Task
    from crewai.mcp import MCPServerHTTP
    from crewfence_sidecar.offline_llm import OfflineLLM

    url = os.environ.get("CREWFENCE_TEST_MCP_URL", "http://127.0.0.1:9/mcp")
    agent = Agent(role="Filer", goal="File tickets", backstory="Files.", llm=OfflineLLM(),
                  mcps=[MCPServerHTTP(url=url)], max_retry_limit=0)
    task = Task(name="file-it", description="File: {request}", expected_output="a ticket",
                agent=agent)
    return Crew(name="registry-mcp", agents=[agent], tasks=[task])


REGISTRY = {"registry-desk": registry_desk, "registry-mcp": registry_mcp_desk}
