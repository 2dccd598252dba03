"""The operator's own client and PKI against a real sidecar process over mutual TLS.

The replica's Secret is rendered by ``transport/pki.py`` and written out as the kubelet would
project it; the operator's ``SidecarClient`` verifies the replica's DNS name on every call.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.sidecar_client import Endpoint, SidecarClient, SidecarFailure
from crewfence_operator.transport import pki
from crewfence_sidecar.contract import FailureCategory, Operation, StartRequest
from sidecar_helpers import SidecarProcess, sidecar_env, write_crews
from tls_pki import ProjectedDir

CREW = CrewRef(name="research", namespace="team-a", uid="uid-1")
TOKEN = "operator-token-0123456789"


@pytest.fixture(scope="module")
def crew_ca() -> pki.certs.Issued:
    return pki.new_crew_ca(CREW)


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory,
            crew_ca: pki.certs.Issued) -> Iterator[SidecarProcess]:
    d = tmp_path_factory.mktemp("replica0")
    hosts = pki.replica_hosts(CREW, 0, "127.0.0.1")
    secret = pki.replica_tls_secret(CREW, 0, crew_ca, pki.issue_serving(crew_ca, hosts))
    files = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    files["token"] = f"{TOKEN}\n".encode()
    projected = ProjectedDir(d / "credentials")
    projected.write(files)
    state = d / "state"
    state.mkdir(mode=0o700)
    env = sidecar_env(state / "journal.db", write_crews(d), CREWFENCE_TOKEN="",
                      CREWFENCE_TOKEN_FILE=str(projected.path("token")),
                      CREWFENCE_TLS_CERT_FILE=str(projected.path("tls.crt")),
                      CREWFENCE_TLS_KEY_FILE=str(projected.path("tls.key")),
                      CREWFENCE_TLS_CLIENT_CA_FILE=str(projected.path("ca.crt")))
    proc = SidecarProcess([], env, d / "sidecar.log").start()
    try:
        proc.wait_listening()
        yield proc
    finally:
        proc.kill()


def _client(session: aiohttp.ClientSession, proc: SidecarProcess, tls: pki.CrewClientTLS,
            server_name: str) -> SidecarClient:
    return SidecarClient(session, Endpoint(f"127.0.0.1:{proc.port}", TOKEN,
                                           ssl_context=tls.context, server_name=server_name))


async def test_operator_client_runs_a_job_and_verifies_the_replica_name(
        replica: SidecarProcess, crew_ca: pki.certs.Issued) -> None:
    tls = pki.CrewClientTLS.for_ca(crew_ca)
    async with aiohttp.ClientSession() as session:
        client = _client(session, replica, tls, pki.replica_dns_name(CREW, 0))
        request = StartRequest(crew_id="research", action_id="team-a/job-1",
                               operation=Operation.RUN, input={"topic": "bees"},
                               timeout_ms=60_000)
        admission = await client.start(request, "key-1")
        assert admission.http_status == 202
        health = await client.health()
        assert health["status"] == "ready"
        lookup = await client.get_job("team-a/job-1")
        assert lookup.record is not None

        # The certificate is replica 0's: asking for replica 1 by name is refused, and the
        # failure proves nothing was sent (not an uncertain outcome).
        other = _client(session, replica, tls, pki.replica_dns_name(CREW, 1))
        with pytest.raises(SidecarFailure) as err:
            await other.get_job("team-a/job-1")
        assert err.value.category is FailureCategory.TRANSPORT
        with pytest.raises(SidecarFailure) as err:
            await other.start(request, "key-1")
        assert err.value.uncertain is False


async def test_client_of_another_crews_ca_opens_nothing(replica: SidecarProcess,
                                                        crew_ca: pki.certs.Issued) -> None:
    foreign_ca = pki.new_crew_ca(CrewRef(name="other", namespace="team-b", uid="uid-2"))
    foreign = pki.CrewClientTLS.for_ca(foreign_ca)
    # It trusts the right CA for the server, but presents a certificate of the other Crew.
    foreign.context.load_verify_locations(cadata=crew_ca.cert_pem.decode())
    async with aiohttp.ClientSession() as session:
        client = _client(session, replica, foreign, pki.replica_dns_name(CREW, 0))
        with pytest.raises(SidecarFailure) as err:
            await client.get_job("team-a/job-1")
        assert err.value.category is FailureCategory.TRANSPORT


def test_replica_secret_holds_no_key_in_its_repr(crew_ca: pki.certs.Issued,
                                                 tmp_path: Path) -> None:
    leaf = pki.issue_serving(crew_ca, pki.replica_hosts(CREW, 0, None))
    assert "PRIVATE" not in repr(leaf) and "PRIVATE" not in repr(crew_ca)


async def test_the_operators_session_keeps_one_connection_per_replica(
        replica: SidecarProcess, crew_ca: pki.certs.Issued) -> None:
    """The mutual-TLS bar is taken on a kept-alive connection because this is what the
    operator does: one pooled session, one SSL context per Crew, so calls to a replica
    share one connection and pay the handshake once (the sidecar counts connections)."""
    from crewfence_operator.runtime import Runtime
    from sidecar_helpers import metric_value

    operator = Runtime()
    tls = pki.CrewClientTLS.for_ca(crew_ca)
    session = operator.session()
    try:
        async with session.get(f"https://127.0.0.1:{replica.port}/metrics", ssl=tls.context,
                               server_hostname=pki.replica_dns_name(CREW, 0)) as r:
            before = metric_value(await r.text(), "crewfence_sidecar_connections_total")
        client = _client(session, replica, tls, pki.replica_dns_name(CREW, 0))
        for i in range(5):
            request = StartRequest(crew_id="research", action_id=f"team-a/pooled-{i}",
                                   operation=Operation.RUN, input={"topic": "bees"},
                                   timeout_ms=60_000)
            assert (await client.start(request, f"pooled-{i}")).http_status == 202
            assert (await client.get_job(f"team-a/pooled-{i}")).record is not None
        async with session.get(f"https://127.0.0.1:{replica.port}/metrics", ssl=tls.context,
                               server_hostname=pki.replica_dns_name(CREW, 0)) as r:
            after = metric_value(await r.text(), "crewfence_sidecar_connections_total")
    finally:
        await operator.close()
    assert after - before == 0, f"{after - before} new connections for 10 calls"
