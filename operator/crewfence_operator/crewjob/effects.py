"""What a CrewJob's record says about its effects: tasks, model calls, tool calls in doubt.

Pure. The summary itself is the wire contract's ``summarize_effects`` (one copy, in
``crewfence_sidecar.contract``); this module keeps the operator's side of it:

* :class:`EffectLog` collects the effect events of one record while the driver follows its
  stream. It is only used when it covers the record **from sequence 0 without a gap up to the
  record's ``event_count``**: a log that began mid-record (an operator restart resumes at
  ``status.eventCursor``) or skipped an event is marked broken and never summarized, so the
  machine reads the record's events again from 0 instead (``machine.ReadEffects``).
* :func:`with_effects` is the one place a verdict's message learns about tool calls: an
  uncertain verdict, or any verdict with a call in doubt, names the calls in doubt (or says
  none was in flight), so "what may have happened outside" is answered where the outcome is.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Final

from crewfence_sidecar.contract import EFFECT_EVENTS as CONTRACT_EFFECT_EVENTS
from crewfence_sidecar.contract import (
    EffectSummary,
    JobEvent,
    JobRecord,
    summarize_effects,
)

from crewfence_operator.crewjob.outcome import Verdict

MAX_READS: Final = 3
"""Attempts to read a terminal record's events before finishing without ``status.effects``."""
EFFECT_EVENTS: Final = CONTRACT_EFFECT_EVENTS
"""The events an :class:`EffectLog` keeps (the rest only advance its sequence): the wire
contract's effect events, resume's ``task_reused``/``tool_call_reused``/... included."""
UNREAD: Final = ("tool calls unknown: the record's events could not be read, so whether a "
                 "tool call was in flight is not known")


@dataclass
class EffectLog:
    """Effect events of one record, in order, read from sequence 0 (mutable, like Progress)."""

    next_sequence: int = 0
    events: list[JobEvent] = field(default_factory=list)
    broken: bool = False
    """An event arrived out of order (a resumed stream): this log never covers the record."""

    def observe(self, event: JobEvent) -> None:
        if self.broken:
            return
        if event.sequence != self.next_sequence:
            self.broken = True
            self.events.clear()
            return
        self.next_sequence += 1
        if event.event in EFFECT_EVENTS:
            self.events.append(event)

    def covers(self, record: JobRecord) -> bool:
        """Every event of ``record`` (terminal: no more will come) went through this log."""
        return not self.broken and self.next_sequence >= record.event_count

    def summary(self) -> EffectSummary:
        return summarize_effects(self.events)


def usage_status(summary: EffectSummary) -> dict[str, Any]:
    """The CrewJob's ``status.usage``."""
    return {"promptTokens": summary.prompt_tokens,
            "completionTokens": summary.completion_tokens,
            "modelCalls": summary.model_calls, "toolCalls": summary.tool_calls}


def with_effects(verdict: Verdict, summary: EffectSummary | None,
                 *, partial: bool = False) -> Verdict:
    """The verdict, its message naming the tool calls in doubt when that matters.

    Invariant: an in-doubt call is always listed. A tool call whose ``tool_call_started`` has
    no ``tool_call_finished``, in a record that did not complete cleanly (or has no terminal
    event yet), is in the CrewJob's terminal patch: named in this message and in
    ``status.effects.inDoubt`` (both show at most ``MAX_STATUS_IN_DOUBT``; the message adds
    "and N more") and counted in ``inDoubtCount``; an uncertain verdict without one says "no
    tool call was in flight". Kept here with ``contract.summarize_effects`` (which calls are
    in doubt) and machine I7 (a summary only from the record's events from sequence 0 without
    a gap, read again when the followed stream did not cover them). The one exception: after
    ``MAX_READS`` failed reads there is no summary, and the message says the tool calls are
    unknown (``UNREAD``), never that none was in flight. Tests that fail without it:
    ``tests/unit/operator_crewjob/test_effects.py::``
    ``test_killed_mid_call_names_exactly_the_call_in_flight``,
    ``::test_events_the_stream_did_not_cover_are_read_again_from_zero_before_finishing``,
    ``::test_status_lists_at_most_ten_calls_but_counts_all``,
    ``::test_unreadable_events_are_retried_then_the_verdict_says_tool_calls_are_unknown``
    (the exception) and ``tests/unit/sidecar/test_effects_summary.py::``
    ``test_a_record_without_a_terminal_event_keeps_its_open_calls_in_doubt``.
    """
    if summary is None:
        if not verdict.uncertain:
            return verdict
        return replace(verdict, message=f"{verdict.message}; {UNREAD}")
    if not (verdict.uncertain or summary.in_doubt):
        return verdict
    text = summary.in_doubt_message()
    if partial:
        text = f"{text} (as far as the operator read the event stream)"
    return replace(verdict, message=f"{verdict.message}; {text}")
