#!/usr/bin/env bash
# Run every check and test of the project: lint, types, unit, component and
# end-to-end tests on a real local control plane (built from Go modules and
# cached on first use).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "crewfence: building or reusing the Kubernetes binaries (etcd, kube-apiserver, kubectl, helm)"
bin_output=$(python tests/e2e/cluster.py bin)
KUBE_BIN=$(printf '%s\n' "$bin_output" | sed -n 's/^KUBE_BIN=//p')
export KUBE_BIN

echo "crewfence: ruff"
ruff check .
echo "crewfence: mypy"
mypy sidecar/crewfence_sidecar operator/crewfence_operator

echo "crewfence: pytest"
exec python -m pytest tests "$@"
