"""Operator <-> sidecar over mutual TLS on the real control plane (the operator's default;
``CREWFENCE_OPERATOR_SIDECAR_TLS=1`` is still set explicitly here, so this module keeps testing
TLS whatever the default): every CrewJob example over HTTPS with a per-Crew CA,
credentials as files only, and who is refused at the sidecar.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from crewfence_operator.transport import certs, pki
from crewjob_support import (
    EXAMPLES,
    apply_file,
    crew_token,
    crewjob_namespace,
    https_get,
    wait_crew_ready,
    wait_phase,
)
from cryptography import x509
from harness.handles import Cluster, Operator, PodRunner

TLS_ENV = {"CREWFENCE_OPERATOR_SIDECAR_TLS": "1"}
EXPECTED = {
    "crewjob-run.yaml": "Succeeded",
    "crewjob-batch-run.yaml": "Succeeded",
    "crewjob-knowledge-query.yaml": "Succeeded",
    "crewjob-test.yaml": "Succeeded",
    "crewjob-train.yaml": "Succeeded",
    "crewjob-memory-reset.yaml": "Succeeded",
    "crewjob-replay.yaml": "Failed",  # names a placeholder task id (see the file)
}


@pytest.fixture(scope="module")
def mtls_ns(cluster: Cluster) -> Iterator[str]:
    with crewjob_namespace(cluster, "e2e-mtls") as name:
        yield name


class _tls_operator:
    def __init__(self, cluster: Cluster) -> None:
        from harness import controlplane
        from harness.operator_launch import OperatorLaunch

        controlplane.install_crds(cluster.info)
        self.op = Operator(cluster, OperatorLaunch.for_cluster(
            str(cluster.kubeconfig), cluster.state_dir, extra_env=TLS_ENV), None)

    def __enter__(self) -> Operator:
        self.op.start()
        return self.op

    def __exit__(self, *exc: object) -> None:
        self.op.stop()


@pytest.fixture(scope="module")
def tls_op(cluster: Cluster, pod_runner: PodRunner,
           _operators: list[Operator]) -> Iterator[Operator]:
    """The operator with sidecar TLS on, for this module only (one operator at a time; the
    next test's ``operator_process`` starts the default one again)."""
    for other in _operators:
        other.stop()
    _operators.clear()
    with _tls_operator(cluster) as op:
        yield op


@pytest.fixture(scope="module")
def research(cluster: Cluster, tls_op: Operator, mtls_ns: str) -> str:
    apply_file(cluster, EXAMPLES / "crew-research.yaml", mtls_ns)
    wait_crew_ready(cluster, mtls_ns, "research", 2)
    return mtls_ns


def _secret_bytes(cluster: Cluster, ns: str, name: str, key: str) -> bytes:
    secret = cluster.get_json("secret", name, "-n", ns)
    return base64.b64decode(secret["data"][key])


def _address(cluster: Cluster, ns: str, ordinal: int) -> str:
    crew = cluster.get_json("crew", "research", "-n", ns)
    rep = next(r for r in crew["status"]["replicas"] if r["ordinal"] == ordinal)
    return str(rep["address"])


def _context(ca_pem: bytes, client: certs.Issued | None, tmp: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    if client is not None:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "c.crt").write_bytes(client.cert_pem)
        certs.write_private(tmp / "c.key", client.key_pem)
        ctx.load_cert_chain(tmp / "c.crt", tmp / "c.key")
    return ctx


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_every_operation_runs_over_mutual_tls(cluster: Cluster, research: str,
                                              example: str) -> None:
    ns = research
    apply_file(cluster, EXAMPLES / example, ns)
    name = example.removesuffix(".yaml")
    status = wait_phase(cluster, ns, name, timeout=600)["status"]
    assert status["phase"] == EXPECTED[example], json.dumps(status)
    assert status["uncertainOutcome"] is False


def test_pods_carry_no_secret_in_their_environment(cluster: Cluster, research: str) -> None:
    ns = research
    for ordinal in (0, 1):
        pod = cluster.get_json("pod", f"research-{ordinal}", "-n", ns)
        (container,) = pod["spec"]["containers"]
        env = container["env"]
        names = {e["name"] for e in env}
        assert "CREWFENCE_TOKEN" not in names
        assert not any("secretKeyRef" in (e.get("valueFrom") or {}) for e in env)
        assert {"CREWFENCE_TOKEN_FILE", "CREWFENCE_TLS_CERT_FILE", "CREWFENCE_TLS_KEY_FILE",
                "CREWFENCE_TLS_CLIENT_CA_FILE"} <= names
        assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        secret = cluster.get_json("secret", f"research-{ordinal}-crewfence-tls", "-n", ns)
        cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"research-{ordinal}.research.{ns}.svc" in san.get_values_for_type(x509.DNSName)
        owner = secret["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "Crew" and owner["name"] == "research"


def test_who_the_sidecar_refuses(cluster: Cluster, research: str, tmp_path: Path) -> None:
    ns = research
    token = crew_token(cluster, ns, "research")
    address = _address(cluster, ns, 0)
    name0 = f"research-0.research.{ns}.svc"
    ca_pem = _secret_bytes(cluster, ns, "research-crewfence-ca", "ca.crt")
    ca = pki.ca_from_secret(cluster.get_json("secret", "research-crewfence-ca", "-n", ns))
    assert ca is not None
    own_client = pki.issue_operator_client(ca)

    # The operator's kind of client: the Crew CA's client certificate and the token.
    status, _ = https_get(address, "/jobs/nothing-here", token,
                     _context(ca_pem, own_client, tmp_path / "own"), name0)
    assert status == 404
    # The token alone (a leaked Secret): 401 before anything else is looked at.
    status, body = https_get(address, "/jobs/nothing-here", token, _context(ca_pem, None, tmp_path),
                        name0)
    assert status == 401 and "client_certificate_required" in body
    # /health and /metrics stay open for probes and scraping, and say nothing secret.
    status, body = https_get(address, "/health", "", _context(ca_pem, None, tmp_path), name0)
    assert status == 200 and token not in body
    # A client certificate of another Crew's CA: refused by the handshake.
    foreign = pki.issue_operator_client(certs.new_ca("crewfence other/other"))
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        https_get(address, "/jobs/nothing-here", token,
             _context(ca_pem, foreign, tmp_path / "foreign"), name0)
    # The operator checks the replica's name: replica 1's certificate does not pass for 0.
    with pytest.raises(ssl.SSLCertVerificationError):
        https_get(_address(cluster, ns, 1), "/health", "", _context(ca_pem, None, tmp_path), name0)
    # Plain HTTP gets nothing.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://{address}/health", timeout=10)


class OpenAIFixture:
    """A loopback OpenAI-compatible chat endpoint that records the credentials it is sent."""

    def __init__(self) -> None:
        import http.server
        import threading

        seen: list[str] = []
        self.authorizations = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                seen.append(self.headers.get("Authorization") or "")
                text = ("Thought: I now know the final answer\n"
                        "Final Answer: Bees make honey from nectar.")
                base = {"id": "chatcmpl-e2e", "created": 0,
                        "model": body.get("model", "gpt-4o-mini")}
                usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                if body.get("stream"):
                    chunks = [
                        {**base, "object": "chat.completion.chunk", "choices": [{
                            "index": 0, "finish_reason": None,
                            "delta": {"role": "assistant", "content": text}}]},
                        {**base, "object": "chat.completion.chunk", "choices": [{
                            "index": 0, "finish_reason": "stop", "delta": {}}]},
                        {**base, "object": "chat.completion.chunk", "choices": [],
                         "usage": usage},
                    ]
                    answer = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n"
                                      for c in chunks) + b"data: [DONE]\n\n"
                    content_type = "text/event-stream"
                else:
                    answer = json.dumps({**base, "object": "chat.completion", "usage": usage,
                                         "choices": [{"index": 0, "finish_reason": "stop",
                                                      "message": {"role": "assistant",
                                                                  "content": text}}]}).encode()
                    content_type = "application/json"
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_llm_api_key_reaches_the_model_only_as_a_file(
        cluster: Cluster, tls_op: Operator, pod_runner: PodRunner, mtls_ns: str) -> None:
    import uuid

    from crewjob_support import apply_obj, crewjob_manifest, events_for, research_crew

    ns, key = mtls_ns, f"sk-e2e-{uuid.uuid4().hex}"
    fixture = OpenAIFixture()
    try:
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llm-key"},
                  "type": "Opaque", "data": {"apiKey": base64.b64encode(key.encode()).decode()}}
        assert apply_obj(cluster, secret, ns).returncode == 0
        crew = research_crew(1)
        crew["metadata"]["name"] = "hosted"
        crew["spec"]["operations"] = ["run"]
        crew["spec"]["llm"] = {"model": "openai/gpt-4o-mini",
                               "baseUrl": f"http://127.0.0.1:{fixture.port}/v1",
                               "apiKeySecretRef": {"name": "llm-key", "key": "apiKey"}}
        assert apply_obj(cluster, crew, ns).returncode == 0
        wait_crew_ready(cluster, ns, "hosted", 1)
        job = crewjob_manifest("hosted-run", "run", {"topic": "bees"}, crew="hosted")
        assert apply_obj(cluster, job, ns).returncode == 0
        obj = wait_phase(cluster, ns, "hosted-run", timeout=300)
        assert obj["status"]["phase"] == "Succeeded", json.dumps(obj["status"])
    finally:
        fixture.close()
    # The model saw exactly the Secret's key as its bearer credential, on every call.
    assert fixture.authorizations and set(fixture.authorizations) == {f"Bearer {key}"}
    # ... and the key is nowhere else: pod spec, process environment, logs, status, Events.
    pod = cluster.get_json("pod", "hosted-0", "-n", ns)
    assert key not in json.dumps(pod)
    pid = pod_runner.pid(ns, "hosted-0")
    assert pid is not None
    assert key.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    assert key not in pod_runner.logs(ns, "hosted-0")
    assert key not in json.dumps(cluster.get_json("crewjob", "hosted-run", "-n", ns))
    assert key not in json.dumps(cluster.get_json("crew", "hosted", "-n", ns))
    assert key not in json.dumps(events_for(cluster, ns, "hosted-run"))
    assert key not in tls_op.logs()


def _served_serial(address: str, ca_pem: bytes, server_name: str) -> int:
    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    with socket.create_connection((host, int(port)), timeout=15) as raw, \
            ctx.wrap_socket(raw, server_hostname=server_name) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_serving_certificates_rotate_while_20_jobs_run(
        cluster: Cluster, research: str, pod_runner: PodRunner) -> None:
    """Both replicas' TLS Secrets are deleted; the operator re-issues them on its next full
    pass and the mounted files change under the running sidecars (kubelet sync). 20 CrewJobs
    admitted before, during and after: all succeed, none uncertain, no sidecar restarted."""
    import time

    from crewjob_support import apply_obj, crewjob_manifest

    ns = research
    ca_pem = _secret_bytes(cluster, ns, "research-crewfence-ca", "ca.crt")
    names = {o: f"research-{o}.research.{ns}.svc" for o in (0, 1)}
    addresses = {o: _address(cluster, ns, o) for o in (0, 1)}
    pids = {o: pod_runner.pid(ns, f"research-{o}") for o in (0, 1)}
    before = {o: _served_serial(addresses[o], ca_pem, names[o]) for o in (0, 1)}
    jobs = [f"rot-{i}" for i in range(20)]

    def submit(name: str) -> None:
        job = crewjob_manifest(name, "run", {"topic": f"rotation {name} [[sleep:2]]"})
        assert apply_obj(cluster, job, ns).returncode == 0

    for name in jobs[:8]:
        submit(name)
    for o in (0, 1):
        cluster.kubectl("delete", "secret", f"research-{o}-crewfence-tls", "-n", ns,
                        check=True)
    pending = jobs[8:]
    deadline = time.monotonic() + 180
    rotated: dict[int, int] = {}
    while len(rotated) < 2:
        assert time.monotonic() < deadline, f"serving certificates not rotated: {rotated}"
        if len(pending) > 4:
            submit(pending.pop(0))
        for o in (0, 1):
            serial = _served_serial(addresses[o], ca_pem, names[o])
            if serial != before[o]:
                rotated[o] = serial
        time.sleep(3)
    for name in pending:
        submit(name)
    for name in jobs:
        status = wait_phase(cluster, ns, name, timeout=300)["status"]
        assert status["phase"] == "Succeeded", json.dumps(status)
        assert status["uncertainOutcome"] is False
    for o in (0, 1):
        secret = cluster.get_json("secret", f"research-{o}-crewfence-tls", "-n", ns)
        cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
        assert cert.serial_number == rotated[o]
        assert pod_runner.pid(ns, f"research-{o}") == pids[o]  # reloaded, not restarted


def test_token_roll_while_20_jobs_run(cluster: Cluster, research: str, pod_runner: PodRunner,
                                      tmp_path: Path) -> None:
    """``kubectl annotate crew research crewfence.dev/rotate-token=<id>``: the operator adds a
    new token next to the old one, switches once every replica accepts it, then drops the old
    one; 20 CrewJobs admitted across the roll all succeed, none uncertain, no restart."""
    import time

    from crewjob_support import apply_obj, crewjob_manifest

    ns = research
    old = crew_token(cluster, ns, "research")
    pids = {o: pod_runner.pid(ns, f"research-{o}") for o in (0, 1)}
    jobs = [f"roll-{i}" for i in range(20)]

    def submit(name: str) -> None:
        job = crewjob_manifest(name, "run", {"topic": f"token roll {name} [[sleep:2]]"})
        assert apply_obj(cluster, job, ns).returncode == 0

    def phase() -> str | None:
        secret = cluster.get_json("secret", "research-crewfence-token", "-n", ns)
        annotations = secret["metadata"].get("annotations") or {}
        return annotations.get("crewfence.dev/token-rotation-phase")

    for name in jobs[:6]:
        submit(name)
    cluster.kubectl("annotate", "crew", "research", "-n", ns,
                    "crewfence.dev/rotate-token=e2e-roll-1", "--overwrite", check=True)
    pending, seen = jobs[6:], []
    deadline = time.monotonic() + 240
    while (current := phase()) != "done":
        assert time.monotonic() < deadline, f"token roll stuck in phase {current}"
        if current and (not seen or seen[-1] != current):
            seen.append(current)
        if len(pending) > 3:
            submit(pending.pop(0))
        time.sleep(2)
    for name in pending:
        submit(name)
    assert "adding" in seen or "switched" in seen, seen
    for name in jobs:
        status = wait_phase(cluster, ns, name, timeout=300)["status"]
        assert status["phase"] == "Succeeded", json.dumps(status)
        assert status["uncertainOutcome"] is False
    new = crew_token(cluster, ns, "research")
    assert new != old and "\n" not in new.strip()

    ca = pki.ca_from_secret(cluster.get_json("secret", "research-crewfence-ca", "-n", ns))
    assert ca is not None
    ctx = _context(ca.cert_pem, pki.issue_operator_client(ca), tmp_path / "client")
    for o in (0, 1):
        address, name = _address(cluster, ns, o), f"research-{o}.research.{ns}.svc"
        assert https_get(address, "/jobs/nothing-here", new, ctx, name)[0] == 404
        # The old token goes once the replica's mounted file drops it (kubelet sync).
        end = time.monotonic() + 60
        while https_get(address, "/jobs/nothing-here", old, ctx, name)[0] != 401:
            assert time.monotonic() < end, "the old token is still accepted"
            time.sleep(1)
        assert pod_runner.pid(ns, f"research-{o}") == pids[o]
    assert old not in pod_runner.logs(ns, "research-0") and new not in pod_runner.logs(
        ns, "research-0")
