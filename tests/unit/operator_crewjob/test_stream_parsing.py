from __future__ import annotations

import pytest
from crewfence_operator.sidecar_client import SidecarFailure, parse_events_page, parse_sse_block


def page(events: list[dict], cursor: int = 0, status: str = "running") -> dict:
    return {"action_id": "a", "cursor": cursor, "next_cursor": cursor + len(events),
            "status": status, "events": events}


def test_contiguous_page_is_accepted() -> None:
    p = parse_events_page(page([{"event": "started", "sequence": 2, "data": {}},
                                {"event": "chunk", "sequence": 3, "data": {"x": 1}}], 2), 2)
    assert [e.sequence for e in p.events] == [2, 3] and p.next_cursor == 4


@pytest.mark.parametrize("bad", [
    page([{"event": "started", "sequence": 1, "data": {}}], 0),        # gap
    {"events": "nope"},
    {**page([], 0), "next_cursor": 5},
    {**page([], 0), "status": "exploded"},
])
def test_invalid_pages_are_invalid_streams(bad: dict) -> None:
    with pytest.raises(SidecarFailure) as info:
        parse_events_page(bad, 0)
    assert info.value.code == "invalid_stream" and info.value.uncertain


def test_sse_block_with_full_event_json() -> None:
    ev = parse_sse_block('id: 4\nevent: chunk\ndata: {"event":"chunk","sequence":4,"data":{}}',
                         4)
    assert ev is not None and (ev.event, ev.sequence) == ("chunk", 4)


def test_sse_keepalive_is_ignored_and_bad_json_is_invalid() -> None:
    assert parse_sse_block(": keep-alive", 0) is None
    with pytest.raises(SidecarFailure):
        parse_sse_block("event: chunk\ndata: {not json", 0)
