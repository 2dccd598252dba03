"""Knowledge storage whose async methods work with the synchronous chromadb client.

crewai 1.15.30's ``KnowledgeStorage`` always creates a synchronous chromadb client, yet
its async methods call the client's async API: under ``akickoff``
(``Agent.aexecute_task`` -> ``ahandle_knowledge_retrieval`` -> ``Knowledge.aquery`` ->
``KnowledgeStorage.asearch``) every search fails with "asearch() requires an
AsyncClientAPI", crewai logs it and the agent runs WITHOUT its knowledge.
:class:`ThreadedKnowledgeStorage` runs the synchronous methods in a worker thread instead.

:func:`install` makes it crewai's default storage for every ``Knowledge`` built later
(crew- and agent-level, registry crews included) through crewai's own factory hook.
"""

from __future__ import annotations

import asyncio
from typing import Any

from crewai.knowledge.storage.base_knowledge_storage import BaseKnowledgeStorage
from crewai.knowledge.storage.factory import set_knowledge_storage_factory
from crewai.knowledge.storage.knowledge_storage import KnowledgeStorage
from crewai.rag.types import SearchResult


class ThreadedKnowledgeStorage(KnowledgeStorage):
    """``KnowledgeStorage`` whose ``a*`` methods are its sync methods in a worker thread."""

    async def asearch(
        self,
        query: list[str],
        limit: int = 5,
        metadata_filter: dict[str, Any] | None = None,
        score_threshold: float = 0.6,
    ) -> list[SearchResult]:
        return await asyncio.to_thread(self.search, query, limit, metadata_filter,
                                       score_threshold)

    async def asave(self, documents: list[str]) -> None:
        await asyncio.to_thread(self.save, documents)

    async def areset(self) -> None:
        await asyncio.to_thread(self.reset)


def threaded_storage(embedder: Any, collection_name: str | None) -> BaseKnowledgeStorage:
    """The storage crewai's ``Knowledge`` would build, with working async methods."""
    return ThreadedKnowledgeStorage(embedder=embedder, collection_name=collection_name)


def install() -> None:
    """Make :class:`ThreadedKnowledgeStorage` the default for ``Knowledge`` built from now on."""
    set_knowledge_storage_factory(threaded_storage)
