"""The one process set-up of every entry point: what must be in place before anything imports jax or a Triton
kernel's module, since both read their configuration when imported.

:func:`prepare_process` sets, each only where it is not set already (yours is kept):

- the host environment (:data:`HOST_ENVIRON`): 8 virtual CPU devices, so that the sharded modes' ``shard_map`` has
  devices to shard over, and jax on the CPU. The main job, its workers, this repository's suite and benchmarks
  take it; the pytest plugin and the golden commands leave it to the user (``host=False``): theirs is the process;
- Triton's interpreter where Triton is installed and torch sees no GPU (``triton_interpreter.use_if_no_gpu``);
- with ``cache=True``, JAX's persistent compilation cache and the built-in adapters' executables on disk
  (``compile_cache.enable``: the directory given, else ``$GMM_HARNESS_COMPILE_CACHE``, else the user cache).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gmm_kernels.runtimes import compile_cache, triton_interpreter

__all__ = ["HOST_ENVIRON", "prepare_process"]

#: the variables :func:`prepare_process` sets with ``host=True``, and the ones a worker process is started with
HOST_ENVIRON: Mapping[str, str] = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}


def prepare_process(*, host: bool = True, cache: bool = False, cache_dir: str | None = None,
                    option_name: str = "option") -> str:
    """Set this process up before anything imports jax or a kernel's module (see the module's docs). Returns the
    compilation cache's one-line description with ``cache=True`` (else ``""``); a ``cache_dir`` that cannot be
    used is a ``ValueError`` naming ``option_name``."""
    if host:
        for name, value in HOST_ENVIRON.items():
            os.environ.setdefault(name, value)
    triton_interpreter.use_if_no_gpu()
    return compile_cache.enable(cache_dir, option_name=option_name) if cache else ""
