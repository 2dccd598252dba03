"""The hosted-model path through the real client stack: a declarative crew with
``model: openai/gpt-4o-mini`` and ``base_url`` pointing at a loopback server that speaks the
OpenAI chat-completions protocol (``tests/support/openai_fixture.py``), run in a worker.

A run succeeds end to end (the fixture saw the key, the model and the input); a cancel during
a slow completion kills the worker, and the fixture sees that request's connection dropped.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crewfence_sidecar.contract import job_path
from sidecar_helpers import AUTH, headers, start_body
from worker_support import HERE, Template

sys.path.insert(0, str(HERE.parents[1] / "support"))
from openai_fixture import OpenAIFixture

pytestmark = pytest.mark.timeout(180)
KEY_ENV = "CREWFENCE_TEST_OPENAI_KEY"
KEY = "sk-fixture-0123456789"


@pytest.fixture(scope="module")
def openai_server() -> Iterator[OpenAIFixture]:
    server = OpenAIFixture(slow_seconds=60).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def worker_template(tmp_path_factory: pytest.TempPathFactory,
                    openai_server: OpenAIFixture, crewai_storage: Path) -> Iterator[Template]:
    """Overrides the session template: this one hosts the crew that calls the fixture."""
    from crewfence_sidecar.workers.settings import TemplateSettings
    from crewfence_sidecar.workers.supervisor import Supervisor

    root = tmp_path_factory.mktemp("hosted")
    crews = root / "crews.yaml"
    crews.write_text(f"""\
crews:
  hosted:
    llm: {{model: openai/gpt-4o-mini, base_url: "{openai_server.base_url}",
           api_key_env: {KEY_ENV}}}
    agents:
      analyst: {{role: Analyst, goal: "Analyse {{topic}}", backstory: "Careful."}}
    tasks:
      - {{name: analyse, agent: analyst, description: "Analyse {{topic}}",
         expected_output: "A finding"}}
  keyless:
    llm: {{model: openai/gpt-4o-mini, base_url: "{openai_server.base_url}",
           api_key_env: CREWFENCE_TEST_UNSET_KEY}}
    agents:
      analyst: {{role: Analyst, goal: "Analyse {{topic}}", backstory: "Careful."}}
    tasks:
      - {{name: analyse, agent: analyst, description: "Analyse {{topic}}",
         expected_output: "A finding"}}
""")
    training = root / "training"
    training.mkdir()
    env = {**os.environ, KEY_ENV: KEY}
    env.pop("OPENAI_API_KEY", None)
    env.pop("CREWFENCE_TEST_UNSET_KEY", None)
    supervisor = Supervisor.spawn_template(
        TemplateSettings(crews_file=str(crews), training_dir=str(training)), env=env)
    supervisor.wait_ready()
    yield Template(supervisor, root / "effects.log", training)
    supervisor.close_sync()


def _requests_about(server: OpenAIFixture, word: str) -> list[Any]:
    return [r for r in server.snapshot() if word in r.last_user_text]


async def test_a_run_succeeds_through_the_openai_protocol(
        make_worker_client: Any, openai_server: OpenAIFixture) -> None:
    c = await make_worker_client()
    r = await c.post("/jobs", json=start_body("hosted-ok", crew_id="hosted", topic="otters"),
                     headers=headers("hosted-ok"))
    assert r.status == 200, await r.text()
    output = await r.json()
    seen = _requests_about(openai_server, "otters")
    assert seen, "the crew never called the model server"
    assert all(req.path == "/v1/chat/completions" for req in seen)
    assert {req.model for req in seen} == {"gpt-4o-mini"}
    assert {req.api_key for req in seen} == {KEY}
    assert all(req.completed and not req.dropped for req in seen)
    assert "fixture answer" in str(output)
    # batch_run kicks off without crewai streaming: the other shape of the protocol
    r = await c.post("/jobs", json=start_body("hosted-batch", crew_id="hosted",
                                              operation="batch_run",
                                              input_={"inputs": [{"topic": "beavers"}]}),
                     headers=headers("hosted-batch"))
    assert r.status == 200, await r.text()
    streams = {req.stream for req in [*seen, *_requests_about(openai_server, "beavers")]}
    assert streams == {True, False}, f"stream flags seen: {streams}"


async def test_cancel_during_a_slow_completion_drops_its_connection(
        make_worker_client: Any, openai_server: OpenAIFixture) -> None:
    c = await make_worker_client()
    r = await c.post("/jobs", json=start_body("hosted-slow", crew_id="hosted",
                                              topic="SLOWREPLY walruses"),
                     headers=headers("hosted-slow", async_=True))
    assert r.status == 202
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not any(req.in_flight for req in _requests_about(openai_server, "walruses")):
        assert loop.time() < deadline, "the slow completion never reached the fixture"
        await asyncio.sleep(0.02)
    [request] = _requests_about(openai_server, "walruses")
    r = await c.post(job_path("hosted-slow", "/cancel"),
                     json={"crew_id": "hosted", "action_id": "hosted-slow"}, headers=AUTH)
    record = await r.json()
    assert record["status"] == "cancelled" and record["error"]["work_stopped"] is True
    deadline = loop.time() + 10
    while not request.dropped:
        assert loop.time() < deadline, "the fixture never saw the connection close"
        await asyncio.sleep(0.02)
    assert not request.completed
    assert len(_requests_about(openai_server, "walruses")) == 1, "the request was retried"


async def test_health_says_which_hosted_model_lacks_credentials(
        make_worker_client: Any) -> None:
    c = await make_worker_client()
    health = await (await c.get("/health", headers=AUTH)).json()
    assert health["model_credentials"]["hosted"] == {
        "model": "openai/gpt-4o-mini", "hosted": True, "credentials": "present"}
    assert health["model_credentials"]["keyless"]["credentials"] == "missing"
    assert health["model_credentials_missing"] == ["keyless"]
    assert KEY not in await (await c.get("/health", headers=AUTH)).text()
