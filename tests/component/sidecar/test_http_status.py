"""Every status code of the wire contract, each from a request a client could really send.

In-process sidecar on a real loopback socket, real crewai with the offline LLM, real SQLite.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from crewfence_sidecar.contract import MAX_BODY_BYTES, job_path
from sidecar_helpers import AUTH, TOKEN, headers, llm_calls, metric_value, start_body


async def _wait_terminal(client: Any, action_id: str, timeout: float = 60) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        resp = await client.get(job_path(action_id), headers=AUTH)
        record = await resp.json()
        if record["status"] != "running":
            return record
        assert loop.time() < deadline, "job did not finish"
        await client.sidecar.runtime.wait_change(action_id, 1.0)


async def _raw_post_status(client: Any, body: dict[str, Any], key: bytes) -> int:
    payload = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(b"POST /jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 b"Authorization: " + AUTH["Authorization"].encode() + b"\r\n"
                 b"Idempotency-Key: " + key + b"\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    return int(status_line.split()[1])


async def test_admission_codes_and_exact_repeat(make_client: Any) -> None:
    c = await make_client()
    body = start_body("ns/job-1")
    r = await c.post("/jobs", json=body, headers=headers("k1", async_=True))
    assert r.status == 202
    assert r.headers["Preference-Applied"] == "respond-async"
    assert r.headers["Location"] == "/jobs/ns%2Fjob-1"
    rec = await r.json()
    assert rec["status"] == "running" and rec["event_count"] >= 1
    done = await _wait_terminal(c, "ns/job-1")
    assert done["status"] == "completed"
    assert done["output"]["tasks_output"][0]["id"]

    calls = llm_calls()
    repeat = await c.post("/jobs", json=body, headers=headers("k1"))
    assert repeat.status == 200 and repeat.headers["X-Crewfence-Exact-Repeat"] == "true"
    assert (await repeat.json()) == done["output"]  # blocking: the output itself
    assert llm_calls() == calls  # nothing scheduled
    metrics = await (await c.get("/metrics")).text()
    assert metric_value(metrics, "crewfence_sidecar_exact_repeats_total") == 1
    assert metric_value(metrics, "crewfence_offline_llm_calls_total") == llm_calls()

    # 409: same action id, changed input or changed key; nothing scheduled
    for b, k in ((start_body("ns/job-1", topic="ants"), "k1"), (body, "k2"),
                 ({**body, "timeout_ms": 600000}, "k1")):
        r = await c.post("/jobs", json=b, headers=headers(k, async_=True))
        assert r.status == 409, await r.text()
    assert llm_calls() == calls


async def test_blocking_run_returns_the_output_itself(make_client: Any) -> None:
    c = await make_client()
    r = await c.post("/jobs", json=start_body("block-1", topic="owls"), headers=headers("b"))
    assert r.status == 200
    output = await r.json()
    assert "owls" in output["raw"] and "status" not in output
    rec = await (await c.get(job_path("block-1"), headers=AUTH)).json()
    assert rec["status"] == "completed" and rec["output"] == output


async def test_request_errors(make_client: Any) -> None:
    c = await make_client(CREWFENCE_ALLOWED_OPERATIONS="run,replay")
    post = c.post
    # 428: missing / blank key
    assert (await post("/jobs", json=start_body("a"), headers=AUTH)).status == 428
    assert (await post("/jobs", json=start_body("a"), headers=headers("  "))).status == 428
    # 400: malformed keys (over 512 bytes; DEL is a valid header octet for aiohttp? send raw)
    assert (await post("/jobs", json=start_body("a"), headers=headers("k" * 513))).status == 400
    # aiohttp's client refuses to send DEL in a header; a raw socket client sends it
    assert await _raw_post_status(c, start_body("a"), b"a\x7fb") == 400
    assert await _raw_post_status(c, start_body("a"), b"a\x01b") == 400
    # 400: unknown field, bad JSON, bad timeout
    assert (await post("/jobs", json={**start_body("a"), "x": 1}, headers=headers())).status == 400
    assert (await post("/jobs", data=b"{not json", headers=headers())).status == 400
    assert (await post("/jobs", json=start_body("a", timeout_ms=0), headers=headers())).status \
        == 400
    # 404 unknown crew, 403 operation not enabled, 422 bad input
    assert (await post("/jobs", json=start_body("a", crew_id="ghost"),
                       headers=headers())).status == 404
    train = start_body("a", operation="train", input_={"n_iterations": 1, "artifact_name": "m"})
    assert (await post("/jobs", json=train, headers=headers())).status == 403
    replay = start_body("a", operation="replay", input_={"inputs": {}})
    r = await post("/jobs", json=replay, headers=headers())
    assert r.status == 422 and (await r.json())["error"]["code"] == "invalid_input"
    # 413: body over the limit (rejected before it is parsed)
    big = b'{"crew_id":"research","action_id":"a","operation":"run","input":{"x":"' + \
        b"y" * MAX_BODY_BYTES + b'"}}'
    assert (await post("/jobs", data=big, headers=headers())).status == 413
    # 413: input over 1 MiB inside a body that fits the HTTP limit is impossible by
    # construction, so the input bound is checked on its own:
    near = start_body("a", input_={"x": "y" * (1024 * 1024)})
    assert (await post("/jobs", json=near, headers=headers())).status == 413
    # nothing of the refused requests was kept
    assert (await c.get(job_path("a"), headers=AUTH)).status == 404


async def test_auth(make_client: Any) -> None:
    c = await make_client()
    for h in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"},
              {"Authorization": "Bearer "}):
        r = await c.get(job_path("x"), headers=h)
        assert r.status == 401
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert "test-token" not in await r.text()
    assert (await c.get("/health")).status == 200  # probes need no token


async def test_events_paging_and_416(make_client: Any) -> None:
    c = await make_client()
    await c.post("/jobs", json=start_body("ev-1"), headers=headers(async_=True))
    rec = await _wait_terminal(c, "ev-1")
    n = rec["event_count"]
    page = await (await c.get(job_path("ev-1", "/events"), params={"cursor": "1", "limit": "1"},
                              headers=AUTH)).json()
    assert page["cursor"] == 1 and page["next_cursor"] == 2 and len(page["events"]) == 1
    full = await (await c.get(job_path("ev-1", "/events"), headers=AUTH)).json()
    assert [e["sequence"] for e in full["events"]] == list(range(n))
    assert full["events"][0]["event"] == "started" and full["events"][-1]["event"] == "completed"
    end = await c.get(job_path("ev-1", "/events"), params={"cursor": str(n)}, headers=AUTH)
    assert end.status == 200 and (await end.json())["events"] == []
    beyond = await c.get(job_path("ev-1", "/events"), params={"cursor": str(n + 1)},
                         headers=AUTH)
    assert beyond.status == 416
    assert (await c.get(job_path("ev-1", "/events"), params={"cursor": "-1"},
                        headers=AUTH)).status == 400
    assert (await c.get(job_path("nope", "/events"), headers=AUTH)).status == 404


async def test_sse_stream_and_follow(make_client: Any) -> None:
    c = await make_client()
    r = await c.post("/jobs/stream", json=start_body("sse-1", topic="moths"), headers=headers())
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    text = await r.text()
    names = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("event: ")]
    assert names[0] == "started" and names[-1] == "completed" and "chunk" in names
    # follow from a cursor with Accept: text/event-stream (terminal: replays and ends)
    f = await c.get(job_path("sse-1", "/events"), params={"cursor": "1"},
                    headers={**AUTH, "Accept": "text/event-stream"})
    ids = [int(line[4:]) for line in (await f.text()).splitlines() if line.startswith("id: ")]
    assert ids == list(range(1, len(names)))


async def test_archive_codes_and_tombstone(make_client: Any) -> None:
    c = await make_client(CREWFENCE_MAX_CONCURRENCY="2")
    slow = start_body("arch-run", topic="[[sleep:3]] slow")
    await c.post("/jobs", json=slow, headers=headers("s", async_=True))
    assert (await c.delete(job_path("arch-run"), headers=AUTH)).status == 428
    r = await c.delete(job_path("arch-run"),
                       headers={**AUTH, "X-AIP-Archive-Confirmation": "arch-run"})
    assert r.status == 409  # running
    assert (await c.delete(job_path("arch-run"),
                           headers={**AUTH, "X-AIP-Archive-Confirmation": "other"})).status == 400
    await c.post(job_path("arch-run", "/cancel"),
                 json={"crew_id": "research", "action_id": "arch-run"}, headers=AUTH)

    body = start_body("ns/arch-done")
    await c.post("/jobs", json=body, headers=headers("a"))
    r = await c.delete(job_path("ns/arch-done"),
                       headers={**AUTH, "X-AIP-Archive-Confirmation": "ns/arch-done"})
    assert r.status == 200 and (await r.json())["archived"] is True
    calls = llm_calls()
    again = await c.post("/jobs", json=body, headers=headers("a", async_=True))
    assert again.status == 410
    gone = await again.json()
    assert gone["tombstone"]["status"] == "completed"
    assert gone["tombstone"]["request_hash"]
    assert llm_calls() == calls  # never run a second time
    assert (await c.get(job_path("ns/arch-done"), headers=AUTH)).status == 410
    changed = start_body("ns/arch-done", topic="other")
    assert (await c.post("/jobs", json=changed, headers=headers("a"))).status == 409
    assert (await c.delete(job_path("missing"),
                           headers={**AUTH, "X-AIP-Archive-Confirmation": "missing"})).status \
        == 404


async def test_blocking_wait_expiry_is_504_and_the_job_keeps_its_record(
        make_client: Any) -> None:
    c = await make_client(CREWFENCE_MAX_CONCURRENCY="1")
    await c.post("/jobs", json=start_body("hog", topic="[[sleep:3]] hog"),
                 headers=headers("h", async_=True))
    r = await c.post("/jobs", json=start_body("waiter", timeout_ms=300), headers=headers("w"))
    assert r.status == 504
    body = await r.json()
    assert body["record"]["action_id"] == "waiter" and body["record"]["status"] == "running"
    assert (await c.get(job_path("waiter"), headers=AUTH)).status == 200
    for aid in ("hog", "waiter"):
        await c.post(job_path(aid, "/cancel"), json={"crew_id": "research", "action_id": aid},
                     headers=AUTH)


async def test_full_journal_is_507_and_keeps_nothing(make_client: Any) -> None:
    c = await make_client(CREWFENCE_MAX_RETAINED_RUNS="1")
    assert (await c.post("/jobs", json=start_body("first"), headers=headers("1"))).status == 200
    calls = llm_calls()
    r = await c.post("/jobs", json=start_body("second"), headers=headers("2", async_=True))
    assert r.status == 507 and (await r.json())["error"]["code"] == "journal_full"
    assert (await c.get(job_path("second"), headers=AUTH)).status == 404
    assert llm_calls() == calls


async def test_health_fields(make_client: Any) -> None:
    c = await make_client()
    h = await (await c.get("/health")).json()
    assert h["status"] == "ready" and h["durable_journal"] is True
    assert set(h["crews"]) == {"research", "duo", "library"}
    assert h["operations"] == ["batch_run", "cancel", "events", "knowledge_query",
                               "memory_reset", "replay", "run", "status", "test", "train"]
    assert h["journal_id"] and h["active_runs"] == 0 and h["retained_runs"] == 0
    assert h["max_retained_runs"] == 10_000


async def test_cancel_codes(make_client: Any) -> None:
    c = await make_client()
    assert (await c.post(job_path("nope", "/cancel"),
                         json={"crew_id": "research", "action_id": "nope"},
                         headers=AUTH)).status == 404
    assert (await c.post(job_path("nope", "/cancel"),
                         json={"crew_id": "research", "action_id": "other"},
                         headers=AUTH)).status == 400
    assert (await c.post(job_path("nope", "/cancel"), json={"crew_id": "research"},
                         headers=AUTH)).status == 400


async def test_fifty_concurrent_identical_admissions_execute_once(make_client: Any) -> None:
    c = await make_client()
    body = start_body("ns/concurrent", topic="herons")
    before = llm_calls()
    responses = await asyncio.gather(*(c.post("/jobs", json=body, headers=headers("same"))
                                       for _ in range(50)))
    outputs = [await r.json() for r in responses]
    assert all(r.status == 200 for r in responses)  # blocking 200: every one completed
    assert len({json.dumps(out, sort_keys=True) for out in outputs}) == 1  # one run's output
    assert sum("X-Crewfence-Exact-Repeat" in r.headers for r in responses) == 49
    assert llm_calls() - before == 1  # the one-task crew called the LLM exactly once
    metrics = await (await c.get("/metrics")).text()
    assert metric_value(metrics, 'crewfence_sidecar_admissions_total{operation="run"}') == 1


async def test_logs_are_json_with_ids_and_never_inputs_outputs_or_tokens(
        make_client: Any, caplog: Any) -> None:
    from crewfence_sidecar.logs import JsonFormatter

    caplog.set_level(logging.INFO, logger="crewfence")
    c = await make_client()
    r = await c.post("/jobs", json=start_body("ns/logged", topic="SECRET-INPUT-4711"),
                     headers=headers("SECRET-KEY-0815"))
    output_raw = (await r.json())["raw"]
    await c.get(job_path("x"), headers={"Authorization": "Bearer SECRET-WRONG-TOKEN"})
    lines = [JsonFormatter().format(rec) for rec in caplog.records
             if rec.name.startswith("crewfence")]
    entries = [json.loads(line) for line in lines]
    assert any(e.get("action_id") == "ns/logged" and e.get("crew_id") == "research"
               for e in entries)
    text = "\n".join(lines)
    for secret in ("SECRET-INPUT-4711", "SECRET-KEY-0815", "SECRET-WRONG-TOKEN", TOKEN,
                   output_raw):
        assert secret not in text


async def test_each_new_admission_is_logged_once_after_its_answer(
        make_client: Any, caplog: Any) -> None:
    """Invariant (Runtime.admit): every new admission writes one ``admitted`` line with its
    ids (on the loop turn after the answer: the answer does not wait for it); an exact
    repeat writes none."""
    caplog.set_level(logging.INFO, logger="crewfence")
    c = await make_client()
    body = start_body("ns/admitted-log")
    for _ in range(2):  # the second is an exact repeat
        r = await c.post("/jobs", json=body, headers=headers("k-log", async_=True))
        assert r.status in (200, 202)
    admitted = [rec for rec in caplog.records if rec.getMessage() == "admitted"]
    assert [(getattr(rec, "action_id", None), getattr(rec, "crew_id", None),
             getattr(rec, "operation", None)) for rec in admitted] == [
        ("ns/admitted-log", "research", "run")]
