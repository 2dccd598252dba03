"""The offline embedder: deterministic unit vectors that rank shared words higher."""

from __future__ import annotations

import numpy as np
import pytest
from crewfence_sidecar.offline_embedder import (
    DIMENSIONS,
    EMBEDDER_NAME,
    OfflineEmbeddingFunction,
    embed_text,
    offline_embedder,
    resolve_embedder,
)


def test_embeddings_are_deterministic_unit_vectors() -> None:
    fn = OfflineEmbeddingFunction()
    first, empty = fn(["Honey bees live in hives", ""])
    again = fn(["Honey bees live in hives"])[0]
    assert first.shape == (DIMENSIONS,)
    assert np.array_equal(first, again)
    assert float(np.linalg.norm(first)) == pytest.approx(1.0, abs=1e-5)
    assert float(np.linalg.norm(empty)) == pytest.approx(1.0, abs=1e-5)


def test_shared_words_rank_higher() -> None:
    query = embed_text("where do bees live")
    bees = embed_text("Honey bees live in hives and make honey")
    pods = embed_text("Kubernetes schedules pods onto nodes")
    assert float(query @ bees) > float(query @ pods)


def test_chromadb_config_round_trip() -> None:
    fn = OfflineEmbeddingFunction(dimensions=64)
    rebuilt = OfflineEmbeddingFunction.build_from_config(fn.get_config())
    assert OfflineEmbeddingFunction.name() == "crewfence-offline"
    assert rebuilt.dimensions == 64
    assert np.array_equal(rebuilt(["a b"])[0], fn(["a b"])[0])


def test_resolver() -> None:
    provider = resolve_embedder(EMBEDDER_NAME)
    assert provider.embedding_callable is OfflineEmbeddingFunction
    assert offline_embedder().embedding_callable is OfflineEmbeddingFunction
    with pytest.raises(ValueError, match="unknown embedder"):
        resolve_embedder("openai/text-embedding-3-small")
