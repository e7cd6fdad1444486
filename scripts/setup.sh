#!/usr/bin/env bash
# Create .venv (if missing) and install gmm-harness with every kernel that installs on this machine,
# at the tested set of versions (constraints.txt; pyproject.toml has the ranges).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q -c constraints.txt -e ".[all,dev]"
