"""Fixtures for the CrewJob machine and handler tests: the fault-injecting sidecar double
(``tests/support/faulty_sidecar.py``) and a fake cluster side for the driver."""

from __future__ import annotations

import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parents[2] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
