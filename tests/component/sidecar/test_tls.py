"""The real ``crewfence-sidecar`` over mutual TLS: who gets in, rotation, plaintext refusal.

Every test runs the executable as a child process on a real loopback socket, with
certificates issued by the operator's own code (``crewfence_operator.transport.certs``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from crewfence_operator.transport import certs
from crewfence_sidecar.contract import job_path
from sidecar_helpers import (
    SidecarProcess,
    metric_value,
    refused_start,
    sidecar_env,
    start_body,
    write_crews,
)
from tls_pki import (
    ClientFiles,
    ProjectedDir,
    client_context,
    client_files,
    served_certificate,
    serving_files,
)

HOSTS = ["127.0.0.1", "localhost"]
OLD, NEW = "token-old-0123456789", "token-new-9876543210"


@dataclass
class Pki:
    crew_ca: certs.Issued
    other_ca: certs.Issued
    client: ClientFiles
    foreign_client: ClientFiles
    ca_file: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    crew_ca = certs.new_ca("crewfence crew team-a/research")
    other_ca = certs.new_ca("crewfence crew team-b/other")
    ca_file = d / "crew-ca.crt"
    ca_file.write_bytes(crew_ca.cert_pem)
    return Pki(crew_ca=crew_ca, other_ca=other_ca,
               client=client_files(d, crew_ca, "crewfence-operator"),
               foreign_client=client_files(d, other_ca, "crewfence-operator-b"),
               ca_file=ca_file)


@dataclass
class TlsSidecar:
    proc: SidecarProcess
    tls_dir: ProjectedDir
    token_dir: ProjectedDir

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.proc.port}"


def _tls_env(tmp_path: Path, pki: Pki, **more: str) -> tuple[dict[str, str], ProjectedDir,
                                                              ProjectedDir]:
    crews = write_crews(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    tls_dir = ProjectedDir(tmp_path / "tls")
    tls_dir.write(serving_files(pki.crew_ca, HOSTS))
    token_dir = ProjectedDir(tmp_path / "token")
    token_dir.write({"token": f"{OLD}\n".encode()})
    env = sidecar_env(state / "journal.db", crews, CREWFENCE_TOKEN="",
                      CREWFENCE_TOKEN_FILE=str(token_dir.path("token")),
                      CREWFENCE_TLS_CERT_FILE=str(tls_dir.path("tls.crt")),
                      CREWFENCE_TLS_KEY_FILE=str(tls_dir.path("tls.key")),
                      CREWFENCE_TLS_CLIENT_CA_FILE=str(tls_dir.path("ca.crt")), **more)
    return env, tls_dir, token_dir


def _running(directory: Path, pki: Pki) -> Iterator[TlsSidecar]:
    env, tls_dir, token_dir = _tls_env(directory, pki, CREWFENCE_MAX_CONCURRENCY="24")
    proc = SidecarProcess([], env, directory / "sidecar.log").start()
    try:
        proc.wait_listening()
        yield TlsSidecar(proc, tls_dir, token_dir)
    finally:
        proc.kill()


@pytest.fixture
def tls_sidecar(tmp_path: Path, pki: Pki) -> Iterator[TlsSidecar]:
    """A sidecar of its own (for tests that rotate its files)."""
    yield from _running(tmp_path, pki)


@pytest.fixture(scope="module")
def shared_sidecar(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[TlsSidecar]:
    """One sidecar for the tests that only knock on its door."""
    yield from _running(tmp_path_factory.mktemp("shared"), pki)


def _session(pki: Pki, client: ClientFiles | None) -> aiohttp.ClientSession:
    # force_close: every request is a fresh TLS handshake (what a rotation must survive).
    connector = aiohttp.TCPConnector(ssl=client_context(pki.ca_file, client), force_close=True)
    return aiohttp.ClientSession(connector=connector)


def _auth(token: str, key: str | None = None, async_: bool = False) -> dict[str, str]:
    h = {"Authorization": f"Bearer {token}"}
    if key is not None:
        h["Idempotency-Key"] = key
    if async_:
        h["Prefer"] = "respond-async"
    return h


async def test_operation_over_mutual_tls_and_open_routes(shared_sidecar: TlsSidecar,
                                                         pki: Pki) -> None:
    async with _session(pki, pki.client) as s:
        async with s.post(f"{shared_sidecar.base}/jobs", json=start_body("tls-run-1"),
                          headers=_auth(OLD, "k1")) as r:
            body = await r.json()
            assert r.status == 200, body  # the blocking route answers with the output
        async with s.get(f"{shared_sidecar.base}{job_path('tls-run-1')}", headers=_auth(OLD)) as r:
            assert (await r.json())["status"] == "completed"
    # The kubelet's probe and Prometheus present no client certificate: only these two.
    async with _session(pki, None) as s:
        async with s.get(f"{shared_sidecar.base}/health") as r:
            assert r.status == 200
            health = await r.json()
            assert health["status"] == "ready"
            assert OLD not in json.dumps(health)
        async with s.get(f"{shared_sidecar.base}/metrics") as r:
            assert r.status == 200
            assert OLD not in await r.text()


@pytest.mark.parametrize("path, method", [
    ("/jobs", "POST"), ("/jobs/stream", "POST"), (job_path("tls-run-1"), "GET"),
    (job_path("tls-run-1", "/events"), "GET"), (job_path("tls-run-1", "/cancel"), "POST"),
    (job_path("tls-run-1"), "DELETE"), ("/openapi.json", "GET"),
])
async def test_token_without_client_certificate_gets_401(
        shared_sidecar: TlsSidecar, pki: Pki, path: str, method: str) -> None:
    async with _session(pki, None) as s:
        async with s.request(method, f"{shared_sidecar.base}{path}", json=start_body("tls-x"),
                             headers=_auth(OLD, "k1")) as r:
            body = await r.json()
            assert r.status == 401, body
            assert body["error"]["code"] == "client_certificate_required"
        async with s.get(f"{shared_sidecar.base}/metrics") as r:
            text = await r.text()
    assert metric_value(text, 'crewfence_sidecar_rejections_total{code="client_certificate_'
                              'required"}') >= 1


async def test_certificate_of_another_ca_is_refused_at_the_handshake(
        shared_sidecar: TlsSidecar, pki: Pki) -> None:
    async with _session(pki, pki.foreign_client) as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.post(f"{shared_sidecar.base}/jobs", json=start_body("tls-foreign"),
                              headers=_auth(OLD, "k1")) as r:
                await r.read()
    # Nothing was admitted: the request never reached the application.
    async with _session(pki, pki.client) as s:
        async with s.get(f"{shared_sidecar.base}{job_path('tls-foreign')}",
                         headers=_auth(OLD)) as r:
            assert r.status == 404


async def test_certificate_without_token_or_with_a_wrong_one_gets_401(
        shared_sidecar: TlsSidecar, pki: Pki) -> None:
    async with _session(pki, pki.client) as s:
        for headers in ({"Idempotency-Key": "k1"}, _auth("not-the-token", "k1")):
            async with s.post(f"{shared_sidecar.base}/jobs", json=start_body("tls-notoken"),
                              headers=headers) as r:
                body = await r.json()
                assert r.status == 401, body
                assert body["error"]["code"] == "unauthenticated"


async def test_plain_http_to_the_tls_port_gets_nothing(shared_sidecar: TlsSidecar) -> None:
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.get(f"http://127.0.0.1:{shared_sidecar.proc.port}/health") as r:
                await r.read()


def test_client_that_expects_another_name_refuses_the_server(
        shared_sidecar: TlsSidecar, pki: Pki) -> None:
    """The operator verifies the replica's name: a certificate for other names is refused."""
    ctx = client_context(pki.ca_file, pki.client)
    with socket.create_connection(("127.0.0.1", shared_sidecar.proc.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            ctx.wrap_socket(raw, server_hostname="research-1.research.team-a.svc")


async def test_rotation_of_serving_certificate_and_token_while_jobs_run(
        tls_sidecar: TlsSidecar, pki: Pki) -> None:
    """20 jobs admitted across a serving-certificate rotation and a token roll (old+new, then
    new only): every admission succeeds and every job completes; afterwards the new
    certificate is served and the old token is refused."""
    port = tls_sidecar.proc.port
    assert port is not None
    first = served_certificate(port, client_context(pki.ca_file, pki.client))
    ids = [f"rot-{i}" for i in range(20)]

    async def admit(s: aiohttp.ClientSession, action_id: str, token: str) -> int:
        body = start_body(action_id, topic=f"bees {action_id} [[sleep:1]]")
        async with s.post(f"{tls_sidecar.base}/jobs", json=body,
                          headers=_auth(token, f"key-{action_id}", async_=True)) as r:
            await r.read()
            return r.status

    async with _session(pki, pki.client) as s:
        statuses = await asyncio.gather(*(admit(s, a, OLD) for a in ids[:7]))
        # Step 1 of the roll: both tokens accepted; the serving certificate is renewed.
        tls_sidecar.token_dir.write({"token": f"{NEW}\n{OLD}\n".encode()})
        tls_sidecar.tls_dir.write(serving_files(pki.crew_ca, HOSTS))
        statuses += await asyncio.gather(*(admit(s, a, OLD) for a in ids[7:10]))
        statuses += await asyncio.gather(*(admit(s, a, NEW) for a in ids[10:14]))
        # Step 2: the client uses the new token only; the old one is removed.
        tls_sidecar.token_dir.write({"token": f"{NEW}\n".encode()})
        statuses += await asyncio.gather(*(admit(s, a, NEW) for a in ids[14:]))
        assert statuses == [202] * 20

        async def terminal(action_id: str) -> str:
            while True:
                async with s.get(f"{tls_sidecar.base}{job_path(action_id)}",
                                 headers=_auth(NEW)) as r:
                    record = await r.json()
                if record["status"] != "running":
                    return str(record["status"])
                await asyncio.sleep(0.1)

        finals = await asyncio.wait_for(asyncio.gather(*(terminal(a) for a in ids)), 120)
        assert finals == ["completed"] * 20
        async with s.get(f"{tls_sidecar.base}{job_path(ids[0])}", headers=_auth(OLD)) as r:
            assert r.status == 401
    second = served_certificate(port, client_context(pki.ca_file, pki.client))
    assert second.serial_number != first.serial_number
    assert tls_sidecar.proc.proc is not None and tls_sidecar.proc.proc.poll() is None
    assert OLD not in tls_sidecar.proc.stderr_text()
    assert NEW not in tls_sidecar.proc.stderr_text()


def test_half_written_rotation_keeps_serving_the_previous_certificate(
        tls_sidecar: TlsSidecar, pki: Pki) -> None:
    """A certificate that does not match the key on disk yet is not loaded."""
    port = tls_sidecar.proc.port
    assert port is not None
    ctx = client_context(pki.ca_file, pki.client)
    before = served_certificate(port, ctx)
    fresh = serving_files(pki.crew_ca, HOSTS)
    cert_target = tls_sidecar.tls_dir.path("tls.crt").resolve()
    cert_target.write_bytes(fresh["tls.crt"])  # the key is still the old one
    assert served_certificate(port, ctx).serial_number == before.serial_number
    certs.write_private(tls_sidecar.tls_dir.path("tls.key").resolve(), fresh["tls.key"])
    assert served_certificate(port, ctx).serial_number != before.serial_number


def test_all_interfaces_without_tls_exits_with_a_clear_message(tmp_path: Path) -> None:
    crews = write_crews(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    line = refused_start(tmp_path, sidecar_env(state / "journal.db", crews,
                                               CREWFENCE_HOST="0.0.0.0"))
    assert "refusing plain HTTP on 0.0.0.0" in line
    assert "CREWFENCE_INSECURE_PLAINTEXT=1" in line


def test_insecure_plaintext_setting_allows_all_interfaces(tmp_path: Path) -> None:
    crews = write_crews(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = sidecar_env(state / "journal.db", crews, CREWFENCE_HOST="0.0.0.0",
                      CREWFENCE_INSECURE_PLAINTEXT="1")
    proc = SidecarProcess([], env, tmp_path / "plain.log").start()
    try:
        proc.wait_listening()
    finally:
        assert proc.terminate() == 0


@pytest.mark.parametrize("change, fragment", [
    ("key_mode_0644", "must have mode 0600"),
    ("missing_ca", "CREWFENCE_TLS_CLIENT_CA_FILE"),
    ("only_cert", "missing CREWFENCE_TLS_KEY_FILE"),
    ("key_of_another_certificate", "cannot be loaded"),
    ("with_plaintext", "exclusive"),
])
def test_bad_tls_configuration_refuses_before_bind(
        tmp_path: Path, pki: Pki, change: str, fragment: str) -> None:
    env, tls_dir, _ = _tls_env(tmp_path, pki)
    if change == "key_mode_0644":
        tls_dir.path("tls.key").resolve().chmod(0o644)
    elif change == "missing_ca":
        env["CREWFENCE_TLS_CLIENT_CA_FILE"] = str(tmp_path / "nope.crt")
    elif change == "only_cert":
        del env["CREWFENCE_TLS_KEY_FILE"], env["CREWFENCE_TLS_CLIENT_CA_FILE"]
    elif change == "key_of_another_certificate":
        other = serving_files(pki.crew_ca, HOSTS)
        certs.write_private(tls_dir.path("tls.key").resolve(), other["tls.key"])
    elif change == "with_plaintext":
        env["CREWFENCE_INSECURE_PLAINTEXT"] = "1"
    line = refused_start(tmp_path, env)
    assert fragment in line
    assert "PRIVATE KEY" not in line
