"""Counts the sidecar keeps for its workers (no crewai). Workers report each offline LLM call
over their channel as it happens, so a worker killed mid-job has reported every call it made;
``/metrics`` adds these to the sidecar process's own count (``metrics._OfflineLLMCalls``)."""

from __future__ import annotations

import threading

_lock = threading.Lock()
_offline_llm_calls = 0


def count_offline_llm_call() -> None:
    global _offline_llm_calls
    with _lock:
        _offline_llm_calls += 1


def offline_llm_calls() -> int:
    with _lock:
        return _offline_llm_calls
