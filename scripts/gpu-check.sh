#!/usr/bin/env bash
# The main job on a GPU machine from the source tree, with the Python and packages already there (no network, no
# install; docs/gpu.md): torch kernels run on CUDA (--device auto), jax kernels on jax's default device. Extra
# arguments go to `gmm-harness check` (e.g. --json gpu.json, --kernel torch.grouped_mm). Then the tests that need a
# GPU (the device copies, the CUDA graph replays; GMM_GPU_TESTS=0 skips them). Exit status: the main job's, else
# the tests'.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/.cache}
"$PY" - <<'PYEOF'
import importlib, platform
print("python", platform.python_version())
for name in ("numpy", "ml_dtypes", "hypothesis", "pytest", "jax", "torch", "triton"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', '?')}")
    except Exception as exc:  # noqa: BLE001 - a missing package is reported, the kernels that need it say n/a
        print(f"{name}: not importable ({type(exc).__name__}: {exc})")
try:
    import torch
    print("torch sees", torch.cuda.device_count(), "CUDA device(s)",
          *(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
except Exception:  # noqa: BLE001
    pass
try:
    import jax
    print("jax devices", jax.devices())
except Exception:  # noqa: BLE001
    pass
PYEOF
"$PY" -m property_tests.cli.main check --device auto "$@"
status=$?
if [ "${GMM_GPU_TESTS:-1}" != 0 ]; then
    echo "== the tests that need a GPU"
    # the pytest plugin: by its entry point where gmm-harness is installed, else named here (for the nested
    # pytest runs too)
    if ! "$PY" -c 'import importlib.metadata as m, sys; sys.exit(not any(e.name == "gmm_harness" for e in m.entry_points(group="pytest11")))'; then
        export PYTEST_PLUGINS=property_tests.plugin
    fi
    "$PY" -m pytest -q -p no:cacheprovider tests/gmm_kernels/test_device.py \
        tests/gmm_kernels/test_cuda_graph.py tests/gmm_kernels/test_routed_cuda_graph.py \
        tests/property_tests/test_graph_mode.py
    tests=$?
    [ "$status" = 0 ] && status=$tests
fi
exit "$status"
