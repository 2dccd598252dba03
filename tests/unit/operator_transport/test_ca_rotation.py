"""The CA rotation's decisions (``transport/ca_rotation.py``): each phase, what each step waits for,
a restart of the operator at every step (decided again from the Secret alone), and real TLS
handshakes between the sidecar's server context and the operator's client material at every
moment of the rotation, including kubelet lag (a sidecar still on the previous files)."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.transport import ca_rotation as rot
from crewfence_operator.transport import certs, pki
from crewfence_sidecar.tls import TlsFiles, build_server_context

CREW = CrewRef(name="research", namespace="team-a", uid="uid-1")
NOW = dt.datetime.now(dt.UTC)
HOSTS = {o: tuple(pki.replica_hosts(CREW, o, f"10.0.0.{o + 1}")) for o in (0, 1)}


def _secret(state: rot.CaState, annotations: Mapping[str, str] | None = None,
            ) -> dict[str, Any]:
    """The CA Secret as the API server would hand it back after the step's write."""
    return {"metadata": {"name": pki.ca_secret_name(CREW.name),
                         "annotations": dict(annotations or {})},
            "data": state.data()}


def _restart(step: rot.CaStep) -> rot.CaState:
    """An operator restart: everything it knows is what the CA Secret holds."""
    state = rot.CaState.from_secret(_secret(step.state, step.annotations))
    assert state is not None
    return state


def _replica_secrets(state: rot.CaState,
                     previous: Mapping[int, dict[str, Any] | None]) -> dict[int, dict[str, Any]]:
    """Each replica's Secret as ``ensure_replica_secrets`` leaves it for ``state``."""
    out: dict[int, dict[str, Any]] = {}
    for o, existing in previous.items():
        wanted = pki.desired_replica_secret(CREW, o, existing, pki.ReplicaIssue(
            ca=state.signing, trust=tuple(state.trust), hosts=HOSTS[o], now=NOW))
        out[o] = wanted[1] if wanted is not None else dict(existing or {})
    return out


def _views(state: rot.CaState, secrets: Mapping[int, dict[str, Any]],
           probe: bool | None) -> dict[int, rot.ReplicaView]:
    return {o: rot.ReplicaView(
        trust=pki.fingerprints(pki.trust_from_secret(s)),
        leaf_issuer=pki.issuer_among(pki.cert_from_secret(s), state.trust),
        probe=probe) for o, s in secrets.items()}


def _operator(state: rot.CaState) -> rot.OperatorView:
    material = pki.CrewClientTLS.for_ca(state.signing, state.trust)
    return rot.OperatorView(client_issuer=material.client_issuer, trusted=material.trusted)


def _obs(state: rot.CaState, replicas: Mapping[int, rot.ReplicaView],
         operator: rot.OperatorView | None, requested: str | None = "r1",
         now: dt.datetime = NOW) -> rot.CaObservation:
    return rot.CaObservation(ca=state, replicas=replicas, operator=operator,
                             requested=requested, now=now)


@pytest.fixture(scope="module")
def ca_a() -> certs.Issued:
    return pki.new_crew_ca(CREW)


@pytest.fixture(scope="module")
def ca_b() -> certs.Issued:
    return pki.new_crew_ca(CREW)


def _never() -> certs.Issued:
    raise AssertionError("a new CA was made where none may be")


def test_a_rotation_moves_through_three_writes(ca_a: certs.Issued, ca_b: certs.Issued) -> None:
    stable = rot.CaState(signing=ca_a)
    secrets0 = _replica_secrets(stable, {0: None, 1: None})
    views0 = _views(stable, secrets0, True)
    # Nothing asked, CA young: nothing to do; no probe plan.
    assert rot.decide(_obs(stable, views0, _operator(stable), requested=None), _never) is None
    assert rot.probe_plan(stable) is None

    trusting = rot.decide(_obs(stable, views0, _operator(stable)), lambda: ca_b)
    assert trusting is not None and trusting.phase == "trusting"
    assert trusting.reason == "requested"
    s1 = _restart(trusting)
    assert s1.phase == "trusting" and s1.rotation_id == "r1"
    assert s1.signing.cert == ca_a.cert  # still signing with A: everyone trusts A
    assert pki.fingerprints(s1.trust) == pki.fingerprints([ca_a.cert, ca_b.cert])

    secrets1 = _replica_secrets(s1, secrets0)
    for o in (0, 1):  # only the bundle changed: the certificate (and key) stay
        assert secrets1[o]["data"]["tls.crt"] == secrets0[o]["data"]["tls.crt"]
        assert secrets1[o]["data"]["tls.key"] == secrets0[o]["data"]["tls.key"]
    plan = rot.probe_plan(s1)
    assert plan is not None and plan.client_ca.cert == ca_b.cert
    assert pki.fingerprints(plan.verify) == pki.fingerprints(s1.trust)

    switching = rot.decide(_obs(s1, _views(s1, secrets1, True), _operator(s1)), _never)
    assert switching is not None and switching.phase == "switching"
    s2 = _restart(switching)
    assert s2.phase == "switching" and s2.signing.cert == ca_b.cert
    assert s2.previous == ca_a.cert and s2.next is None
    assert pki.fingerprints(s2.trust) == pki.fingerprints([ca_a.cert, ca_b.cert])

    secrets2 = _replica_secrets(s2, secrets1)
    for o in (0, 1):  # re-issued by B, the bundle still holds A
        leaf = pki.cert_from_secret(secrets2[o])
        assert leaf is not None and pki.signed_by(leaf, ca_b.cert)
    plan = rot.probe_plan(s2)
    assert plan is not None and plan.verify == (ca_b.cert,) and plan.client_ca.cert == ca_b.cert

    done = rot.decide(_obs(s2, _views(s2, secrets2, True), _operator(s2)), _never)
    assert done is not None and done.phase == "done"
    s3 = _restart(done)
    assert s3.phase == "stable" and s3.signing.cert == ca_b.cert
    assert pki.fingerprints(s3.trust) == {pki.fingerprint(ca_b.cert)}
    secrets3 = _replica_secrets(s3, secrets2)
    for o in (0, 1):
        assert pki.fingerprints(pki.trust_from_secret(secrets3[o])) == {
            pki.fingerprint(ca_b.cert)}
        assert secrets3[o]["data"]["tls.crt"] == secrets2[o]["data"]["tls.crt"]
    # The same request is carried out once.
    assert rot.decide(_obs(s3, _views(s3, secrets3, None), _operator(s3)), _never) is None


def test_a_restart_at_every_step_decides_the_same_and_makes_no_second_ca(
        ca_a: certs.Issued, ca_b: certs.Issued) -> None:
    stable = rot.CaState(signing=ca_a)
    secrets0 = _replica_secrets(stable, {0: None, 1: None})
    step = rot.decide(_obs(stable, _views(stable, secrets0, True), _operator(stable)),
                      lambda: ca_b)
    assert step is not None
    seen = [step.phase]
    secrets = secrets0
    while step is not None and step.phase != "done":
        state = _restart(step)
        # Right after the write, before anything synced: the restarted operator waits and
        # makes nothing new (the same request id is recorded on the Secret).
        stale = _views(state, secrets, False)
        assert rot.decide(_obs(state, stale, _operator(state)), _never) is None
        assert rot.blockers(_obs(state, stale, _operator(state)))
        secrets = _replica_secrets(state, secrets)
        # Decided twice from the same Secret: the same step.
        obs = _obs(state, _views(state, secrets, True), _operator(state))
        first, again = rot.decide(obs, _never), rot.decide(obs, _never)
        assert first is not None and again is not None and first.phase == again.phase
        assert first.state.data() == again.state.data()
        step = first
        seen.append(step.phase)
    assert seen == ["trusting", "switching", "done"]


def test_the_switch_waits_for_every_secret_every_sidecar_and_the_operator(
        ca_a: certs.Issued, ca_b: certs.Issued) -> None:
    trusting = rot.CaState(signing=ca_a, next=ca_b, rotation_id="r1")
    secrets = _replica_secrets(trusting, {0: None, 1: None})
    good = _views(trusting, secrets, True)
    assert rot.decide(_obs(trusting, good, _operator(trusting)), _never) is not None
    # Replica 1's Secret still carries A alone.
    old = _replica_secrets(rot.CaState(signing=ca_a), {1: None})
    lagging = {**good, 1: _views(trusting, old, True)[1]}
    assert rot.decide(_obs(trusting, lagging, _operator(trusting)), _never) is None
    assert any("replica 1" in b for b in rot.blockers(_obs(trusting, lagging,
                                                           _operator(trusting))))
    # Replica 0's sidecar has not yet proved it accepts B's client certificate.
    unproved = {**good, 0: rot.ReplicaView(good[0].trust, good[0].leaf_issuer, False)}
    assert rot.decide(_obs(trusting, unproved, _operator(trusting)), _never) is None
    # The operator does not verify against B yet (its material predates the bundle).
    before = _operator(rot.CaState(signing=ca_a))
    assert rot.decide(_obs(trusting, good, before), _never) is None
    assert rot.decide(_obs(trusting, good, None), _never) is None
    # A replica without a pod holds nothing: it starts from its Secret as written.
    podless = {**good, 1: rot.ReplicaView(good[1].trust, good[1].leaf_issuer, None)}
    assert rot.decide(_obs(trusting, podless, _operator(trusting)), _never) is not None


def test_the_old_ca_is_dropped_only_when_nothing_it_signed_is_in_use(
        ca_a: certs.Issued, ca_b: certs.Issued) -> None:
    switching = rot.CaState(signing=ca_b, previous=ca_a.cert, rotation_id="r1")
    trusting = rot.CaState(signing=ca_a, next=ca_b, rotation_id="r1")
    secrets = _replica_secrets(switching, _replica_secrets(trusting, {0: None, 1: None}))
    good = _views(switching, secrets, True)
    assert rot.decide(_obs(switching, good, _operator(switching)), _never) is not None
    # A Secret still holding A's certificate.
    still_a = _replica_secrets(trusting, {1: None})
    mixed = {**good, 1: _views(switching, still_a, True)[1]}
    assert mixed[1].leaf_issuer == pki.fingerprint(ca_a.cert)
    assert rot.decide(_obs(switching, mixed, _operator(switching)), _never) is None
    # A sidecar not yet serving B's certificate (kubelet lag) does not pass the B-only probe.
    lag = {**good, 0: rot.ReplicaView(good[0].trust, good[0].leaf_issuer, False)}
    assert rot.decide(_obs(switching, lag, _operator(switching)), _never) is None
    # The operator still presents a client certificate of A.
    assert rot.decide(_obs(switching, good, _operator(trusting)), _never) is None


def test_expiry_starts_a_rotation_and_lifetimes_are_settings(ca_a: certs.Issued) -> None:
    stable = rot.CaState(signing=ca_a, rotation_id="r0")
    later = NOW + dt.timedelta(days=2500)  # less than a third of ten years left
    assert rot.rotation_due(stable, None, NOW) is None
    assert rot.rotation_due(stable, "r0", NOW) is None  # an old request is not repeated
    assert rot.rotation_due(stable, None, later) == "expiring"
    step = rot.decide(_obs(stable, {}, None, requested=None, now=later),
                      lambda: pki.new_crew_ca(CREW))
    assert step is not None and step.reason == "expiring" and step.state.rotation_id == "r0"
    # A rotation under way is not started again by the expiry.
    assert rot.rotation_due(_restart(step), None, later) is None

    from crewfence_operator.config import OperatorConfig
    cfg = OperatorConfig.from_env({"CREWFENCE_OPERATOR_CA_LIFETIME_SECONDS": "90",
                                   "CREWFENCE_OPERATOR_LEAF_LIFETIME_SECONDS": "30"})
    assert (cfg.ca_lifetime_seconds, cfg.leaf_lifetime_seconds) == (90.0, 30.0)
    short = pki.new_crew_ca(CREW, dt.timedelta(seconds=cfg.ca_lifetime_seconds))
    life = short.cert.not_valid_after_utc - short.cert.not_valid_before_utc
    assert life == dt.timedelta(seconds=99)  # backdated a tenth for clock skew, not 5 min
    # Due once a third of it is left (33 s): 57 s after it was made, not before.
    made = short.cert.not_valid_after_utc - dt.timedelta(seconds=90)
    assert rot.rotation_due(rot.CaState(signing=short), None, made) is None
    assert rot.rotation_due(rot.CaState(signing=short), None,
                            made + dt.timedelta(seconds=56)) is None
    assert rot.rotation_due(rot.CaState(signing=short), None,
                            made + dt.timedelta(seconds=58)) == "expiring"
    # A leaf never outlives its CA.
    leaf = pki.issue_serving(short, list(HOSTS[0]), dt.timedelta(days=90))
    assert leaf.cert.not_valid_after_utc == short.cert.not_valid_after_utc


def test_no_key_in_reprs_and_distinct_ca_names(ca_a: certs.Issued, ca_b: certs.Issued) -> None:
    state = rot.CaState(signing=ca_a, next=ca_b)
    step = rot.CaStep(state, "trusting", "requested")
    for text in (repr(state), repr(step)):
        assert "PRIVATE" not in text and ca_a.key_pem.decode() not in text
    assert ca_a.cert.subject != ca_b.cert.subject  # one subject per CA inside a bundle
    long = CrewRef(name="r" * 253, namespace="n" * 63, uid="u")
    long_ca = pki.new_crew_ca(long)
    assert len(long_ca.cert.subject.rfc4514_string()) <= 64 + 3
    # A serving certificate for a pod DNS name over 64 characters: the SAN carries it whole.
    hosts = pki.replica_hosts(long, 0, None)
    assert len(hosts[0]) > 64
    leaf = pki.issue_serving(long_ca, hosts)
    assert pki.renewal_reason(leaf.cert, long_ca, hosts, NOW) is None
    assert rot.CaState.from_secret(None) is None
    broken = _secret(state)
    broken["data"][rot.NEXT_KEY_KEY] = base64.b64encode(b"nonsense").decode()
    parsed = rot.CaState.from_secret(broken)
    assert parsed is not None and parsed.phase == "stable"  # an unreadable next CA is no CA


# --- real handshakes at every moment of the rotation ----------------------------------------
def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> bool:
    """A TLS handshake over memory BIOs, then one record each way (TLS 1.3 reports a refused
    client certificate only after the client's side finished)."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname=name)
    done = {"srv": False, "cli": False}
    try:
        for _ in range(20):
            for key, obj in (("cli", cli), ("srv", srv)):
                if not done[key]:
                    try:
                        obj.do_handshake()
                        done[key] = True
                    except ssl.SSLWantReadError:
                        pass
            s_in.write(c_out.read())
            c_in.write(s_out.read())
            if all(done.values()):
                break
        if not all(done.values()):
            return False
        cli.write(b"ping")
        s_in.write(c_out.read())
        if srv.read(4) != b"ping":
            return False
        srv.write(b"pong")
        c_in.write(s_out.read())
        return cli.read(4) == b"pong"
    except ssl.SSLError:
        return False


def _server(secret: Mapping[str, Any], directory: Path) -> ssl.SSLContext:
    directory.mkdir(parents=True, exist_ok=True)
    files = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    for key, data in files.items():
        certs.write_private(directory / key, data)
    return build_server_context(TlsFiles(cert=directory / "tls.crt", key=directory / "tls.key",
                                         client_ca=directory / "ca.crt"))


@pytest.fixture
def states(ca_a: certs.Issued, ca_b: certs.Issued) -> Iterator[list[rot.CaState]]:
    yield [rot.CaState(signing=ca_a), rot.CaState(signing=ca_a, next=ca_b),
           rot.CaState(signing=ca_b, previous=ca_a.cert), rot.CaState(signing=ca_b)]


def test_mutual_trust_holds_at_every_moment_even_with_lagging_files(
        states: list[rot.CaState], tmp_path: Path) -> None:
    """Between two writes of the CA Secret a sidecar may still serve with the previous
    Secret's files (kubelet sync), and a call in flight may still use the operator's previous
    material: every one of those four combinations completes a mutual handshake."""
    name = pki.replica_dns_name(CREW, 0)
    secrets: dict[int, dict[str, Any] | None] = {0: None}
    replica: list[dict[str, Any]] = []
    for state in states:
        secrets = dict(_replica_secrets(state, secrets))
        replica.append(dict(secrets[0] or {}))
    operator = [pki.CrewClientTLS.for_ca(s.signing, s.trust) for s in states]
    for i in range(len(states) - 1):
        for side in (i, i + 1):
            server = _server(replica[side], tmp_path / f"r{i}-{side}")
            for op in (i, i + 1):
                assert _handshake(server, operator[op].context, name), (
                    f"step {i}->{i + 1}: sidecar on files {side}, operator material {op}")
    # Afterwards: the sidecar refuses a client certificate of the old CA, and the operator
    # would not accept a serving certificate of it.
    final = _server(replica[-1], tmp_path / "final")
    old_client = pki.CrewClientTLS.for_ca(states[0].signing)
    assert not _handshake(final, old_client.context, name)
    old_server = _server(replica[0], tmp_path / "old")
    assert not _handshake(old_server, operator[-1].context, name)


def test_without_the_overlap_the_switch_breaks_the_connection(
        states: list[rot.CaState], tmp_path: Path) -> None:
    """The check that the matrix above can fail: renewing in one write (A straight to B, the
    way a CA is replaced without a bundle) leaves a lagging sidecar and the operator unable
    to talk in both directions."""
    name = pki.replica_dns_name(CREW, 0)
    before = _replica_secrets(states[0], {0: None})
    after = _replica_secrets(states[-1], before)
    lagging_sidecar = _server(before[0], tmp_path / "before")
    new_operator = pki.CrewClientTLS.for_ca(states[-1].signing)
    assert not _handshake(lagging_sidecar, new_operator.context, name)
    updated_sidecar = _server(after[0], tmp_path / "after")
    in_flight = pki.CrewClientTLS.for_ca(states[0].signing)
    assert not _handshake(updated_sidecar, in_flight.context, name)


def test_the_per_pass_shortcut_never_hides_a_due_rotation(
        ca_a: certs.Issued, ca_b: certs.Issued, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pki_apply._quiet`` spares the CA Secret read on a daemon pass only while nothing can
    be due: a new request, another CA in the operator's material or an expiring CA read it."""
    from crewfence_operator.transport import pki_apply

    key = (CREW.namespace, CREW.name)
    monkeypatch.setattr(pki_apply, "_clients", {})
    monkeypatch.setattr(pki_apply, "_settled", {})
    assert not pki_apply._quiet(CREW, None, NOW)  # nothing known (a fresh start): read
    material = pki.CrewClientTLS.for_ca(ca_a)
    pki_apply._clients[key] = (0.0, material)
    assert not pki_apply._quiet(CREW, None, NOW)  # never read stable yet
    pki_apply._settled[key] = ("r1", pki.fingerprint(ca_a.cert))
    assert pki_apply._quiet(CREW, None, NOW)
    assert pki_apply._quiet(CREW, "r1", NOW)  # the request already carried out
    assert not pki_apply._quiet(CREW, "r2", NOW)  # a new request
    assert not pki_apply._quiet(CREW, None, NOW + dt.timedelta(days=2500))  # expiring
    pki_apply._clients[key] = (0.0, pki.CrewClientTLS.for_ca(ca_a, [ca_a.cert,
                                                                           ca_b.cert]))
    assert not pki_apply._quiet(CREW, None, NOW)  # a bundle: a rotation under way
    pki_apply._clients[key] = (0.0, pki.CrewClientTLS.for_ca(ca_b))
    assert not pki_apply._quiet(CREW, None, NOW)  # the Secret changed since it was read
