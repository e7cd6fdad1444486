"""Repository conftest: 8 virtual CPU devices for shard_map tests (before jax is imported), and the suite's
broken-kernel corpus (``tests.corpus``) importable by the processes the tests start, from any directory."""

import os
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = str(Path(__file__).resolve().parent)
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
