"""Journal: the journaled draining switch, bulk archive by age, and their wire contract."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from crewfence_sidecar.contract import (
    BulkArchiveResult,
    ContractError,
    DrainState,
    JobRecord,
    Operation,
    Status,
    bulk_archive_confirmation,
    health_operations,
    parse_bulk_archive_request,
    parse_drain_request,
)
from crewfence_sidecar.journal import Journal, JournalLimits, utc_iso, utc_now


def _open(path: Path) -> Journal:
    return Journal.open(path, JournalLimits())


def _finished(j: Journal, action_id: str, *, age_s: int = 0,
              status: Status = Status.COMPLETED) -> None:
    now = utc_now()
    j.admit(JobRecord(action_id=action_id, crew_id="c", operation="run", request_hash="h" * 64,
                      status=Status.RUNNING, event_count=0, created_at=now, updated_at=now), {})
    if status is not Status.RUNNING:
        j.finish(action_id, status, output={"raw": action_id}, error=None, uncertain=False,
                 event_data={})
    if age_s:
        stamp = utc_iso(datetime.now(UTC) - timedelta(seconds=age_s))
        j._conn.execute("UPDATE records SET updated_at = ? WHERE action_id = ?",
                        (stamp, action_id))
        j.records[action_id].updated_at = stamp


@pytest.fixture
def jpath(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d / "journal.db"


def test_draining_is_journaled_and_survives_a_reopen(jpath: Path) -> None:
    j = _open(jpath)
    assert j.draining is False
    j.set_draining(True)
    j.close()
    j = _open(jpath)
    assert j.draining is True
    j.set_draining(False)
    j.close()
    assert _open(jpath).draining is False


def test_archive_older_than_takes_only_old_terminal_records(jpath: Path) -> None:
    j = _open(jpath)
    _finished(j, "old-ok", age_s=7200)
    _finished(j, "old-failed", age_s=5000, status=Status.FAILED)
    _finished(j, "new-ok")
    _finished(j, "running", status=Status.RUNNING)
    j._conn.execute("UPDATE records SET updated_at = ? WHERE action_id = 'running'",
                    (utc_iso(datetime.now(UTC) - timedelta(days=3)),))
    cutoff = utc_iso(datetime.now(UTC) - timedelta(seconds=3600))
    stones = j.archive_older_than(cutoff)
    assert [s.action_id for s in stones] == ["old-ok", "old-failed"]  # oldest first
    assert {s.status for s in stones} == {Status.COMPLETED, Status.FAILED}
    assert set(j.records) == {"new-ok", "running"}
    assert j.events("old-ok") == []
    j.close()
    j = _open(jpath)  # durable: the tombstones and the remaining records after a reopen
    assert j.tombstone("old-ok") is not None and j.tombstone("old-failed") is not None
    assert j.tombstone("running") is None and set(j.records) == {"new-ok", "running"}
    j.close()


def test_wire_contract_of_the_admin_routes() -> None:
    assert parse_drain_request({"draining": True}) is True
    for bad in ({}, {"draining": 1}, {"draining": True, "x": 1}, None):
        with pytest.raises(ContractError) as err:
            parse_drain_request(bad)
        assert err.value.status == 400
    assert parse_bulk_archive_request({"older_than_seconds": 60}, "older-than:60") == 60
    assert bulk_archive_confirmation(60) == "older-than:60"
    for body, header, status in (({"older_than_seconds": 60}, None, 428),
                                 ({"older_than_seconds": 60}, "older-than:61", 400),
                                 ({"older_than_seconds": -1}, "older-than:-1", 400),
                                 ({"older_than_seconds": True}, "older-than:True", 400)):
        with pytest.raises(ContractError) as err:
            parse_bulk_archive_request(body, header)
        assert err.value.status == status
    assert DrainState.from_wire({"draining": True, "unarchived_records": 3}) == DrainState(True, 3)
    with pytest.raises(ValueError):
        DrainState.from_wire({"draining": "yes", "unarchived_records": 3})
    result = BulkArchiveResult.from_wire({"archived": ["a", "b"], "count": 2})
    assert result.count == 2 and result.to_wire() == {"archived": ["a", "b"], "count": 2}
    assert health_operations({Operation.RUN}) == ["cancel", "events", "run", "status"]
