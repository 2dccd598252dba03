"""SidecarClient against a REAL sidecar process (offline LLM, ephemeral journal, loopback)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from crewfence_operator.sidecar_client import Endpoint, SidecarClient, SidecarFailure
from crewfence_sidecar.contract import FailureCategory, Operation, StartRequest, Status

pytestmark = pytest.mark.slow
TOKEN = "component-test-token"


@dataclass
class Sidecar:
    address: str
    proc: subprocess.Popen[bytes]


def _listening_port(log: Path) -> int | None:
    """The port from the sidecar's JSON ``"msg": "listening"`` line on stderr, once logged."""
    for line in log.read_text(errors="replace").split("\n")[:-1]:  # complete lines only
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("msg") == "listening":
                return int(entry["port"])
    return None


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    # CREWFENCE_PORT=0: the sidecar binds a port the kernel chooses and logs it (a port probed
    # free here and bound by the child later can be taken by another xdist worker between)
    work = tmp_path_factory.mktemp("sidecar")
    env = dict(os.environ, CREWFENCE_REGISTRY="crewfence_sidecar.samples:SAMPLE_CREWS",
               CREWFENCE_EPHEMERAL="1", CREWFENCE_HOST="127.0.0.1", CREWFENCE_PORT="0",
               CREWFENCE_TOKEN=TOKEN, CREWFENCE_ALLOWED_OPERATIONS="run,knowledge_query",
               CREWAI_STORAGE_DIR=str(work / "crewai"), HOME=str(work))
    log = work / "sidecar.log"  # a file, not a pipe: nothing read later can fill and block it
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "crewfence_sidecar.cli"], env=env,
                                cwd=work, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 120
    while (port := _listening_port(log)) is None:
        if proc.poll() is not None:
            raise AssertionError(f"sidecar exited: {log.read_text(errors='replace')[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(10)
            raise AssertionError("sidecar did not start listening")
        time.sleep(0.2)
    yield Sidecar(f"127.0.0.1:{port}", proc)
    proc.kill()
    proc.wait(10)


@pytest.fixture
async def client(sidecar: Sidecar) -> AsyncIterator[SidecarClient]:
    async with aiohttp.ClientSession() as session:
        yield SidecarClient(session, Endpoint(sidecar.address, TOKEN))


def req(action_id: str, topic: str, timeout_ms: int | None = None) -> StartRequest:
    return StartRequest(crew_id="research", action_id=action_id, operation=Operation.RUN,
                        input={"topic": topic}, timeout_ms=timeout_ms)


async def test_health_reports_a_journal_id(client: SidecarClient) -> None:
    health = await client.health()
    assert health["status"] == "ready" and health.get("journal_id")


async def test_admit_follow_and_exact_repeat(client: SidecarClient) -> None:
    action = "team-a/hello"  # a slash: must stay one path segment
    assert not (await client.get_job(action)).known
    first = await client.start(req(action, "bees"), "key-1")
    assert first.http_status in (200, 202) and first.journal_id
    names = [e.event async for e in client.follow(action, 0)]
    assert names[0] == "started" and names[-1] == "completed"
    lookup = await client.get_job(action)
    assert lookup.record is not None and lookup.record.status is Status.COMPLETED
    page = await client.events_page(action, 1)
    assert page.cursor == 1 and page.next_cursor == len(names)
    again = await client.start(req(action, "bees"), "key-1")
    assert again.http_status == 200
    assert again.record.created_at == lookup.record.created_at
    assert again.record.request_hash == first.record.request_hash


async def test_changed_request_is_a_permanent_conflict(client: SidecarClient) -> None:
    action = "team-a/conflict"
    await client.start(req(action, "bees"), "key-1")
    with pytest.raises(SidecarFailure) as info:
        await client.start(req(action, "ants"), "key-1")
    f = info.value
    assert (f.http_status, f.category, f.uncertain) == (409, FailureCategory.PERMANENT, False)


async def test_wrong_token_is_auth(sidecar: Sidecar) -> None:
    async with aiohttp.ClientSession() as session:
        bad = SidecarClient(session, Endpoint(sidecar.address, "wrong"))
        with pytest.raises(SidecarFailure) as info:
            await bad.start(req("team-a/auth", "bees"), "k")
    assert info.value.category is FailureCategory.AUTH and not info.value.uncertain
    assert "wrong" not in str(info.value)


async def test_cancel_a_slow_job(client: SidecarClient) -> None:
    action = "team-a/slow"
    await client.start(req(action, "[[sleep:60]] slow"), "key-slow")
    record = await client.cancel("research", action, reason="test")
    if not record.terminal:
        async for _ in client.follow(action, 0):
            pass
        lookup = await client.get_job(action)
        assert lookup.record is not None
        record = lookup.record
    assert record.status is Status.CANCELLED


async def test_refused_connection_is_transport_and_certain() -> None:
    # a port this test holds bound but never listens on: connecting is refused, and no other
    # process can listen there meanwhile (a port probed free and released could be taken)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        async with aiohttp.ClientSession() as session:
            dead = SidecarClient(session, Endpoint(f"127.0.0.1:{port}", TOKEN))
            with pytest.raises(SidecarFailure) as info:
                await dead.start(req("team-a/dead", "bees"), "k")
    assert info.value.category is FailureCategory.TRANSPORT and not info.value.uncertain


async def test_events_follow_ends_with_the_terminal_event(client: SidecarClient) -> None:
    action = "team-a/follow"
    await client.start(req(action, "ants"), "key-f")
    seqs = [e.sequence async for e in client.follow(action, 0)]
    assert seqs == list(range(len(seqs)))
