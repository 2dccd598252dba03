"""Check a saved campaign history again (e.g. with a newer checker):

    python tests/e2e/campaign/recheck.py .e2e/bench-campaign/campaign-<seed>.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from campaign import checker
from campaign.history import History


def main(argv: list[str]) -> int:
    failing = 0
    for path in argv:
        history = History.from_json(Path(path).read_text())
        anomalies = checker.check(history)
        print(f"{path}: seed {history.seed}, {len(history.ops)} operations, "
              f"{sum(history.faults().values())} faults, {len(anomalies)} anomalies "
              f"({len(checker.hard(anomalies))} not explained by a known gap)")
        for anomaly in anomalies:
            print(f"  {anomaly}")
        failing += len(checker.hard(anomalies))
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
