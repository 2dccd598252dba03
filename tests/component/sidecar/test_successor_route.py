"""``POST /jobs/{action_id}/successor``: the one-successor fence and the resolution it depends
on are journal facts, written once, so nothing a CrewJob's status forgets (delete and re-apply)
can admit the work twice. Real sidecar (in process, and the real executable SIGKILLed between
the claims), real SQLite."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from crewfence_sidecar.contract import job_path
from sidecar_helpers import (
    AUTH,
    SidecarProcess,
    headers,
    sidecar_env,
    start_body,
    uncertain_after_restart,
)

RESOLVE = {"crew_id": "research", "note": "provider logs show no request",
           "evidence": ["https://tickets/1"], "resolved_by": "kubectl-crewfence"}


async def _resolve(c: Any, action_id: str, outcome: str, **more: Any) -> Any:
    return await c.post(job_path(action_id, "/resolution"), headers=AUTH,
                        json={**RESOLVE, "action_id": action_id, "outcome": outcome, **more})


async def _claim(c: Any, action_id: str, successor: str) -> Any:
    return await c.post(job_path(action_id, "/successor"), headers=AUTH,
                        json={"crew_id": "research", "action_id": action_id,
                              "successor_action_id": successor})


async def _code(resp: Any) -> str:
    return str((await resp.json())["error"]["code"])


async def test_one_successor_only_after_a_journaled_resolution_that_allows_it(
        make_client: Any) -> None:
    c = await uncertain_after_restart(make_client, ("ns/p", "ns/h"))

    unresolved = await _claim(c, "ns/p", "ns/next")
    assert unresolved.status == 409 and await _code(unresolved) == "unresolved"

    assert (await _resolve(c, "ns/p", "NotHappened")).status == 201
    first = await _claim(c, "ns/p", "ns/next")
    assert first.status == 201, await first.text()
    body = await first.json()
    assert body["event"]["event"] == "successor"
    assert body["event"]["data"]["successor_action_id"] == "ns/next"
    assert body["resolution"]["data"]["outcome"] == "NotHappened"

    repeat = await _claim(c, "ns/p", "ns/next")  # the same successor asks again: exact repeat
    assert repeat.status == 200
    assert (await repeat.json())["event"] == body["event"]
    assert (await repeat.json())["created"] is False

    other = await _claim(c, "ns/p", "ns/other")
    assert other.status == 409 and await _code(other) == "already_superseded"
    assert (await other.json())["error"]["successor"]["data"]["successor_action_id"] == \
        "ns/next"

    # The resolution's answer carries the claim too (what the operator mirrors into status).
    again = await _resolve(c, "ns/p", "NotHappened")
    assert again.status == 200
    assert (await again.json())["successor"]["data"]["successor_action_id"] == "ns/next"

    # Resolved Happened: never a successor.
    assert (await _resolve(c, "ns/h", "Happened")).status == 201
    happened = await _claim(c, "ns/h", "ns/h-next")
    assert happened.status == 409 and await _code(happened) == "happened"

    page = await (await c.get(job_path("ns/p", "/events"), headers=AUTH)).json()
    assert [e["event"] for e in page["events"]][-3:] == ["failed", "resolution", "successor"]


async def test_claims_refused_for_known_outcomes_running_jobs_and_bad_bodies(
        make_client: Any) -> None:
    c = await make_client()
    r = await c.post("/jobs", json=start_body("sure", topic="bees"),
                     headers=headers("sure", async_=True))
    assert r.status == 202
    assert await c.sidecar.runtime.wait_terminal("sure", 60)
    known = await _claim(c, "sure", "sure-next")
    assert known.status == 409 and await _code(known) == "not_uncertain"

    r = await c.post("/jobs", json=start_body("slow", topic="[[sleep:30]] slowly"),
                     headers=headers("slow", async_=True))
    assert r.status == 202
    running = await _claim(c, "slow", "slow-next")
    assert running.status == 409 and await _code(running) == "job_running"

    assert (await _claim(c, "nope", "x")).status == 404
    same = await _claim(c, "sure", "sure")
    assert same.status == 400
    mismatch = await c.post(job_path("sure", "/successor"), headers=AUTH,
                            json={"crew_id": "research", "action_id": "other",
                                  "successor_action_id": "x"})
    assert mismatch.status == 400
    extra = await c.post(job_path("sure", "/successor"), headers=AUTH,
                         json={"crew_id": "research", "action_id": "sure",
                               "successor_action_id": "x", "more": 1})
    assert extra.status == 400


async def test_a_resolution_is_written_once_whoever_sends_it_again(make_client: Any) -> None:
    """The same finding re-sent by another field manager (a re-applied manifest) is an exact
    repeat: 200 with the journaled event (no 409 to retry forever); another finding is a 409
    that names the journaled one."""
    c = await uncertain_after_restart(make_client, ("ns/r",))
    first = await _resolve(c, "ns/r", "Happened")
    assert first.status == 201
    journaled = (await first.json())["event"]

    reapplied = await _resolve(c, "ns/r", "Happened", resolved_by="kubectl-client-side-apply")
    assert reapplied.status == 200, await reapplied.text()
    assert (await reapplied.json())["event"] == journaled  # the first writer stays on record

    other = await _resolve(c, "ns/r", "NotHappened", resolved_by="kubectl-client-side-apply")
    assert other.status == 409 and await _code(other) == "resolution_conflict"
    assert (await other.json())["error"]["journaled"] == journaled

    page = await (await c.get(job_path("ns/r", "/events"), headers=AUTH)).json()
    assert [e["event"] for e in page["events"]].count("resolution") == 1


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    key = "k-" + body["action_id"].replace("/", "-")
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={**AUTH, "Content-Type": "application/json",
                                          "Prefer": "respond-async", "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _get(url: str, path: str) -> dict[str, Any]:
    req = urllib.request.Request(url + path, headers=AUTH)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return dict(json.loads(resp.read()))


def test_the_claim_survives_sigkill_of_the_real_process(tmp_path: Path) -> None:
    from sidecar_helpers import write_crews

    crews = write_crews(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = sidecar_env(state / "journal.db", crews)
    path = job_path("ns/p")

    first = SidecarProcess([], env, tmp_path / "first.log").start().wait_listening()
    try:
        code, _ = _post(first.url, "/jobs", start_body("ns/p", topic="[[sleep:60]] slowly"))
        assert code == 202
    finally:
        first.kill()  # SIGKILL while the job runs: the restart records it uncertain

    second = SidecarProcess([], env, tmp_path / "second.log").start().wait_listening()
    try:
        assert _get(second.url, path)["uncertain_outcome"] is True
        code, _ = _post(second.url, path + "/resolution",
                        {**RESOLVE, "action_id": "ns/p", "outcome": "Compensated"})
        assert code == 201
        code, claimed = _post(second.url, path + "/successor",
                              {"crew_id": "research", "action_id": "ns/p",
                               "successor_action_id": "ns/next"})
        assert code == 201, claimed
    finally:
        second.kill()  # right after the answer: the claim must already be durable

    third = SidecarProcess([], env, tmp_path / "third.log").start().wait_listening()
    try:
        code, refused = _post(third.url, path + "/successor",
                              {"crew_id": "research", "action_id": "ns/p",
                               "successor_action_id": "ns/second"})
        assert code == 409 and refused["error"]["code"] == "already_superseded", refused
        code, repeat = _post(third.url, path + "/successor",
                             {"crew_id": "research", "action_id": "ns/p",
                              "successor_action_id": "ns/next"})
        assert code == 200 and repeat["event"] == claimed["event"]
    finally:
        assert third.terminate() == 0
