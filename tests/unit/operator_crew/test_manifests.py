"""Pure manifest builders: pod, claim, service, secret, crews file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from crewfence_operator import constants as c
from crewfence_operator.crew import children
from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.pod import PodSettings, pod_claims, replica_pod
from crewfence_operator.crew.resources import (
    LLM_API_KEY_ENV,
    crews_configmap,
    headless_service,
    render_crews_file,
    state_claim,
    token_secret,
)
from crewfence_operator.crew.spec import JournalBounds, SpecError, parse_spec
from crewfence_operator.crew.template import pod_template_hash
from crewfence_operator.transport.token_roll import new_token


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom"))
            for e in pod["spec"]["containers"][0]["env"]}


def _assert_owned(obj: dict[str, Any], crew: CrewRef) -> None:
    meta = obj["metadata"]
    assert meta["namespace"] == crew.namespace
    assert meta["labels"][c.LABEL_MANAGED_BY] == "crewfence"
    assert meta["labels"][c.LABEL_CREW] == crew.name
    (ref,) = meta["ownerReferences"]
    assert ref == {"apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew", "name": crew.name,
                   "uid": crew.uid, "controller": True, "blockOwnerDeletion": True}


def test_pod_shape(crew_ref: CrewRef, example_crew: dict[str, Any]) -> None:
    spec = parse_spec(example_crew["spec"])
    pod = replica_pod(crew_ref, spec, 1, PodSettings(default_image="img:1"))
    _assert_owned(pod, crew_ref)
    assert pod["metadata"]["name"] == "research-1"
    assert pod["metadata"]["labels"][c.LABEL_REPLICA] == "1"
    assert pod_claims(pod) == ["research-state-1"]
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["crewfence-sidecar"]
    assert container["image"] == "img:1"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["ports"][0]["containerPort"] == 8090
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    psc = pod["spec"]["securityContext"]
    assert psc["fsGroup"] == c.FS_GROUP and psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert psc["fsGroupChangePolicy"] == "OnRootMismatch"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert container["resources"]["limits"] == {"memory": "1Gi"}


def test_pod_env(crew_ref: CrewRef, example_crew: dict[str, Any]) -> None:
    spec = parse_spec(example_crew["spec"])
    env = _env(replica_pod(crew_ref, spec, 0, PodSettings()))
    assert env["CREWFENCE_HOST"] == {"fieldRef": {"apiVersion": "v1",
                                                  "fieldPath": "status.podIP"}}
    assert env["CREWFENCE_POD_UID"] == {"fieldRef": {"apiVersion": "v1",
                                                     "fieldPath": "metadata.uid"}}
    assert env["CREWFENCE_PORT"] == "8090"
    assert env["CREWFENCE_STATE_FILE"].startswith(c.STATE_MOUNT + "/")
    assert env["CREWFENCE_TOKEN"] == {"secretKeyRef": {"name": "research-crewfence-token",
                                                       "key": "token"}}
    assert env["CREWFENCE_CREWS_FILE"] == c.CREWS_FILE
    assert env["CREWFENCE_ALLOWED_OPERATIONS"].split(",") == list(spec.operations)
    assert env["CREWFENCE_TRAINING_DIR"] == c.TRAINING_DIR
    assert env["CREWFENCE_MAX_RETAINED_RUNS"] == "1000"
    assert env["CREWFENCE_MAX_CONCURRENCY"] == "8"
    assert "CREWFENCE_MAX_EVENT_BYTES" not in env  # unset bounds keep the sidecar's defaults
    assert env["CREWAI_DISABLE_TELEMETRY"] == "true"
    assert env["CREWAI_TRACING_ENABLED"] == "false"
    assert env["OTEL_SDK_DISABLED"] == "true"
    mounts = {m["mountPath"]: m for m in
              replica_pod(crew_ref, spec, 0, PodSettings())["spec"]["containers"][0]
              ["volumeMounts"]}
    scratch = {m["mountPath"] for m in mounts.values() if m["name"] == "scratch"}
    assert env["HOME"] in scratch
    assert env["CREWAI_STORAGE_DIR"].startswith(c.SCRATCH_MOUNT)


def test_tombstone_retention_reaches_the_sidecar_only_when_set(crew_ref: CrewRef) -> None:
    """Default: no CREWFENCE_TOMBSTONE_RETENTION_SECONDS, so tombstones never expire."""
    base = {"entrypoint": "m:a"}
    assert "CREWFENCE_TOMBSTONE_RETENTION_SECONDS" not in _env(
        replica_pod(crew_ref, parse_spec(base), 0, PodSettings()))
    spec = parse_spec({**base, "journal": {"tombstoneRetention": "365d"}})
    env = _env(replica_pod(crew_ref, spec, 0, PodSettings()))
    assert env["CREWFENCE_TOMBSTONE_RETENTION_SECONDS"] == str(365 * 86400)


@pytest.mark.parametrize("window", ["0s", "36601d"])
def test_a_tombstone_retention_the_sidecar_would_refuse_is_named(window: str) -> None:
    """Out of the sidecar's CREWFENCE_TOMBSTONE_RETENTION_SECONDS range (1 s .. 36600 days),
    refused here, so the Crew's status names the field instead of the pods crash-looping."""
    from crewfence_sidecar.config import BOUNDS

    with pytest.raises(SpecError, match=r"journal\.tombstoneRetention"):
        parse_spec({"entrypoint": "m:a", "journal": {"tombstoneRetention": window}})
    top = BOUNDS["tombstone_retention_seconds"].maximum
    assert top == 36600 * 86400
    spec = parse_spec({"entrypoint": "m:a", "journal": {"tombstoneRetention": f"{top}s"}})
    assert spec.journal.tombstone_retention_seconds == top


def test_operator_wide_journal_defaults(crew_ref: CrewRef, example_crew: dict[str, Any]) -> None:
    defaults = JournalBounds(max_retained_runs=50, max_event_bytes=4096)
    minimal = parse_spec({"entrypoint": "m:a"})
    env = _env(replica_pod(crew_ref, minimal, 0, PodSettings(journal_defaults=defaults)))
    assert env["CREWFENCE_MAX_RETAINED_RUNS"] == "50"
    assert env["CREWFENCE_MAX_EVENT_BYTES"] == "4096"
    assert "CREWFENCE_MAX_CONCURRENCY" not in env
    # The Crew's own bounds win over the operator's defaults.
    own = _env(replica_pod(crew_ref, parse_spec(example_crew["spec"]), 0,
                           PodSettings(journal_defaults=defaults)))
    assert own["CREWFENCE_MAX_RETAINED_RUNS"] == "1000"
    assert own["CREWFENCE_MAX_EVENT_BYTES"] == "4096"


def test_minimal_spec_defaults(crew_ref: CrewRef) -> None:
    spec = parse_spec({"agents": {"a": {"role": "r", "goal": "g", "backstory": "b"}},
                       "tasks": [{"name": "t", "agent": "a", "description": "d",
                                  "expected_output": "o"}]})
    assert spec.replicas == 1 and spec.operations == ("run",)
    assert spec.storage.access_mode == "ReadWriteOncePod"
    env = _env(replica_pod(crew_ref, spec, 0, PodSettings()))
    assert env["CREWFENCE_ALLOWED_OPERATIONS"] == "run"
    assert "CREWFENCE_TRAINING_DIR" not in env
    assert "CREWFENCE_REGISTRY" not in env


def test_entrypoint_and_api_key(crew_ref: CrewRef) -> None:
    spec = parse_spec({"entrypoint": "mycrews.registry:CREWS", "image": "me/crews:2",
                       "llm": {"model": "openai/gpt-4o-mini",
                               "apiKeySecretRef": {"name": "llm", "key": "k"}}})
    pod = replica_pod(crew_ref, spec, 0, PodSettings(default_image="default:1"))
    env = _env(pod)
    assert env["CREWFENCE_REGISTRY"] == "mycrews.registry:CREWS"
    assert "CREWFENCE_CREWS_FILE" not in env
    assert env[LLM_API_KEY_ENV] == {"secretKeyRef": {"name": "llm", "key": "k"}}
    assert pod["spec"]["containers"][0]["image"] == "me/crews:2"


@pytest.mark.parametrize("mode", ["ReadWriteMany", "ReadOnlyMany"])
def test_shared_modes_refused(mode: str) -> None:
    with pytest.raises(SpecError, match="ReadWriteOncePod"):
        parse_spec({"entrypoint": "m:a", "storage": {"accessMode": mode}})


def test_unknown_operation_refused() -> None:
    with pytest.raises(SpecError, match="unknown operations"):
        parse_spec({"entrypoint": "m:a", "operations": ["run", "launch_missiles"]})


def test_claim_per_ordinal(crew_ref: CrewRef) -> None:
    spec = parse_spec({"entrypoint": "m:a", "replicas": 3,
                       "storage": {"size": "2Gi", "storageClassName": "fast",
                                   "accessMode": "ReadWriteOnce"}})
    claims = [state_claim(crew_ref, spec, o) for o in range(3)]
    assert [cl["metadata"]["name"] for cl in claims] == [
        "research-state-0", "research-state-1", "research-state-2"]
    for ordinal, claim in enumerate(claims):
        _assert_owned(claim, crew_ref)
        assert claim["metadata"]["labels"][c.LABEL_ROLE] == "state"
        assert claim["metadata"]["labels"][c.LABEL_REPLICA] == str(ordinal)
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
        assert claim["spec"]["storageClassName"] == "fast"


def test_existing_claim_for_replica_zero(crew_ref: CrewRef) -> None:
    spec = parse_spec({"entrypoint": "m:a", "storage": {"existingClaim": "mine"}})
    assert pod_claims(replica_pod(crew_ref, spec, 0, PodSettings())) == ["mine"]
    with pytest.raises(SpecError, match="one replica"):
        parse_spec({"entrypoint": "m:a", "replicas": 2, "storage": {"existingClaim": "x"}})


def test_service_secret_configmap(crew_ref: CrewRef, example_crew: dict[str, Any]) -> None:
    svc = headless_service(crew_ref)
    _assert_owned(svc, crew_ref)
    assert svc["metadata"]["name"] == "research"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"][c.LABEL_CREW] == "research"
    token = new_token()
    assert len(token) >= 40 and new_token() != token
    secret = token_secret(crew_ref, token)
    _assert_owned(secret, crew_ref)
    assert secret["metadata"]["name"] == "research-crewfence-token"
    assert secret["stringData"] == {"token": token}
    cm = crews_configmap(crew_ref, parse_spec(example_crew["spec"]))
    _assert_owned(cm, crew_ref)
    assert token not in yaml.safe_dump(cm)


def test_crews_file_is_what_the_sidecar_loads(
    crew_ref: CrewRef, example_crew: dict[str, Any], tmp_path: Path
) -> None:
    # The handoff with the sidecar: its own loader (crewai-free parsing) accepts our rendering.
    from crewfence_sidecar.declarative import load_crews_file

    path = tmp_path / "crews.yaml"
    path.write_text(render_crews_file(crew_ref, parse_spec(example_crew["spec"])))
    crews = load_crews_file(path)
    assert list(crews) == ["research"]
    definition = crews["research"]
    assert [t.name for t in definition.tasks] == ["research", "summary"]
    assert len(definition.knowledge) == 2


def test_template_hash_follows_spec(crew_ref: CrewRef, example_crew: dict[str, Any]) -> None:
    spec = parse_spec(example_crew["spec"])
    settings = PodSettings()
    first = children.desired_pod(crew_ref, spec, 0, settings)
    again = children.desired_pod(crew_ref, spec, 0, settings)
    assert pod_template_hash(first) == pod_template_hash(again)
    changed_ops = parse_spec({**example_crew["spec"], "operations": ["run"]})
    assert pod_template_hash(children.desired_pod(crew_ref, changed_ops, 0, settings)) != \
        pod_template_hash(first)
    changed_task = dict(example_crew["spec"])
    changed_task["tasks"] = [dict(example_crew["spec"]["tasks"][0], description="other")]
    assert pod_template_hash(children.desired_pod(
        crew_ref, parse_spec(changed_task), 0, settings)) != pod_template_hash(first)
