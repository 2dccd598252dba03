"""Resume applied to a crewai crew: the predecessor's completed tasks are not run again.

crewai's checkpoint support does the skipping: with ``checkpoint_kickoff_event_id`` set,
``Crew._execute_tasks`` starts at the first task whose ``output`` is None and hands the
earlier tasks' outputs on as context, exactly as after a checkpoint restore. The journal is
the source of truth: the outputs given to crewai are the journaled ones.

Invariant: only a sequential crew with no async task, with as many tasks as the
predecessor journaled, gets its prefix reused; anything else runs every task (a mismatch
never reuses an output for a task it did not come from).
"""

from __future__ import annotations

from typing import Any

from crewfence_sidecar.resume import ResumePlan
from crewfence_sidecar.tools.ledger import JobLedger


def reusable_prefix(crew: Any, plan: ResumePlan) -> int:
    """How many leading tasks of ``crew`` take their output from ``plan`` (0: none)."""
    from crewai.process import Process

    tasks = list(crew.tasks)
    if (not plan.task_outputs or crew.process != Process.sequential
            or (plan.tasks_total and plan.tasks_total != len(tasks))
            or any(getattr(t, "async_execution", False) for t in tasks)):
        return 0
    return min(len(plan.task_outputs), len(tasks))


def reuse_completed_tasks(crew: Any, plan: ResumePlan, job_ledger: JobLedger | None) -> int:
    """Give the first :func:`reusable_prefix` tasks their journaled outputs; journal each as
    ``task_reused``; return how many."""
    from crewai.tasks.output_format import OutputFormat
    from crewai.tasks.task_output import TaskOutput

    count = reusable_prefix(crew, plan)
    if count == 0:
        return 0
    total = len(crew.tasks)
    for index in range(count):
        task = crew.tasks[index]
        agent = getattr(task, "agent", None)
        task.output = TaskOutput(description=task.description, name=task.name,
                                 expected_output=task.expected_output,
                                 agent=str(getattr(agent, "role", "") or ""),
                                 raw=plan.task_outputs[index],
                                 output_format=OutputFormat.RAW)
        if job_ledger is not None:
            job_ledger.task_reused(index, total, str(task.name or f"task-{index}"),
                                   plan.task_outputs[index])
    crew.checkpoint_kickoff_event_id = f"crewfence-resume:{plan.predecessor}"
    return count
