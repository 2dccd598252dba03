#!/usr/bin/env bash
# Run every check and test of the project: lint, types, unit, component and
# end-to-end tests on a real local control plane (built from Go modules and
# cached on first use).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

# promtool (Debian's `prometheus` package) checks and unit-tests the chart's alert rule. Best
# effort: without it that one test skips and the expression is still evaluated on live scrapes.
if ! command -v promtool >/dev/null && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "crewfence: installing promtool (Debian package prometheus)"
  if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends prometheus) >/dev/null 2>&1; then
    echo "crewfence: promtool could not be installed; its test will skip" >&2
  fi
fi

echo "crewfence: building or reusing the Kubernetes binaries (etcd, kube-apiserver, kubectl, helm)"
bin_output=$(python tests/e2e/cluster.py bin)
KUBE_BIN=$(printf '%s\n' "$bin_output" | sed -n 's/^KUBE_BIN=//p')
export KUBE_BIN
echo "crewfence: building or reusing cert-manager's controllers (tests/e2e/test_mtls_cert_manager.py)"
python tests/e2e/cluster.py cert-manager
echo "crewfence: building or reusing Kueue's controller manager (tests/e2e/test_crewjob_kueue.py)"
python tests/e2e/cluster.py kueue
echo "crewfence: building or reusing the kstatus verdict program (tests/e2e/test_kstatus_verdicts.py)"
python tests/e2e/cluster.py kstatus

echo "crewfence: ruff"
ruff check .
echo "crewfence: mypy"
mypy sidecar/crewfence_sidecar operator/crewfence_operator

# One pytest-xdist worker per core plus one (at most 8), each its own pytest session: the e2e
# tests spend much of their time awaiting the control plane, so with one worker per core the
# two cores of CI sat 42.5 % idle (session 11, /proc/stat over a run); with three they sat 12 %
# idle and pytest took 18:09 instead of 21:36-24:07. `--dist loadfile` keeps a test file on one
# worker (module fixtures stay shared inside a file); every worker that gets e2e files starts
# its own control plane (tests/e2e/conftest.py, ~0.6 GB each). CREWFENCE_TEST_WORKERS=N sets
# the count; 0 runs the suite serially in one process, as `python -m pytest tests` does; so
# does a reused cluster (CREWFENCE_E2E_STATE_DIR), which only one session may drive. Files go
# out heaviest first (tests/conftest.py, by tests/file_seconds.json; `--no-loadscope-reorder`
# keeps that order) and the 25 slowest tests are listed at the end of every log.
cores=$(nproc 2>/dev/null || echo 2)
default_workers=$(( cores + 1 > 8 ? 8 : cores + 1 ))
workers=${CREWFENCE_TEST_WORKERS:-$default_workers}
if [[ -n ${CREWFENCE_E2E_STATE_DIR:-} ]]; then
  workers=0
fi
echo "crewfence: pytest ($workers workers; load average $(cut -d' ' -f1-3 /proc/loadavg))"
status=0
python -m pytest tests -n "$workers" --dist loadfile --no-loadscope-reorder --durations=25 "$@" \
  || status=$?
if [[ $status -eq 5 ]]; then
  echo "crewfence: pytest collected no test to run (exit 5); that is a failure" >&2
fi
exit "$status"
