"""``torch._grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None)`` in its four forms.

Rows (2d x 3d) or columns (3d x 2d) past ``offs[-1]`` are never written, on
CUDA and on CPU alike (the output is ``torch.empty``): undefined. Every
operand's leading stride must be a multiple of 16 bytes; operands may be
strided views (a transposed view, a slice, a chunk of a split); ``out_dtype``
equals the input dtype, or float32 from bfloat16; no bias.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gmm_ref.conventions import base
from gmm_ref.conventions.base import Convention
from gmm_ref.problem import RAGGED_FAMILIES as FAMILIES
from gmm_ref.problem import Problem

__all__ = ["GROUPED_MM", "grouped_mm"]


def _sizes_from_offsets(offs: Any) -> np.ndarray:
    o = base.as_sizes("offs", offs)
    if o.size and np.any(np.diff(o) < 0):
        raise ValueError(f"offs: expected non-decreasing cumulative group ends, got {o.tolist()}")
    if o.size and o[0] < 0:
        raise ValueError(f"offs: expected non-negative cumulative group ends, got {o.tolist()}")
    return np.diff(np.concatenate([[0], o])).astype(np.int64)


class _GroupedMM(Convention):
    def parse(self, mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Problem:
        """``torch._grouped_mm`` in its four forms.

        2d x 3d: ``[sum M, K] x [G, K, N] -> [sum M, N]``; 3d x 2d:
        ``[G, M, K] x [K, sum N] -> [M, sum N]``; 2d x 2d: ``[M, sum K] x [sum K, N]
        -> [G, M, N]``; 3d x 3d: batched, no ``offs``. ``offs`` are int32
        cumulative group ends; elements past ``offs[-1]`` are undefined.
        """
        a, b = base.as_array("mat_a", mat_a), base.as_array("mat_b", mat_b)
        base.expect_ndim("mat_a", a, (2, 3))
        base.expect_ndim("mat_b", b, (2, 3))
        if bias is not None:
            raise ValueError("bias: torch._grouped_mm does not support bias; expected None")
        out = base.optional_dtype("out_dtype", out_dtype)
        if a.ndim == 3 and b.ndim == 3:
            if offs is not None:
                raise ValueError("offs: must be None for 3d x 3d (batched) grouped_mm")
            if a.shape[0] != b.shape[0]:
                raise ValueError(f"mat_b: expected {a.shape[0]} groups on axis 0 (as mat_a), got {b.shape[0]}")
            return Problem("batch", a, b, None, out_dtype=out, convention=self.name, **self.policies("batch"))
        if offs is None:
            raise ValueError(f"offs: required when mat_a or mat_b is 2-D (got {a.ndim}d x {b.ndim}d)")
        sizes = _sizes_from_offsets(offs)
        family = {(2, 3): "ragged_m", (3, 2): "ragged_n", (2, 2): "ragged_k"}[(a.ndim, b.ndim)]
        grouped = ("mat_b", b) if b.ndim == 3 else ("mat_a", a) if a.ndim == 3 else None  # the 3-D operand
        if grouped is not None and grouped[1].shape[0] != sizes.size:
            raise ValueError(
                f"{grouped[0]}: expected {sizes.size} groups on axis 0 (len(offs)), got {grouped[1].shape[0]}")
        return Problem(family, a, b, sizes, out_dtype=out, convention=self.name, **self.policies(family))

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        gs = base.sizes32(p)
        offs = None if gs is None else np.cumsum(gs).astype(np.int32)
        return (p.lhs, p.rhs), {"offs": offs, "out_dtype": p.out_dtype}


GROUPED_MM = _GroupedMM(
    name="torch.grouped_mm", framework="torch", families=FAMILIES, layouts=tuple((f, base.PLAIN) for f in FAMILIES),
    # out_dtype float32 from bfloat16 is documented (the CUDA path takes it; torch 2.13's CPU path refuses it)
    dtype_pairs=(("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16"), ("bfloat16", "float32")),
    listed_pairs_only=True, tail="undefined", empty="zero", strided=True,
    # every operand's and the output's leading stride is a multiple of 16 bytes
    multiple_of=(("k", "16B"), ("n", "16B")),
    # a nominal tile (the CPU path has none; CUDA kernels tile by 64 or 128): extents are drawn around
    # its edges, far enough apart that a 16-byte step (8 bfloat16) still lands off them
    default_tiling=(32, 32, 32),
    summary="torch._grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None): 2d/3d x 2d/3d",
)
grouped_mm = base.front_end(GROUPED_MM, "grouped_mm")
