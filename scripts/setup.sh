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
# vLLM's batched experts kernel (the vllm.batched_moe adapter) is read from vLLM's wheel, not installed (its torch
# pin clashes with ours): download it, without its dependencies, into the cache the adapter looks in. A failed
# download leaves that adapter n/a, saying how to get the wheel; it does not fail the set-up.
VLLM_VERSION=0.33.0
WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/gmm-harness/wheels"
if ! ls "$WHEELS"/vllm-"$VLLM_VERSION"-*.whl >/dev/null 2>&1; then
    mkdir -p "$WHEELS" && timeout 600 python -m pip download -q --no-deps --only-binary=:all: \
        "vllm==$VLLM_VERSION" -d "$WHEELS" >/dev/null 2>&1 \
        || echo "vLLM $VLLM_VERSION's wheel could not be downloaded into $WHEELS: vllm.batched_moe will be n/a"
fi
# unsloth's grouped GEMM kernel (the unsloth.grouped_gemm adapter) is read from unsloth's wheel the same way: its
# package root imports a GPU stack this harness does not need. A failed download leaves that adapter n/a.
UNSLOTH_VERSION=2026.10.9
if ! ls "$WHEELS"/unsloth-"$UNSLOTH_VERSION"-*.whl >/dev/null 2>&1; then
    mkdir -p "$WHEELS" && timeout 600 python -m pip download -q --no-deps --only-binary=:all: \
        "unsloth==$UNSLOTH_VERSION" -d "$WHEELS" >/dev/null 2>&1 \
        || echo "unsloth $UNSLOTH_VERSION's wheel could not be downloaded into $WHEELS: unsloth.grouped_gemm will be n/a"
fi
# SGLang's fused MoE kernel (the sglang.fused_moe adapter) likewise, from SGLang's wheel (it pins its own torch too).
SGLANG_VERSION=0.5.23
if ! ls "$WHEELS"/sglang-"$SGLANG_VERSION"-*.whl >/dev/null 2>&1; then
    mkdir -p "$WHEELS" && timeout 600 python -m pip download -q --no-deps --only-binary=:all: \
        "sglang==$SGLANG_VERSION" -d "$WHEELS" >/dev/null 2>&1 \
        || echo "SGLang $SGLANG_VERSION's wheel could not be downloaded into $WHEELS: sglang.fused_moe will be n/a" \
                "(get it with: python -m pip download --no-deps --only-binary=:all: sglang==$SGLANG_VERSION -d $WHEELS)"
fi
