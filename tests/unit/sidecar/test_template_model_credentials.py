"""``/health``'s ``model_credentials`` as the worker template computes it: a hosted model's
key counts as present from its environment variable or from the file its ``<VAR>_FILE``
names (how the operator hands the key over when credentials are files), never otherwise."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from crewfence_sidecar.workers.template import _credentials

ENV = "CREWFENCE_LLM_API_KEY"


def _definitions(model: str, api_key_env: str | None = ENV) -> dict[str, Any]:
    llm = SimpleNamespace(model=model, api_key_env=api_key_env, api_key_file=None)
    return {"research": SimpleNamespace(llm=llm)}


def _state(model: str = "openai/gpt-4o-mini", **kw: Any) -> str:
    return str(_credentials(_definitions(model, **kw))["research"]["credentials"])


def test_offline_model_needs_nothing() -> None:
    assert _state("crewfence/offline") == "not_needed"


def test_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(f"{ENV}_FILE", raising=False)
    monkeypatch.delenv(ENV, raising=False)
    assert _state() == "missing"
    monkeypatch.setenv(ENV, "")
    assert _state() == "missing"
    monkeypatch.setenv(ENV, "sk-not-a-real-key")
    assert _state() == "present"


def test_file_named_by_the_file_convention(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)
    key = tmp_path / "llm-api-key"
    monkeypatch.setenv(f"{ENV}_FILE", str(key))
    assert _state() == "missing"  # no such file
    key.write_text("  \n")
    assert _state() == "missing"  # blank
    key.write_text("sk-not-a-real-key\n")
    entry = _credentials(_definitions("openai/gpt-4o-mini"))["research"]
    assert entry == {"model": "openai/gpt-4o-mini", "hosted": True, "credentials": "present"}


def test_provider_default_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY_FILE", raising=False)
    assert _state("anthropic/claude-3-5-haiku", api_key_env=None) == "missing"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    assert _state("anthropic/claude-3-5-haiku", api_key_env=None) == "present"
