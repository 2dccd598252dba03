"""Resume material survives retention until the successor ends (issue 21): bulk archiving
(``journal.retention``'s recorded-only archive, ``POST /admin/archive``) keeps an uncertain
record that journaled resume material while it may still be resumed and while its resuming
successor has not ended; archiving that one record by hand is refused meanwhile. Real
in-process sidecar, real SQLite, real crewai with the offline LLM."""

from __future__ import annotations

from typing import Any

from crewfence_sidecar.contract import RECORDED_SUFFIX, job_path
from crewfence_sidecar.journal import ResumeFacts, kept_for_resume
from sidecar_helpers import AUTH, headers, start_body

CONFIRM = {**AUTH, "X-AIP-Archive-Confirmation": "older-than:0"}
MATERIAL = {"CREWFENCE_RESUME_MATERIAL": "1"}


async def _archive(c: Any) -> list[str]:
    r = await c.post("/admin/archive", json={"older_than_seconds": 0, "recorded_only": True},
                     headers=CONFIRM)
    assert r.status == 200, await r.text()
    return list((await r.json())["archived"])


async def _stopped_while_running(make_client: Any, action_id: str, **env: str) -> None:
    """``action_id`` runs until the sidecar stops: it ends failed and uncertain."""
    c = await make_client(**env)
    r = await c.post("/jobs", json=start_body(action_id, topic="[[sleep:30]] slowly"),
                     headers=headers(action_id.replace("/", "-"), async_=True))
    assert r.status == 202, await r.text()
    await c.sidecar.runtime.close()
    c.sidecar.opened.close()


async def test_retention_keeps_a_resumable_predecessor_until_its_successor_ends(
        make_client: Any) -> None:
    await _stopped_while_running(make_client, "ns/p", **MATERIAL)
    await _stopped_while_running(make_client, "ns/plain")  # no resume material journaled
    c = await make_client(**MATERIAL)
    for action_id in ("ns/p", "ns/plain"):
        record = await (await c.get(job_path(action_id), headers=AUTH)).json()
        assert record["uncertain_outcome"] is True
        r = await c.post(job_path(action_id, RECORDED_SUFFIX), headers=AUTH,
                         json={"crew_id": "research", "action_id": action_id})
        assert r.status == 200  # the operator wrote both outcomes into their CrewJobs
    # nobody has decided ns/p yet: it may still be resumed, so its material stays
    assert await _archive(c) == ["ns/plain"]

    r = await c.post(job_path("ns/p", "/resolution"), headers=AUTH,
                     json={"crew_id": "research", "action_id": "ns/p",
                           "outcome": "NotHappened", "note": "no effect outside"})
    assert r.status == 201, await r.text()
    r = await c.post(job_path("ns/p", "/successor"), headers=AUTH,
                     json={"crew_id": "research", "action_id": "ns/p",
                           "successor_action_id": "ns/s", "resume": True})
    assert r.status == 201, await r.text()
    # claimed, not admitted yet: the successor reads the material at its admission
    assert await _archive(c) == []
    refused = await c.delete(job_path("ns/p"), headers={**AUTH,
                                                        "X-AIP-Archive-Confirmation": "ns/p"})
    assert refused.status == 409
    assert (await refused.json())["error"]["code"] == "resume_pending"

    r = await c.post("/jobs", json=start_body("ns/s", resume_from="ns/p"),
                     headers=headers("ns-s"))
    assert r.status == 200, await r.text()  # resumed, and it ended
    assert await _archive(c) == ["ns/p"]


def test_the_keep_ends_with_a_plain_successor_claim_or_the_resumed_successors_end() -> None:
    resume = {"successor_action_id": "s", "resume": True}
    assert kept_for_resume(ResumeFacts(material=True, claim=None, successor_ended=False))
    assert not kept_for_resume(ResumeFacts(material=False, claim=None, successor_ended=False))
    assert kept_for_resume(ResumeFacts(material=True, claim=resume, successor_ended=False))
    assert not kept_for_resume(ResumeFacts(material=True, claim=resume, successor_ended=True))
    plain = {"successor_action_id": "s"}  # a rerun: needs no material, and no resume follows
    assert not kept_for_resume(ResumeFacts(material=True, claim=plain, successor_ended=False))
