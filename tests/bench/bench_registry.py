"""A registry crew for the run benchmarks: the crew of ``bench_sidecar.CREWS`` shipped as a
``module:attribute`` factory (``CREWFENCE_REGISTRY=bench_registry:REGISTRY``), which is how
every custom image (a Crew's ``entrypoint``) hands its crews to the sidecar.

The factory is user code as a new user would write it: it builds agent, task and crew on
every call; a waiting worker calls it ahead of the next job, as it does for every registry
factory that does not opt out (the crew serves within 30 s of its build).
"""

from __future__ import annotations

from crewai import Agent, Crew, Task
from crewfence_sidecar.offline_llm import OfflineLLM

CREW_ID = "research-registry"


def research() -> Crew:
    researcher = Agent(role="Researcher", goal="Research {topic}", backstory="Curious.",
                       llm=OfflineLLM())
    task = Task(name="research", agent=researcher, description="Research {topic}",
                expected_output="A summary")
    return Crew(agents=[researcher], tasks=[task])


REGISTRY = {CREW_ID: research}
