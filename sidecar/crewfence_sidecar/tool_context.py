"""The idempotency key of the tool call running now: the public accessor for tool authors.

A Python tool that has an effect (creates a ticket, sends a mail) reads
:func:`current_idempotency_key` and hands it to the system it changes, which then performs a
repeated call (the same job's same call, replayed after a crash) only once::

    from crewfence_sidecar.tool_context import current_idempotency_key

    def _run(self, title: str) -> str:
        return tickets.create(title, idempotency_key=current_idempotency_key())

Invariant: inside a tool call the crewfence ledger journaled durably, the key is the one in
that call's ``tool_call_started`` event (``cfk1-...``, see
:func:`crewfence_sidecar.contract.tool_idempotency_key`); outside any call it is None. The
key lives in a :class:`contextvars.ContextVar`, so threads and tasks crewai derives for the
call (which copy the context) see it too.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "crewfence_tool_idempotency_key", default=None)


def current_idempotency_key() -> str | None:
    """The ``cfk1-`` key of the tool call running in this context, or None."""
    return _KEY.get()


def set_idempotency_key(key: str | None) -> contextvars.Token[str | None]:
    """Bind ``key`` for the tool call about to run (the ledger does this)."""
    return _KEY.set(key)


def reset_idempotency_key(token: contextvars.Token[str | None]) -> None:
    try:
        _KEY.reset(token)
    except ValueError:  # set in another context (crewai copied it): just clear this one
        _KEY.set(None)


@contextmanager
def idempotency_key(key: str | None) -> Iterator[None]:
    """``key`` is the current key inside the block."""
    token = _KEY.set(key)
    try:
        yield
    finally:
        reset_idempotency_key(token)
