"""A crews registry (``worker_crews:CREWS``) for the worker tests, shipped the way users ship
crews in their own image. Each crew leaves evidence in the file named by
``CREWFENCE_TEST_EFFECTS_LOG`` (one line per effect: ``<kind> <pid> <tag>``), written with
O_APPEND by whatever process runs the job, so a test in another process can count effects.

- ``stuck``: three tasks; every model call is logged, then blocks for :data:`STUCK_SECONDS`
  ignoring any cancel signal of crewfence's own (like a hosted model's socket read).
- ``hang``: the first model call never returns.
- ``spin``: the model asks for the ``spin`` tool, which loops forever in pure Python and logs
  a line every :data:`SPIN_LOG_EVERY` iterations (a job stuck in a tight tool loop).
- ``segfault``: the model call dereferences NULL (a native extension fault).
- ``tagged``: the offline model, each call logged (which worker ran the job: reuse tests).
- ``leak_thread``: a tool starts a non-daemon thread that sleeps for an hour, then the job
  ends normally (its worker must not be reused).
- ``leak_process``: a tool starts ``sleep 3600`` in the worker's process group, then the job
  ends normally (its worker must not be reused; the child dies with the group).
- ``leak_daemon``: a tool starts ``sleep 3600`` with ``setsid`` and a double fork (outside
  the worker's process group, its parent gone), then the job ends normally (its worker must
  not be reused; the daemon escapes the group's kill: the test kills it).
- ``daemon_then_block``: a tool starts such a daemon, then blocks for an hour (a cancel must
  stop the daemon too before the record says ``work_stopped``).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import time
from typing import Any

from crewai import Agent, Crew, Task
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool
from crewfence_sidecar.offline_llm import OfflineLLM, prompt_text

STUCK_SECONDS = 1.0
SPIN_LOG_EVERY = 100_000


def effect(kind: str, tag: str = "") -> None:
    path = os.environ.get("CREWFENCE_TEST_EFFECTS_LOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{kind} {os.getpid()} {tag}\n".encode())
    finally:
        os.close(fd)


def _tag(messages: Any) -> str:
    text = prompt_text(messages)
    marker = "TAG-"
    at = text.find(marker)
    return text[at:at + 24].split()[0] if at >= 0 else ""


class StuckLLM(OfflineLLM):
    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        effect("llm", _tag(messages))
        time.sleep(STUCK_SECONDS)
        return super().call(messages, *args, **kwargs)

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call(messages, *args, **kwargs)


class HangLLM(OfflineLLM):
    """A model call that never returns (a provider that stopped answering)."""

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        effect("llm", _tag(messages))
        time.sleep(3600)
        return super().call(messages, *args, **kwargs)

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call(messages, *args, **kwargs)


class SpinTool(BaseTool):
    name: str = "spin"
    description: str = "Spins forever."

    def _run(self, **kwargs: Any) -> str:
        n = 0
        while True:
            n += 1
            if n % SPIN_LOG_EVERY == 0:
                effect("tool")


class ToolLoopLLM(BaseLLM):
    def __init__(self, **data: Any) -> None:
        super().__init__(model="test/tool-loop", **data)

    def supports_function_calling(self) -> bool:
        return False

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        effect("llm", _tag(messages))
        return "Thought: I must spin.\nAction: spin\nAction Input: {}"

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call(messages, *args, **kwargs)


class SegfaultLLM(BaseLLM):
    def __init__(self, **data: Any) -> None:
        super().__init__(model="test/segfault", **data)

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        effect("llm", _tag(messages))
        ctypes.string_at(0)  # SIGSEGV
        return "unreachable"

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call(messages, *args, **kwargs)


class TaggedLLM(OfflineLLM):
    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        effect("llm", _tag(messages))
        return super().call(messages, *args, **kwargs)

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call(messages, *args, **kwargs)


class LeakThreadTool(BaseTool):
    name: str = "leak"
    description: str = "Leaves something running."

    def _run(self, **kwargs: Any) -> str:
        threading.Thread(target=time.sleep, args=(3600,), name="leaked-sleeper").start()
        return "left a thread running"


class LeakProcessTool(BaseTool):
    name: str = "leak"
    description: str = "Leaves something running."

    def _run(self, **kwargs: Any) -> str:
        child = subprocess.Popen(["sleep", "3600"])
        effect("child", str(child.pid))
        return "left a process running"


class LeakDaemonTool(BaseTool):
    name: str = "leak"
    description: str = "Leaves a daemon running outside its process group."

    def _run(self, **kwargs: Any) -> str:
        # setsid + double fork: the daemon leaves the worker's process group and its parent
        # (the shell) exits at once, so only a subreaper still sees it as a descendant
        shell = subprocess.run(["sh", "-c", "sleep 3600 >/dev/null 2>&1 & echo $!"],
                               start_new_session=True, capture_output=True, text=True,
                               check=True)
        effect("daemon", shell.stdout.strip())
        return "left a daemon running"


class DaemonThenBlockTool(LeakDaemonTool):
    def _run(self, **kwargs: Any) -> str:
        super()._run(**kwargs)
        time.sleep(3600)
        return "left a daemon running"


class UseToolOnceLLM(BaseLLM):
    """Asks for the ``leak`` tool once, then gives its final answer."""

    def __init__(self, **data: Any) -> None:
        super().__init__(model="test/use-tool-once", **data)

    def supports_function_calling(self) -> bool:
        return False

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        text = prompt_text(messages)
        effect("llm", _tag(messages))
        if "left a " in text:  # the tool's observation came back
            return "Thought: I now know the final answer\nFinal Answer: done"
        return "Thought: I must leak.\nAction: leak\nAction Input: {}"

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call(messages, *args, **kwargs)


def _crew(llm: BaseLLM, tasks: int = 1, tools: list[BaseTool] | None = None) -> Crew:
    agent = Agent(role="Worker", goal="Work on {topic}", backstory="Diligent.", llm=llm,
                  tools=tools or [], max_iter=3)
    return Crew(agents=[agent], tasks=[
        Task(description=f"Step {i} on {{topic}}", expected_output="Notes", agent=agent)
        for i in range(tasks)])


CREWS = {
    "stuck": lambda: _crew(StuckLLM(), tasks=3),
    "hang": lambda: _crew(HangLLM(), tasks=2),
    "spin": lambda: _crew(ToolLoopLLM(), tools=[SpinTool()]),
    "segfault": lambda: _crew(SegfaultLLM()),
    "tagged": lambda: _crew(TaggedLLM()),
    "leak_thread": lambda: _crew(UseToolOnceLLM(), tools=[LeakThreadTool()]),
    "leak_process": lambda: _crew(UseToolOnceLLM(), tools=[LeakProcessTool()]),
    "leak_daemon": lambda: _crew(UseToolOnceLLM(), tools=[LeakDaemonTool()]),
    "daemon_then_block": lambda: _crew(UseToolOnceLLM(), tools=[DaemonThenBlockTool()]),
}
