"""Declarative crews: the YAML the ``Crew`` resource carries, turned into fresh ``crewai.Crew``s.

A crews file (``CREWFENCE_CREWS_FILE``) has exactly this shape::

    crews:                          # mapping crew_id -> crew definition (may be empty)
      research:                     # crew_id: 1..256 characters
        llm:                        # optional; default {model: crewfence/offline}
          model: crewfence/offline  # or e.g. openai/gpt-4o-mini
          api_key_env: LLM_KEY      # optional: env var holding the API key (apiKeyEnv too)
          api_key_file: /path       # optional, exclusive with api_key_env: owner-only file
                                    # holding the API key, re-read for every job (apiKeyFile)
          base_url: https://...     # optional (baseUrl too)
          temperature: 0.2          # optional
        process: sequential         # sequential (default) | hierarchical
        agents:                     # mapping agent name -> agent, at least one
          researcher:
            role: Researcher        # required
            goal: Research {topic}  # required
            backstory: "..."        # required
            allow_delegation: false # optional (allowDelegation), default false
            max_iter: 5             # optional (maxIter)
            max_retry_limit: 0      # optional (maxRetryLimit)
            verbose: false          # optional
            tools: [tickets/create_ticket, lookup]   # optional, names from `tools` below
        tools:                      # optional, see crewfence_sidecar.tools.definitions
          mcpServers: [{name: tickets, url: "http://tickets:8080/mcp"}]
          python: [{name: lookup, ref: "my_tools:lookup"}]
        tasks:                      # list, at least one, names unique
          - name: research          # required
            agent: researcher       # required for sequential, optional for hierarchical
            description: Research {topic}
            expected_output: A summary   # (expectedOutput too)
            context: [other-task]   # optional: names of EARLIER tasks
        knowledge:                  # optional text knowledge sources
          - {name: bees, content: "Honey bees live in hives."}   # `text` = `content`
        embedder: {model: crewfence/offline}  # optional; default when knowledge is given

Camel-case spellings are accepted because the ``Crew`` resource uses them. Anything else is
refused with a :class:`DefinitionError` naming the crew and the field.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from crewai import Agent, Crew, Process, Task
from crewai.knowledge.knowledge import Knowledge
from crewai.knowledge.source.string_knowledge_source import StringKnowledgeSource

from crewfence_sidecar.knowledge_storage import threaded_storage
from crewfence_sidecar.offline_embedder import EMBEDDER_NAME, resolve_embedder
from crewfence_sidecar.offline_llm import MODEL_NAME, resolve_llm
from crewfence_sidecar.tools.definitions import (
    ToolsDefinition,
    parse_agent_tools,
    parse_tools,
)

MAX_CREW_ID_CHARS = 256
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CAMEL = {
    "apiKeyEnv": "api_key_env",
    "apiKeyFile": "api_key_file",
    "baseUrl": "base_url",
    "allowDelegation": "allow_delegation",
    "maxIter": "max_iter",
    "maxRetryLimit": "max_retry_limit",
    "expectedOutput": "expected_output",
}
NO_TOOLS = ToolsDefinition()
_CREW_KEYS = {"llm", "process", "agents", "tasks", "knowledge", "embedder", "tools"}
_LLM_KEYS = {"model", "api_key_env", "api_key_file", "base_url", "temperature"}
_AGENT_KEYS = {"role", "goal", "backstory", "allow_delegation", "max_iter", "max_retry_limit",
               "verbose", "tools"}
_TASK_KEYS = {"name", "agent", "description", "expected_output", "context"}
_KNOWLEDGE_KEYS = {"name", "content", "text"}


class DefinitionError(ValueError):
    """A crews file or crew definition that cannot be built; the message names the field."""


def _where(crew_id: str, path: str) -> str:
    return f"crew {crew_id!r}: {path}"


def _mapping(crew_id: str, path: str, value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise DefinitionError(f"{_where(crew_id, path)} must be a mapping")
    normalised: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise DefinitionError(f"{_where(crew_id, path)} has a non-string key {key!r}")
        name = _CAMEL.get(key, key)
        if name in normalised:
            raise DefinitionError(f"{_where(crew_id, path)} sets {name} twice")
        normalised[name] = item
    return normalised


def _only(crew_id: str, path: str, value: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise DefinitionError(
            f"{_where(crew_id, path)}: unknown field(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


def _text(crew_id: str, path: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DefinitionError(f"{_where(crew_id, path)} must be a non-empty string")
    return value


def _optional(crew_id: str, path: str, value: object, kind: type, default: Any) -> Any:
    if value is None:
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise DefinitionError(f"{_where(crew_id, path)} must be a non-negative integer")
    if kind is bool and not isinstance(value, bool):
        raise DefinitionError(f"{_where(crew_id, path)} must be true or false")
    if kind is float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise DefinitionError(f"{_where(crew_id, path)} must be a number")
    return value


@dataclass(frozen=True)
class LLMDefinition:
    model: str = MODEL_NAME
    api_key_env: str | None = None
    base_url: str | None = None
    temperature: float | None = None
    api_key_file: str | None = None

    def build(self) -> Any:
        params: dict[str, Any] = {}
        if self.api_key_file is not None:
            params["api_key_file"] = self.api_key_file
        if self.base_url is not None:
            params["base_url"] = self.base_url
        if self.temperature is not None:
            params["temperature"] = self.temperature
        return resolve_llm(self.model, self.api_key_env, **params)


@dataclass(frozen=True)
class AgentDefinition:
    name: str
    role: str
    goal: str
    backstory: str
    allow_delegation: bool = False
    max_iter: int | None = None
    max_retry_limit: int | None = None
    verbose: bool = False
    tools: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskDefinition:
    name: str
    agent: str | None
    description: str
    expected_output: str
    context: tuple[str, ...] = ()


@dataclass(frozen=True)
class KnowledgeDefinition:
    name: str
    content: str


@dataclass(frozen=True)
class CrewDefinition:
    crew_id: str
    llm: LLMDefinition
    process: Process
    agents: tuple[AgentDefinition, ...]
    tasks: tuple[TaskDefinition, ...]
    knowledge: tuple[KnowledgeDefinition, ...] = ()
    embedder: str | None = None
    tools: ToolsDefinition = NO_TOOLS

    def knowledge_collection(self) -> str:
        """A collection per crew and knowledge content (crewai's default is one shared name)."""
        parts = [self.crew_id, self.embedder or "", *(k.content for k in self.knowledge)]
        material = "\0".join(parts)
        return "crewfence-" + hashlib.sha256(material.encode("utf-8")).hexdigest()[:24]

    def build(self) -> Crew:
        """A fresh crew: new LLM, agents, tasks and knowledge objects on every call."""
        agents: dict[str, Agent] = {}
        tool_builder = self.tools.builder()
        for spec in self.agents:
            extra: dict[str, Any] = {}
            if spec.tools:
                extra["tools"] = tool_builder.for_agent(spec.tools)
            if spec.max_iter is not None:
                extra["max_iter"] = spec.max_iter
            if spec.max_retry_limit is not None:
                extra["max_retry_limit"] = spec.max_retry_limit
            agents[spec.name] = Agent(
                role=spec.role, goal=spec.goal, backstory=spec.backstory,
                allow_delegation=spec.allow_delegation, verbose=spec.verbose,
                llm=self.llm.build(), **extra,
            )
        tasks: dict[str, Task] = {}
        for task_spec in self.tasks:
            tasks[task_spec.name] = Task(
                name=task_spec.name,
                description=task_spec.description,
                expected_output=task_spec.expected_output,
                agent=agents[task_spec.agent] if task_spec.agent else None,
                context=[tasks[name] for name in task_spec.context] or None,
            )
        extra_crew: dict[str, Any] = {}
        if self.process is Process.hierarchical:
            extra_crew["manager_llm"] = self.llm.build()
        if self.knowledge and self.embedder:
            embedder = resolve_embedder(self.embedder)
            collection = self.knowledge_collection()
            knowledge = Knowledge(
                collection_name=collection,
                sources=[StringKnowledgeSource(content=k.content) for k in self.knowledge],
                embedder=embedder,
                # crewai's own storage cannot search from akickoff (see knowledge_storage)
                storage=threaded_storage(embedder, collection),
            )
            knowledge.add_sources()
            extra_crew["knowledge"] = knowledge
            extra_crew["embedder"] = embedder
        return Crew(
            name=self.crew_id,
            agents=list(agents.values()),
            tasks=list(tasks.values()),
            process=self.process,
            verbose=False,
            **extra_crew,
        )


def _parse_llm(crew_id: str, raw: object) -> LLMDefinition:
    if raw is None:
        return LLMDefinition()
    llm = _mapping(crew_id, "llm", raw)
    _only(crew_id, "llm", llm, _LLM_KEYS)
    model = _text(crew_id, "llm.model", llm.get("model"))
    env = llm.get("api_key_env")
    if env is not None and (not isinstance(env, str) or not _ENV_NAME_RE.fullmatch(env)):
        raise DefinitionError(f"{_where(crew_id, 'llm.api_key_env')} must be an env var name")
    key_file = llm.get("api_key_file")
    if key_file is not None:
        key_file = _text(crew_id, "llm.api_key_file", key_file)
        if env is not None:
            raise DefinitionError(f"{_where(crew_id, 'llm.api_key_file')} and api_key_env are "
                                  "exclusive")
    base_url = llm.get("base_url")
    if base_url is not None:
        base_url = _text(crew_id, "llm.base_url", base_url)
    temperature = _optional(crew_id, "llm.temperature", llm.get("temperature"), float, None)
    return LLMDefinition(model=model, api_key_env=env, base_url=base_url, api_key_file=key_file,
                         temperature=None if temperature is None else float(temperature))


def _parse_agents(crew_id: str, raw: object,
                  tools: ToolsDefinition = NO_TOOLS) -> tuple[AgentDefinition, ...]:
    agents_raw = _mapping(crew_id, "agents", raw)
    if not agents_raw:
        raise DefinitionError(f"{_where(crew_id, 'agents')} must define at least one agent")
    agents = []
    for name, value in agents_raw.items():
        path = f"agents.{name}"
        agent = _mapping(crew_id, path, value)
        _only(crew_id, path, agent, _AGENT_KEYS)
        agents.append(AgentDefinition(
            name=name,
            role=_text(crew_id, f"{path}.role", agent.get("role")),
            goal=_text(crew_id, f"{path}.goal", agent.get("goal")),
            backstory=_text(crew_id, f"{path}.backstory", agent.get("backstory")),
            allow_delegation=_optional(crew_id, f"{path}.allow_delegation",
                                       agent.get("allow_delegation"), bool, False),
            max_iter=_optional(crew_id, f"{path}.max_iter", agent.get("max_iter"), int, None),
            max_retry_limit=_optional(crew_id, f"{path}.max_retry_limit",
                                      agent.get("max_retry_limit"), int, None),
            verbose=_optional(crew_id, f"{path}.verbose", agent.get("verbose"), bool, False),
            tools=parse_agent_tools(agent.get("tools"), tools, f"{path}.tools",
                                    lambda message: DefinitionError(_where(crew_id, message))),
        ))
    return tuple(agents)


def _parse_tasks(crew_id: str, raw: object, agent_names: set[str],
                 process: Process) -> tuple[TaskDefinition, ...]:
    if not isinstance(raw, list) or not raw:
        raise DefinitionError(f"{_where(crew_id, 'tasks')} must be a non-empty list")
    tasks: list[TaskDefinition] = []
    seen: set[str] = set()
    for index, value in enumerate(raw):
        path = f"tasks[{index}]"
        task = _mapping(crew_id, path, value)
        _only(crew_id, path, task, _TASK_KEYS)
        name = _text(crew_id, f"{path}.name", task.get("name"))
        if name in seen:
            raise DefinitionError(f"{_where(crew_id, path)}.name {name!r} is not unique")
        agent = task.get("agent")
        if agent is None and process is Process.sequential:
            raise DefinitionError(f"{_where(crew_id, path)}.agent is required (sequential)")
        if agent is not None and agent not in agent_names:
            raise DefinitionError(
                f"{_where(crew_id, path)}.agent {agent!r} is not one of the crew's agents"
            )
        context_raw = task.get("context") or []
        if not isinstance(context_raw, list) or not all(c in seen for c in context_raw):
            raise DefinitionError(
                f"{_where(crew_id, path)}.context must list names of earlier tasks"
            )
        tasks.append(TaskDefinition(
            name=name,
            agent=agent,
            description=_text(crew_id, f"{path}.description", task.get("description")),
            expected_output=_text(crew_id, f"{path}.expected_output",
                                  task.get("expected_output")),
            context=tuple(context_raw),
        ))
        seen.add(name)
    return tuple(tasks)


def _parse_knowledge(crew_id: str, raw: object) -> tuple[KnowledgeDefinition, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise DefinitionError(f"{_where(crew_id, 'knowledge')} must be a list")
    sources = []
    for index, value in enumerate(raw):
        path = f"knowledge[{index}]"
        source = _mapping(crew_id, path, value)
        _only(crew_id, path, source, _KNOWLEDGE_KEYS)
        if ("content" in source) == ("text" in source):
            raise DefinitionError(f"{_where(crew_id, path)} needs exactly one of content, text")
        content = _text(crew_id, f"{path}.content", source.get("content", source.get("text")))
        name = source.get("name", f"source-{index}")
        sources.append(KnowledgeDefinition(name=_text(crew_id, f"{path}.name", name),
                                           content=content))
    return tuple(sources)


def parse_crew(crew_id: str, raw: object) -> CrewDefinition:
    """Validate one crew definition (the ``Crew`` resource's spec shape)."""
    if not isinstance(crew_id, str) or not 1 <= len(crew_id) <= MAX_CREW_ID_CHARS:
        raise DefinitionError(f"crew id {crew_id!r} must be a string of 1..256 characters")
    spec = _mapping(crew_id, "definition", raw)
    _only(crew_id, "definition", spec, _CREW_KEYS)
    process_raw = spec.get("process", "sequential")
    try:
        process = Process(process_raw)
    except ValueError:
        raise DefinitionError(
            f"{_where(crew_id, 'process')} must be sequential or hierarchical"
        ) from None
    tools = parse_tools(spec.get("tools"),
                        lambda message: DefinitionError(_where(crew_id, message)))
    agents = _parse_agents(crew_id, spec.get("agents"), tools)
    tasks = _parse_tasks(crew_id, spec.get("tasks"), {a.name for a in agents}, process)
    knowledge = _parse_knowledge(crew_id, spec.get("knowledge"))
    embedder: str | None = None
    if spec.get("embedder") is not None:
        emb = _mapping(crew_id, "embedder", spec["embedder"])
        _only(crew_id, "embedder", emb, {"model"})
        embedder = _text(crew_id, "embedder.model", emb.get("model"))
        if embedder != EMBEDDER_NAME:
            raise DefinitionError(
                f"{_where(crew_id, 'embedder.model')} {embedder!r} is not supported; "
                f"use {EMBEDDER_NAME}"
            )
    elif knowledge:
        embedder = EMBEDDER_NAME
    return CrewDefinition(crew_id=crew_id, llm=_parse_llm(crew_id, spec.get("llm")),
                          process=process, agents=agents, tasks=tasks, knowledge=knowledge,
                          embedder=embedder, tools=tools)


def parse_crews_document(document: object, source: str = "crews file") -> dict[str, CrewDefinition]:
    """Validate a whole ``{crews: {crew_id: definition}}`` document."""
    if not isinstance(document, Mapping) or set(document) != {"crews"}:
        raise DefinitionError(f"{source}: the document must be a mapping with the single key "
                              "'crews'")
    crews = document["crews"]
    if crews is None:
        return {}
    if not isinstance(crews, Mapping):
        raise DefinitionError(f"{source}: 'crews' must be a mapping of crew id to definition")
    return {str(crew_id): parse_crew(crew_id, raw) for crew_id, raw in crews.items()}


def load_crews_file(path: Path) -> dict[str, CrewDefinition]:
    """Read and validate a crews file; errors name the file, the crew and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DefinitionError(f"cannot read crews file {path}: {exc.strerror or exc}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DefinitionError(f"crews file {path} is not valid YAML: {exc}") from None
    return parse_crews_document(document, f"crews file {path}")
