"""Worker process settings: the C library is looked up once per process (not per prctl)."""

from __future__ import annotations

import ctypes.util

import pytest
from crewfence_sidecar.workers import settings


def test_libc_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``find_library`` runs ``ldconfig`` (~2 ms): paid once in the template, inherited by
    every forked worker, never once per ``prctl``."""
    real = ctypes.util.find_library
    calls: list[str] = []

    def counting(name: str) -> str | None:
        calls.append(name)
        return real(name)

    settings.libc.cache_clear()
    monkeypatch.setattr(ctypes.util, "find_library", counting)
    try:
        first = settings.libc()
        assert settings.libc() is first
        assert calls == ["c"]
    finally:
        settings.libc.cache_clear()
