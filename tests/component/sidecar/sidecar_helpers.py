"""Helpers shared by the sidecar component tests (put on sys.path by conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

TOKEN = "test-token-0123456789"
SUPPORT = Path(__file__).resolve().parents[2] / "support"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ALL_OPS = "run,batch_run,replay,train,test,knowledge_query,memory_reset"
SIDECAR_BIN = str(Path(sys.executable).with_name("crewfence-sidecar"))
T = TypeVar("T")

CREWS_YAML = """\
crews:
  research:
    agents:
      researcher: {role: Researcher, goal: "Research {topic}", backstory: "Curious."}
    tasks:
      - {name: research, agent: researcher, description: "Research {topic}",
         expected_output: "A summary"}
  duo:
    agents:
      researcher: {role: Researcher, goal: "Research {topic}", backstory: "Curious."}
      writer: {role: Writer, goal: "Write about {topic}", backstory: "Clear."}
    tasks:
      - {name: research, agent: researcher, description: "Research {topic}",
         expected_output: "Notes"}
      - {name: write, agent: writer, description: "Write about {topic}",
         expected_output: "An article", context: [research]}
  library:
    agents:
      librarian: {role: Librarian, goal: "Answer {question}", backstory: "Knows books."}
    tasks:
      - {name: answer, agent: librarian, description: "Answer {question}",
         expected_output: "An answer"}
    knowledge:
      - {name: bees, content: "Honey bees live in hives and make honey from nectar."}
      - {name: ants, content: "Ants live in colonies and farm aphids."}
"""


def write_crews(directory: Path) -> Path:
    path = directory / "crews.yaml"
    path.write_text(CREWS_YAML)
    return path



def start_body(action_id: str, topic: str = "bees", crew_id: str = "research",
               operation: str = "run", input_: dict[str, Any] | None = None,
               **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"crew_id": crew_id, "action_id": action_id, "operation": operation,
                            "input": {"topic": topic} if input_ is None else input_}
    body.update(extra)
    return body


def headers(key: str | None = "key-1", *, async_: bool = False, **more: str) -> dict[str, str]:
    h = dict(AUTH)
    if key is not None:
        h["Idempotency-Key"] = key
    if async_:
        h["Prefer"] = "respond-async"
    h.update(more)
    return h


def llm_calls() -> int:
    from crewfence_sidecar.offline_llm import call_count

    return call_count()


async def until_llm_called(before: int, timeout: float = 60) -> None:
    """Await the offline LLM's call count passing ``before`` (a job is in its model call)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while llm_calls() <= before:
        assert loop.time() < deadline, "the job never reached the LLM"
        await asyncio.sleep(0.01)


async def serve_in_process(sidecar: Any, made: list[tuple[Any, Any]]) -> Any:
    """Serve an in-process sidecar on a real loopback socket: its aiohttp TestClient (with
    ``client.sidecar``), remembered in ``made`` for :func:`close_in_process`."""
    from aiohttp.test_utils import TestClient, TestServer

    client = TestClient(TestServer(sidecar.app, host="127.0.0.1"))
    await client.start_server()
    client.sidecar = sidecar  # type: ignore[attr-defined]
    made.append((client, sidecar))
    return client


async def close_in_process(made: list[tuple[Any, Any]]) -> None:
    """Stop what :func:`serve_in_process` started: runtime, server, journal."""
    for client, sidecar in made:
        await sidecar.runtime.close()
        await client.close()
        sidecar.opened.close()


def port_is_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def wait_until(check: Callable[[], T | None], timeout: float = 30.0,
               what: str = "condition") -> T:
    """Poll a condition with a deadline (no sleeping as synchronisation)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def json_call(url: str, method: str = "GET", body: dict[str, Any] | None = None,
              extra: dict[str, str] | None = None,
              timeout: float = 120.0) -> tuple[int, Any]:
    """One authorised JSON request to a sidecar: (status, decoded body), errors included."""
    req = urllib.request.Request(url, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={**AUTH, "Content-Type": "application/json",
                                          **(extra or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@contextlib.contextmanager
def mcp_ledger_server(where: Path,
                      transport: str = "streamable-http") -> Iterator[tuple[str, Path]]:
    """(URL, ledger file) of the real MCP test server (``tests/support/mcp_ledger_server.py``)
    on loopback, over ``transport`` (``streamable-http`` or ``sse``), while the block runs;
    its ledger and log go in ``where``. The server binds port 0 itself and writes the port it
    got to a file once it listens (a port probed free here could be taken before it binds)."""
    ledger, port_file = where / "tickets.jsonl", where / "server.port"
    log = where / "server.log"
    port_file.unlink(missing_ok=True)  # never an earlier server's port
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, str(SUPPORT / "mcp_ledger_server.py"),
                                 "0", str(ledger), transport, str(port_file)],
                                stdout=subprocess.DEVNULL, stderr=err)

    def listening() -> int | None:
        assert proc.poll() is None, log.read_text()
        return int(port_file.read_text()) if port_file.exists() else None

    try:
        port = wait_until(listening, 60, "the MCP server to listen")
        yield f"http://127.0.0.1:{port}/{'sse' if transport == 'sse' else 'mcp'}", ledger
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} missing")


@dataclass
class SidecarProcess:
    """The real ``crewfence-sidecar`` executable as a child process."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    port: int | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)

    def start(self) -> SidecarProcess:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen([SIDECAR_BIN, *self.args], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_listening(self, timeout: float = 90.0) -> SidecarProcess:
        def check() -> int | None:
            assert self.proc is not None
            for line in self.stderr_text().splitlines():
                if line.startswith("{"):
                    entry = json.loads(line)
                    if entry.get("msg") == "listening":
                        return int(entry["port"])
            if self.proc.poll() is not None:
                raise AssertionError(f"sidecar exited {self.proc.returncode}: "
                                     f"{self.stderr_text()[-2000:]}")
            return None

        self.port = wait_until(check, timeout, "the sidecar to listen")
        return self

    def wait_exit(self, timeout: float = 90.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def terminate(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


def sidecar_env(state_file: Path | None, crews_file: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWFENCE_")}
    env.update({"CREWFENCE_CREWS_FILE": str(crews_file), "CREWFENCE_HOST": "127.0.0.1",
                "CREWFENCE_PORT": "0", "CREWFENCE_TOKEN": TOKEN})
    if state_file is not None:
        env["CREWFENCE_STATE_FILE"] = str(state_file)
    env.update(more)
    return {k: v for k, v in env.items() if v != ""}


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A loopback port held, while the block runs, by a socket bound with SO_REUSEADDR that
    never listens. Connecting to it is refused, and no other process is handed it for port 0
    or can bind it without SO_REUSEADDR; a server that binds it explicitly WITH SO_REUSEADDR
    (asyncio's and so aiohttp's default on POSIX, as the sidecar does) still binds and listens
    (Linux: a reuse bind conflicts only with a listening socket)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def refused_start(tmp_path: Path, env: dict[str, str], *args: str) -> str:
    """Run the sidecar expecting a refusal: exit 2, one stderr line, port never bound.

    The port is held by :func:`reserved_port` throughout instead of being probed free and
    released, so another test process is not handed it meanwhile (only one that had already
    picked this number, racily, and binds it with SO_REUSEADDR could still listen there: a
    false failure, never a false pass). A sidecar that wrongly starts can still bind it: it
    would listen and not exit (``wait_exit`` fails), not refuse with "cannot bind"."""
    with reserved_port() as port:
        proc = SidecarProcess(list(args), {**env, "CREWFENCE_PORT": str(port)},
                              tmp_path / f"refused-{port}.log").start()
        assert proc.wait_exit(60) == 2
        assert port_is_closed(port)
    lines = proc.stderr_text().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("crewfence-sidecar: error: ")
    return lines[0]


async def uncertain_after_restart(make_client: Any, action_ids: tuple[str, ...]) -> Any:
    """Jobs stopped while running (the sidecar stops: failed + uncertain), then a client of
    the sidecar opened again on the same journal; each record is checked uncertain."""
    from crewfence_sidecar.contract import job_path

    c = await make_client()
    for action_id in action_ids:
        r = await c.post("/jobs", json=start_body(action_id, topic="[[sleep:30]] slowly"),
                         headers=headers(action_id.replace("/", "-"), async_=True))
        assert r.status == 202, await r.text()
    await c.sidecar.runtime.close()
    c.sidecar.opened.close()
    c = await make_client()
    for action_id in action_ids:
        record = await (await c.get(job_path(action_id), headers=AUTH)).json()
        assert record["uncertain_outcome"] is True, record
    return c
