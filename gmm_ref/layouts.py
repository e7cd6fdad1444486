"""Layouts: map a packed operand buffer to its per-group blocks.

Every block is returned in canonical orientation, ``(m_g, k_g)`` for lhs and
``(k_g, n_g)`` for rhs, as a view whenever the storage allows it; a scaled
operand's block is its dequantized values (float64, exact).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from gmm_ref.problem import Problem

__all__ = ["Block", "blocks", "dequantized", "stored"]


def _ragged_slice(mat: np.ndarray, axis: int, start: int, size: int, packed: bool) -> np.ndarray:
    """Group ``[start, start + size)`` of a 2-D stored matrix ragged along ``axis``."""
    if axis == 0:
        return mat[start:start + size, :]
    if not packed:
        return mat[:, start:start + size]
    rows = mat.shape[0]
    flat = mat.reshape(-1)
    return flat[rows * start: rows * (start + size)].reshape(rows, size)


class Block:
    """One group's operands and where its result goes, at one batch index."""

    __slots__ = ("a", "b", "batch_index", "group", "k", "local", "out_index")

    def __init__(self, group, local, batch_index, a, b, out_index, k):
        self.group = group
        self.local = local
        self.batch_index = batch_index
        self.a = a
        self.b = b
        self.out_index = out_index
        self.k = k


def _operand(p: Problem, which: str, bi: tuple[int, ...], local: int, start: int, size: int) -> np.ndarray:
    facts = p.family_facts
    buf = p.lhs if which == "lhs" else p.rhs
    transposed = p.lhs_transposed if which == "lhs" else p.rhs_transposed
    mat = buf[(local, *bi)] if facts.is_grouped(which) else buf[bi]
    # logical ragged dim of this operand: lhs (M, K) -> 0 or 1; rhs (K, N) -> 0 or 1 (masked: the valid rows of
    # the group's own matrix)
    ragged = facts.ragged_dim(which)
    if ragged is not None:
        stored_axis = ragged if not transposed else 1 - ragged
        mat = _ragged_slice(mat, stored_axis, start, size, p.packed)
    return mat.T if transposed else mat


def blocks(p: Problem) -> Iterator[Block]:
    """Every (batch index, local group) block of the problem, in order."""
    facts = p.family_facts
    for bi in np.ndindex(*p.batch_shape):
        starts, ends = p.spans_at(bi)
        for local, g in enumerate(p.local_groups):
            start, size = int(starts[g]), int(ends[g] - starts[g])
            if not facts.takes_sizes:
                start, size = 0, 0
            a = _operand(p, "lhs", bi, local, start, size)
            b = _operand(p, "rhs", bi, local, start, size)
            if p.lhs_quant is not None:
                a = dequantized(a, p.lhs_quant, p.scales_of("lhs", local), p.global_of("lhs", local))
            if p.rhs_quant is not None:
                b = dequantized(b.T, p.rhs_quant, p.scales_of("rhs", local), p.global_of("rhs", local)).T
            out_index = facts.index("out", local, start, start + size, bi)
            yield Block(g, local, bi, a, b, out_index, a.shape[1])


def dequantized(codes: np.ndarray, quant: Any, scales: np.ndarray, global_scale: float = 1.0) -> np.ndarray:
    """``scale * code`` (times the group's ``global_scale``) of one group's ``[rows, K]`` codes, in float64:
    exact (a code has at most 4 significant bits, int8 7, a scale 24; with a global scale the block scale has at
    most 8 and the global 24; each product fits float64's 53). NaN/Inf codes or scales give NaN/Inf, as a
    kernel's arithmetic would."""
    rows, k = codes.shape
    with np.errstate(invalid="ignore", over="ignore"):
        values = codes.astype(np.float64) * quant.expand(scales, rows, k)
        return values if global_scale == 1.0 else values * global_scale


def stored(a: np.ndarray, kind: str) -> np.ndarray:
    """A fresh, writable array equal to ``a`` laid out as ``kind`` (:data:`gmm_ref.problem.STORAGES`) in its
    last two axes: its own C-contiguous buffer, a transposed view of a contiguous buffer, a slice of a
    buffer 16 bytes wider per row, or the second half of a buffer twice as wide (a chunk of a split).
    Leading strides stay multiples of 16 bytes when ``a``'s rows are."""
    if kind == "contiguous":
        return np.array(a, copy=True, order="C")
    if kind == "transposed":
        return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    cols = a.shape[-1]
    if kind == "slice":
        pad = max(1, 16 // a.dtype.itemsize)
        buf = np.zeros((*a.shape[:-1], cols + pad), a.dtype)
        view = buf[..., :cols]
    elif kind == "chunk":
        buf = np.zeros((*a.shape[:-1], 2 * cols), a.dtype)
        view = buf[..., cols:]
    else:
        raise ValueError(f"kind: expected one of ('contiguous', 'transposed', 'slice', 'chunk'), got {kind!r}")
    view[...] = a
    return view
