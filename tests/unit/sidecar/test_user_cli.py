"""`crewfence journal inspect|export|archive` on a real journal while no sidecar runs."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from crewfence_sidecar.contract import JobRecord, Status
from crewfence_sidecar.fencing import acquire_lock
from crewfence_sidecar.journal import Journal, JournalLimits, utc_now
from crewfence_sidecar.user_cli import main


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    path = d / "journal.db"
    j = Journal.open(path, JournalLimits())
    for aid in ("old-done", "new-done", "still-running"):
        now = utc_now()
        j.admit(JobRecord(aid, "crew", "run", "h" * 64, Status.RUNNING, 0, now, now), {})
    for aid in ("old-done", "new-done"):
        j.finish(aid, Status.COMPLETED, output={"raw": aid}, error=None, uncertain=False,
                 event_data={})
    j.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE records SET updated_at='2020-01-01T00:00:00.000Z' "
                 "WHERE action_id='old-done'")
    conn.commit()
    conn.close()
    return path


def test_inspect_changes_nothing(journal_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = journal_path.read_bytes()
    assert main(["journal", "inspect", str(journal_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 3 and out["by_status"] == {"completed": 2, "running": 1}
    assert journal_path.read_bytes() == before  # the running record was not "recovered"


def test_export_one_record_and_everything(journal_path: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["journal", "export", str(journal_path), "--action-id", "new-done"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert [r["record"]["action_id"] for r in one["records"]] == ["new-done"]
    assert [e["event"] for e in one["records"][0]["events"]] == ["started", "completed"]
    target = tmp_path / "evidence.json"
    assert main(["journal", "export", str(journal_path), "-o", str(target)]) == 0
    everything = json.loads(target.read_text())
    assert len(everything["records"]) == 3 and everything["journal_id"]
    assert main(["journal", "export", str(journal_path), "--action-id", "missing"]) == 2


def test_archive_terminal_records_older_than(journal_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["journal", "archive", str(journal_path), "--older-than", "7d",
                 "--dry-run"]) == 0
    assert "1 record(s) would be archived" in capsys.readouterr().out
    assert main(["journal", "archive", str(journal_path), "--older-than", "7d", "--yes"]) == 0
    j = Journal.open(journal_path, JournalLimits())
    assert j.get("old-done") is None and j.tombstone("old-done") is not None
    assert j.get("new-done") is not None
    j.close()


def test_refuses_while_a_sidecar_owns_the_journal(journal_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    lock = acquire_lock(journal_path)
    try:
        assert main(["journal", "inspect", str(journal_path)]) == 2
        assert "owned by another running process" in capsys.readouterr().err
    finally:
        lock.release()


def test_bad_age_is_refused(journal_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["journal", "archive", str(journal_path), "--older-than", "soon"])
