"""The adapters in the ``ragged_dot`` and ``ragged_dot_general`` conventions (``gmm_ref.conventions.ragged_dot``).

``jax.lax.ragged_dot`` and ``jax.lax.ragged_dot_general`` on the default (CPU) backend; jax's Mosaic GPU
ragged dot (``jax.ragged_dot_mgpu``); tokamax's ``ragged_dot`` (``tokamax.ragged_dot[...]``); qwix's
quantized-training ``ragged_dot_qt`` (``qwix.ragged_dot_qt``). Each package's notes head its section.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

from gmm_kernels.adapters._tokamax import absl_flags_parsed
from gmm_kernels.base import KernelAdapter, VariantAdapter, import_failure
from gmm_kernels.known_issues import xla_bf16_transposed_issues, xla_nan_leak_issues
from gmm_kernels.runtimes import executables
from gmm_kernels.sandbox.convert import jax_x64, lax_dimension_numbers, uses_64bit
from gmm_kernels.scope import KnownIssue, Limits, Scope
from gmm_ref import AmaxQuantizer, Numerics, Problem

__all__ = ["JaxRaggedDot", "JaxRaggedDotGeneral", "MosaicGpuRaggedDot", "QwixRaggedDotQt", "TokamaxRaggedDot",
           "pick_block", "qwix_qt_format"]


# ---- jax.lax
# ``jax.lax.ragged_dot`` and ``jax.lax.ragged_dot_general`` on the default (CPU) backend.
#
# Each distinct (shapes, dtypes, dimension numbers) compiles once: the group
# sizes are a traced argument. Problems with a 64-bit array or output dtype run
# under ``jax.enable_x64(True)`` (without it jax silently computes float64
# inputs in float32). XLA flushes subnormals (FTZ/DAZ on CPU; GPU and TPU do
# too): a bf16 input of 2**-130 times 2**10 gives 0, not 2**-120.
#
# Every jitted function of this module goes through ``gmm_kernels.runtimes.executables``: a shape compiled by an
# earlier process is loaded, not traced, lowered or compiled again.


def _cached(fn: Any, name: str, *static: Any, libraries: tuple[str, ...] = ()) -> Any:
    return executables.cached(fn, name=name, static=static, modules=(__name__,), libraries=libraries)


@functools.cache
def _jitted_ragged_dot(preferred_element_type: Any) -> Any:
    from jax import lax

    return _cached(lambda a, b, g: lax.ragged_dot(a, b, g, preferred_element_type=preferred_element_type),
                   "ragged_dot", preferred_element_type)


@functools.cache
def _jitted_ragged_dot_general(dn_key: Any, preferred_element_type: Any) -> Any:
    from jax import lax

    dn = lax_dimension_numbers(dn_key)
    return _cached(lambda a, b, g: lax.ragged_dot_general(a, b, g, dn, preferred_element_type=preferred_element_type),
                   "ragged_dot_general", dn_key, preferred_element_type)


@functools.cache
def _jitted_ragged_dot_vjp(preferred_element_type: Any) -> Any:
    import jax
    from jax import lax

    def f(a: Any, b: Any, g: Any, ct: Any) -> Any:
        _, pullback = jax.vjp(lambda x, y: lax.ragged_dot(x, y, g, preferred_element_type=preferred_element_type),
                              a, b)
        return pullback(ct)

    return _cached(f, "ragged_dot_vjp", preferred_element_type)


def _dn_key(dn: Any) -> tuple:
    (lc, rc), (lb, rb) = dn[0]

    def ints(xs: Any) -> tuple[int, ...]:
        return tuple(int(x) for x in xs)

    return (((ints(lc), ints(rc)), (ints(lb), ints(rb))), ints(dn[1]), ints(dn[2]))


def _ped(x: Any) -> Any:
    return None if x is None else np.dtype(x)


class _JaxLax(KernelAdapter):
    requires = ("jax",)
    flush_subnormals = True
    default_precision = True

    @property
    def known_issues(self) -> tuple[KnownIssue, ...]:  # type: ignore[override]
        return xla_nan_leak_issues()


class JaxRaggedDot(_JaxLax):
    """``jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=...)``."""

    name = "jax.ragged_dot"
    convention = "ragged_dot"

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None,
             preferred_element_type: Any = None) -> np.ndarray:
        if precision is not None:
            raise ValueError("this adapter runs the default precision only")
        ped = _ped(preferred_element_type)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            return np.asarray(_jitted_ragged_dot(ped)(lhs, rhs, np.asarray(group_sizes, np.int32)))

    def vjp(self, problem: Problem, cotangent: Any) -> dict[str, np.ndarray]:
        """``jax.vjp`` of ``lax.ragged_dot`` (mode 1) w.r.t. lhs and rhs, jitted, sizes traced."""
        with self.arguments(problem) as ((lhs, rhs, gs), kw):
            ped = _ped(kw.get("preferred_element_type"))
            with jax_x64(uses_64bit(lhs, rhs, ped)):
                dl, dr = _jitted_ragged_dot_vjp(ped)(lhs, rhs, np.asarray(gs, np.int32), np.asarray(cotangent))
                return {"lhs": np.asarray(dl), "rhs": np.asarray(dr)}


class JaxRaggedDotGeneral(_JaxLax):
    """``jax.lax.ragged_dot_general`` (modes 1, 2, 3, with batch dims)."""

    name = "jax.ragged_dot_general"
    convention = "ragged_dot_general"

    @property
    def known_issues(self) -> tuple[KnownIssue, ...]:  # type: ignore[override]
        # its jitted VJP transposes d/dlhs of a transposed lhs: XLA CPU's bfloat16 accumulation there (jaxlib 0.12)
        return (*xla_nan_leak_issues(), *xla_bf16_transposed_issues())

    def differentiable_fn(self) -> Any:
        from jax import lax

        return lax.ragged_dot_general  # jax differentiates mode 1 only; modes 2 and 3 decline

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, ragged_dot_dimension_numbers: Any,
             precision: Any = None, preferred_element_type: Any = None) -> np.ndarray:
        if precision is not None:
            raise ValueError("this adapter runs the default precision only")
        ped = _ped(preferred_element_type)
        fn = _jitted_ragged_dot_general(_dn_key(ragged_dot_dimension_numbers), ped)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            return np.asarray(fn(lhs, rhs, np.asarray(group_sizes, np.int32)))


# ---- jax's Mosaic GPU ragged dot
# jax's Mosaic GPU ragged dot (``jax.experimental.pallas.ops.gpu.ragged_dot_mgpu``).
#
# Natively it needs a Hopper GPU (wgmma, TMA). Without one it runs under jax's
# private GPU interpret mode (``jax._src.pallas.mosaic_gpu.interpret``,
# ``force_gpu_interpret_mode``), which simulates the 132 "SM" programs,
# shared memory and barriers on the CPU. The interpreter checks every TMA copy
# against the buffer, so (unlike the hardware, whose TMA clips) it raises on
# any partial block: M, N and K must be multiples of the block sizes. The
# output dtype is the input dtype; rows past ``sum(sizes)`` are never written
# (NaN under the interpreter). With a single group (G=1) the interpreted
# kernel kills the process (SIGFPE while XLA folds an integer division by
# zero), so ``supports`` refuses G=1 here. After a failed interpreted call the interpreter
# state is reset, as its documentation requires.

_BLOCKS = (64, 32, 16, 8)


def pick_block(extent: int) -> int | None:
    """The largest of 64, 32, 16, 8 that divides ``extent`` (None if none does)."""
    for b in _BLOCKS:
        if extent % b == 0:
            return b
    return None


@functools.cache
def _jitted_mgpu(bm: int, bn: int, bk: int, native: bool) -> Any:
    import jax
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

    def f(a: Any, b: Any, g: Any) -> Any:
        return ragged_dot_mgpu.ragged_dot(a, b, group_sizes=g, block_m=bm, block_n=bn, block_k=bk,
                                          max_concurrent_steps=2, grid_block_n=1)

    # interpreted, the program calls back into the interpreter's Python state (and whether it is interpreted is
    # a context jax does not key on): only the native kernel's executables are cached
    return _cached(f, "ragged_dot_mgpu", bm, bn, bk) if native else jax.jit(f)


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
            fn = _jitted_mgpu(64, 128, 64, True)
            return np.asarray(fn(lhs, rhs, np.asarray(group_sizes, np.int32)))
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks, params

        blocks = (pick_block(m), pick_block(n), pick_block(k))
        if None in blocks:
            raise ValueError(f"ragged_dot_mgpu (interpreted): M, N, K = {m}, {n}, {k} must be multiples of 8")
        fn = _jitted_mgpu(*blocks, False)
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


# ---- tokamax ragged_dot
# tokamax ``ragged_dot`` (lax signature plus ``implementation=``).
#
# ``"xla"`` runs anywhere (it calls ``lax.ragged_dot_general`` accumulating in
# at least float32, then casts). ``"mosaic"`` (Mosaic GPU sm90/sm100, or Mosaic
# TPU v5+) and ``"triton"`` (Pallas Triton) raise ``NotImplementedError: Not
# supported on cpu``: every op checks ``supported_on(device)`` before running,
# so neither the Mosaic TPU op's ``interpret=True`` field nor jax's GPU
# interpret mode can reach them on a CPU. ``"xla"`` also takes qwix QArray operands
# (:class:`~gmm_kernels.adapters.qwix.TokamaxQArrayRaggedDot`, in the ``qwix.ragged_dot`` convention).

_NEEDS = {
    "mosaic": "a Hopper/Blackwell GPU (Mosaic GPU) or a TPU v5+ (Mosaic TPU)",
    "triton": "a GPU (Pallas Triton)",
}


@functools.cache
def _jitted_tokamax(implementation: str, preferred_element_type: Any) -> Any:
    import tokamax

    absl_flags_parsed()

    return _cached(lambda a, b, g: tokamax.ragged_dot(
        a, b, g, preferred_element_type=preferred_element_type, implementation=implementation),
        "tokamax.ragged_dot", implementation, preferred_element_type, libraries=("tokamax",))


class TokamaxRaggedDot(VariantAdapter):
    """``tokamax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=..., implementation=...)``."""

    op = "tokamax.ragged_dot"
    implementations = ("xla", *_NEEDS)
    xla_via = "tokamax 0.0.12 implementation='xla' calls lax.ragged_dot_general"
    convention = "ragged_dot"
    requires = ("jax", "tokamax")
    flush_subnormals = True
    default_precision = True

    def _unavailable(self) -> str | None:
        if self.implementation == "xla":
            return None
        import jax

        if jax.default_backend() == "cpu":
            return (f"tokamax {self.implementation!r} needs {_NEEDS[self.implementation]}; on CPU "
                    "it raises NotImplementedError('Not supported on cpu') and has no interpret mode")
        return None

    def differentiable_fn(self) -> Any:
        import tokamax

        absl_flags_parsed()
        return functools.partial(tokamax.ragged_dot, implementation=self.implementation)

    def _refusal(self, problem: Any) -> str | None:
        if self.implementation == "mosaic" and min(problem.m, problem.k, problem.n) < 128:
            return "tokamax Mosaic TPU needs every non-group dimension >= 128"
        return None

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None,
             preferred_element_type: Any = None) -> np.ndarray:
        if precision is not None:
            raise ValueError("this adapter runs the default precision only")
        ped = None if preferred_element_type is None else np.dtype(preferred_element_type)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            out = _jitted_tokamax(self.implementation, ped)(lhs, rhs, np.asarray(group_sizes, np.int32))
            return np.asarray(out)


# ---- qwix ragged_dot_qt
#: qwix's dynamic quantization of bfloat16 operands for ``ragged_dot_qt`` (``qarray.quantize`` with absmax
#: calibration): scale = amax / 448 computed and stored in bfloat16, a scale below sqrt(bfloat16's smallest
#: normal) replaced by 1, codes = x / scale in bfloat16, clipped to +-448, cast to float8_e4m3fn
def qwix_qt_format(block: Any, across_groups: bool = False) -> Any:
    bf16 = "bfloat16"
    return AmaxQuantizer("float8_e4m3fn", block, scale_dtype=bf16, rule="amax/max", codes="divide", arith=bf16,
                         code_arith=bf16, min_scale=2.0 ** -63, zero_scale=1.0, across_groups=across_groups)


@functools.cache
def _jitted_qt(preferred_element_type: Any) -> Any:
    import jax.numpy as jnp
    from qwix._src.core import ragged_dot_qt

    config = ragged_dot_qt.RaggedDotQtConfig(lhs_qtype=jnp.float8_e4m3fn, rhs_qtype=jnp.float8_e4m3fn)

    def f(lhs: Any, rhs: Any, gs: Any) -> Any:
        return ragged_dot_qt.ragged_dot_qt(lhs, rhs, gs, config, None, preferred_element_type)

    return _cached(f, "qwix.ragged_dot_qt", "float8_e4m3fn", preferred_element_type, libraries=("qwix",))


class QwixRaggedDotQt(KernelAdapter):
    """qwix's quantized-training ``ragged_dot`` (``ragged_dot_qt``, what qwix's QT provider runs for a model's
    ``lax.ragged_dot``): bfloat16 operands quantized inside to float8_e4m3fn with absmax scales, lhs per row,
    rhs per output channel; then ``qwix.ragged_dot`` on the QArrays (its fast path).

    Its declared format is what its source does: the weights' channel scales are taken over every expert at
    once (``channelwise_axes=[2]`` of ``[G, K, N]``: the group axis is reduced), so one expert's large weights
    coarsen every other expert's codes. Declared per expert instead (blocks restarting at every group, as the
    harness's model has them), the same kernel fails as soon as the experts' magnitudes differ: see
    ``tests/gmm_ref/test_quantizers.py``."""

    name = "qwix.ragged_dot_qt"
    convention = "ragged_dot"
    requires = ("jax", "qwix")
    flush_subnormals = True
    scope = Scope(dtypes=("bfloat16",), zero_extents=(),
                  quantizes=(qwix_qt_format("row"), qwix_qt_format("row", across_groups=True)),
                  # the codes' products summed over K in float32, rounded to the bfloat16 of the scales, then each
                  # scale applied in bfloat16 (qwix's fast path on these QArrays)
                  numerics=Numerics(multiply=None, accumulate="bfloat16", promote_every=1 << 31,
                                    partial_accumulate="float32", flush_subnormals=True))

    @property
    def known_issues(self) -> Any:  # type: ignore[override]
        return xla_nan_leak_issues("qwix's ragged_dot_qt calls lax.ragged_dot_general on the codes")

    def _unavailable(self) -> str | None:
        return import_failure("qwix._src.core", "ragged_dot_qt", "qwix's ragged_dot_qt")

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None, preferred_element_type: Any = None
             ) -> Any:
        if precision is not None:
            raise ValueError("this adapter runs the default precision")
        fn = _jitted_qt(None if preferred_element_type is None else np.dtype(preferred_element_type))
        return np.asarray(fn(np.asarray(lhs), np.asarray(rhs), np.asarray(group_sizes, np.int32)))
