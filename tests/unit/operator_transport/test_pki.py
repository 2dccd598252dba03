"""The per-Crew CA and its certificates: renewal decisions, Secret round trips, no key leaks."""

from __future__ import annotations

import datetime as dt

import pytest
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.transport import certs, pki
from cryptography import x509

CREW = CrewRef(name="research", namespace="team-a", uid="uid-1")
NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def ca() -> certs.Issued:
    return pki.new_crew_ca(CREW)


def test_replica_names() -> None:
    assert pki.replica_dns_name(CREW, 1) == "research-1.research.team-a.svc"
    assert pki.replica_hosts(CREW, 0, "10.0.0.7") == ["research-0.research.team-a.svc",
                                                           "10.0.0.7"]
    assert pki.replica_hosts(CREW, 0, None) == ["research-0.research.team-a.svc"]


def test_serving_certificate_carries_the_names_and_is_fresh(ca: certs.Issued) -> None:
    hosts = pki.replica_hosts(CREW, 0, "10.0.0.7")
    leaf = pki.issue_serving(ca, hosts)
    assert pki.renewal_reason(leaf.cert, ca, hosts, NOW) is None
    san = leaf.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["research-0.research.team-a.svc"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert not pki.is_client_certificate(leaf.cert)
    assert pki.is_client_certificate(pki.issue_operator_client(ca).cert)


def test_renewal_reasons(ca: certs.Issued) -> None:
    hosts = pki.replica_hosts(CREW, 0, None)
    leaf = pki.issue_serving(ca, hosts)
    assert pki.renewal_reason(None, ca, hosts, NOW) == "missing"
    # The pod got its IP: the certificate must name it too.
    assert pki.renewal_reason(leaf.cert, ca, [*hosts, "10.0.0.7"], NOW) == "hosts"
    # Two thirds of 90 days later: renewed before expiry, not at it.
    assert pki.renewal_reason(leaf.cert, ca, hosts, NOW + dt.timedelta(days=59)) is None
    assert pki.renewal_reason(leaf.cert, ca, hosts,
                                   NOW + dt.timedelta(days=61)) == "expiring"
    assert pki.renewal_reason(leaf.cert, ca, hosts,
                                   NOW + dt.timedelta(days=200)) == "expiring"
    other = pki.new_crew_ca(CrewRef(name="research", namespace="team-b", uid="u"))
    assert pki.renewal_reason(leaf.cert, other, hosts, NOW) == "issuer"
    # Same subject, other key (a re-created CA): the signature decides.
    twin = certs.new_ca(ca.cert.subject.rfc4514_string().removeprefix("CN="))
    assert twin.cert.subject == ca.cert.subject
    assert pki.renewal_reason(leaf.cert, twin, hosts, NOW) == "issuer"


def test_ca_renewal(ca: certs.Issued) -> None:
    assert pki.ca_renewal_reason(None, NOW) == "missing"
    assert pki.ca_renewal_reason(ca, NOW) is None
    assert pki.ca_renewal_reason(ca, NOW + dt.timedelta(days=2500)) == "expiring"


def test_secrets_round_trip_and_keep_keys_out_of_reprs(ca: certs.Issued) -> None:
    secret = pki.ca_secret(CREW, ca)
    assert secret["metadata"]["name"] == "research-crewfence-ca"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    again = pki.ca_from_secret(secret)
    assert again is not None and again.cert == ca.cert and again.key_pem == ca.key_pem
    assert pki.ca_from_secret(None) is None
    assert pki.ca_from_secret({"data": {"ca.crt": "not base64!"}}) is None

    leaf = pki.issue_serving(ca, pki.replica_hosts(CREW, 2, None))
    replica = pki.replica_tls_secret(CREW, 2, ca, leaf)
    assert replica["metadata"]["name"] == "research-2-crewfence-tls"
    assert replica["type"] == "kubernetes.io/tls"
    assert set(replica["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert pki.cert_from_secret(replica) == leaf.cert
    for issued in (ca, leaf):
        assert "PRIVATE" not in repr(issued)


def test_client_context_is_cached_per_ca_and_renewed(ca: certs.Issued) -> None:
    material = pki.CrewClientTLS.for_ca(ca)
    assert material.still_good(ca, NOW)
    assert not material.still_good(ca, NOW + dt.timedelta(days=61))
    assert not material.still_good(pki.new_crew_ca(CREW), NOW)


def test_client_context_trusts_the_crews_ca_only(ca: certs.Issued) -> None:
    """A certificate from any system CA must open no replica: only the bundle is trusted."""
    client = pki.issue_operator_client(ca)
    ctx = pki.client_ssl_context(ca, client)
    # (ssl pads the hex serial to whole bytes: compare numbers, not strings)
    assert [int(c["serialNumber"], 16) for c in ctx.get_ca_certs()] == [ca.cert.serial_number]
    assert ctx.check_hostname and ctx.verify_mode.name == "CERT_REQUIRED"
    other = pki.new_crew_ca(CrewRef(name="other", namespace="team-b", uid="uid-2"))
    both = pki.client_ssl_context(ca, client, trust=[ca.cert, other.cert])
    assert len(both.get_ca_certs()) == 2


def test_the_client_secret_holds_a_client_certificate_and_the_bundle_never_the_ca_key(
        ca: certs.Issued) -> None:
    """Invariant (least exposure): ``kubectl crewfence explain`` gets what it needs from a
    Secret without the CA's key; re-issued when the signing CA changes, bundle-only when
    only the trust changed, left alone while good."""
    want = pki.ReplicaIssue(ca=ca, trust=(ca.cert,), hosts=(), now=NOW)
    reason, body = pki.desired_client_secret(CREW, None, want) or ("", {})
    assert reason == "missing"
    assert body["metadata"]["name"] == "research-crewfence-operator-client"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert set(body["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert ca.key_pem.decode() not in str(body) and pki.CA_KEY_KEY not in body["data"]
    client = pki.cert_from_secret(body)
    assert client is not None and pki.is_client_certificate(client)
    assert pki.signed_by(client, ca.cert)
    assert pki.desired_client_secret(CREW, body, want) is None  # good: nothing to write

    other = pki.new_crew_ca(CREW)
    both = pki.ReplicaIssue(ca=ca, trust=(ca.cert, other.cert), hosts=(), now=NOW)
    reason, rebundled = pki.desired_client_secret(CREW, body, both) or ("", {})
    assert reason == "trust" and rebundled["data"]["tls.key"] == body["data"]["tls.key"]
    moved = pki.ReplicaIssue(ca=other, trust=(ca.cert, other.cert), hosts=(), now=NOW)
    reason, reissued = pki.desired_client_secret(CREW, rebundled, moved) or ("", {})
    assert reason == "issuer" and reissued["data"]["tls.key"] != body["data"]["tls.key"]
