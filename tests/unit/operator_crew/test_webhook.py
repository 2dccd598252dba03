"""Admission decisions and the webhook's TLS material (a real handshake)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import kopf
import pytest
from crewfence_operator import kube
from crewfence_operator.config import WebhookConfig, WebhookMode
from crewfence_operator.handlers import webhook
from crewfence_operator.transport import certs


def test_shared_access_modes_named() -> None:
    for mode in ("ReadWriteMany", "ReadOnlyMany"):
        message = webhook.crew_access_mode_problem("c", {"storage": {"accessMode": mode}})
        assert message is not None and mode in message and "ReadWriteOncePod" in message
    assert webhook.crew_access_mode_problem("c", {"storage": {"accessMode": "ReadWriteOnce"}}) \
        is None
    assert webhook.crew_access_mode_problem("c", {}) is None


def test_existing_claim_used_elsewhere() -> None:
    other = {"metadata": {"name": "other"}, "spec": {"storage": {"existingClaim": "data"}}}
    me = {"metadata": {"name": "me"}, "spec": {"storage": {"existingClaim": "data"}}}
    message = webhook.existing_claim_problem("me", "data", None, [me, other])
    assert message is not None and '"data"' in message and '"other"' in message
    labelled: dict[str, Any] = {"metadata": {"name": "data", "labels": {
        "crewfence.dev/role": "state", "crewfence.dev/crew": "other",
        "crewfence.dev/replica": "0"}}}
    assert "Crew \"other\"" in (webhook.existing_claim_problem("me", "data", labelled, [me])
                                or "")
    mine = {"metadata": {"name": "data", "labels": {**labelled["metadata"]["labels"],
                                                    "crewfence.dev/crew": "me"}}}
    assert webhook.existing_claim_problem("me", "data", mine, [me]) is None


async def test_validate_crew_raises_admission_error() -> None:
    with pytest.raises(kopf.AdmissionError) as err:
        await webhook.validate_crew(spec={"storage": {"accessMode": "ReadWriteMany"}},
                                    name="c", namespace="ns")
    assert err.value.code == 403


async def test_pod_without_claims_needs_no_lookup() -> None:
    body = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"volumes": [
        {"name": "e", "emptyDir": {}}]}}
    # No API is configured in unit tests: a lookup would be refused with AdmissionError 503.
    await webhook.validate_pod(body=body, namespace="ns")


async def test_generated_certificate_serves_tls(tmp_path: Path) -> None:
    files = certs.generate(tmp_path, ["127.0.0.1", "localhost"])
    assert (files.key.stat().st_mode & 0o777) == 0o600
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(files.cert, files.key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    client_ctx = ssl.create_default_context(cafile=str(files.ca))
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                       server_hostname="127.0.0.1")
        assert await reader.read() == b"ok"
        writer.close()
    # A client trusting another CA refuses it.
    other = certs.generate(tmp_path / "other", ["127.0.0.1"])
    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    async with server:
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection(
                "127.0.0.1", port, ssl=ssl.create_default_context(cafile=str(other.ca)),
                server_hostname="127.0.0.1")


def test_server_uses_mounted_certificates(tmp_path: Path) -> None:
    files = certs.generate(tmp_path, ["crewfence-webhook.crewfence-system.svc"])
    cfg = WebhookConfig(mode=WebhookMode.SERVICE, addr="0.0.0.0", cert_dir=str(tmp_path))
    server = webhook.make_server(cfg, webhook.certificate_files(cfg))
    assert server.certfile == str(files.cert) and server.pkeyfile == str(files.key)
    assert server.cadata == files.ca.read_bytes()


async def test_pod_on_state_claim_rejected_via_api(api: Any, crew_ref: Any) -> None:
    from crewfence_operator.crew.resources import state_claim
    from crewfence_operator.crew.spec import parse_spec

    await asyncio.to_thread(kube.create_if_absent,
                            state_claim(crew_ref, parse_spec({"entrypoint": "m:a"}), 0))
    await asyncio.to_thread(kube.create_if_absent, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "plain", "namespace": "team-a"}, "spec": {}})

    def pod(claim: str) -> dict[str, Any]:
        return {"metadata": {"name": "intruder", "namespace": "team-a"},
                "spec": {"volumes": [{"name": "v",
                                      "persistentVolumeClaim": {"claimName": claim}}]}}

    with pytest.raises(kopf.AdmissionError) as err:
        await webhook.validate_pod(body=pod("research-state-0"), namespace="team-a")
    assert err.value.code == 403
    assert '"intruder"' in str(err.value) and '"research-state-0"' in str(err.value)
    await webhook.validate_pod(body=pod("plain"), namespace="team-a")  # not state: admitted
    await webhook.validate_pod(body=pod("missing"), namespace="team-a")  # nothing to protect


async def test_existing_claim_check_reads_other_crews(api: Any) -> None:
    api.resources["crewfence.dev/v1alpha1/crews"].namespaced = True
    api.objects["crewfence.dev/v1alpha1/crews", "team-a", "owner"] = {
        "apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew",
        "metadata": {"name": "owner", "namespace": "team-a"},
        "spec": {"storage": {"existingClaim": "data"}}}
    with pytest.raises(kopf.AdmissionError) as err:
        await webhook.validate_crew(spec={"storage": {"existingClaim": "data"}}, name="second",
                                    namespace="team-a")
    assert 'Crew "owner"' in str(err.value) and '"data"' in str(err.value)
    await webhook.validate_crew(spec={"storage": {"existingClaim": "other"}}, name="second",
                                namespace="team-a")


async def test_lookup_failure_admits(api: Any) -> None:
    """A failed lookup never denies: the pod's claims cannot be tied to a Crew."""
    kube.use_api_server("http://127.0.0.1:9")  # nothing listens: the check cannot be done
    body = {"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}}
    await webhook.validate_pod(body=body, namespace="ns")
    await webhook.validate_crew(spec={"storage": {"existingClaim": "c"}}, name="x",
                                namespace="ns")


async def test_one_failed_lookup_still_denies_a_claim_tied_to_a_crew(
    api: Any, crew_ref: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crewfence_operator.crew.resources import state_claim
    from crewfence_operator.crew.spec import parse_spec

    claim = state_claim(crew_ref, parse_spec({"entrypoint": "m:a"}), 0)

    def get_claim(namespace: str, name: str) -> dict[str, Any] | None:
        if name == "broken":
            raise RuntimeError("throttled")
        return claim if name == "research-state-0" else None

    monkeypatch.setattr(kube, "get_claim", get_claim)
    body = {"metadata": {"name": "intruder", "namespace": "team-a"},
            "spec": {"volumes": [{"name": n, "persistentVolumeClaim": {"claimName": n}}
                                 for n in ("broken", "research-state-0")]}}
    with pytest.raises(kopf.AdmissionError) as err:
        await webhook.validate_pod(body=body, namespace="team-a")
    assert err.value.code == 403 and '"research-state-0"' in str(err.value)


def _served(claim: str, retained: int | None = 3) -> dict[str, Any]:
    """A Crew object as the API server sends it as ``oldObject``: spec and status."""
    entry: dict[str, Any] = {"ordinal": 0, "claim": claim, "journalId": "j0"}
    if retained is not None:
        entry["retainedRuns"] = retained
    spec = {"storage": {"existingClaim": claim}} if claim != "research-state-0" else {}
    return {"spec": spec, "status": {"replicas": [entry]}}


@pytest.mark.parametrize("before, after_spec", [
    ("research-state-0", {"storage": {"existingClaim": "team-state"}}),
    ("team-state", {"storage": {}}),
    ("team-state", {"storage": {"existingClaim": "other-state"}}),
])
def test_moving_replica_zero_off_a_claim_that_served_it_is_warned(
        before: str, after_spec: dict[str, Any]) -> None:
    """The known gap (docs/reliability.md): the old claim keeps its journal unserved, so a
    re-applied CrewJob of an action recorded there would run it again; whoever moves replica 0
    is told so, with the records the status counted and both claim names."""
    warning = webhook.claim_move_warning("research", _served(before), after_spec)
    after = (after_spec["storage"].get("existingClaim") or "research-state-0")
    assert warning is not None
    assert f'"{before}" to "{after}"' in warning and "3 record(s)" in warning
    assert "runs a second time" in warning
    unknown = webhook.claim_move_warning("research", _served(before, retained=None), after_spec)
    assert unknown is not None and "its records" in unknown
    scaled_to_zero = _served(before)
    scaled_to_zero["status"] = {"replicas": [], "retainedClaims": [
        {"ordinal": 0, "claim": before, "retainedRuns": 2, "reason": "Retain"}]}
    retained = webhook.claim_move_warning("research", scaled_to_zero, after_spec)
    assert retained is not None and "2 record(s)" in retained


def test_no_warning_without_a_move_or_a_served_claim() -> None:
    old = _served("team-state")
    assert webhook.claim_move_warning("research", old, old["spec"]) is None
    assert webhook.claim_move_warning("research", None, {"storage": {}}) is None  # a create
    never_served = {**old, "status": {"replicas": [{"ordinal": 0, "claim": "elsewhere"}]}}
    assert webhook.claim_move_warning("research", never_served, {"storage": {}}) is None
    assert webhook.claim_move_warning("research", {**old, "status": {}}, {"storage": {}}) is None


async def test_validate_crew_answers_a_move_with_a_warning_not_a_denial(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "list_crews", lambda namespace: [])
    monkeypatch.setattr(kube, "get_claim", lambda namespace, name: None)
    warnings: list[str] = []
    await webhook.validate_crew(spec={"storage": {"existingClaim": "team-state"}},
                                name="research", namespace="team-a",
                                old=_served("research-state-0"), warnings=warnings)
    assert len(warnings) == 1 and '"research-state-0" to "team-state"' in warnings[0]
