"""CrewCatalog: registry and crews file, a fresh crew per build, clear catalog errors."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from crewai import Crew
from crewfence_sidecar import crews, operations
from crewfence_sidecar.crews import CatalogError, CrewCatalog, PreparedCatalog

CREW_MODULE = """
from crewai import Agent, Crew, Task
from crewfence_sidecar.offline_llm import OfflineLLM

def _crew():
    agent = Agent(role="R", goal="G", backstory="B", llm=OfflineLLM())
    return Crew(agents=[agent], tasks=[Task(description="d", expected_output="x", agent=agent)])

INSTANCE = _crew()
CREWS = {"instance": INSTANCE, "shared": lambda: INSTANCE, "bad": lambda: "not a crew"}
NOT_A_MAPPING = [1, 2]
BAD_VALUE = {"x": 42}
BAD_ID = {"": _crew}
CALLS = []


def make_crews():
    CALLS.append("called")
    return {"made": _crew}


def raising():
    raise RuntimeError("no crews today")


def returns_a_list():
    return ["made"]
"""


@pytest.fixture
def crew_module(importable: Callable[[str, str], str], request: pytest.FixtureRequest) -> str:
    # A module name of identifier characters only: a parameter's text (spaces, colons) must
    # not end up in the registry string, where a colon would split it elsewhere.
    return importable("cf_reg_" + re.sub(r"\W", "_", request.node.name), CREW_MODULE)


def test_registry_catalog_builds_fresh_crews(sample_catalog: CrewCatalog) -> None:
    assert sample_catalog.crew_ids() == ["knowledge", "research", "single"]
    assert "research" in sample_catalog and "nope" not in sample_catalog
    first, second = sample_catalog.build("research"), sample_catalog.build("research")
    assert isinstance(first, Crew) and first is not second
    assert {t.id for t in first.tasks}.isdisjoint({t.id for t in second.tasks})


def test_crew_instances_are_cloned_per_build(crew_module: str) -> None:
    catalog = CrewCatalog.load(f"{crew_module}:CREWS", None)
    module = __import__(crew_module)
    built = [catalog.build("instance") for _ in range(2)]
    assert all(crew is not module.INSTANCE for crew in built)
    assert built[0] is not built[1]
    assert built[0].tasks[0].id != built[1].tasks[0].id


def test_a_factory_returning_a_shared_crew_still_gives_fresh_ones(crew_module: str) -> None:
    catalog = CrewCatalog.load(f"{crew_module}:CREWS", None)
    built = [catalog.build("shared") for _ in range(3)]
    assert len({id(crew) for crew in built}) == 3


def test_a_factory_returning_no_crew_is_refused(crew_module: str) -> None:
    catalog = CrewCatalog.load(f"{crew_module}:CREWS", None)
    with pytest.raises(CatalogError, match="factory of crew 'bad' returned str"):
        catalog.build("bad")


def test_a_registry_callable_is_called_once_for_its_mapping(crew_module: str) -> None:
    """The reference sidecar's form: the attribute is a callable returning the mapping."""
    catalog = CrewCatalog.load(f"{crew_module}:make_crews", None)
    assert catalog.crew_ids() == ["made"]
    first, second = catalog.build("made"), catalog.build("made")
    assert isinstance(first, Crew) and first is not second
    assert __import__(crew_module).CALLS == ["called"]


def test_registry_and_file_combine(crews_file: Path, tmp_path: Path) -> None:
    extra = tmp_path / "crews.yaml"
    extra.write_text(yaml.safe_dump({"crews": {"extra": {
        "agents": {"a": {"role": "R", "goal": "G", "backstory": "B"}},
        "tasks": [{"name": "t", "agent": "a", "description": "d", "expected_output": "x"}],
    }}}), encoding="utf-8")
    catalog = CrewCatalog.load("crewfence_sidecar.samples:SAMPLE_CREWS", extra)
    assert catalog.crew_ids() == ["extra", "knowledge", "research", "single"]
    # The fixture file defines 'research' too: one id in two places is refused.
    with pytest.raises(CatalogError, match="'research' defined both"):
        CrewCatalog.load("crewfence_sidecar.samples:SAMPLE_CREWS", crews_file)


def test_file_catalog(file_catalog: CrewCatalog) -> None:
    assert file_catalog.crew_ids() == ["manager", "research"]
    assert file_catalog.build("manager") is not file_catalog.build("manager")


@pytest.mark.parametrize(
    ("attribute", "expected"),
    [
        ("NOT_A_MAPPING", "must be a mapping crew_id -> factory, not list"),
        ("BAD_VALUE", "crew 'x' must be a zero-argument factory or a crewai.Crew, not int"),
        ("BAD_ID", "crew id '' must be a string of 1..256 characters"),
        ("MISSING", "has no attribute 'MISSING'"),
        ("raising", "calling it raised RuntimeError: no crews today"),
        ("returns_a_list",
         "is a callable that must return a mapping crew_id -> factory, not list"),
    ],
)
def test_bad_registry_values(crew_module: str, attribute: str, expected: str) -> None:
    with pytest.raises(CatalogError, match=expected):
        CrewCatalog.load(f"{crew_module}:{attribute}", None)


@pytest.mark.parametrize(
    ("registry", "expected"),
    [
        ("no_colon_here", "must have the form module:attribute"),
        (":ATTR", "must have the form module:attribute"),
        ("cf_no_such_module_xyz:CREWS", "cannot import module 'cf_no_such_module_xyz'"),
    ],
)
def test_bad_registry_strings(registry: str, expected: str) -> None:
    with pytest.raises(CatalogError, match=expected):
        CrewCatalog.load(registry, None)


def test_no_crews_at_all(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="no crews"):
        CrewCatalog.load(None, None)
    empty = tmp_path / "crews.yaml"
    empty.write_text(yaml.safe_dump({"crews": {}}), encoding="utf-8")
    with pytest.raises(CatalogError, match="no crews"):
        CrewCatalog.load(None, empty)


def test_a_bad_crews_file_is_a_catalog_error(tmp_path: Path) -> None:
    bad = tmp_path / "crews.yaml"
    bad.write_text(yaml.safe_dump({"crews": {"c": {"agents": {}}}}), encoding="utf-8")
    with pytest.raises(CatalogError, match="crew 'c': agents must define at least one agent"):
        CrewCatalog.load(None, bad)


def test_loading_a_catalog_declines_crewai_first_time_tracing(sample_catalog: CrewCatalog) -> None:
    from crewai.events.listeners.tracing.trace_listener import TraceCollectionListener
    from crewai.events.listeners.tracing.utils import has_user_declined_tracing, is_first_execution

    assert not is_first_execution()
    assert has_user_declined_tracing()
    listener = getattr(TraceCollectionListener, "_instance", None)
    assert listener is None or not listener.first_time_handler.is_first_time


def test_a_prepared_crew_is_handed_out_once_then_crews_are_built_fresh(
        sample_catalog: CrewCatalog) -> None:
    prepared = PreparedCatalog.prepare(sample_catalog, ["research"])
    ahead = prepared.prepared["research"]
    assert prepared.take_prepared("research") is ahead
    assert prepared.take_prepared("research") is None
    assert sample_catalog.take_prepared("research") is None
    fresh = prepared.build("research")
    assert isinstance(fresh, Crew) and fresh is not ahead


async def test_a_job_takes_its_prepared_crew_without_a_thread_hop(
        sample_catalog: CrewCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a crew built ahead of its job costs the job no thread hop (on the serial
    path of every run); a crew still to be built is built off the event loop."""
    hops: list[object] = []
    real_to_thread = asyncio.to_thread

    async def counting_to_thread(func: Callable[..., object], /, *args: object) -> object:
        hops.append(func)
        return await real_to_thread(func, *args)

    monkeypatch.setattr(operations.asyncio, "to_thread", counting_to_thread)
    prepared = PreparedCatalog.prepare(sample_catalog, ["research"])
    ahead = prepared.prepared["research"]
    assert await operations._build(prepared, "research") is ahead
    assert hops == []
    built = await operations._build(prepared, "research")
    assert isinstance(built, Crew) and built is not ahead and len(hops) == 1


def test_a_registry_crew_built_ahead_serves_only_while_young(
        sample_catalog: CrewCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant (a factory's crew is never old): a registry crew built ahead past
    PREPARED_REGISTRY_MAX_AGE_S is dropped and the job's crew is built when it comes."""
    now = [1000.0]
    monkeypatch.setattr(crews.time, "monotonic", lambda: now[0])
    prepared = PreparedCatalog.prepare(sample_catalog, ["research"])
    ahead = prepared.prepared["research"]
    now[0] += crews.PREPARED_REGISTRY_MAX_AGE_S + 0.001
    assert prepared.take_prepared("research") is None
    fresh = prepared.build("research")
    assert isinstance(fresh, Crew) and fresh is not ahead


def test_a_declarative_crew_built_ahead_serves_whenever_its_job_comes(
        file_catalog: CrewCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(crews.time, "monotonic", lambda: now[0])
    crew_id = sorted(file_catalog.declarative)[0]
    prepared = PreparedCatalog.prepare(file_catalog, [crew_id])
    ahead = prepared.prepared[crew_id]
    now[0] += 3600
    assert prepared.take_prepared(crew_id) is ahead


def test_an_unused_prepared_crew_keeps_its_first_build_time(
        sample_catalog: CrewCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker prepares again after each job; a crew it did not use is kept, and its age
    counts from its own build, so re-preparing never makes an old crew look young."""
    now = [1000.0]
    monkeypatch.setattr(crews.time, "monotonic", lambda: now[0])
    first = PreparedCatalog.prepare(sample_catalog, ["research"])
    ahead = first.prepared["research"]
    now[0] += 10
    again = PreparedCatalog.prepare(first, ["research"])
    assert again.prepared["research"] is ahead and again.built_at["research"] == 1000.0
    now[0] += crews.PREPARED_REGISTRY_MAX_AGE_S
    assert again.take_prepared("research") is None


def test_a_factory_can_opt_out_of_being_built_ahead(sample_catalog: CrewCatalog) -> None:
    research = sample_catalog.factories["research"]

    def at_job_time() -> Crew:
        return research()

    at_job_time.crewfence_build_ahead = False  # type: ignore[attr-defined]
    catalog = CrewCatalog({**sample_catalog.factories, "late": at_job_time})
    assert "late" not in catalog.ahead_ids()
    assert "research" in catalog.ahead_ids()


def test_a_waiting_worker_builds_registry_crews_ahead(sample_catalog: CrewCatalog) -> None:
    from crewfence_sidecar.workers.worker import MAX_PREPARED_CREWS, _prepare

    ids = sample_catalog.ahead_ids()
    prepared = _prepare(sample_catalog)
    if len(ids) <= MAX_PREPARED_CREWS:
        assert isinstance(prepared, PreparedCatalog)
        assert sorted(prepared.prepared) == ids
    else:
        assert prepared is sample_catalog
