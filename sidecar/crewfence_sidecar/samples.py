"""Sample crews on the offline LLM, for demos and tests.

Use as ``CREWFENCE_REGISTRY=crewfence_sidecar.samples:SAMPLE_CREWS``:

- ``research``: researcher + writer, two sequential tasks (inputs: ``topic``);
- ``single``: one agent, one task (inputs: ``topic``);
- ``knowledge``: one task plus two text knowledge sources (for ``knowledge_query``).

Put ``[[sleep:N]]`` or ``[[fail]]`` into ``topic`` to rehearse a slow or failing model.
"""

from __future__ import annotations

from collections.abc import Callable

from crewai import Agent, Crew, Process, Task

from crewfence_sidecar.declarative import parse_crew
from crewfence_sidecar.offline_llm import OfflineLLM


def research_crew() -> Crew:
    researcher = Agent(role="Researcher", goal="Research {topic}",
                       backstory="A careful analyst who cites sources.", llm=OfflineLLM(),
                       max_retry_limit=0)
    writer = Agent(role="Writer", goal="Write about {topic}",
                   backstory="A concise technical writer.", llm=OfflineLLM(), max_retry_limit=0)
    research = Task(name="research", description="Research {topic}",
                    expected_output="Three key facts", agent=researcher)
    write = Task(name="write", description="Write a short summary about {topic}",
                 expected_output="One paragraph", agent=writer, context=[research])
    return Crew(name="research", agents=[researcher, writer], tasks=[research, write],
                process=Process.sequential)


def single_crew() -> Crew:
    agent = Agent(role="Analyst", goal="Answer about {topic}", backstory="Brief and exact.",
                  llm=OfflineLLM(), max_retry_limit=0)
    task = Task(name="answer", description="Answer a question about {topic}",
                expected_output="One sentence", agent=agent)
    return Crew(name="single", agents=[agent], tasks=[task])


_KNOWLEDGE = parse_crew("knowledge", {
    "agents": {"librarian": {"role": "Librarian", "goal": "Answer from the shelf about {topic}",
                             "backstory": "Knows the catalogue.", "max_retry_limit": 0}},
    "tasks": [{"name": "lookup", "agent": "librarian", "description": "Look up {topic}",
               "expected_output": "A short answer"}],
    "knowledge": [
        {"name": "bees", "content": "Honey bees live in hives and turn nectar into honey."},
        {"name": "pods", "content": "Kubernetes schedules pods onto nodes of a cluster."},
    ],
})

SAMPLE_CREWS: dict[str, Callable[[], Crew]] = {
    "research": research_crew,
    "single": single_crew,
    "knowledge": _KNOWLEDGE.build,
}
