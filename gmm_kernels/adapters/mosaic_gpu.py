"""jax's Mosaic GPU ragged dot (``jax.experimental.pallas.ops.gpu.ragged_dot_mgpu``).

Natively it needs a Hopper GPU (wgmma, TMA). Without one it runs under jax's
private GPU interpret mode (``jax._src.pallas.mosaic_gpu.interpret``,
``force_gpu_interpret_mode``), which simulates the 132 "SM" programs,
shared memory and barriers on the CPU. The interpreter checks every TMA copy
against the buffer, so (unlike the hardware, whose TMA clips) it raises on
any partial block: M, N and K must be multiples of the block sizes. The
output dtype is the input dtype; rows past ``sum(sizes)`` are never written
(NaN under the interpreter). With a single group (G=1) the interpreted
kernel kills the process (SIGFPE while XLA folds an integer division by
zero), so ``supports`` refuses G=1 here. After a failed interpreted call the interpreter
state is reset, as its documentation requires.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

from gmm_kernels.base import KernelAdapter
from gmm_kernels.scope import Limits
from gmm_ref import Problem

__all__ = ["MosaicGpuRaggedDot", "pick_block"]

_BLOCKS = (64, 32, 16, 8)


def pick_block(extent: int) -> int | None:
    """The largest of 64, 32, 16, 8 that divides ``extent`` (None if none does)."""
    for b in _BLOCKS:
        if extent % b == 0:
            return b
    return None


@functools.cache
def _jitted(bm: int, bn: int, bk: int) -> Any:
    import jax
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

    return jax.jit(lambda a, b, g: ragged_dot_mgpu.ragged_dot(
        a, b, group_sizes=g, block_m=bm, block_n=bn, block_k=bk,
        max_concurrent_steps=2, grid_block_n=1))


def _native() -> bool:
    import jax

    dev = jax.devices()[0]
    return dev.platform == "gpu" and getattr(dev, "compute_capability", "") == "9.0"


class MosaicGpuRaggedDot(KernelAdapter):
    """``ragged_dot_mgpu.ragged_dot(lhs, rhs, group_sizes=...)`` in the ``ragged_dot`` convention."""

    name = "jax.ragged_dot_mgpu"
    convention = "ragged_dot"
    requires = ("jax",)
    input_dtypes = ("float32", "bfloat16", "float16")
    equal_input_dtypes = True
    output_is_input = True
    flush_subnormals = True  # interpreted on XLA CPU, which flushes subnormals
    default_precision = True

    @property
    def max_examples(self) -> int | None:  # type: ignore[override]
        return None if _native() else 3  # interpreted: 0.1-2 s per call, 1-2 s per compile

    def _limits(self) -> Limits:
        """M/K/N multiples of 8 (no partial blocks), G >= 2 (G = 1 kills the interpreted
        process), no tail: rows past sum(group_sizes) are never written, where the
        ragged_dot convention zeroes them, and no zero extent (an empty grid raises)."""
        return Limits(multiples={"m": 8, "k": 8, "n": 8}, max_extent=64, min_groups=2, max_groups=4, tail=False,
                      zero_extents=())

    def large_refusal(self) -> str | None:
        if _native():
            return None
        return self._runs_interpreted("Mosaic GPU interpret mode", takes="days")

    def _unavailable(self) -> str | None:
        try:
            import jax.experimental.pallas.ops.gpu.ragged_dot_mgpu  # noqa: F401
            if not _native():
                from jax._src.pallas.mosaic_gpu.interpret import params  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"no Hopper GPU and no Mosaic GPU interpret mode: {type(e).__name__}: {e}"
        return None

    def _refusal(self, problem: Problem) -> str | None:
        if problem.group_sizes is not None and int(problem.group_sizes.sum(axis=-1).min()) < problem.m:
            return ("ragged_dot_mgpu never writes rows past sum(group_sizes) (NaN under the interpreter; "
                    "the tail is undefined on Mosaic GPU), where the ragged_dot convention zeroes them")
        if problem.num_groups == 1 and not _native():
            return ("ragged_dot_mgpu (interpreted) with G=1 kills the process: SIGFPE in XLA CPU "
                    "compilation (stablehlo constant folding divides by zero)")
        for ax, ext in (("M", problem.m), ("N", problem.n), ("K", problem.k)):
            if ext == 0:
                return (f"ragged_dot_mgpu raises on {ax} = 0: its grid would be empty ('All elements in the grid "
                        "must be strictly positive')")
            if pick_block(ext) is None:
                return f"ragged_dot_mgpu (interpreted) needs {ax}={ext} divisible by 8 (no partial blocks)"
        return None

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None,
             preferred_element_type: Any = None) -> np.ndarray:
        if precision is not None:
            raise ValueError("this adapter runs the default precision only")
        if preferred_element_type is not None and np.dtype(preferred_element_type) != lhs.dtype:
            raise ValueError(f"ragged_dot_mgpu returns {lhs.dtype}, not {preferred_element_type}")
        m, k = lhs.shape
        n = rhs.shape[2]
        if _native():
            fn = _jitted(64, 128, 64)
            return np.asarray(fn(lhs, rhs, np.asarray(group_sizes, np.int32)))
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks, params

        blocks = (pick_block(m), pick_block(n), pick_block(k))
        if None in blocks:
            raise ValueError(f"ragged_dot_mgpu (interpreted): M, N, K = {m}, {n}, {k} must be multiples of 8")
        fn = _jitted(*blocks)
        try:
            with params.force_gpu_interpret_mode(params.InterpretGPUParams()), warnings.catch_warnings():
                # the interpreter's NumPy matmul warns on NaN/Inf inputs (poisoned padding); under
                # filterwarnings=error that warning kills the io_callback and the whole call
                warnings.filterwarnings("ignore", category=RuntimeWarning,
                                        module=r"jax\._src\.pallas\.mosaic_gpu\.interpret")
                return np.asarray(fn(lhs, rhs, np.asarray(group_sizes, np.int32)))
        except Exception:
            gpu_callbacks.reset_gpu_interpret_mode_state()
            raise
