"""A Crew whose hosted model has no API key says so in its status (``ModelCredentials``),
on the real control plane with real sidecars. No CrewJob: no hosted model is ever called."""

from __future__ import annotations

from typing import Any

from harness.handles import Cluster, Operator, wait_until

MODEL = "openai/gpt-4o-mini"


AGENTS = {"writer": {"role": "Writer", "goal": "Write about {topic}", "backstory": "Terse."}}
TASKS = [{"name": "write", "agent": "writer", "description": "Write about {topic}",
          "expected_output": "A paragraph"}]


def _manifest(name: str, llm: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {"apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "llm": llm, "agents": AGENTS, "tasks": TASKS}}


def _condition(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    status = (cluster.get_json("crew", name, "-n", ns) or {}).get("status") or {}
    return next((c for c in status.get("conditions") or () if c["type"] == "ModelCredentials"),
                None)


def test_hosted_model_without_key_gets_the_condition(
    cluster: Cluster, operator_process: Operator, namespace: str,
) -> None:
    # One Crew names no Secret at all (known from the spec); the other names a Secret whose
    # key is empty, which only its replica's /health can tell.
    cluster.apply({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "llm-key", "namespace": namespace},
                   "stringData": {"api-key": ""}})
    cluster.apply(_manifest("nokey", {"model": MODEL}, namespace))
    cluster.apply(_manifest("emptykey", {"model": MODEL, "apiKeySecretRef": {
        "name": "llm-key", "key": "api-key"}}, namespace))

    def missing(name: str) -> dict[str, Any] | None:
        cond = _condition(cluster, namespace, name)
        return cond if cond and cond["status"] == "False" else None

    nokey = wait_until(lambda: missing("nokey"), timeout=120, interval=0.5,
                       what="ModelCredentials=False on nokey")
    assert nokey["reason"] == "MissingModelCredentials"
    assert MODEL in nokey["message"] and "apiKeySecretRef" in nokey["message"]

    emptykey = wait_until(lambda: missing("emptykey"), timeout=180, interval=0.5,
                          what="ModelCredentials=False on emptykey (from the replica's health)")
    assert emptykey["reason"] == "MissingModelCredentials"
    assert MODEL in emptykey["message"] and "replica(s) 0" in emptykey["message"]
    # The replica that reported it is up: the condition came from its /health.
    status = cluster.get_json("crew", "emptykey", "-n", namespace)["status"]
    assert [r["journalId"] for r in status["replicas"] if r.get("journalId")]
