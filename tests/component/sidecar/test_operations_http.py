"""All seven operations end to end through HTTP on real crewai with the offline LLM.

The blocking ``POST /jobs`` answers 200 with the operation's output itself (AIP); the record
(``GET /jobs/{id}``) carries the same output.
"""

from __future__ import annotations

from typing import Any

from crewfence_sidecar.contract import job_path
from sidecar_helpers import AUTH, headers, llm_calls, start_body


async def _run(c: Any, action_id: str, crew_id: str, operation: str,
               input_: dict[str, Any]) -> dict[str, Any]:
    r = await c.post("/jobs", json=start_body(action_id, crew_id=crew_id, operation=operation,
                                              input_=input_), headers=headers(action_id))
    assert r.status == 200, await r.text()
    output = await r.json()
    record = await (await c.get(job_path(action_id), headers=AUTH)).json()
    assert record["status"] == "completed", record
    assert record["output"] == output
    return record


async def test_run_streams_chunks_and_names_its_tasks(make_client: Any) -> None:
    c = await make_client()
    rec = await _run(c, "op-run", "duo", "run", {"topic": "otters"})
    assert [t["name"] for t in rec["output"]["tasks_output"]] == ["research", "write"]
    events = (await (await c.get(job_path("op-run", "/events"), headers=AUTH)).json())["events"]
    assert sum(e["event"] == "chunk" for e in events) >= 2


async def test_batch_run(make_client: Any) -> None:
    c = await make_client()
    before = llm_calls()
    rec = await _run(c, "op-batch", "research", "batch_run",
                     {"inputs": [{"topic": "a"}, {"topic": "b"}, {"topic": "c"}]})
    raws = [r["raw"] for r in rec["output"]["results"]]
    assert len(raws) == 3 and len(set(raws)) == 3 and rec["output"]["count"] == 3
    assert llm_calls() - before == 3


async def test_replay_of_a_task_from_an_earlier_run(make_client: Any) -> None:
    c = await make_client()
    first = await _run(c, "op-before-replay", "duo", "run", {"topic": "lynx"})
    task_id = first["output"]["tasks_output"][1]["id"]
    before = llm_calls()
    rec = await _run(c, "op-replay", "duo", "replay", {"task_id": task_id})
    assert rec["output"]["replayed_task_id"] == task_id
    assert "lynx" in rec["output"]["raw"]
    assert llm_calls() > before


async def test_train_writes_its_artifact_inside_the_training_dir(make_client: Any) -> None:
    c = await make_client()
    rec = await _run(c, "op-train", "research", "train",
                     {"n_iterations": 1, "artifact_name": "research-model",
                      "inputs": {"topic": "crows"}, "feedback": ["more detail"]})
    artifact = c.training_dir / "research-model.pkl"
    assert artifact.is_file() and artifact.stat().st_size == rec["output"]["bytes"]
    assert rec["output"]["artifact"] == "research-model.pkl"
    assert rec["output"]["status"] == "completed"
    assert rec["output"]["artifact_name"] == "research-model"
    # a name that would escape the directory is refused before anything runs
    bad = start_body("op-train-bad", operation="train",
                     input_={"n_iterations": 1, "artifact_name": "../evil"})
    assert (await c.post("/jobs", json=bad, headers=headers("x"))).status == 422


async def test_test_operation_reports_scores(make_client: Any) -> None:
    c = await make_client()
    rec = await _run(c, "op-test", "research", "test",
                     {"n_iterations": 1, "eval_llm": "crewfence/offline",
                      "inputs": {"topic": "eels"}})
    assert rec["output"]["n_iterations"] == 1 and rec["output"]["scores"]
    assert rec["output"]["status"] == "completed"
    assert rec["output"]["eval_llm"] == "crewfence/offline"


async def test_knowledge_query(make_client: Any) -> None:
    c = await make_client()
    rec = await _run(c, "op-knowledge", "library", "knowledge_query",
                     {"query": ["Where do honey bees live?"], "results_limit": 2,
                      "score_threshold": 0.0})
    contents = " ".join(r["content"] for r in rec["output"]["results"])
    assert "hives" in contents


async def test_memory_reset(make_client: Any) -> None:
    c = await make_client()
    rec = await _run(c, "op-reset", "research", "memory_reset",
                     {"command_type": "kickoff_outputs"})
    assert rec["output"] == {"status": "completed", "command_type": "kickoff_outputs"}
