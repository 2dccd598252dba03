"""A task's context names EARLIER tasks, or the operator refuses the spec (no crash loop)."""

from __future__ import annotations

from typing import Any

import pytest
from crewfence_operator.crew.spec import SpecError, misplaced_context, parse_spec

TASKS: list[dict[str, Any]] = [{"name": "one"}, {"name": "two", "context": ["one"]},
                               {"name": "three", "context": ["one", "two"]}]


def test_earlier_tasks_are_fine() -> None:
    assert misplaced_context(TASKS) is None


@pytest.mark.parametrize(("index", "context", "said"), [
    (0, ["two"], "'two', which is a later task"),
    (1, ["nope"], "'nope', which is no task of spec.tasks"),
    (2, ["three"], "'three', which is the task itself"),
])
def test_a_misplaced_context_is_named(index: int, context: list[str], said: str) -> None:
    tasks = [dict(t) for t in TASKS]
    tasks[index]["context"] = context
    message = misplaced_context(tasks)
    assert message is not None and said in message and f"spec.tasks[{index}]" in message
    with pytest.raises(SpecError, match="EARLIER"):
        parse_spec({"agents": {"a": {}}, "tasks": tasks})
