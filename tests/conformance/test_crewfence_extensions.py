"""The crewfence extensions docs/aip-compatibility.md marks: they add, never change, what a
reference client reads (archive tombstones, draining, the async start form)."""

from __future__ import annotations

import aiohttp
from aip_client import (
    RECORD_FIELDS,
    Target,
    auth,
    call,
    job_path,
    new_action_id,
    start_body,
    start_headers,
    wait_record,
)


async def test_prefer_respond_async_answers_202_with_the_record(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("async")
    got = await call(session, "POST", sidecar.url + "/jobs",
                     json_body=start_body(action, "run", {"topic": "newts"}),
                     headers=start_headers(sidecar.token, "k", action, Prefer="respond-async"))
    assert got.status == 202 and RECORD_FIELDS <= set(got.body)
    assert got.headers["Location"] == job_path(action)
    await wait_record(session, sidecar.url, sidecar.token, action, until={"completed"})


async def test_archive_leaves_a_tombstone_answering_410(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    action = new_action_id("archive")
    body = start_body(action, "run", {"topic": "terns"})
    hdrs = start_headers(sidecar.token, "k", action)
    assert (await call(session, "POST", sidecar.url + "/jobs", json_body=body,
                       headers=hdrs)).status == 200
    got = await call(session, "DELETE", sidecar.url + job_path(action),
                     headers=auth(sidecar.token))
    assert got.status == 428
    got = await call(session, "DELETE", sidecar.url + job_path(action),
                     headers={**auth(sidecar.token), "X-AIP-Archive-Confirmation": action})
    assert got.status == 200 and got.body["archived"] is True
    again = await call(session, "POST", sidecar.url + "/jobs", json_body=body, headers=hdrs)
    assert again.status == 410 and again.body["tombstone"]["action_id"] == action
    got = await call(session, "GET", sidecar.url + job_path(action), headers=auth(sidecar.token))
    assert got.status == 410


async def test_draining_refuses_new_actions_only(
        one_slot_sidecar: Target, session: aiohttp.ClientSession) -> None:
    target = one_slot_sidecar
    known = new_action_id("known")
    body = start_body(known, "run", {"topic": "rooks"})
    assert (await call(session, "POST", target.url + "/jobs", json_body=body,
                       headers=start_headers(target.token, "k", known))).status == 200
    drain = await call(session, "POST", target.url + "/admin/drain",
                       json_body={"draining": True}, headers=auth(target.token))
    assert drain.status == 200 and drain.body["draining"] is True
    try:
        health = (await call(session, "GET", target.url + "/health")).body
        assert health["draining"] is True and health["unarchived_records"] >= 1
        fresh = new_action_id("fresh")
        got = await call(session, "POST", target.url + "/jobs",
                         json_body=start_body(fresh, "run", {"topic": "x"}),
                         headers=start_headers(target.token, "k", fresh))
        assert got.status == 503 and got.body["code"] == "draining" and got.body["detail"]
        assert int(got.headers["Retry-After"]) > 0
        repeat = await call(session, "POST", target.url + "/jobs", json_body=body,
                            headers=start_headers(target.token, "k", known))
        assert repeat.status == 200 and repeat.body["raw"]
    finally:
        undrain = await call(session, "POST", target.url + "/admin/drain",
                             json_body={"draining": False}, headers=auth(target.token))
        assert undrain.status == 200 and undrain.body["draining"] is False


async def test_metrics_and_openapi_need_no_token(
        sidecar: Target, session: aiohttp.ClientSession) -> None:
    async with session.get(sidecar.url + "/metrics") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    got = await call(session, "GET", sidecar.url + "/openapi.json")
    assert got.status == 200
    assert {"/health", "/jobs", "/jobs/stream", "/admin/drain", "/admin/archive"} <= set(
        got.body["paths"])
