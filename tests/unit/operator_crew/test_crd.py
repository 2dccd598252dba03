"""The Crew CRD: structural, documented everywhere, and declaring every status field we write."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from crewfence_operator import constants as c
from crewfence_operator.crew.status import (
    CrewObservation,
    Health,
    ReplicaObservation,
    ReplicaState,
    RetainedClaim,
    crew_status,
)
from crewfence_sidecar.contract import Operation


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def _walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, child in (node.get("properties") or {}).items():
        found += _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += _walk(node["items"], f"{path}[]")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        found += _walk(extra, f"{path}{{}}")
    return found


def test_identity(crew_crd: dict[str, Any]) -> None:
    spec = crew_crd["spec"]
    assert crew_crd["metadata"]["name"] == f"{c.CREW_PLURAL}.{c.GROUP}"
    assert spec["group"] == c.GROUP and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == c.CREW_KIND
    assert "crw" in spec["names"]["shortNames"]
    assert spec["names"]["categories"] == ["crewfence"]
    (version,) = spec["versions"]
    assert version["name"] == c.VERSION and version["subresources"] == {"status": {}}
    columns = {col["name"] for col in version["additionalPrinterColumns"]}
    assert {"Replicas", "Ready", "Age"} <= columns


def test_every_field_has_a_description(crew_crd: dict[str, Any]) -> None:
    missing = [
        path for path, node in _walk(_schema(crew_crd))
        if path not in ("", ".metadata") and not node.get("x-kubernetes-int-or-string")
        and not node.get("description")
    ]
    assert missing == []


def test_every_node_has_a_type(crew_crd: dict[str, Any]) -> None:
    untyped = [path for path, node in _walk(_schema(crew_crd))
               if "type" not in node and not node.get("x-kubernetes-int-or-string")]
    assert untyped == []


def test_spec_defaults_enums_and_bounds(crew_crd: dict[str, Any]) -> None:
    spec = _schema(crew_crd)["properties"]["spec"]["properties"]
    assert spec["replicas"]["default"] == 1
    assert (spec["replicas"]["minimum"], spec["replicas"]["maximum"]) == (0, 16)
    assert spec["operations"]["default"] == ["run"]
    assert spec["operations"]["items"]["enum"] == [op.value for op in Operation]
    assert spec["process"]["enum"] == ["sequential", "hierarchical"]
    mode = spec["storage"]["properties"]["accessMode"]
    assert mode["default"] == "ReadWriteOncePod"
    rules = [r["rule"] for r in mode["x-kubernetes-validations"]]
    assert "self in ['ReadWriteOncePod', 'ReadWriteOnce']" in rules
    assert spec["llm"]["properties"]["apiKeySecretRef"]["required"] == ["name"]
    journal = spec["journal"]["properties"]
    assert set(journal) == {"maxRetainedRuns", "maxEventsPerRun", "maxEventBytes",
                            "maxStateBytes", "maxConcurrency", "retention",
                            "resumeMaterial", "tombstoneRetention"}
    assert all("minimum" in j and "maximum" in j for k, j in journal.items()
               if k not in ("retention", "resumeMaterial", "tombstoneRetention"))
    assert journal["resumeMaterial"]["type"] == "boolean"
    assert journal["retention"]["pattern"] == "^([0-9]+(d|h|m|s))+$"
    assert journal["tombstoneRetention"]["pattern"] == "^([0-9]+(d|h|m|s))+$"
    assert "never expires" in journal["tombstoneRetention"]["description"]
    when_scaled = spec["storage"]["properties"]["whenScaled"]
    assert (when_scaled["default"], when_scaled["enum"]) == ("Retain", ["Retain", "Delete"])
    state = _schema(crew_crd)["properties"]["status"]["properties"]["replicas"]["items"][
        "properties"]["state"]
    assert state["enum"] == [s.value for s in ReplicaState]


@pytest.mark.parametrize("field, bound", [
    ("memoryMiB", "worker_memory_mb"), ("cpuSeconds", "worker_cpu_seconds"),
    ("maxJobs", "worker_max_jobs"), ("nice", "worker_nice"), ("spares", "worker_spares"),
    ("maxRssMiB", "worker_max_rss_mb")])
def test_worker_limits_admit_only_what_the_sidecar_accepts(
        crew_crd: dict[str, Any], field: str, bound: str) -> None:
    """A value the API server admits reaches the sidecar as CREWFENCE_WORKER_*; outside the
    sidecar's range the sidecar would refuse to start and the replica would crash-loop."""
    from crewfence_sidecar.config import BOUNDS

    limits = _schema(crew_crd)["properties"]["spec"]["properties"]["workerLimits"]["properties"]
    b = BOUNDS[bound]
    assert b.minimum <= limits[field]["minimum"] <= limits[field]["maximum"] <= b.maximum


def _nullable_to_jsonschema(node: Any) -> Any:
    """OpenAPI 3.0 ``nullable`` -> JSON Schema type lists, so jsonschema can check status."""
    if isinstance(node, list):
        return [_nullable_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable_to_jsonschema(v) for k, v in node.items()
           if not k.startswith("x-kubernetes") and k != "nullable"}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if node.get("type") == "object" and "properties" in node:
        out["additionalProperties"] = False  # anything undeclared would be pruned
    return out


@pytest.mark.parametrize("fenced", [False, True])
def test_status_we_write_is_declared(crew_crd: dict[str, Any], fenced: bool) -> None:
    status_schema = _nullable_to_jsonschema(_schema(crew_crd)["properties"]["status"])
    obs = CrewObservation(
        generation=3, desired_replicas=2,
        replicas=[
            ReplicaObservation(
                ordinal=0, pod_name="r-0", claim="r-state-0",
                pod={"metadata": {"name": "r-0"},
                     "status": {"podIP": "10.0.0.1",
                                "conditions": [{"type": "Ready", "status": "True"}]}},
                health=Health(status="ready", journal_id="j0", retained_runs=3, active_runs=1),
                fence_reason="shared" if fenced else None),
            ReplicaObservation(ordinal=1, pod_name="r-1", claim="r-state-1", pod=None,
                               health=None),
            ReplicaObservation(ordinal=2, pod_name="r-2", claim="r-state-2", pod=None,
                               health=None, message="scaling down",
                               state=ReplicaState.DRAINING),
            ReplicaObservation(ordinal=3, pod_name="r-3", claim="r-state-3", pod=None,
                               health=Health(status="ready", journal_id="j3", retained_runs=1,
                                             active_runs=0, draining=True,
                                             unarchived_records=1),
                               state=ReplicaState.RETAINED),
        ],
        retained_claims=[RetainedClaim(ordinal=3, claim="r-state-3", retained_runs=None,
                                       reason="unknown")],
        previous_conditions=[],
    )
    status = crew_status(obs, now="2026-01-01T00:00:00Z")
    jsonschema.validate(status, status_schema)
    assert status["readyReplicas"] == (0 if fenced else 1)
