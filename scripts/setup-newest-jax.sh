#!/usr/bin/env bash
# Create .venv-newest-jax (if missing): Python 3.12 with the newest JAX that installs there
# (constraints-newest-jax.txt), no torch/tokamax/ejkernel. CI's second leg runs the suite in it.
set -euo pipefail
cd "$(dirname "$0")/.."
find_python312() {
    if [ -n "${PYTHON312:-}" ]; then echo "$PYTHON312"; return; fi
    if python3.12 -c pass 2>/dev/null; then command -v python3.12; return; fi
    local root
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    ls -d "$root"/versions/3.12*/bin/python3.12 2>/dev/null | sort -V | tail -1
}
PY=$(find_python312)
if [ -z "$PY" ]; then
    echo "setup-newest-jax.sh: no Python 3.12 found (set PYTHON312=/path/to/python3.12)" >&2
    exit 1
fi
[ -x .venv-newest-jax/bin/python ] || "$PY" -m venv .venv-newest-jax
. .venv-newest-jax/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q -c constraints-newest-jax.txt -e ".[jax,redis]"
