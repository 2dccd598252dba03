"""`crewfence`: the user CLI.

    crewfence journal inspect PATH [--json]
    crewfence journal export PATH [--action-id ID] [--output FILE]
    crewfence journal archive PATH --older-than AGE [--dry-run] [--yes]
    crewfence demo

Journal commands work while NO sidecar owns the journal: they take the same `.lock` flock
and refuse clearly if a sidecar holds it. inspect and export change nothing; archive
removes terminal records older than AGE and leaves tombstones (a later identical request
answers 410 and never runs again).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from crewfence_sidecar.config import BOUNDS
from crewfence_sidecar.fencing import FencingError, JournalLock, fence_journal
from crewfence_sidecar.journal import Journal, JournalError, JournalLimits, utc_now

_AGE_RE = re.compile(r"^(\d+)([smhdw])$")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class CliError(Exception):
    pass


def parse_age(value: str) -> timedelta:
    match = _AGE_RE.fullmatch(value.strip())
    if not match:
        raise argparse.ArgumentTypeError("age must look like 30s, 15m, 12h, 7d or 2w")
    return timedelta(**{_AGE_UNITS[match.group(2)]: int(match.group(1))})


def _generous_limits() -> JournalLimits:
    """Inspection must be able to read a journal whatever bounds its sidecar used."""
    return JournalLimits(
        max_retained_runs=BOUNDS["max_retained_runs"].maximum,
        max_events_per_run=BOUNDS["max_events_per_run"].maximum,
        max_event_bytes=BOUNDS["max_event_bytes"].maximum,
        max_state_bytes=BOUNDS["max_state_bytes"].maximum,
    )


def _open(path: Path, *, readonly: bool) -> tuple[Journal, JournalLock]:
    if not path.exists():
        raise CliError(f"journal {path} does not exist")
    try:
        lock, _ = fence_journal(path.absolute())
    except FencingError as exc:
        raise CliError(str(exc)) from None
    try:
        return Journal.open(path.absolute(), _generous_limits(), create=False,
                            readonly=readonly), lock
    except JournalError as exc:
        lock.release()
        raise CliError(str(exc)) from None


def _record_evidence(journal: Journal, action_id: str) -> dict[str, Any]:
    record = journal.get(action_id)
    if record is None:
        raise CliError(f"no record {action_id!r} in the journal")
    events = journal.events(action_id, 0, journal.limits.max_events_per_run)
    return {"record": record.to_wire(), "events": [e.to_wire() for e in events]}


def cmd_inspect(args: argparse.Namespace) -> int:
    journal, lock = _open(Path(args.path), readonly=True)
    try:
        records = sorted(journal.records.values(), key=lambda r: r.created_at)
        by_status: dict[str, int] = {}
        for r in records:
            by_status[r.status.value] = by_status.get(r.status.value, 0) + 1
        summary = {
            "journal": str(Path(args.path).absolute()),
            "journal_id": journal.journal_id,
            "bytes": journal.state_bytes(),
            "records": len(records),
            "by_status": by_status,
            "uncertain": sum(r.uncertain_outcome for r in records),
            "tombstones": journal.tombstone_count(),
        }
        if args.json:
            summary["entries"] = [
                {k: v for k, v in r.to_wire().items() if k not in ("output",)} for r in records
            ]
            print(json.dumps(summary, indent=2, ensure_ascii=False))
            return 0
        for key, value in summary.items():
            print(f"{key}: {value}")
        if records:
            print()
            print(f"{'STATUS':<10} {'UNCERTAIN':<9} {'EVENTS':>6}  {'UPDATED':<24} "
                  f"{'CREW':<16} ACTION")
            for r in records:
                print(f"{r.status.value:<10} {('yes' if r.uncertain_outcome else 'no'):<9} "
                      f"{r.event_count:>6}  {r.updated_at:<24} {r.crew_id[:16]:<16} "
                      f"{r.action_id}")
        return 0
    finally:
        journal.close()
        lock.release()


def cmd_export(args: argparse.Namespace) -> int:
    journal, lock = _open(Path(args.path), readonly=True)
    try:
        evidence: dict[str, Any] = {
            "kind": "crewfence-journal-evidence",
            "journal": str(Path(args.path).absolute()),
            "journal_id": journal.journal_id,
            "exported_at": utc_now(),
            "note": "the journal stores the request hash, events, status and output; it does "
                    "not store the original input or idempotency key",
        }
        if args.action_id is not None:
            evidence["records"] = [_record_evidence(journal, args.action_id)]
        else:
            evidence["records"] = [_record_evidence(journal, a)
                                   for a in sorted(journal.records)]
            evidence["tombstones"] = [t.to_wire() for t in journal.tombstones()]
    finally:
        journal.close()
        lock.release()
    text = json.dumps(evidence, indent=2, ensure_ascii=False, sort_keys=True)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
        print(f"wrote {args.output} ({len(evidence['records'])} records, sha256 {digest})",
              file=sys.stderr)
    else:
        print(text)
    return 0


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def cmd_archive(args: argparse.Namespace) -> int:
    cutoff = datetime.now(UTC) - args.older_than
    journal, lock = _open(Path(args.path), readonly=args.dry_run)
    try:
        if journal.restore_report.recovered_running:
            print(f"recovered {len(journal.restore_report.recovered_running)} running "
                  "record(s) as failed + uncertain (no sidecar owned them)", file=sys.stderr)
        due = sorted((r for r in journal.records.values()
                      if r.terminal and _parse_time(r.updated_at) < cutoff),
                     key=lambda r: r.updated_at)
        if args.dry_run:
            for r in due:
                print(f"would archive {r.action_id} ({r.status.value}, {r.updated_at})")
            print(f"{len(due)} record(s) would be archived")
            return 0
        if due and not args.yes and sys.stdin.isatty():
            answer = input(f"archive {len(due)} terminal record(s) older than "
                           f"{args.older_than}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing archived")
                return 1
        for r in due:
            stone = journal.archive(r.action_id)
            print(f"archived {stone.action_id} ({stone.status.value})")
        print(f"{len(due)} record(s) archived; tombstones keep them from running again")
        return 0
    finally:
        journal.close()
        lock.release()


def cmd_demo(args: argparse.Namespace) -> int:
    # The demo drives a real control plane; it lives with the tests of a source checkout.
    here = Path(__file__).resolve()
    for parent in here.parents:
        demo = parent / "tests" / "e2e" / "demo.py"
        if demo.is_file() and (parent / "pyproject.toml").is_file():
            return subprocess.call([sys.executable, str(demo), *args.demo_args], cwd=parent)
    print("crewfence demo needs a source checkout of crewfence (tests/e2e/demo.py); "
          "run it from a clone of the repository", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="crewfence", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    journal = sub.add_parser("journal", help="inspect, export or archive a sidecar journal")
    jsub = journal.add_subparsers(dest="journal_command", required=True)

    inspect = jsub.add_parser("inspect", help="summarise a journal (changes nothing)")
    inspect.add_argument("path")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(func=cmd_inspect)

    export = jsub.add_parser("export", help="a record or the whole journal as JSON evidence")
    export.add_argument("path")
    export.add_argument("--action-id", help="only this record (with its events)")
    export.add_argument("--output", "-o", help="write to this file instead of stdout")
    export.set_defaults(func=cmd_export)

    archive = jsub.add_parser("archive", help="archive terminal records older than an age")
    archive.add_argument("path")
    archive.add_argument("--older-than", type=parse_age, required=True,
                         help="e.g. 7d, 12h, 30m")
    archive.add_argument("--dry-run", action="store_true")
    archive.add_argument("--yes", "-y", action="store_true", help="do not ask")
    archive.set_defaults(func=cmd_archive)

    demo = sub.add_parser("demo", help="run the end-to-end demo (source checkout)")
    demo.add_argument("demo_args", nargs=argparse.REMAINDER)
    demo.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"crewfence: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
