"""SidecarClient over a real loopback HTTP server that answers 200 with malformed JSON bodies.

Invariant (``sidecar_client._from_object``, malformed answers are connector failures): a drain,
archive or record answer that is not the expected object raises ``SidecarFailure`` (category
connector, the answer's HTTP status, uncertain exactly when the call was an invocation), never a
bare KeyError/TypeError/ValueError into the CrewJob driver.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from crewfence_operator.sidecar_client import Endpoint, SidecarClient, SidecarFailure
from crewfence_sidecar import contract
from crewfence_sidecar.contract import FailureCategory

ANSWERS: list[Any] = [[1, 2], {}, "text"]


@pytest.fixture(params=range(len(ANSWERS)), ids=["array", "empty_object", "string"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[SidecarClient]:
    answer = ANSWERS[request.param]

    async def malformed(_: web.Request) -> web.Response:
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post(contract.DRAIN_PATH, malformed)
    app.router.add_post(contract.BULK_ARCHIVE_PATH, malformed)
    app.router.add_get("/{tail:.*}", malformed)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield SidecarClient(session, Endpoint(f"127.0.0.1:{server.port}", "token-0123456789"))
    await server.close()


CALLS: list[tuple[str, Callable[[SidecarClient], Awaitable[object]], str, bool, str]] = [
    ("drain", lambda c: c.set_draining(True), "invalid_response", True, "drain answer"),
    ("archive", lambda c: c.archive_older_than(60), "invalid_response", True, "archive answer"),
    ("lookup", lambda c: c.get_job("ns/job"), "invalid_record", False, "sidecar record"),
]


@pytest.mark.parametrize(("call", "code", "uncertain", "what"), [row[1:] for row in CALLS],
                         ids=[row[0] for row in CALLS])
async def test_malformed_answer_is_a_connector_failure(
        client: SidecarClient, call: Callable[[SidecarClient], Awaitable[object]], code: str,
        uncertain: bool, what: str) -> None:
    """Uncertain for the invocations (drain, archive), certain for the lookup."""
    with pytest.raises(SidecarFailure) as caught:
        await call(client)
    failure = caught.value
    assert (failure.category, failure.code, failure.http_status, failure.uncertain) == (
        FailureCategory.CONNECTOR, code, 200, uncertain)
    assert failure.message.startswith(f"{what} is malformed: ")
