"""``qwix.ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None)``
with quantized (``QArray``) operands.

``lhs`` is ``[T, K]`` ragged along T, ``rhs`` ``[G, K, N]``; each is a plain
array or a ``QArray``: codes (``qvalue``, float8_e4m3fn, int8 or int4; int8
activations may meet int4 weights) and scales of
the same rank whose shape divides the codes' (each scale covers a tile).
The scaled forms modelled here:

=====================  =========================  ===========================
operand                scale shape                block (``[rows, K]`` view)
=====================  =========================  ===========================
lhs per row            ``[T, 1]``                 ``row``
lhs per row, K tiles   ``[T, K / t]``             ``(1, t)``
rhs per channel        ``[G, 1, N]``              ``row`` (a row is a column n)
rhs per channel tiles  ``[G, K / t, N]``          ``(1, t)``
rhs per group          ``[G, 1, 1]``              ``tensor``
=====================  =========================  ===========================

A scale tile spanning several lhs rows would cross group boundaries, which the
model's blocks do not (they restart at every group): such a call is refused.
Rows past ``sum(group_sizes)`` are zero (qwix computes them with
``lax.ragged_dot_general``); their scale slots hold 1 in the arguments built
here (qwix multiplies every row of the product by its scale, so a NaN there
would reach the tail). Strategies draw ``(1, 16)`` tiles, so K is a multiple
of 16; no extent is 0 (qwix 0.1.8 raises on a zero-size axis: its scale
broadcast divides by it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.conventions import base
from gmm_ref.conventions.base import Convention
from gmm_ref.problem import Problem
from gmm_ref.scaled.model import Quantization

__all__ = ["QARRAY_QUANTIZATIONS", "QWIX_RAGGED_DOT", "QArrayArgs", "qwix_ragged_dot"]

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
INT4 = np.dtype(ml_dtypes.int4)
TILE = 16


class QArrayArgs(NamedTuple):
    """A ``qwix.QArray`` as NumPy: its codes and scales (a kernel adapter builds the real one)."""

    qvalue: np.ndarray
    scale: np.ndarray


def _pairs() -> tuple[tuple[Quantization, Quantization], ...]:
    out = []
    for elem in (E4M3, np.dtype(np.int8), INT4):
        row, tiled = Quantization(elem, np.float32, "row"), Quantization(elem, np.float32, (1, TILE))
        out += [(row, row), (tiled, tiled), (row, Quantization(elem, np.float32, "tensor"))]
    # int8 activations x int4 weights (w4a8): int32 sums of the mixed codes
    out += [(Quantization(np.int8, np.float32, "row"), Quantization(INT4, np.float32, "row"))]
    return tuple(out)


#: the (lhs, rhs) quantizations strategies draw: per row x per channel, K tiles of 16, per row x per group
QARRAY_QUANTIZATIONS = _pairs()


def _split(name: str, x: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """(codes, scales) of a QArray-like (anything with ``qvalue`` and ``scale``), (array, None) otherwise."""
    if hasattr(x, "qvalue") and hasattr(x, "scale"):
        if getattr(x, "zero_point", None) is not None:
            raise ValueError(f"{name}: a QArray with a zero_point (asymmetric quantization) is not modelled")
        codes, scales = base.as_array(f"{name}.qvalue", x.qvalue), base.as_array(f"{name}.scale", x.scale)
        if codes.ndim != scales.ndim or any(s == 0 or c % s for c, s in zip(codes.shape, scales.shape,
                                                                              strict=True)):
            raise ValueError(f"{name}.scale: expected the rank of qvalue {codes.shape} and a shape dividing it, "
                             f"got {scales.shape}")
        return codes, scales
    return base.as_array(name, x), None


def _block(name: str, extent: int, count: int, row_axis: bool) -> int | None:
    """One axis of a block: None (one scale over the whole extent) or the tile size."""
    if count == extent and row_axis:
        return 1
    if count == 1:
        return None
    if row_axis:
        raise ValueError(f"{name}: a scale per {extent // count} rows spans group boundaries; the harness models "
                         "blocks that restart at every group (per row, or one per group)")
    return extent // count


class _QwixRaggedDot(Convention):
    def parse(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None, preferred_element_type: Any = None,
              group_offset: Any = None) -> Problem:
        """``qwix.ragged_dot``: ``[T, K] x [G, K, N] -> [T, N]``, each operand a plain array or a QArray."""
        a, sa = _split("lhs", lhs)
        b, sb = _split("rhs", rhs)
        base.expect_ndim("lhs", a, 2)
        base.expect_ndim("rhs", b, 3)
        if group_offset is not None:
            raise ValueError("group_offset: not modelled for qwix.ragged_dot (jax's CPU ragged_dot takes none)")
        if precision is not None:
            raise ValueError("precision: the reference is exact; expected None")
        sizes = base.as_sizes("group_sizes", group_sizes)
        if b.shape[0] != sizes.size:
            raise ValueError(f"rhs: expected {sizes.size} groups on axis 0 (len(group_sizes)), got {b.shape[0]}")
        out = base.optional_dtype("preferred_element_type", preferred_element_type)
        extra: dict[str, Any] = {}
        ends = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        g, k, n = b.shape
        if sa is not None:
            rows = _block("lhs.scale", a.shape[0], sa.shape[0], True)
            tile = _block("lhs.scale", k, sa.shape[1], False)
            if rows is None:  # one scale for every row: the same block in every group
                blocks = [sa.reshape(1, -1)] * g
                q = Quantization(a.dtype, sa.dtype, (None, tile))
            else:
                blocks = [sa[ends[i]:ends[i + 1]] for i in range(g)]
                q = Quantization(a.dtype, sa.dtype, (1, tile))
            extra.update(lhs_quant=q, lhs_scales=blocks)
        if sb is not None:
            full = np.broadcast_to(sb, (g, sb.shape[1], sb.shape[2]))
            rows = _block("rhs.scale", n, sb.shape[2], True)
            tile = _block("rhs.scale", k, sb.shape[1], False)
            q = Quantization(b.dtype, sb.dtype, (rows, tile))
            extra.update(rhs_quant=q, rhs_scales=[np.swapaxes(full[i], 0, 1) for i in range(g)])
        if out is None:  # qwix: the scales' dtype, bfloat16 for float8 and int32 for int8 plain operands
            dts = [(sa if sa is not None else a).dtype, (sb if sb is not None else b).dtype]
            dts = [np.dtype(np.int32) if d.itemsize == 1 and _dt.is_integer(d) else
                   np.dtype(ml_dtypes.bfloat16) if d.itemsize == 1 else d for d in dts]
            out = np.result_type(*dts) if ml_dtypes.bfloat16 not in dts else np.dtype(ml_dtypes.bfloat16)
        return Problem("ragged_m", a, b, sizes, out_dtype=out, convention=self.name,
                       **self.policies("ragged_m"), **extra)

    def _refusal(self, p: Problem) -> str | None:
        if p.lhs_quant is not None and p.lhs_quant.block[0] is None:
            return f"{self.name}: an lhs scale shared by every group is one array, not one per group"
        return None

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        g = p.num_groups
        lhs: Any = p.lhs
        rhs: Any = p.rhs
        if p.lhs_quant is not None:
            parts = [p.scales_of("lhs", i) for i in range(g)]
            width = p.lhs_quant.scale_shape(p.m, p.k)[1]
            # rows past the groups: scale 1. The tail must come out zero, and qwix multiplies every row of
            # the product by its scale (a NaN there would make the tail NaN: qwix reads the slot, as it may)
            tail = np.ones((p.m - int(p.group_sizes.sum()), width), np.float64).astype(p.lhs_quant.scale)
            lhs = QArrayArgs(p.lhs, np.concatenate([*parts, tail]))
        if p.rhs_quant is not None:
            blocks = [np.swapaxes(p.scales_of("rhs", i), 0, 1) for i in range(g)]
            shape = p.rhs_quant.scale_shape(p.n, p.k)[::-1]  # [K tiles, N] per group
            rhs = QArrayArgs(p.rhs, np.stack(blocks) if g else np.zeros((0, *shape), p.rhs_quant.scale))
        return (lhs, rhs, base.sizes32(p)), {"preferred_element_type": p.out_dtype}


QWIX_RAGGED_DOT = _QwixRaggedDot(
    name="qwix.ragged_dot", framework="jax", families=("ragged_m",), layouts=(("ragged_m", base.PLAIN),),
    dtype_pairs=((E4M3, np.float32), (np.int8, np.float32), (np.int8, ml_dtypes.bfloat16), (INT4, np.float32),
                 (INT4, ml_dtypes.bfloat16)),
    listed_pairs_only=True, tail="zero", empty="zero",
    multiple_of=(("k", TILE),), default_tiling=(32, 32, 32), zero_extents=(),
    quantizations=QARRAY_QUANTIZATIONS,
    summary="qwix.ragged_dot(lhs, rhs, group_sizes, ...): QArray (codes + tiled scales) x QArray",
)
qwix_ragged_dot = base.front_end(QWIX_RAGGED_DOT, "qwix_ragged_dot")
