#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv with everything the tests and the
# demo need. Idempotent: a warm run only checks that the install is current.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  echo "crewfence: creating .venv with $($python --version)"
  "$python" -m venv .venv
fi

stamp=.venv/.crewfence-install-stamp
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "crewfence: installing the package and its test dependencies into .venv"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[dev]'
  echo "$want" > "$stamp"
fi
