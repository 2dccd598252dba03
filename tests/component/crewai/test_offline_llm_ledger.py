"""The offline LLM's call ledger (``CREWFENCE_OFFLINE_LLM_LEDGER``): off by default, one JSON
line per call, the task excerpt without markers, every call counted (a failing one too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from crewai.utilities.types import LLMMessage
from crewfence_sidecar.offline_llm import LEDGER_ENV, OfflineLLM, OfflineLLMFailure


def _prompt(task: str) -> list[LLMMessage]:
    return [{"role": "system", "content": "You are Researcher."},
            {"role": "user", "content": f"\nCurrent Task: {task}\n\nThis is the expected "
                                        "criteria for your final answer: A summary"}]


def test_no_ledger_without_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    OfflineLLM().call(_prompt("Research bees"))
    assert list(tmp_path.iterdir()) == []


def test_every_call_appends_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    llm = OfflineLLM()
    llm.call(_prompt("Research tok-1 [[sleep:0]] bees"))
    llm.call(_prompt("Research tok-2 bees"))
    with pytest.raises(OfflineLLMFailure):
        llm.call(_prompt("Research tok-3 [[fail]]"))
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [line["task"] for line in lines] == ["Research tok-1 bees", "Research tok-2 bees",
                                                "Research tok-3"]
    assert all(isinstance(line["pid"], int) for line in lines)


def test_an_unwritable_ledger_never_fails_the_call(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "missing" / "ledger.jsonl"))
    assert "Offline answer" in str(OfflineLLM().call(_prompt("Research bees")))
