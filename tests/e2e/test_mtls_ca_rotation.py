"""Renewing a Crew's CA on the real control plane while CrewJobs run (``transport/ca_rotation.py``).

``kubectl annotate crew research crewfence.dev/rotate-ca=<id>``: the operator adds a new CA
to every trust bundle, switches every certificate to it once every sidecar accepts it, and
drops the old CA once nothing it signed is in use. CrewJobs admitted before, during and after
all succeed, none uncertain; afterwards the sidecars refuse a client certificate of the old
CA, and the operator still reaches every replica (jobs admitted afterwards land on each).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from crewfence_operator.assignment import choose_ordinal
from crewfence_operator.transport import ca_rotation, certs, pki
from crewjob_support import (
    apply_obj,
    crew_token,
    crewjob_manifest,
    https_get,
    research_crew,
    wait_crew_ready,
    wait_phase,
)
from cryptography import x509
from harness.handles import Cluster, Operator, PodRunner

TLS_ENV = {"CREWFENCE_OPERATOR_SIDECAR_TLS": "1"}


def _ca_secret(cluster: Cluster, ns: str) -> dict[str, Any]:
    secret: dict[str, Any] = cluster.get_json("secret", "research-crewfence-ca", "-n", ns)
    return secret


def _phase(cluster: Cluster, ns: str) -> str | None:
    annotations = _ca_secret(cluster, ns)["metadata"].get("annotations") or {}
    return annotations.get(ca_rotation.PHASE_ANNOTATION)


def _address(cluster: Cluster, ns: str, ordinal: int) -> str:
    crew = cluster.get_json("crew", "research", "-n", ns)
    rep = next(r for r in crew["status"]["replicas"] if r["ordinal"] == ordinal)
    return str(rep["address"])


def _context(trust: list[x509.Certificate], client: certs.Issued, tmp: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=pki.bundle_pem(trust).decode())
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "c.crt").write_bytes(client.cert_pem)
    certs.write_private(tmp / "c.key", client.key_pem)
    ctx.load_cert_chain(tmp / "c.crt", tmp / "c.key")
    return ctx


def _refused(call: Callable[[], object]) -> bool:
    try:
        call()
    except (ssl.SSLError, ConnectionError, OSError):
        return True
    return False


def _names_per_ordinal(ns: str, prefix: str) -> dict[int, str]:
    """One CrewJob name whose action id (``<namespace>/<name>``) is assigned to each ordinal."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < 2:
        name = f"{prefix}-{i}"
        ordinal = choose_ordinal(f"{ns}/{name}", [0, 1])
        assert ordinal is not None
        found.setdefault(ordinal, name)
        i += 1
    return found


def test_ca_rotation_while_jobs_run(cluster: Cluster, pod_runner: PodRunner,
                                    operator_factory: Callable[..., Operator], namespace: str,
                                    tmp_path: Path) -> None:
    ns = namespace
    op = operator_factory(extra_env=TLS_ENV)
    assert apply_obj(cluster, research_crew(2), ns).returncode == 0
    wait_crew_ready(cluster, ns, "research", 2)
    old = ca_rotation.CaState.from_secret(_ca_secret(cluster, ns))
    assert old is not None and old.phase == "stable"
    token = crew_token(cluster, ns, "research")
    pids = {o: pod_runner.pid(ns, f"research-{o}") for o in (0, 1)}
    names = {o: f"research-{o}.research.{ns}.svc" for o in (0, 1)}
    old_client = pki.issue_operator_client(old.signing)
    old_ctx = _context([old.signing.cert], old_client, tmp_path / "old")
    for o in (0, 1):  # the old CA's client certificate works before the rotation
        assert https_get(_address(cluster, ns, o), "/jobs/nothing-here", token, old_ctx,
                         names[o])[0] == 404

    jobs = [f"carot-{i}" for i in range(16)]

    def submit(name: str) -> None:
        job = crewjob_manifest(name, "run", {"topic": f"ca rotation {name} [[sleep:2]]"})
        assert apply_obj(cluster, job, ns).returncode == 0

    for name in jobs[:6]:
        submit(name)
    log_offset = len(op.logs())
    cluster.kubectl("annotate", "crew", "research", "-n", ns,
                    f"{ca_rotation.ROTATE_ANNOTATION}=e2e-ca-1", "--overwrite", check=True)
    pending = jobs[6:]
    deadline = time.monotonic() + 300
    while (current := _phase(cluster, ns)) != "done":
        assert time.monotonic() < deadline, f"CA rotation stuck in phase {current}"
        if pending:
            submit(pending.pop(0))
        time.sleep(1)
    for name in pending:
        submit(name)
    # Three writes of the CA Secret, in order (the operator logs each step it takes).
    steps = [line.split("CA rotation: phase ", 1)[1].split()[0]
             for line in op.logs()[log_offset:].splitlines() if "CA rotation: phase " in line]
    assert steps == ["trusting", "switching", "done"], steps

    # The CA Secret: the new CA only, the request recorded (it is not carried out twice).
    secret = _ca_secret(cluster, ns)
    new = ca_rotation.CaState.from_secret(secret)
    assert new is not None and new.phase == "stable"
    assert new.signing.cert != old.signing.cert
    assert secret["metadata"]["annotations"][ca_rotation.ROTATION_ID_ANNOTATION] == "e2e-ca-1"
    for o in (0, 1):  # each replica's Secret: a certificate of the new CA, trusting it alone
        replica = cluster.get_json("secret", f"research-{o}-crewfence-tls", "-n", ns)
        leaf = pki.cert_from_secret(replica)
        assert leaf is not None and pki.signed_by(leaf, new.signing.cert)
        assert pki.fingerprints(pki.trust_from_secret(replica)) == {
            pki.fingerprint(new.signing.cert)}

    # Every job admitted across the rotation: succeeded, none uncertain.
    for name in jobs:
        status = wait_phase(cluster, ns, name, timeout=300)["status"]
        assert status["phase"] == "Succeeded", json.dumps(status)
        assert status["uncertainOutcome"] is False

    # The sidecars refuse the old CA's client certificate once their files dropped it (the
    # kubelet's sync), and take the new CA's; no sidecar was restarted for any of it.
    new_ctx = _context([new.signing.cert], pki.issue_operator_client(new.signing),
                       tmp_path / "new")
    for o in (0, 1):
        address = _address(cluster, ns, o)
        assert https_get(address, "/jobs/nothing-here", token, new_ctx, names[o])[0] == 404
        end = time.monotonic() + 60
        while not _refused(partial(https_get, address, "/jobs/nothing-here", token, old_ctx,
                                   names[o])):
            assert time.monotonic() < end, f"replica {o} still accepts the old CA's client"
            time.sleep(1)
        assert pod_runner.pid(ns, f"research-{o}") == pids[o]
    # ... and a client that trusts the old CA alone no longer accepts the replicas.
    old_only = _context([old.signing.cert], pki.issue_operator_client(new.signing),
                        tmp_path / "old-trust")
    assert _refused(partial(https_get, _address(cluster, ns, 0), "/health", token, old_only,
                            names[0]))

    # The operator still talks to every replica: a job assigned to each one succeeds.
    after = _names_per_ordinal(ns, "carot-after")
    for name in after.values():
        submit(name)
    for ordinal, name in after.items():
        status = wait_phase(cluster, ns, name, timeout=300)["status"]
        assert status["phase"] == "Succeeded", json.dumps(status)
        assert status["uncertainOutcome"] is False
        assert status["assignment"]["pod"] == f"research-{ordinal}"
    # Nothing secret in the operator's log: no private key of either CA.
    logs = op.logs()
    for issued in (old.signing, new.signing):
        assert base64.b64encode(issued.key_pem).decode()[:40] not in logs
        assert issued.key_pem.decode().splitlines()[1] not in logs


def _wait_log(op: Operator, offset: int, text: str, timeout: float = 120) -> int:
    """Wait until the operator's log shows ``text`` after ``offset``; the offset past it."""
    deadline = time.monotonic() + timeout
    while (found := op.logs().find(text, offset)) < 0:
        assert time.monotonic() < deadline, f"the operator never logged {text!r}"
        time.sleep(0.5)
    return found + len(text)


def test_a_silent_replica_holds_the_rotation_across_an_operator_restart(
        cluster: Cluster, pod_runner: PodRunner, operator_factory: Callable[..., Operator],
        namespace: str) -> None:
    """Replica 1's sidecar is frozen (SIGSTOP): it cannot prove it trusts the new CA, so the
    rotation stays in ``trusting``; the operator is restarted there and carries on from the
    Secret (the same new CA, no second one); once the sidecar runs again the rotation ends."""
    ns = namespace
    op = operator_factory(extra_env=TLS_ENV)
    assert apply_obj(cluster, research_crew(2), ns).returncode == 0
    wait_crew_ready(cluster, ns, "research", 2)
    frozen = pod_runner.kill(ns, "research-1", sig=signal.SIGSTOP)
    try:
        offset = len(op.logs())
        cluster.kubectl("annotate", "crew", "research", "-n", ns,
                        f"{ca_rotation.ROTATE_ANNOTATION}=e2e-hold", "--overwrite", check=True)
        offset = _wait_log(op, offset, "(phase trusting) waits: ")
        held = ca_rotation.CaState.from_secret(_ca_secret(cluster, ns))
        assert held is not None and held.phase == "trusting" and held.next is not None
        assert "replica 1: not yet proved" in op.logs()[offset - 200:offset + 300]

        op.restart()  # the restarted operator knows only the Secrets
        offset = _wait_log(op, offset, "(phase trusting) waits: ")
        again = ca_rotation.CaState.from_secret(_ca_secret(cluster, ns))
        assert again is not None and again.phase == "trusting"
        assert again.next is not None and again.next.cert == held.next.cert  # no second CA
        assert again.signing.cert == held.signing.cert
    finally:
        os.kill(frozen, signal.SIGCONT)
    deadline = time.monotonic() + 180
    while (current := _phase(cluster, ns)) != "done":
        assert time.monotonic() < deadline, f"CA rotation stuck in phase {current}"
        time.sleep(1)
    done = ca_rotation.CaState.from_secret(_ca_secret(cluster, ns))
    assert done is not None and done.signing.cert == held.next.cert
    # The thawed replica proved its trust to end the rotation, but its pod turns Ready again
    # only at its next readiness probe; until then its jobs rightly go to the other replica.
    wait_crew_ready(cluster, ns, "research", 2)
    after = _names_per_ordinal(ns, "hold-after")
    for name in after.values():
        job = crewjob_manifest(name, "run", {"topic": f"after the hold {name}"})
        assert apply_obj(cluster, job, ns).returncode == 0
    for ordinal, name in after.items():
        status = wait_phase(cluster, ns, name, timeout=300)["status"]
        assert status["phase"] == "Succeeded", json.dumps(status)
        assert status["assignment"]["pod"] == f"research-{ordinal}"


@pytest.mark.parametrize("lifetime", [120])
def test_an_expiring_ca_is_renewed_by_itself(cluster: Cluster, pod_runner: PodRunner,
                                             operator_factory: Callable[..., Operator],
                                             namespace: str, lifetime: int) -> None:
    """With ``CREWFENCE_OPERATOR_CA_LIFETIME_SECONDS`` short, the CA is renewed before it
    expires with nobody asking (once a third of its lifetime is left), and the operator
    goes on reaching the replica with the new CA."""
    ns = namespace
    operator_factory(extra_env={**TLS_ENV,
                                "CREWFENCE_OPERATOR_CA_LIFETIME_SECONDS": str(lifetime)})
    assert apply_obj(cluster, research_crew(1), ns).returncode == 0
    wait_crew_ready(cluster, ns, "research", 1)
    first = ca_rotation.CaState.from_secret(_ca_secret(cluster, ns))
    assert first is not None
    expires = first.signing.cert.not_valid_after_utc.timestamp()
    assert expires - time.time() <= lifetime  # the setting took effect
    deadline = time.monotonic() + 3 * lifetime
    while True:  # the trigger is the clock here: nothing else asks for this rotation
        state = ca_rotation.CaState.from_secret(_ca_secret(cluster, ns))
        assert state is not None
        if state.phase == "stable" and state.signing.cert != first.signing.cert:
            break
        assert time.monotonic() < deadline, f"CA not renewed; phase {state.phase}"
        time.sleep(1)
    assert time.time() < expires  # renewed before the old CA expired
    annotations = _ca_secret(cluster, ns)["metadata"].get("annotations") or {}
    assert ca_rotation.ROTATION_ID_ANNOTATION not in annotations  # nobody asked
    job = crewjob_manifest("after-expiry", "run", {"topic": "expiry [[sleep:1]]"})
    assert apply_obj(cluster, job, ns).returncode == 0
    status = wait_phase(cluster, ns, "after-expiry", timeout=300)["status"]
    assert status["phase"] == "Succeeded" and status["uncertainOutcome"] is False
