"""Declarative crews: the crews-file shape, fresh crews per build, errors naming crew+field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from crewai import Crew, Process
from crewfence_sidecar.declarative import (
    DefinitionError,
    load_crews_file,
    parse_crew,
    parse_crews_document,
)
from crewfence_sidecar.offline_llm import OfflineLLM


def _crew(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "agents": {"a": {"role": "R", "goal": "G {topic}", "backstory": "B"}},
        "tasks": [{"name": "t", "agent": "a", "description": "Do {topic}",
                   "expected_output": "x"}],
    }
    spec.update(overrides)
    return spec


def test_the_sample_file_loads(crews_file: Path) -> None:
    crews = load_crews_file(crews_file)
    assert sorted(crews) == ["manager", "research"]
    research = crews["research"]
    assert [a.name for a in research.agents] == ["researcher", "writer"]
    assert research.agents[1].max_retry_limit == 0  # camelCase spelling accepted
    assert research.tasks[1].expected_output == "One paragraph"
    assert research.tasks[1].context == ("research",)
    assert [k.name for k in research.knowledge] == ["bees", "pods"]
    assert research.embedder == "crewfence/offline"
    assert crews["manager"].process is Process.hierarchical


def test_every_build_is_a_fresh_crew(crews_file: Path) -> None:
    definition = load_crews_file(crews_file)["research"]
    first, second = definition.build(), definition.build()
    assert isinstance(first, Crew) and first is not second
    assert first.id != second.id
    assert {t.id for t in first.tasks}.isdisjoint({t.id for t in second.tasks})
    assert first.agents[0] is not second.agents[0]
    assert first.agents[0].llm is not second.agents[0].llm
    assert all(isinstance(agent.llm, OfflineLLM) for agent in first.agents)
    assert first.tasks[1].context == [first.tasks[0]]
    assert first.knowledge is not None and first.knowledge is not second.knowledge


def test_hierarchical_crew_gets_an_offline_manager(crews_file: Path) -> None:
    crew = load_crews_file(crews_file)["manager"].build()
    assert isinstance(crew.manager_llm, OfflineLLM)
    assert crew.tasks[0].agent is None


def test_knowledge_collections_are_per_crew() -> None:
    knowledge = [{"content": "same text"}]
    one = parse_crew("one", _crew(knowledge=knowledge))
    two = parse_crew("two", _crew(knowledge=knowledge))
    assert one.embedder == "crewfence/offline"  # the default when knowledge is given
    assert one.knowledge_collection() != two.knowledge_collection()


def test_api_key_env_is_read_at_build(monkeypatch: pytest.MonkeyPatch) -> None:
    definition = parse_crew("remote", _crew(llm={"model": "openai/gpt-4o-mini",
                                                 "apiKeyEnv": "CF_TEST_DECL_KEY"}))
    monkeypatch.delenv("CF_TEST_DECL_KEY", raising=False)
    with pytest.raises(ValueError, match="CF_TEST_DECL_KEY"):
        definition.build()
    monkeypatch.setenv("CF_TEST_DECL_KEY", "sk-test-only")
    crew = definition.build()  # built, never kicked off
    llm = crew.agents[0].llm
    assert not isinstance(llm, OfflineLLM)
    assert getattr(llm, "api_key", None) == "sk-test-only"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (_crew(bogus=1), "crew 'c': definition: unknown field(s) bogus"),
        (_crew(process="parallel"), "crew 'c': process must be sequential or hierarchical"),
        (_crew(agents={}), "crew 'c': agents must define at least one agent"),
        (_crew(agents={"a": {"role": "R", "goal": "G"}}), "crew 'c': agents.a.backstory"),
        (_crew(agents={"a": {"role": "R", "goal": "G", "backstory": "B", "max_iter": -1}}),
         "agents.a.max_iter must be a non-negative integer"),
        (_crew(tasks=[]), "crew 'c': tasks must be a non-empty list"),
        (_crew(tasks=[{"name": "t", "agent": "nobody", "description": "d",
                       "expected_output": "x"}]),
         "crew 'c': tasks[0].agent 'nobody' is not one of the crew's agents"),
        (_crew(tasks=[{"name": "t", "description": "d", "expected_output": "x"}]),
         "tasks[0].agent is required"),
        (_crew(tasks=[{"name": "t", "agent": "a", "description": "d", "expected_output": "x"},
                      {"name": "t", "agent": "a", "description": "e",
                       "expected_output": "y"}]),
         "tasks[1].name 't' is not unique"),
        (_crew(tasks=[{"name": "t", "agent": "a", "description": "d", "expected_output": "x",
                       "context": ["later"]}]),
         "tasks[0].context must list names of earlier tasks"),
        (_crew(tasks=[{"name": "t", "agent": "a", "description": "d"}]),
         "tasks[0].expected_output must be a non-empty string"),
        (_crew(llm={"model": ""}), "crew 'c': llm.model must be a non-empty string"),
        (_crew(llm={"model": "m", "api_key_env": "not a name"}), "llm.api_key_env"),
        (_crew(knowledge=[{"content": "a", "text": "b"}]),
         "knowledge[0] needs exactly one of content, text"),
        (_crew(knowledge="text"), "crew 'c': knowledge must be a list"),
        (_crew(embedder={"model": "openai/x"}), "embedder.model 'openai/x' is not supported"),
        (["not", "a", "mapping"], "crew 'c': definition must be a mapping"),
    ],
)
def test_bad_definitions_name_the_crew_and_field(spec: Any, expected: str) -> None:
    with pytest.raises(DefinitionError) as error:
        parse_crews_document({"crews": {"c": spec}})
    assert expected in str(error.value)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"research": _crew()}, "single key 'crews'"),
        ({"crews": {"c": _crew()}, "extra": 1}, "single key 'crews'"),
        ({"crews": ["c"]}, "'crews' must be a mapping"),
        ({"crews": {7: _crew()}}, "crew id 7 must be a string"),
    ],
)
def test_bad_documents_are_refused(document: Any, expected: str) -> None:
    with pytest.raises(DefinitionError, match=expected):
        parse_crews_document(document)


def test_empty_crews_mapping_is_allowed() -> None:
    assert parse_crews_document({"crews": {}}) == {}
    assert parse_crews_document({"crews": None}) == {}


def test_unreadable_or_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="cannot read crews file"):
        load_crews_file(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("crews: {a: [\n", encoding="utf-8")
    with pytest.raises(DefinitionError, match="not valid YAML"):
        load_crews_file(broken)
