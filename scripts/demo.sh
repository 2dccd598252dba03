#!/usr/bin/env bash
# The crewfence demo: a local control plane, the operator, a Crew and a CrewJob
# that succeeds, then a forced sidecar crash that surfaces an uncertain outcome,
# resolved and resumed with the kubectl plugin (it shows what was reused).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
exec python tests/e2e/demo.py "$@"
