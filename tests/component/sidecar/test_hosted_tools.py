"""The hosted-model path with native tool calling, through the real ``crewfence-sidecar``
(jobs in worker processes): a declarative crew whose model (``openai/gpt-4o-mini``) points at
the loopback OpenAI-compatible fixture (``tests/support/openai_fixture.py``), which answers
with ``tool_calls`` naming the agent's Python tool and, after the tool's result, a final
answer. The tool (``ledger_tools:lookup``) writes its effect with the key it received to a
file outside the sidecar's state. No network beyond loopback."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from crewfence_sidecar.contract import summarize_effects
from sidecar_helpers import SidecarProcess, headers, json_call, sidecar_env

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from openai_fixture import OpenAIFixture

SUPPORT = Path(__file__).resolve().parents[2] / "support"

pytestmark = pytest.mark.timeout(300)
KEY_ENV = "CREWFENCE_TEST_OPENAI_KEY"


@pytest.fixture(scope="module")
def openai_server() -> Iterator[OpenAIFixture]:
    server = OpenAIFixture().start()
    yield server
    server.stop()




def test_a_hosted_model_calls_a_tool_natively_and_the_ledger_holds_it(
        tmp_path: Path, openai_server: OpenAIFixture) -> None:
    crews = tmp_path / "crews.yaml"
    crews.write_text(f"""\
crews:
  hosted-desk:
    llm: {{model: openai/gpt-4o-mini, base_url: "{openai_server.base_url}",
           api_key_env: {KEY_ENV}}}
    tools:
      python:
        - {{name: lookup, ref: "ledger_tools:lookup"}}
    agents:
      clerk: {{role: Clerk, goal: Look things up, backstory: Careful., max_retry_limit: 0,
              tools: [lookup]}}
    tasks:
      - {{name: look, agent: clerk, description: "Handle: {{request}}",
         expected_output: A note}}
""")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    tool_ledger = tmp_path / "tools.jsonl"
    env = sidecar_env(state / "journal.db", crews, CREWFENCE_TEST_TOOL_LEDGER=str(tool_ledger),
                      CREWFENCE_REGISTRY="ledger_tools:REGISTRY",
                      PYTHONPATH=os.pathsep.join(p for p in (str(SUPPORT),
                                                             os.environ.get("PYTHONPATH")) if p),
                      **{KEY_ENV: "sk-fixture-hosted"})
    env.pop("OPENAI_API_KEY", None)
    sidecar = SidecarProcess([], env, tmp_path / "sidecar.log").start()
    try:
        sidecar.wait_listening()
        body = {"crew_id": "hosted-desk", "action_id": "hosted-tool", "operation": "run",
                "input": {"request": 'find [[tool:lookup {"term": "H-1"}]] please'}}
        status, record = json_call(f"{sidecar.url}/jobs", "POST", body, headers("key-hosted"))
        _, page = json_call(f"{sidecar.url}/jobs/hosted-tool/events?cursor=0&limit=1000")
    finally:
        sidecar.terminate()
    assert status == 200, record
    events = page["events"]
    seen = [r for r in openai_server.snapshot() if "H-1" in r.user_texts]
    # the model asked for the tool natively, then answered after its result
    assert [len(r.tool_calls) for r in seen] == [1, 0]
    assert seen[0].tools == ["lookup"] and seen[0].tool_calls[0]["name"] == "lookup"
    assert seen[1].tool_results == 1
    assert "fixture answer" in json.dumps(record)
    # the tool ran once, with the key its start was journaled with
    ran = [json.loads(line) for line in tool_ledger.read_text().splitlines()]
    assert [(r["tool"], r["term"]) for r in ran] == [("lookup", "H-1")]
    started = [e["data"] for e in events if e["event"] == "tool_call_started"]
    finished = [e["data"] for e in events if e["event"] == "tool_call_finished"]
    assert [s["tool"] for s in started] == ["lookup"] and len(finished) == 1
    assert started[0]["idempotency_key"] == finished[0]["idempotency_key"] == ran[0]["key"]
    assert finished[0]["error"] is None
    # each model call journaled with its tokens and the provider's id of its response
    models = [e["data"] for e in events if e["event"] == "model_call"]
    assert [m["request_id"] for m in models] == [r.response_id for r in seen]
    assert all(m["prompt_tokens"] > 0 and m["completion_tokens"] > 0 for m in models)
    assert all(m["model"].endswith("gpt-4o-mini") for m in models)
    summary = summarize_effects(events)
    assert (summary.model_calls, summary.tool_calls, summary.in_doubt) == (2, 1, [])
