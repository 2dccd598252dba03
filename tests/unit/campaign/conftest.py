"""The campaign package lives with the e2e harness (tests/e2e/campaign); its schedule and
checker are pure, so they are unit-tested here without a cluster."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "e2e"))
