"""The offline deterministic embedder ``crewfence/offline``.

A hashed bag of words (feature hashing of lower-cased word tokens with a signed bucket,
L2-normalised): texts sharing words are close, so ``knowledge_query`` over
``StringKnowledgeSource`` gives meaningful nearest neighbours without any model download or
network call. crewai accepts it only as a provider object
(``CustomProvider(embedding_callable=...)``); the dict form fails its validation.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
from crewai.rag.core.types import Documents, Embeddings
from crewai.rag.embeddings.providers.custom.custom_provider import CustomProvider
from crewai.rag.embeddings.providers.custom.embedding_callable import CustomEmbeddingFunction

EMBEDDER_NAME = "crewfence/offline"
DIMENSIONS = 256
_TOKEN_RE = re.compile(r"[^\W_]+", re.UNICODE)


def embed_text(text: str, dimensions: int = DIMENSIONS) -> np.ndarray[Any, np.dtype[np.float32]]:
    """The unit vector for ``text`` (a fixed unit vector when it has no word)."""
    vector = np.zeros(dimensions, dtype=np.float32)
    for token in _TOKEN_RE.findall(text.lower()):
        digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "big") % dimensions
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = float(np.linalg.norm(vector))
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return vector / norm


class OfflineEmbeddingFunction(CustomEmbeddingFunction):
    """chromadb-compatible embedding function; chromadb calls every method below."""

    def __init__(self, dimensions: int = DIMENSIONS, **_: Any) -> None:
        self.dimensions = dimensions

    def __call__(self, input: Documents) -> Embeddings:
        return [embed_text(text, self.dimensions) for text in input]

    @staticmethod
    def name() -> str:
        return "crewfence-offline"

    def get_config(self) -> dict[str, Any]:
        return {"dimensions": self.dimensions}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> OfflineEmbeddingFunction:
        return OfflineEmbeddingFunction(int(config.get("dimensions", DIMENSIONS)))

    def is_legacy(self) -> bool:
        return False

    def default_space(self) -> str:
        return "cosine"

    def supported_spaces(self) -> list[str]:
        return ["cosine", "l2", "ip"]

    @staticmethod
    def validate_config(config: dict[str, Any]) -> None:
        dimensions = config.get("dimensions", DIMENSIONS)
        if not isinstance(dimensions, int) or dimensions < 1:
            raise ValueError("dimensions must be a positive integer")

    def validate_config_update(self, old_config: dict[str, Any],
                               new_config: dict[str, Any]) -> None:
        if old_config.get("dimensions") != new_config.get("dimensions"):
            raise ValueError("the embedding dimensions of a collection cannot change")


def _register_with_chromadb() -> None:
    # chromadb persists the function's name with each collection and looks it up again when
    # a later process opens the collection.
    from chromadb.utils.embedding_functions import (
        known_embedding_functions,
        register_embedding_function,
    )

    if OfflineEmbeddingFunction.name() not in known_embedding_functions:
        register_embedding_function(OfflineEmbeddingFunction)


_register_with_chromadb()


def offline_embedder() -> CustomProvider:
    """The crewai embedder object to pass as ``Crew(embedder=...)``."""
    return CustomProvider(embedding_callable=OfflineEmbeddingFunction)


def resolve_embedder(model: str) -> CustomProvider:
    """The embedder for a declarative ``embedder {model}``; only the offline one exists."""
    if model != EMBEDDER_NAME:
        raise ValueError(f"unknown embedder model {model!r}; supported: {EMBEDDER_NAME}")
    return offline_embedder()
