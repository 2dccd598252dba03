"""The kubectl plugin's pure parts: the uncertain list, successor naming and spec, the
evidence text, kubectl's flag conventions, and explain's access to the sidecar (the e2e test
runs it through kubectl)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import pytest
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.kubectl import explain, rerun, sidecar
from crewfence_operator.kubectl.client import Kube
from crewfence_operator.kubectl.main import build_parser
from crewfence_operator.kubectl.uncertain import uncertain_rows
from crewfence_operator.transport import certs, pki
from kubernetes.client.exceptions import ApiException

NOW = datetime(2026, 11, 30, 22, 20, tzinfo=UTC).timestamp()


def job(name: str, status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns",
                         "creationTimestamp": "2026-11-30T20:00:00Z"},
            "spec": {"crewRef": {"name": "research"}, "operation": "run",
                     "input": {"topic": "t"}, **spec},
            "status": status}


def uncertain(since: str, **extra: Any) -> dict[str, Any]:
    return {"phase": "Failed", "reason": "Timeout", "uncertainOutcome": True,
            "assignment": {"ordinal": 1, "pod": "research-1"},
            "conditions": [{"type": "OutcomeUncertain", "status": "True", "reason": "Timeout",
                            "lastTransitionTime": since}], **extra}


def test_uncertain_lists_only_unresolved_uncertain_jobs_oldest_first() -> None:
    items = [
        job("newer", uncertain("2026-11-30T22:00:00Z")),
        job("older", uncertain("2026-11-30T21:00:00Z")),
        job("resolved", uncertain("2026-11-30T20:30:00Z",
                                  resolution={"outcome": "Happened"})),
        job("fine", {"phase": "Succeeded", "uncertainOutcome": False}),
    ]
    rows = uncertain_rows(items, NOW)
    assert [r["name"] for r in rows] == ["older", "newer"]
    assert rows[0]["age"] == "1h" and rows[1]["age"] == "20m"
    assert rows[0]["reason"] == "Timeout" and rows[0]["replica"] == "research-1"


def test_successor_names_are_deterministic() -> None:
    assert rerun.successor_name("report") == "report-rerun"
    assert rerun.successor_name("report-rerun") == "report-rerun-2"
    assert rerun.successor_name("report-rerun-2") == "report-rerun-3"


def test_successor_copies_the_spec_but_not_the_identity() -> None:
    pred = job("report", {}, timeoutMs=5000, actionId="custom", idempotencyKey="k",
               cancel=True, deletionPolicy="Orphan",
               resolution={"outcome": "NotHappened", "note": "n"})
    body = rerun.successor_body(pred, "report-rerun")
    assert body["metadata"]["name"] == "report-rerun"
    assert body["spec"] == {"crewRef": {"name": "research"}, "operation": "run",
                            "input": {"topic": "t"}, "timeoutMs": 5000,
                            "deletionPolicy": "Orphan", "supersedes": "report"}


def test_explain_says_what_is_known_in_words() -> None:
    obj = job("report", uncertain("2026-11-30T21:00:00Z", recovery="Reconcile first.",
                                  cancellation={"requested": True, "dispatched": True}))
    text = explain.explain_text(explain.evidence(
        obj, {"status": "failed", "uncertain_outcome": True, "error": {"code": "timeout"},
              "event_count": 2},
        [{"sequence": 0, "event": "started", "data": {}},
         {"sequence": 1, "event": "failed",
          "data": {"status": "failed", "error": {"code": "timeout"},
                   "uncertain_outcome": True}}], "from x"))
    assert "UNCERTAIN (Timeout)" in text
    assert "replica 1 (pod research-1" in text
    assert "#1 failed (timeout), outcome UNCERTAIN" in text
    assert "never proof that the provider stopped" in text
    assert "Recovery advice: Reconcile first." in text
    assert "kubectl crewfence resolve report" in text


def test_explain_says_where_the_whole_output_is() -> None:
    small = {"value": "out", "sha256": "ab" * 32, "size": 3, "truncated": False}
    text = explain.explain_text(explain.evidence(
        job("r", {"phase": "Succeeded", "output": small}), None, None, "n/a"))
    assert f"Output: 3 bytes, sha256 {'ab' * 32}, whole in status.output.value." in text
    big = {**small, "size": 40000, "truncated": True,
           "configMap": {"name": "r-output", "key": "output", "truncated": False}}
    ev = explain.evidence(job("r", {"phase": "Succeeded", "output": big}), None, None, "n/a")
    assert ev["output"]["in"] == "ConfigMap r-output (key output)"
    assert "whole in ConfigMap r-output (key output)." in explain.explain_text(ev)
    foreign = {**big, "configMap": None, "configMapError": "ConfigMap r-output exists and ..."}
    text = explain.explain_text(explain.evidence(
        job("r", {"phase": "Succeeded", "output": foreign}), None, None, "n/a"))
    assert "only its start is in status.output.value (ConfigMap r-output exists" in text


def test_kubectl_flags_work_before_and_after_the_subcommand() -> None:
    parser = build_parser()
    args = parser.parse_args(["-n", "a", "uncertain"])
    assert args.namespace == "a"
    args = parser.parse_args(["-n", "a", "uncertain", "-n", "b", "-o", "yaml"])
    assert (args.namespace, args.output) == ("b", "yaml")
    args = parser.parse_args(["resolve", "j", "--not-happened", "--note", "x",
                              "--evidence", "l1", "--evidence", "l2", "--context", "c"])
    assert (args.not_happened, args.evidence, args.context) == (True, ["l1", "l2"], "c")


# --- explain's access to the sidecar: the Crew's Secrets read with the user's credentials ----
class _Secret:
    def __init__(self, data: dict[str, str]) -> None:
        self.data = data


class _Core:
    """read_namespaced_secret over a dict; a name mapped to an int answers that status."""

    def __init__(self, secrets: dict[str, dict[str, str] | int]) -> None:
        self.secrets = secrets

    def read_namespaced_secret(self, name: str, namespace: str) -> _Secret:
        found = self.secrets.get(name, 404)
        if isinstance(found, int):
            raise ApiException(status=found, reason="Forbidden" if found == 403 else "Nope")
        return _Secret(found)


CREW_OBJ = {"metadata": {"name": "research", "namespace": "ns"}, "spec": {"replicas": 2},
            "status": {"replicas": [{"ordinal": 0, "address": "10.0.0.5:8090", "ready": True},
                                    {"ordinal": 1, "address": "10.0.0.6:8090", "ready": True}]}}


def _kube(secrets: dict[str, dict[str, str] | int]) -> Kube:
    return Kube(api=None, core=_Core(secrets), namespace="ns")  # type: ignore[arg-type]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_explain_uses_the_crews_ca_and_verifies_the_replica_name() -> None:
    ca = pki.new_crew_ca(CrewRef("research", "ns", ""))
    secret = pki.ca_secret(CrewRef("research", "ns", "uid"), ca)
    access = sidecar.sidecar_access(_kube({"research-crewfence-token": {"token": _b64("new\nold")},
                                      "research-crewfence-ca": secret["data"]}), CREW_OBJ, 1)
    assert access.address == "10.0.0.6:8090"
    assert access.token == "new"  # the first line during a roll, as the operator sends
    assert access.context is not None and access.context.check_hostname
    # trusts the Crew's CA (the context is the operator's own, pki.CrewClientTLS)
    subjects = [dict(rdn[0] for rdn in cert["subject"]).get("commonName")
                for cert in access.context.get_ca_certs()]
    assert ca.cert.subject.rfc4514_string().removeprefix("CN=") in subjects
    assert access.source == "a client certificate of the Crew's CA"
    assert access.server_name == "research-1.research.ns.svc"
    assert "new" not in repr(access) and "PRIVATE" not in repr(access)


def test_explain_uses_the_crews_client_certificate_secret_without_the_ca() -> None:
    ca = certs.new_ca("cm ca")
    client = pki.issue_operator_client(ca)
    secret = {"ca.crt": _b64(ca.cert_pem.decode()), "tls.crt": _b64(client.cert_pem.decode()),
              "tls.key": _b64(client.key_pem.decode())}
    access = sidecar.sidecar_access(_kube({"research-crewfence-token": {"token": _b64("t")},
                                      "research-crewfence-operator-client": secret}),
                               CREW_OBJ, 0)
    assert access.context is not None and access.server_name == "research-0.research.ns.svc"
    assert access.source == "the Crew's client certificate"
    # RBAC scoped to the token and this Secret: the CA Secret's 403 does not stop it
    scoped = sidecar.sidecar_access(_kube({"research-crewfence-token": {"token": _b64("t")},
                                      "research-crewfence-ca": 403,
                                      "research-crewfence-operator-client": secret}),
                               CREW_OBJ, 0)
    assert scoped.source == access.source


def test_explain_without_tls_material_speaks_plain_http() -> None:
    access = sidecar.sidecar_access(_kube({"research-crewfence-token": {"token": _b64("t")}}),
                               CREW_OBJ, 0)
    assert access.context is None and access.server_name is None


def test_explain_says_in_one_line_which_secret_it_may_not_read() -> None:
    for forbidden, holds in (("research-crewfence-ca", "the Crew's CA"),
                             ("research-crewfence-token", "the Crew's bearer token")):
        secrets: dict[str, dict[str, str] | int] = {
            "research-crewfence-token": {"token": _b64("t")},
            "research-crewfence-ca": {"ca.crt": "", "ca.key": ""}}
        secrets[forbidden] = 403
        with pytest.raises(sidecar.EvidenceUnavailable) as info:
            sidecar.sidecar_access(_kube(secrets), CREW_OBJ, 0)
        note = str(info.value)
        assert "\n" not in note and "403" in note and f"ns/{forbidden}" in note
        assert holds in note and "CrewJob's own status" in note


def test_explain_names_the_client_secret_first_when_it_may_read_neither() -> None:
    secrets: dict[str, dict[str, str] | int] = {
        "research-crewfence-token": {"token": _b64("t")},
        "research-crewfence-operator-client": 403, "research-crewfence-ca": 403}
    with pytest.raises(sidecar.EvidenceUnavailable) as info:
        sidecar.sidecar_access(_kube(secrets), CREW_OBJ, 0)
    assert "ns/research-crewfence-operator-client (403" in str(info.value)


class _CronApi:
    """CustomObjectsApi's two calls the trigger makes, in memory."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                     plural: str, name: str) -> Any:
        return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "CrewCronJob",
                "metadata": {"name": name, "namespace": namespace, "uid": "cj-uid"},
                "spec": {"interval": "60s", "jobTemplate": {"spec": {
                    "crewRef": {"name": "research"}, "operation": "run", "input": {}}}}}

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                        plural: str, body: Any) -> Any:
        self.created.append(body)
        return body


def test_the_trigger_verb_creates_one_manual_run(capsys: Any) -> None:
    from crewfence_operator.kubectl import main as plugin_main
    from crewfence_operator.kubectl import trigger as trigger_verb

    assert trigger_verb in plugin_main.VERBS
    args = plugin_main.build_parser().parse_args(["trigger", "nightly", "-n", "ns"])
    api = _CronApi()
    assert trigger_verb.run(args, Kube(api=api, core=None, namespace="ns")) == 0  # type: ignore[arg-type]
    assert len(api.created) == 1
    made = api.created[0]
    assert made["spec"]["actionId"].startswith("ns/nightly/manual-")
    assert "created in ns" in capsys.readouterr().out
