"""``qwix.ragged_dot`` with ``QArray`` operands (``qwix.ragged_dot`` convention), on jax's default backend.

qwix picks a path from its operands (qwix 0.1.8, ``qwix/_src/core/ragged_dot.py``):

- ``[fast]``: both operands are QArrays without a zero point. ``lax.ragged_dot_general`` runs on the raw
  codes (K tiles become a batch axis; int8 x int8 accumulates in int32, float8 in the output dtype), then
  each operand's scales multiply the partial sums and the tiles are summed: scales per K block.
- ``[slow]``: anything else (here: the same QArrays with a zero point of 0, which changes no value): both
  operands are dequantized into their scales' dtype (float32 here), then ``lax.ragged_dot_general``.

Both compute with XLA's ragged_dot, so they inherit its CPU NaN leak in the poisoned mode (a known
upstream bug, declared). Each distinct shape compiles once; group sizes are traced.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np

from gmm_kernels.base import KernelAdapter, VariantAdapter, import_failure
from gmm_kernels.convert import device_array
from gmm_kernels.known_issues import xla_nan_leak_issues
from gmm_kernels.scope import Scope
from gmm_ref import AmaxQuantizer, Numerics, Problem

__all__ = ["QwixRaggedDot", "QwixRaggedDotQt", "as_qarray", "qwix_qt_format", "to_jax"]


def to_jax(x: Any) -> Any:
    """An operand of the ``qwix.ragged_dot`` convention (an array, or ``QArrayArgs`` codes and scales) as jax."""
    return tuple(device_array(v) for v in x) if isinstance(x, tuple) else device_array(x)


def as_qarray(x: Any, zero_point: bool = False) -> Any:
    """(codes, scales) as a ``qwix.QArray`` (with a zero point of 0 when ``zero_point``); an array as it is."""
    if not isinstance(x, tuple):
        return x
    import jax.numpy as jnp
    import qwix

    qv, scale = x
    zp = jnp.zeros((1,) * qv.ndim, qv.dtype) if zero_point else None
    return qwix.QArray(qvalue=qv, scale=scale, zero_point=zp)


@functools.cache
def _jitted(preferred_element_type: Any, zero_point: bool) -> Any:
    import jax
    import qwix

    def f(lhs: Any, rhs: Any, gs: Any) -> Any:
        return qwix.ragged_dot(as_qarray(lhs, zero_point), as_qarray(rhs, zero_point), gs,
                               preferred_element_type=preferred_element_type)

    return jax.jit(f)


class QwixRaggedDot(VariantAdapter):
    """``qwix.ragged_dot`` on QArrays: ``[fast]`` (codes, then scales per K tile) or ``[slow]`` (dequantize first)."""

    family = "qwix.ragged_dot"
    implementations = ("fast", "slow")
    xla_via = "qwix.ragged_dot calls lax.ragged_dot_general"
    convention = "qwix.ragged_dot"
    requires: ClassVar[tuple[str, ...]] = ("jax", "qwix")
    flush_subnormals = True

    def __init__(self, implementation: str = "fast") -> None:
        super().__init__(implementation)

    @property
    def known_issues(self) -> Any:  # type: ignore[override]
        from gmm_kernels.known_issues import xla_nan_leak_issues

        return xla_nan_leak_issues(self.xla_via)

    def _refusal(self, problem: Problem) -> str | None:
        if problem.lhs_quant is None or problem.rhs_quant is None:
            return f"{self.name} checks QArray x QArray calls"
        return None

    def numerics_for(self, problem: Problem) -> Numerics:
        """``[fast]``: exact code products into float32 (int32 for int8), scales per K tile; ``[slow]``: the
        dequantized values (code * float32 scale, rounded once) multiplied in float32."""
        if self.scope is not None and self.scope.numerics is not None:
            return self.scope.numerics
        multiply = "float32" if self.implementation == "slow" else None
        return Numerics(multiply=multiply, accumulate="float32", flush_subnormals=True)

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None, preferred_element_type: Any = None,
             group_offset: Any = None) -> Any:
        if precision is not None or group_offset is not None:
            raise ValueError("this adapter runs the default precision and no group_offset")
        fn = _jitted(None if preferred_element_type is None else np.dtype(preferred_element_type),
                     self.implementation == "slow")
        return np.asarray(fn(to_jax(lhs), to_jax(rhs), np.asarray(group_sizes, np.int32)))


#: qwix's dynamic quantization of bfloat16 operands for ``ragged_dot_qt`` (``qarray.quantize`` with absmax
#: calibration): scale = amax / 448 computed and stored in bfloat16, a scale below sqrt(bfloat16's smallest
#: normal) replaced by 1, codes = x / scale in bfloat16, clipped to +-448, cast to float8_e4m3fn
def qwix_qt_format(block: Any, across_groups: bool = False) -> Any:
    bf16 = "bfloat16"
    return AmaxQuantizer("float8_e4m3fn", block, scale_dtype=bf16, rule="amax/max", codes="divide", arith=bf16,
                         code_arith=bf16, min_scale=2.0 ** -63, zero_scale=1.0, across_groups=across_groups)


@functools.cache
def _jitted_qt(preferred_element_type: Any) -> Any:
    import jax
    import jax.numpy as jnp
    from qwix._src.core import ragged_dot_qt

    config = ragged_dot_qt.RaggedDotQtConfig(lhs_qtype=jnp.float8_e4m3fn, rhs_qtype=jnp.float8_e4m3fn)

    def f(lhs: Any, rhs: Any, gs: Any) -> Any:
        return ragged_dot_qt.ragged_dot_qt(lhs, rhs, gs, config, None, preferred_element_type)

    return jax.jit(f)


class QwixRaggedDotQt(KernelAdapter):
    """qwix's quantized-training ``ragged_dot`` (``ragged_dot_qt``, what qwix's QT provider runs for a model's
    ``lax.ragged_dot``): bfloat16 operands quantized inside to float8_e4m3fn with absmax scales, lhs per row,
    rhs per output channel; then ``qwix.ragged_dot`` on the QArrays (its fast path).

    Its declared format is what its source does: the weights' channel scales are taken over every expert at
    once (``channelwise_axes=[2]`` of ``[G, K, N]``: the group axis is reduced), so one expert's large weights
    coarsen every other expert's codes. Declared per expert instead (blocks restarting at every group, as the
    harness's model has them), the same kernel fails as soon as the experts' magnitudes differ: see
    ``property_tests/tests/test_quantizers.py``."""

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
