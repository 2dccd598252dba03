"""Python tools for the effect-ledger tests (importable as ``ledger_tools`` with tests/support
on the path). Each appends one JSON line to ``$CREWFENCE_TEST_TOOL_LEDGER`` (a file outside
the sidecar's state dir) with the idempotency key it saw, so a test can compare what ran with
what the journal holds."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from crewai.hooks.dispatch import InterceptionPoint, register
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


def _pause_sidecar_before_tripwire(ctx: Any) -> None:
    """A ``pre_tool_call`` hook registered at import, so before the ledger's (installed at a
    job's start): for ``tripwire``, SIGSTOP the sidecar and SIGCONT it ``PAUSE_SECONDS``
    later. The tool's start reaches a sidecar that cannot commit it for that long; a worker
    that ran the tool without waiting for the acknowledgement would run its body (which
    kills the sidecar) before the start is journaled."""
    pid_file = os.environ.get("CREWFENCE_TEST_SIDECAR_PID_FILE")
    if not pid_file or getattr(ctx, "tool_name", None) != "tripwire":
        return
    pid = int(Path(pid_file).read_text())
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(PAUSE_SECONDS, os.kill, (pid, signal.SIGCONT))
    timer.daemon = True
    timer.start()


PAUSE_SECONDS = 1.0
register(InterceptionPoint.PRE_TOOL_CALL, _pause_sidecar_before_tripwire)


def kill_sidecar(note: str) -> str:
    """``tripwire``: SIGKILL the sidecar (pid in ``$CREWFENCE_TEST_SIDECAR_PID_FILE``) at this
    tool's first instructions, then this worker: whatever the journal holds afterwards was
    committed before the tool body ran (the write-ahead test). The key it saw is noted first,
    without fsync (a killed process's writes stay in the page cache), so the kill comes at
    once."""
    target = os.environ.get("CREWFENCE_TEST_TOOL_LEDGER")
    if target:
        with Path(target).open("a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": "kill_sidecar", "key": current_idempotency_key(),
                                  "note": note}) + "\n")
    pid_file = os.environ.get("CREWFENCE_TEST_SIDECAR_PID_FILE")
    if pid_file:
        os.kill(int(Path(pid_file).read_text()), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def noop(n: int = 0) -> str:
    """Do nothing (the benchmark's tool; ``n`` tells its calls apart)."""
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
