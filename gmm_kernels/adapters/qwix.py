"""``qwix.ragged_dot`` with ``QArray`` operands (``qwix.ragged_dot`` convention), on jax's default backend.

qwix picks a path from its operands (qwix 0.1.8, ``qwix/_src/core/ragged_dot.py``):

- ``[fast]``: both operands are QArrays without a zero point. ``lax.ragged_dot_general`` runs on the raw
  codes (K tiles become a batch axis; int8 x int8 accumulates in int32, float8 in the output dtype), then
  each operand's scales multiply the partial sums and the tiles are summed: scales per K block.
- ``[slow]``: anything else (here: the same QArrays with a zero point of 0, which changes no value): both
  operands are dequantized into their scales' dtype (float32 here), then ``lax.ragged_dot_general``.

Both compute with XLA's ragged_dot, so they inherit its CPU NaN leak in the poisoned mode (a known
upstream bug, declared). Each distinct shape compiles once; group sizes are traced. The jitted functions go
through ``gmm_kernels.runtimes.executables``: a shape compiled by an earlier process is loaded, not traced again.

Also here: tokamax's ``ragged_dot`` on QArray operands (:class:`TokamaxQArrayRaggedDot`), the same convention.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np

from gmm_kernels.adapters._tokamax import absl_flags_parsed
from gmm_kernels.base import KernelAdapter, VariantAdapter
from gmm_kernels.runtimes import executables
from gmm_kernels.sandbox.convert import device_array
from gmm_ref import Numerics, Problem

__all__ = ["QwixRaggedDot", "TokamaxQArrayRaggedDot", "as_qarray", "to_jax"]


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
    import qwix

    def f(lhs: Any, rhs: Any, gs: Any) -> Any:
        return qwix.ragged_dot(as_qarray(lhs, zero_point), as_qarray(rhs, zero_point), gs,
                               preferred_element_type=preferred_element_type)

    return executables.cached(f, name="qwix.ragged_dot", static=(preferred_element_type, zero_point),
                              modules=(__name__,), libraries=("qwix",))


class QwixRaggedDot(VariantAdapter):
    """``qwix.ragged_dot`` on QArrays: ``[fast]`` (codes, then scales per K tile) or ``[slow]`` (dequantize first)."""

    op = "qwix.ragged_dot"
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


# ---- tokamax ragged_dot on QArrays
@functools.cache
def _jitted_qarray(preferred_element_type: Any) -> Any:
    import tokamax

    absl_flags_parsed()
    return executables.cached(lambda a, b, g: tokamax.ragged_dot(
        as_qarray(a), as_qarray(b), g, preferred_element_type=preferred_element_type, implementation="xla"),
        name="tokamax.ragged_dot[QArray]", static=(preferred_element_type,), modules=(__name__,),
        libraries=("tokamax", "qwix"))


class TokamaxQArrayRaggedDot(KernelAdapter):
    """``tokamax.ragged_dot(..., implementation="xla")`` with QArray operands (``qwix.ragged_dot`` convention).

    tokamax 0.0.12's XLA op dequantizes each QArray first (``quantization.as_array``: code * scale in the scale's
    dtype, float32 here), then calls ``lax.ragged_dot_general`` accumulating in float32."""

    name = "tokamax.ragged_dot[xla,QArray]"
    convention = "qwix.ragged_dot"
    requires = ("jax", "tokamax", "qwix")

    @property
    def known_issues(self) -> Any:  # type: ignore[override]
        from gmm_kernels.known_issues import xla_nan_leak_issues

        return xla_nan_leak_issues("tokamax 0.0.12 implementation='xla' calls lax.ragged_dot_general")

    def numerics_for(self, problem: Any) -> Numerics:
        """Dequantized values (code * float32 scale, rounded once) multiplied in float32."""
        if self.scope is not None and self.scope.numerics is not None:
            return self.scope.numerics
        return Numerics(multiply="float32", accumulate="float32", flush_subnormals=True)

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None, preferred_element_type: Any = None,
             group_offset: Any = None) -> np.ndarray:
        if precision is not None or group_offset is not None:
            raise ValueError("this adapter runs the default precision and no group_offset")
        ped = None if preferred_element_type is None else np.dtype(preferred_element_type)
        return np.asarray(_jitted_qarray(ped)(to_jax(lhs), to_jax(rhs), np.asarray(group_sizes, np.int32)))
