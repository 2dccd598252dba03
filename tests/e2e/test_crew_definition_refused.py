"""A Crew definition the sidecar would refuse is refused by the API server (issue 19), so it
never reaches a pod as a crash loop: two tasks of one name, a blank role/goal/backstory/
description/expected output. What CEL cannot afford (a ``context`` naming a later, unknown or
the same task) the operator refuses before any pod exists: the Crew's status names the field.
The sidecar's own parser (``declarative.py``) refuses each of these too.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from crewjob_support import apply_obj, wait_for
from harness.handles import Cluster, Operator

BASE: dict[str, Any] = {
    "apiVersion": "crewfence.dev/v1alpha1", "kind": "Crew", "metadata": {"name": "defs"},
    "spec": {"replicas": 0,
             "agents": {"a": {"role": "Researcher", "goal": "Research", "backstory": "Keen."}},
             "tasks": [{"name": "one", "agent": "a", "description": "First.",
                        "expected_output": "Text."},
                       {"name": "two", "agent": "a", "description": "Second.",
                        "expected_output": "Text.", "context": ["one"]}]},
}


def _with(path: list[Any], value: Any) -> dict[str, Any]:
    crew = copy.deepcopy(BASE)
    node: Any = crew["spec"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return crew


@pytest.mark.parametrize(("crew", "said"), [
    (_with(["tasks", 1, "name"], "one"), "Duplicate value"),
    (_with(["agents", "a", "role"], "   "), "spec.agents.a.role"),
    (_with(["agents", "a", "goal"], ""), "spec.agents.a.goal"),
    (_with(["agents", "a", "backstory"], "\t"), "spec.agents.a.backstory"),
    (_with(["tasks", 0, "description"], " "), "spec.tasks[0].description"),
    (_with(["tasks", 0, "expected_output"], ""), "spec.tasks[0].expected_output"),
], ids=["duplicate-task", "blank-role", "empty-goal", "blank-backstory", "blank-description",
        "empty-expected-output"])
def test_the_api_server_refuses_what_the_sidecar_would(
        cluster: Cluster, operator_process: Operator, namespace: str, crew: dict[str, Any],
        said: str) -> None:
    result = apply_obj(cluster, crew, namespace)
    assert result.returncode != 0, result.stdout
    assert said in result.stderr, result.stderr
    assert cluster.get_json("crew", "defs", "-n", namespace) is None


def test_a_well_formed_definition_is_accepted(
        cluster: Cluster, operator_process: Operator, namespace: str) -> None:
    result = apply_obj(cluster, BASE, namespace)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("context", "said"), [
    (["two"], "'two', which is a later task"),
    (["nope"], "'nope', which is no task of spec.tasks"),
    (["one"], "'one', which is the task itself"),
])
def test_a_misplaced_context_is_named_in_the_crew_status_and_no_pod_is_made(
        cluster: Cluster, operator_process: Operator, namespace: str, context: list[str],
        said: str) -> None:
    crew = _with(["tasks", 0, "context"], context)
    crew["spec"]["replicas"] = 1
    assert apply_obj(cluster, crew, namespace).returncode == 0

    def refused() -> dict[str, Any] | None:
        obj = cluster.get_json("crew", "defs", "-n", namespace) or {}
        ready = next((c for c in (obj.get("status") or {}).get("conditions") or []
                      if c.get("type") == "Ready"), None)
        return ready if ready and said in (ready.get("message") or "") else None

    ready = wait_for(refused, timeout=60, what="the Crew's Ready condition to name the field")
    assert ready["status"] == "False" and "spec.tasks[0].context" in ready["message"]
    assert not cluster.get_json("pods", "-n", namespace)["items"], "no pod to crash-loop"
