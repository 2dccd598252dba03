"""A CA rotation against a real sidecar process whose files change the way the kubelet
changes them, late: the rotation's decisions (``transport/ca_rotation.py``) fed with the real
probes (``pki_apply.probe_replica``) wait while the sidecar's files lag behind the Secret,
go on once they caught up, and the operator's material of every phase keeps working against
the sidecar in the state it may be in meanwhile. Afterwards the old CA opens nothing."""

from __future__ import annotations

import base64
import datetime as dt
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.sidecar_client import Endpoint, SidecarClient, SidecarFailure
from crewfence_operator.transport import ca_rotation as rot
from crewfence_operator.transport import certs, pki, pki_apply
from crewfence_sidecar.contract import FailureCategory, Operation, StartRequest
from sidecar_helpers import SidecarProcess, sidecar_env, write_crews
from tls_pki import ProjectedDir

CREW = CrewRef(name="research", namespace="team-a", uid="uid-1")
TOKEN = "operator-token-ca-rotation-0123"
HOSTS = tuple(pki.replica_hosts(CREW, 0, "127.0.0.1"))
NAME = pki.replica_dns_name(CREW, 0)


class Replica:
    """One sidecar process and its projected credentials folder."""

    def __init__(self, root: Path, secret: dict[str, Any]) -> None:
        self.projected = ProjectedDir(root / "credentials")
        self.sync(secret)
        state = root / "state"
        state.mkdir(mode=0o700)
        env = sidecar_env(state / "journal.db", write_crews(root), CREWFENCE_TOKEN="",
                          CREWFENCE_TOKEN_FILE=str(self.projected.path("token")),
                          CREWFENCE_TLS_CERT_FILE=str(self.projected.path("tls.crt")),
                          CREWFENCE_TLS_KEY_FILE=str(self.projected.path("tls.key")),
                          CREWFENCE_TLS_CLIENT_CA_FILE=str(self.projected.path("ca.crt")))
        self.proc = SidecarProcess([], env, root / "sidecar.log")

    def sync(self, secret: dict[str, Any]) -> None:
        """What the kubelet does, some time after the Secret changed."""
        files = {k: base64.b64decode(v) for k, v in secret["data"].items()}
        files["token"] = f"{TOKEN}\n".encode()
        self.projected.write(files)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.proc.port}"


def _secret(state: rot.CaState, existing: dict[str, Any] | None) -> dict[str, Any]:
    """The replica's Secret as ``ensure_replica_secrets`` leaves it for ``state``."""
    wanted = pki.desired_replica_secret(CREW, 0, existing, pki.ReplicaIssue(
        ca=state.signing, trust=tuple(state.trust), hosts=HOSTS, now=dt.datetime.now(dt.UTC)))
    return wanted[1] if wanted is not None else dict(existing or {})


@pytest.fixture(scope="module")
def ca_a() -> certs.Issued:
    return pki.new_crew_ca(CREW)


@pytest.fixture(scope="module")
def ca_b() -> certs.Issued:
    return pki.new_crew_ca(CREW)


@pytest.fixture
def replica(tmp_path: Path, ca_a: certs.Issued) -> Iterator[Replica]:
    rep = Replica(tmp_path, _secret(rot.CaState(signing=ca_a), None))
    rep.proc.start()
    try:
        rep.proc.wait_listening()
        yield rep
    finally:
        rep.proc.kill()


async def _answers(session: aiohttp.ClientSession, replica: Replica,
                   material: pki.CrewClientTLS) -> bool:
    """A call as the operator makes it, on a fresh connection (a fresh handshake)."""
    client = SidecarClient(session, Endpoint(replica.address, TOKEN,
                                             ssl_context=material.context, server_name=NAME))
    try:
        await client.get_job("nothing-here")
    except SidecarFailure as exc:
        assert exc.category is FailureCategory.TRANSPORT
        return False
    return True


async def _step(session: aiohttp.ClientSession, replica: Replica, state: rot.CaState,
                secret: dict[str, Any], operator: pki.CrewClientTLS,
                make_ca: Any = None) -> rot.CaStep | None:
    plan = rot.probe_plan(state)
    probe: bool | None = None
    if plan is not None:
        probe = await pki_apply.probe_replica(session, replica.address, TOKEN,
                                                pki_apply.probe_tls(plan), NAME)
    view = rot.ReplicaView(
        trust=pki.fingerprints(pki.trust_from_secret(secret)),
        leaf_issuer=pki.issuer_among(pki.cert_from_secret(secret), state.trust),
        probe=probe)
    obs = rot.CaObservation(ca=state, replicas={0: view},
                            operator=rot.OperatorView(operator.client_issuer, operator.trusted),
                            requested="r1", now=dt.datetime.now(dt.UTC))
    return rot.decide(obs, make_ca or (lambda: pytest.fail("no new CA may be made here")))


async def test_rotation_waits_for_the_files_and_never_loses_the_replica(
        replica: Replica, ca_a: certs.Issued, ca_b: certs.Issued) -> None:
    pid = replica.proc.proc.pid if replica.proc.proc else None
    stable = rot.CaState(signing=ca_a)
    s0 = _secret(stable, None)
    m0 = pki.CrewClientTLS.for_ca(stable.signing, stable.trust)
    # Fresh connections per call: a pooled connection would not prove a new handshake.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        assert await _answers(session, replica, m0)
        step = await _step(session, replica, stable, s0, m0, lambda: ca_b)
        assert step is not None and step.phase == "trusting"

        # trusting: the Secret has [A, B]; the sidecar's files do not yet.
        s1_state = step.state
        s1 = _secret(s1_state, s0)
        m1 = pki.CrewClientTLS.for_ca(s1_state.signing, s1_state.trust)
        assert await _step(session, replica, s1_state, s1, m1) is None  # files lag: wait
        assert await _answers(session, replica, m1)
        replica.sync(s1)
        step = await _step(session, replica, s1_state, s1, m1)
        assert step is not None and step.phase == "switching"

        # switching: the Secret has a certificate of B; the sidecar still serves A's.
        s2_state = step.state
        s2 = _secret(s2_state, s1)
        m2 = pki.CrewClientTLS.for_ca(s2_state.signing, s2_state.trust)
        assert await _step(session, replica, s2_state, s2, m2) is None  # files lag: wait
        for material in (m1, m2):  # a call in flight with either material gets through
            assert await _answers(session, replica, material)
        # An admission across the switch: presented with B's client certificate.
        client = SidecarClient(session, Endpoint(replica.address, TOKEN,
                                                 ssl_context=m2.context, server_name=NAME))
        admission = await client.start(StartRequest(
            crew_id="research", action_id="team-a/rotating", operation=Operation.RUN,
            input={"topic": "bees"}, timeout_ms=60_000), "key-rotating")
        assert admission.http_status == 202
        replica.sync(s2)
        for material in (m1, m2):
            assert await _answers(session, replica, material)
        step = await _step(session, replica, s2_state, s2, m2)
        assert step is not None and step.phase == "done"

        # done: [B] alone. Before the files follow, the new material already works.
        s3_state = step.state
        s3 = _secret(s3_state, s2)
        m3 = pki.CrewClientTLS.for_ca(s3_state.signing, s3_state.trust)
        assert await _answers(session, replica, m3)
        replica.sync(s3)
        assert await _answers(session, replica, m3)
        # The old CA's client certificate opens nothing any more.
        assert not await _answers(session, replica, m0)
        lookup = await SidecarClient(session, Endpoint(
            replica.address, TOKEN, ssl_context=m3.context, server_name=NAME)).get_job(
            "team-a/rotating")
        assert lookup.record is not None
    assert replica.proc.proc is not None and replica.proc.proc.pid == pid
    assert replica.proc.proc.poll() is None  # reloaded, never restarted


def _raw_get(replica: Replica, ctx: ssl.SSLContext, session: ssl.SSLSession | None = None,
             ) -> tuple[int, ssl.SSLSession | None, bool]:
    """GET /jobs/nothing-here on a new connection (resuming ``session`` when given)."""
    with socket.create_connection(("127.0.0.1", replica.proc.port), timeout=15) as raw, \
            ctx.wrap_socket(raw, server_hostname=NAME, session=session) as tls:
        tls.sendall(f"GET /jobs/nothing-here HTTP/1.1\r\nHost: {NAME}\r\n"
                    f"Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
        resumed, kept = tls.session_reused, tls.session
    if not data:
        raise ConnectionError("closed without an HTTP answer")
    return int(data.split(b"\r\n", 1)[0].split()[1]), kept, resumed


def test_a_resumed_tls12_session_does_not_outlive_its_ca(
        replica: Replica, ca_a: certs.Issued, ca_b: certs.Issued, tmp_path: Path) -> None:
    """A TLS 1.2 session made with the old CA's client certificate could be resumed after the
    old CA left the client-CA file (the resumption skips verification): the sidecar does not
    count a resumed session as a client certificate."""
    client = pki.issue_operator_client(ca_a)
    (tmp_path / "c.crt").write_bytes(client.cert_pem)
    certs.write_private(tmp_path / "c.key", client.key_pem)
    ctx = ssl.create_default_context(cadata=ca_a.cert_pem.decode())
    ctx.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    status, session, resumed = _raw_get(replica, ctx)
    assert (status, resumed) == (404, False)
    # The old CA leaves the client-CA file (the replica keeps serving its old certificate).
    secret = _secret(rot.CaState(signing=ca_a), None)
    secret["data"]["ca.crt"] = base64.b64encode(ca_b.cert_pem).decode()
    replica.sync(secret)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _raw_get(replica, ctx)  # a new handshake fails
    status, _, resumed = _raw_get(replica, ctx, session)
    assert resumed  # the TLS layer did resume the old session ...
    assert status == 401  # ... and it opens nothing
