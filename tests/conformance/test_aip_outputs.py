"""Every operation's output shape (docs/aip-compatibility.md, "Operation outputs"): the
blocking 200 body, the record's output and the `completed` event's data are that object."""

from __future__ import annotations

from typing import Any

import aiohttp
from aip_client import (
    Target,
    assert_run_output,
    auth,
    call,
    job_path,
    new_action_id,
    start_body,
    start_headers,
    wait_record,
)


async def _blocking(session: aiohttp.ClientSession, target: Target, operation: str,
                    input_: dict[str, Any], crew_id: str = "research") -> Any:
    """Run one operation through the blocking route; check the three views agree."""
    action = new_action_id(operation)
    got = await call(session, "POST", target.url + "/jobs",
                     json_body=start_body(action, operation, input_, crew_id=crew_id),
                     headers=start_headers(target.token, f"key-{action}", action))
    assert got.status == 200, (operation, got.status, got.body)
    record = await wait_record(session, target.url, target.token, action, until={"completed"})
    assert record["output"] == got.body
    page = await call(session, "GET", target.url + job_path(action, "/events"),
                      headers=auth(target.token))
    completed = page.body["events"][-1]
    assert completed["event"] == "completed" and completed["data"] == got.body
    return got.body


async def test_run_output_is_crewai_crew_output_in_json_mode(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    output = await _blocking(session, sidecar, "run", {"topic": "otters"}, crew_id="duo")
    assert_run_output(output)
    assert [t["name"] for t in output["tasks_output"]] == ["research", "write"]
    assert [t["agent"] for t in output["tasks_output"]] == ["Researcher", "Writer"]
    assert output["pydantic"] is None and output["json_dict"] is None


async def test_batch_run_output(sidecar: Target, session: aiohttp.ClientSession) -> None:
    output = await _blocking(session, sidecar, "batch_run",
                             {"inputs": [{"topic": "alpha"}, {"topic": "beta"}]})
    assert output["count"] == 2 and len(output["results"]) == 2
    for topic, result in zip(("alpha", "beta"), output["results"], strict=True):
        assert_run_output(result)
        assert topic in result["raw"]


async def test_replay_output_is_the_run_output_shape(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    run = await _blocking(session, sidecar, "run", {"topic": "lynx"}, crew_id="duo")
    # crewfence extension used here: each task output names its task id
    task_id = run["tasks_output"][1]["id"]
    output = await _blocking(session, sidecar, "replay", {"task_id": task_id}, crew_id="duo")
    assert_run_output(output)
    assert output["raw"] == run["raw"]


async def test_train_output(sidecar: Target, session: aiohttp.ClientSession) -> None:
    output = await _blocking(session, sidecar, "train",
                             {"n_iterations": 1, "artifact_name": "conformance-model",
                              "inputs": {"topic": "crows"}})
    assert output["status"] == "completed"
    assert output["artifact_name"] == "conformance-model"
    assert output["n_iterations"] == 1
    assert any(p.name.startswith("conformance-model") for p in sidecar.training_dir.iterdir())


async def test_test_output(sidecar: Target, session: aiohttp.ClientSession) -> None:
    output = await _blocking(session, sidecar, "test",
                             {"n_iterations": 1, "eval_llm": "crewfence/offline",
                              "inputs": {"topic": "eels"}})
    assert output["status"] == "completed"
    assert output["n_iterations"] == 1 and output["eval_llm"] == "crewfence/offline"


async def test_knowledge_query_output(sidecar: Target, session: aiohttp.ClientSession) -> None:
    output = await _blocking(session, sidecar, "knowledge_query",
                             {"query": ["Where do honey bees live?"], "results_limit": 2,
                              "score_threshold": 0.0}, crew_id="library")
    assert isinstance(output["results"], list) and output["results"]


async def test_memory_reset_output(sidecar: Target, session: aiohttp.ClientSession) -> None:
    output = await _blocking(session, sidecar, "memory_reset",
                             {"command_type": "kickoff_outputs"})
    assert output["status"] == "completed" and output["command_type"] == "kickoff_outputs"
