"""The golden inputs' generator (``splitmix64-v1``): bit-identical values on every machine.

In NumPy ``uint64`` wrapping arithmetic::

    mix(z)   = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
               z *= 0x94D049BB133111EB; z ^ (z >> 31)        # SplitMix64's finalizer
    key      = mix(seed * GAMMA + fnv1a64(operand_name))      # GAMMA = 0x9E3779B97F4A7C15
    bits[i]  = mix(key + (i + 1) * GAMMA)                     # i = flat row-major index

(``bits`` is the i-th output of SplitMix64 started at state ``key``). Values:
``"uniform"``: ``u = (bits >> 11) * 2**-53`` in [0, 1), value ``scale * (2u - 1)``
rounded once to nearest even into the operand dtype (:func:`gmm_ref.round_to`);
``"int"``: ``(bits >> 11) % (2r + 1) - r`` for ``r = int_range`` (exact mode
when sums stay small).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt

__all__ = ["GENERATOR", "raw_bits", "splitmix64", "values"]

GENERATOR = "splitmix64-v1"
GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_U64 = np.uint64


def _mix(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=_U64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _U64(30))) * _U64(_M1)
        z = (z ^ (z >> _U64(27))) * _U64(_M2)
    return z ^ (z >> _U64(31))


def _fnv1a64(text: str) -> int:
    h = 0xCBF29CE484222325
    for byte in text.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def splitmix64(state: int, count: int) -> np.ndarray:
    """The first ``count`` outputs of SplitMix64 started at ``state`` (uint64)."""
    i = np.arange(1, count + 1, dtype=_U64)
    with np.errstate(over="ignore"):
        return _mix(_U64(state & 0xFFFFFFFFFFFFFFFF) + i * _U64(GAMMA))


def raw_bits(seed: int, name: str, count: int) -> np.ndarray:
    """Counter-based uint64 stream for ``(seed, name)``: element i depends only on (seed, name, i)."""
    key = int(_mix(np.array((seed * GAMMA + _fnv1a64(name)) & 0xFFFFFFFFFFFFFFFF, dtype=_U64)))
    return splitmix64(key, count)


def values(seed: int, name: str, shape: Sequence[int], dtype: Any, *, kind: str = "uniform",
           int_range: int = 3, scale: float = 1.0) -> np.ndarray:
    """Operand ``name`` of a case: deterministic values of ``dtype`` (see the module docstring)."""
    dtype = _dt.as_dtype(dtype, name="dtype", codes=True)
    count = int(np.prod(shape, dtype=np.int64))
    top = raw_bits(seed, name, count) >> _U64(11)  # 53 random bits
    if kind == "int":
        if int_range < 0:
            raise ValueError(f"int_range: expected >= 0, got {int_range}")
        v = (top % _U64(2 * int_range + 1)).astype(np.int64) - int_range
        if _dt.is_integer(dtype):
            return v.astype(dtype).reshape(shape)
        return _dt.round_to(v.astype(np.float64), dtype).reshape(shape)
    if kind != "uniform":
        raise ValueError(f"kind: expected 'uniform' or 'int', got {kind!r}")
    if _dt.is_integer(dtype):
        raise ValueError(f"kind: 'uniform' needs a float dtype, got {dtype}; use kind='int'")
    u = top.astype(np.float64) * 2.0 ** -53
    return _dt.round_to(scale * (2.0 * u - 1.0), dtype).reshape(shape)
