"""What a kernel declares about its arithmetic, and the error bound it earns.

For every defined output element (DESIGN.md section 2)::

    bound = (2*u_in + gamma(K_ij, u_acc) + gamma(K_ij + 1, u_ref)) * (|A||B|)_ij
            + u_out * |C_ij| + tiny_out

``u_ref = 2**-53`` accounts for the float64 reference itself (its products
are exact for inputs of float32 or narrower; its sums are not). When every
input of an element's group is an integer small enough for the multiply
precision, and ``(|A||B|)_ij`` fits the accumulator's and output's
significands, every partial sum is exact whatever the order: the bound is 0
and the kernel must match bit for bit (exact mode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt

__all__ = ["Numerics", "gamma"]

U_REF = 2.0 ** -53


def gamma(k: Any, u: float) -> Any:
    """``k*u / (1 - k*u)``, the classical bound on k roundings of unit roundoff u."""
    ku = np.asarray(k, dtype=np.float64) * u
    with np.errstate(divide="ignore"):
        return np.where(ku < 1, ku / np.maximum(1 - ku, 1e-300), np.inf)


def _representable(src: np.dtype, dst: np.dtype) -> bool:
    """Whether every finite value of ``src`` is exact in ``dst``."""
    if _dt.is_integer(src):
        bits = np.iinfo(src).bits
        return _dt.is_integer(dst) or _dt.float_format(dst).mant + 1 >= bits - 1
    if _dt.is_integer(dst):
        return False
    s, d = _dt.float_format(src), _dt.float_format(dst)
    return s.mant <= d.mant and s.emax <= d.emax and s.emin - s.mant >= d.emin - d.mant


@dataclass(frozen=True)
class Numerics:
    """A kernel's arithmetic: the precision it multiplies in and its accumulator.

    ``multiply=None`` means products are formed exactly (as float32 or
    narrower inputs multiplied into a float32 accumulator are); a dtype means
    the inputs pass through it first (e.g. bfloat16 for TPU DEFAULT precision).
    """

    multiply: Any = None
    accumulate: Any = np.float32
    #: subnormal inputs, products, partial sums and outputs may be flushed to zero
    #: (FTZ/DAZ, as XLA on CPU and most GPU/TPU paths do): widens the bound by the
    #: flushed terms and the smallest normals of the accumulator and the output.
    flush_subnormals: bool = False

    def __post_init__(self) -> None:
        if self.multiply is not None:
            object.__setattr__(self, "multiply", _dt.as_dtype(self.multiply, name="multiply"))
        object.__setattr__(self, "accumulate", _dt.as_dtype(self.accumulate, name="accumulate"))
        if not isinstance(self.flush_subnormals, (bool, np.bool_)):
            raise TypeError(f"flush_subnormals: expected a bool, got {self.flush_subnormals!r}")

    @classmethod
    def default_for(cls, lhs_dtype: Any, rhs_dtype: Any, out_dtype: Any) -> Numerics:
        """Exact products, accumulation in the widest of float32, inputs and output."""
        dts = [np.dtype(lhs_dtype), np.dtype(rhs_dtype), np.dtype(out_dtype)]
        if all(_dt.is_integer(d) for d in dts):
            return cls(multiply=None, accumulate=np.int32)
        wide = np.float64 if np.dtype(np.float64) in dts else np.float32
        return cls(multiply=None, accumulate=wide)

    def u_in(self, *input_dtypes: Any) -> float:
        if self.multiply is None:
            return 0.0
        if all(_representable(np.dtype(d), self.multiply) for d in input_dtypes):
            return 0.0
        return _dt.unit_roundoff(self.multiply)

    @property
    def u_acc(self) -> float:
        return _dt.unit_roundoff(self.accumulate)

    def exact_limits(self, input_dtypes: tuple[Any, ...], out_dtype: Any) -> tuple[float, float]:
        """(largest |input|, largest |A||B|) for which integer inputs compute exactly."""
        def sig_limit(dtype: Any) -> float:
            dtype = np.dtype(dtype)
            if _dt.is_integer(dtype):
                return float(np.iinfo(dtype).max)
            return 2.0 ** (_dt.float_format(dtype).mant + 1)

        in_limit = min(sig_limit(d) for d in input_dtypes)
        if self.multiply is not None:
            in_limit = min(in_limit, sig_limit(self.multiply))
        sum_limit = min(sig_limit(self.accumulate), sig_limit(out_dtype))
        return in_limit, sum_limit


def min_normal(dtype: Any) -> float:
    """The smallest positive normal number of a float dtype (0 for integers)."""
    dtype = np.dtype(dtype)
    return 0.0 if _dt.is_integer(dtype) else 2.0 ** _dt.float_format(dtype).emin
