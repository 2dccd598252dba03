"""The crews a sidecar hosts, keyed by ``crew_id``: a registry and/or a declarative file.

- Registry ``module:attribute`` (``CREWFENCE_REGISTRY``): a mapping ``crew_id -> zero-argument
  factory`` returning a fresh ``crewai.Crew``, or (as the reference sidecar accepts) a
  callable returning that mapping, called once when the catalog loads; one that raises or
  returns anything but a mapping is a start-up error. A value that is a ``Crew`` instance is
  accepted too and cloned with ``crew.copy()`` for every job.
- Declarative crews file (``CREWFENCE_CREWS_FILE``): see :mod:`crewfence_sidecar.declarative`.

``build(crew_id)`` returns a new crew on every call; one Crew object never serves two jobs.

A worker waiting for its job builds the next job's crews ahead (``PreparedCatalog``): the
declarative ones, and the registry's unless a factory says ``crewfence_build_ahead = False``.
A registry crew built ahead serves a job only within ``PREPARED_REGISTRY_MAX_AGE_S`` of its
build (a factory is user code: what it read when it ran must not be old); older, it is
dropped and the job's crew is built when the job comes.
"""

from __future__ import annotations

import importlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from crewai import Crew

from crewfence_sidecar.crewai_env import decline_first_time_tracing
from crewfence_sidecar.declarative import DefinitionError, load_crews_file
from crewfence_sidecar.knowledge_storage import install as install_knowledge_storage

MAX_CREW_ID_CHARS = 256
PREPARED_REGISTRY_MAX_AGE_S = 30.0
BUILD_AHEAD_ATTRIBUTE = "crewfence_build_ahead"
"""Set to False on a registry factory that must run when its job comes, never ahead."""

CrewFactory = Callable[[], Crew]


class CatalogError(Exception):
    """A registry or crews file that cannot serve crews; the message says what and where."""


def _resolve_attribute(registry: str) -> object:
    module_name, sep, attribute = registry.partition(":")
    if not sep or not module_name or not attribute:
        raise CatalogError(f"registry {registry!r} must have the form module:attribute")
    try:
        target: object = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is a configuration error
        raise CatalogError(
            f"registry {registry!r}: cannot import module {module_name!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CatalogError(
                f"registry {registry!r}: module {module_name!r} has no attribute {attribute!r}"
            ) from None
    return target


def _clone_factory(crew: Crew) -> CrewFactory:
    return crew.copy


def _registry_mapping(registry: str) -> Mapping[object, object]:
    """The registry attribute, or what it returns when it is a callable (called once here)."""
    target = _resolve_attribute(registry)
    if isinstance(target, Mapping):
        return target
    if not callable(target):
        raise CatalogError(
            f"registry {registry!r} must be a mapping crew_id -> factory, "
            f"not {type(target).__name__} (or a callable returning that mapping)"
        )
    try:
        produced = target()
    except Exception as exc:  # user code: whatever it raises is a configuration error
        raise CatalogError(
            f"registry {registry!r}: calling it raised {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(produced, Mapping):
        raise CatalogError(
            f"registry {registry!r} is a callable that must return a mapping "
            f"crew_id -> factory, not {type(produced).__name__}"
        )
    return produced


def _registry_factories(registry: str) -> dict[str, CrewFactory]:
    mapping = _registry_mapping(registry)
    factories: dict[str, CrewFactory] = {}
    for crew_id, value in mapping.items():
        if not isinstance(crew_id, str) or not 1 <= len(crew_id) <= MAX_CREW_ID_CHARS:
            raise CatalogError(
                f"registry {registry!r}: crew id {crew_id!r} must be a string of "
                f"1..{MAX_CREW_ID_CHARS} characters"
            )
        if isinstance(value, Crew):
            factories[crew_id] = _clone_factory(value)
        elif callable(value):
            factories[crew_id] = value
        else:
            raise CatalogError(
                f"registry {registry!r}: crew {crew_id!r} must be a zero-argument factory "
                f"or a crewai.Crew, not {type(value).__name__}"
            )
    return factories


class _HandedOut:
    """Remembers crews already given to a job, so a factory returning a shared one is caught."""

    def __init__(self) -> None:
        self._crews: weakref.WeakSet[Crew] = weakref.WeakSet()
        self._lock = threading.Lock()

    def claim(self, crew: Crew) -> bool:
        """True when ``crew`` is new; False when it already served a job."""
        with self._lock:
            if crew in self._crews:
                return False
            self._crews.add(crew)
            return True


_HANDED_OUT = _HandedOut()


@dataclass(frozen=True)
class CrewCatalog:
    factories: Mapping[str, CrewFactory]
    declarative: frozenset[str] = frozenset()
    """Crew ids built from the crews file: no user code runs when they are built."""

    @classmethod
    def load(cls, registry: str | None, crews_file: Path | None) -> CrewCatalog:
        """Both sources may be given; a crew id defined twice, or no crew at all, is an error."""
        if registry is None and crews_file is None:
            raise CatalogError("no crews: set a registry (module:attribute) or a crews file")
        factories: dict[str, CrewFactory] = {}
        declarative: frozenset[str] = frozenset()
        if registry is not None:
            factories.update(_registry_factories(registry))
        if crews_file is not None:
            try:
                definitions = load_crews_file(crews_file)
            except DefinitionError as exc:
                raise CatalogError(str(exc)) from None
            twice = sorted(set(definitions) & set(factories))
            if twice:
                raise CatalogError(
                    f"crew id(s) {', '.join(map(repr, twice))} defined both in the registry "
                    f"and in crews file {crews_file}"
                )
            factories.update({crew_id: d.build for crew_id, d in definitions.items()})
            declarative = frozenset(definitions)
        if not factories:
            raise CatalogError("no crews: the registry and the crews file define none")
        decline_first_time_tracing()
        # Knowledge the registry's factories build (crew- or agent-level) must be searchable
        # from crewai's async path too.
        install_knowledge_storage()
        return cls(dict(factories), declarative)

    def crew_ids(self) -> list[str]:
        return sorted(self.factories)

    def __contains__(self, crew_id: object) -> bool:
        return crew_id in self.factories

    def __iter__(self) -> Iterator[str]:
        return iter(self.crew_ids())

    def build(self, crew_id: str) -> Crew:
        """A fresh crew for one job. KeyError for an unknown id; CatalogError for a bad factory."""
        factory = self.factories[crew_id]
        crew = factory()
        if not isinstance(crew, Crew):
            raise CatalogError(
                f"the factory of crew {crew_id!r} returned {type(crew).__name__}, "
                "not a crewai.Crew"
            )
        if not _HANDED_OUT.claim(crew):
            # The factory returned a crew that already served a job: never share one.
            crew = crew.copy()
            _HANDED_OUT.claim(crew)
        return crew

    def take_prepared(self, crew_id: str) -> Crew | None:
        """A crew built ahead of its job, handed out once; None when there is none."""
        return None

    def ahead_ids(self) -> list[str]:
        """The crews a waiting worker may build ahead of their job: every declarative crew,
        and each registry crew whose factory does not opt out (``crewfence_build_ahead``)."""
        return sorted(crew_id for crew_id, factory in self.factories.items()
                      if crew_id in self.declarative
                      or getattr(factory, BUILD_AHEAD_ATTRIBUTE, True) is not False)


@dataclass(frozen=True)
class PreparedCatalog(CrewCatalog):
    """A catalog holding crews built ahead of their job (a spare worker builds them while it
    waits): each prepared crew serves one job at most, then crews are built fresh."""

    prepared: dict[str, Crew] = field(default_factory=dict)
    built_at: dict[str, float] = field(default_factory=dict)
    """``time.monotonic()`` when each prepared crew was built."""

    @classmethod
    def prepare(cls, catalog: CrewCatalog, crew_ids: Iterable[str]) -> PreparedCatalog:
        """Build ``crew_ids`` ahead; one still unused from an earlier round (``catalog`` is
        itself prepared) is kept with its first build time."""
        earlier = dict(catalog.built_at) if isinstance(catalog, PreparedCatalog) else {}
        prepared: dict[str, Crew] = {}
        built_at: dict[str, float] = {}
        for crew_id in crew_ids:
            kept = catalog.take_prepared(crew_id)
            if kept is not None:
                prepared[crew_id], built_at[crew_id] = kept, earlier[crew_id]
            else:
                prepared[crew_id] = CrewCatalog.build(catalog, crew_id)
                built_at[crew_id] = time.monotonic()
        return cls(catalog.factories, catalog.declarative, prepared, built_at)

    def build(self, crew_id: str) -> Crew:
        crew = self.take_prepared(crew_id)
        return crew if crew is not None else super().build(crew_id)

    def take_prepared(self, crew_id: str) -> Crew | None:
        """Invariant (a factory's crew is never old): a registry crew built more than
        ``PREPARED_REGISTRY_MAX_AGE_S`` ago is dropped, not handed out; a declarative one
        (no user code ran to build it) serves whenever its job comes."""
        crew = self.prepared.pop(crew_id, None)
        built = self.built_at.pop(crew_id, None)
        if crew is None or crew_id in self.declarative:
            return crew
        if built is None or time.monotonic() - built > PREPARED_REGISTRY_MAX_AGE_S:
            return None
        return crew
