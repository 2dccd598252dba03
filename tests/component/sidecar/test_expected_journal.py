"""An admission names the journal it was assigned to; another journal admits nothing.

In-process sidecar on a real loopback socket (real SQLite journal), and the operator's
``SidecarClient`` against it. The address an operator holds may reach another journal than
the one it chose (a replaced pod on a renamed or re-created claim, a reused pod IP): that
journal answers 412 ``journal_mismatch``, keeps no record, and names its own journal id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from crewfence_sidecar.contract import (
    EXPECTED_JOURNAL_ID_HEADER,
    JOURNAL_ID_HEADER,
    JOURNAL_MISMATCH_CODE,
    FailureCategory,
    Operation,
    StartRequest,
    job_path,
)
from sidecar_helpers import AUTH, headers, start_body


@pytest.mark.parametrize("route", ["/jobs", "/jobs/stream"])
async def test_an_admission_naming_another_journal_admits_nothing(
        make_client: Any, route: str) -> None:
    c = await make_client()
    journal_id = c.sidecar.runtime.journal.journal_id
    r = await c.post(route, json=start_body("team-a/elsewhere"),
                     headers=headers("k1", async_=True,
                                     **{EXPECTED_JOURNAL_ID_HEADER: "another-journal"}))
    body = await r.json()
    assert r.status == 412, body
    assert body["error"]["code"] == JOURNAL_MISMATCH_CODE
    assert body["error"]["journal_id"] == journal_id == r.headers[JOURNAL_ID_HEADER]
    assert (await c.get(job_path("team-a/elsewhere"), headers=AUTH)).status == 404
    assert c.sidecar.runtime.journal.get("team-a/elsewhere") is None


async def test_an_admission_naming_this_journal_is_admitted(make_client: Any) -> None:
    c = await make_client()
    journal_id = c.sidecar.runtime.journal.journal_id
    r = await c.post("/jobs", json=start_body("team-a/here"),
                     headers=headers("k1", async_=True,
                                     **{EXPECTED_JOURNAL_ID_HEADER: journal_id}))
    assert r.status == 202, await r.text()
    assert c.sidecar.runtime.journal.get("team-a/here") is not None


async def test_the_operators_client_reads_the_refusal_as_certain(make_client: Any) -> None:
    from crewfence_operator.sidecar_client import Endpoint, SidecarClient, SidecarFailure

    c = await make_client()
    request = StartRequest(crew_id="research", action_id="team-a/job-1",
                           operation=Operation.RUN, input={"topic": "bees"})
    async with aiohttp.ClientSession() as session:
        client = SidecarClient(session, Endpoint(f"127.0.0.1:{c.server.port}",
                                                 AUTH["Authorization"].split()[1]))
        with pytest.raises(SidecarFailure) as refused:
            await client.start(request, "k1", expected_journal_id="another-journal")
        assert (refused.value.code, refused.value.http_status) == (JOURNAL_MISMATCH_CODE, 412)
        assert refused.value.category is FailureCategory.PERMANENT
        assert not refused.value.uncertain, "nothing was admitted: no outcome to learn"
        assert c.sidecar.runtime.journal.get("team-a/job-1") is None
        admitted = await client.start(
            request, "k1", expected_journal_id=c.sidecar.runtime.journal.journal_id)
        assert admitted.http_status == 202
        assert admitted.journal_id == c.sidecar.runtime.journal.journal_id


async def test_health_names_the_pod_the_sidecar_runs_in(make_client: Any,
                                                       tmp_path: Path) -> None:
    """The operator drops a health answer whose pod is not the one its index holds."""
    named = await make_client(CREWFENCE_POD_UID="0f9e-pod-uid")
    assert (await (await named.get("/health")).json())["pod_uid"] == "0f9e-pod-uid"
    other = tmp_path / "other"
    other.mkdir()
    unnamed = await make_client(CREWFENCE_POD_UID="",
                                CREWFENCE_STATE_FILE=str(other / "journal.db"))
    assert "pod_uid" not in await (await unnamed.get("/health")).json()
