"""Repository conftest: the harness's process set-up before jax is imported (``prepare_process``: 8 virtual CPU
devices for the shard_map tests, Triton's interpreter where no GPU is seen), and the suite's broken-kernel corpus
(``tests.corpus``) importable by the processes the tests start, from any directory."""

import os
from pathlib import Path

from gmm_kernels.runtimes.process import prepare_process

prepare_process()
_ROOT = str(Path(__file__).resolve().parent)
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
