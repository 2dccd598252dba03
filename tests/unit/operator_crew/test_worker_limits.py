"""``spec.workerLimits`` reaches each replica's sidecar as CREWFENCE_WORKER_* variables."""

from __future__ import annotations

from typing import Any

from crewfence_operator.crew.identity import CrewRef
from crewfence_operator.crew.pod import PodSettings, replica_pod
from crewfence_operator.crew.spec import parse_spec


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom"))
            for e in pod["spec"]["containers"][0]["env"]}


def test_worker_limits_become_sidecar_settings() -> None:
    ref = CrewRef(namespace="team-a", name="research", uid="u-1")
    limited = parse_spec({"entrypoint": "m:a",
                          "workerLimits": {"memoryMiB": 2048, "cpuSeconds": 600,
                                           "maxJobs": 1, "nice": 0, "spares": 0,
                                           "maxRssMiB": 512}})
    env = _env(replica_pod(ref, limited, 0, PodSettings()))
    assert env["CREWFENCE_WORKER_MEMORY_MB"] == "2048"
    assert env["CREWFENCE_WORKER_CPU_SECONDS"] == "600"
    assert env["CREWFENCE_WORKER_MAX_JOBS"] == "1"
    assert env["CREWFENCE_WORKER_NICE"] == "0", "0 is a setting, not an absent one"
    assert env["CREWFENCE_WORKER_SPARES"] == "0", "0 is a setting, not an absent one"
    assert env["CREWFENCE_WORKER_MAX_RSS_MB"] == "512"
    plain = _env(replica_pod(ref, parse_spec({"entrypoint": "m:a"}), 0, PodSettings()))
    assert "CREWFENCE_WORKER_MEMORY_MB" not in plain
    assert "CREWFENCE_WORKER_CPU_SECONDS" not in plain
    assert "CREWFENCE_WORKER_MAX_JOBS" not in plain
    assert "CREWFENCE_WORKER_NICE" not in plain
    assert "CREWFENCE_WORKER_SPARES" not in plain
    assert "CREWFENCE_WORKER_MAX_RSS_MB" not in plain


def test_resume_material_is_the_crews_opt_in() -> None:
    ref = CrewRef(namespace="team-a", name="research", uid="u-1")
    opted = parse_spec({"entrypoint": "m:a", "journal": {"resumeMaterial": True}})
    assert _env(replica_pod(ref, opted, 0, PodSettings()))["CREWFENCE_RESUME_MATERIAL"] == "1"
    off = parse_spec({"entrypoint": "m:a", "journal": {"resumeMaterial": False}})
    assert "CREWFENCE_RESUME_MATERIAL" not in _env(replica_pod(ref, off, 0, PodSettings()))
