"""Layouts: map a packed operand buffer to its per-group blocks, name a layout, and say where a storage puts it.

Every block is returned in canonical orientation, ``(m_g, k_g)`` for lhs and
``(k_g, n_g)`` for rhs, as a view whenever the storage allows it; a scaled
operand's block is its dequantized values (float64, exact). A layout
(``lhs_transposed, rhs_transposed, packed``) has a name (:func:`layout_name`:
``plain``, ``lhsT``, ``rhsT+packed``, ...), and an operand stored as one of
``gmm_ref.problem.STORAGES`` (:func:`stored`) has a byte offset into its buffer and
byte strides (:func:`stored_geometry`) that a kernel may need aligned
(:func:`misalignment`, :func:`aligned_multiples`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from gmm_ref.families import DIMS
from gmm_ref.problem import Problem

__all__ = ["LAYOUT_NAMES", "SLICE_PAD_BYTES", "Block", "aligned_multiples", "blocks", "dequantized", "layout_name",
           "misalignment", "named", "stored", "stored_geometry"]

#: how much wider than the operand's rows a slice's buffer rows are (:func:`stored`)
SLICE_PAD_BYTES = 16


def layout_name(layout: tuple[bool, bool, bool]) -> str:
    """``plain``, or the operands stored transposed and whether one is packed, joined: ``lhsT+rhsT``, ``packed``."""
    lt, rt, packed = layout
    parts = [p for p, on in (("lhsT", lt), ("rhsT", rt), ("packed", packed)) if on]
    return "+".join(parts) or "plain"


def named(layouts: tuple[tuple[bool, bool, bool], ...], names: tuple[str, ...] | None
          ) -> tuple[tuple[bool, bool, bool], ...]:
    """Those of ``layouts`` whose :func:`layout_name` is one of ``names`` (None: all of them), in their order."""
    return tuple(x for x in layouts if names is None or layout_name(x) in names)


#: every layout's name, in the conventions' order (plain, rhsT, lhsT, lhsT+rhsT, then packed ones)
LAYOUT_NAMES = tuple(layout_name((lt, rt, packed)) for packed in (False, True) for lt in (False, True)
                     for rt in (False, True))


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
        pad = max(1, SLICE_PAD_BYTES // a.dtype.itemsize)
        buf = np.zeros((*a.shape[:-1], cols + pad), a.dtype)
        view = buf[..., :cols]
    elif kind == "chunk":
        buf = np.zeros((*a.shape[:-1], 2 * cols), a.dtype)
        view = buf[..., cols:]
    else:
        raise ValueError(f"kind: expected one of ('contiguous', 'transposed', 'slice', 'chunk'), got {kind!r}")
    view[...] = a
    return view


def stored_geometry(shape: tuple[int, ...], itemsize: int, kind: str) -> tuple[int, tuple[int, ...]]:
    """(byte offset into its own buffer, byte strides) of an operand of ``shape`` and ``itemsize`` laid out by
    :func:`stored` as ``kind``, as a kernel gets it: a chunk starts one row's width into its buffer, the other
    storages at its start; a view that is contiguous after all (no element, one row, a column of one) is copied
    by itself, with its own standard strides, as ``gmm_kernels.sandbox`` copies the arguments it hands a kernel."""
    shape = tuple(int(d) for d in shape)
    lead, (rows, cols) = shape[:-2], shape[-2:]
    buffer = {"transposed": (*lead, cols, rows), "slice": (*lead, rows, cols + max(1, SLICE_PAD_BYTES // itemsize)),
              "chunk": (*lead, rows, 2 * cols)}.get(kind, shape)
    strides = _c_strides(buffer, itemsize)
    if kind == "transposed":
        strides = (*strides[:-2], strides[-1], strides[-2])
    # numpy's own contiguity rules, on a view that touches no memory
    probe = np.lib.stride_tricks.as_strided(np.empty(1, f"V{itemsize}"), shape, strides)
    if probe.size == 0 or probe.flags.c_contiguous:
        return 0, _c_strides(shape, itemsize)
    if probe.flags.f_contiguous:
        return 0, _c_strides(shape[::-1], itemsize)[::-1]
    return (cols * itemsize if kind == "chunk" else 0), strides


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def misalignment(shape: tuple[int, ...], offset: int, strides: tuple[int, ...], itemsize: int,
                 alignment: int) -> str | None:
    """What of an array of ``shape`` at byte ``offset`` into its buffer with byte ``strides`` is not a multiple of
    ``alignment`` bytes: its offset, or the stride of an axis of more than one element other than its unit one (the
    innermost such axis whose stride is one element, as torch's ``_grouped_mm`` reads it); None where all are, and for
    an array of no element (none of its addresses is read)."""
    if 0 in shape:
        return None
    if offset % alignment:
        return f"a byte offset of {offset}"
    used = [i for i, d in enumerate(shape) if d > 1]  # an axis of one element never moves the address
    unit = max((i for i in used if strides[i] == itemsize), default=None)
    for i in used:
        if i != unit and strides[i] % alignment:
            return f"a stride of {strides[i]} bytes (axis {i})"
    return None


def aligned_multiples(layout: tuple[bool, bool, bool], itemsize: int, alignment: Mapping[str, int]) -> dict[str, int]:
    """axis -> what its extent must be a multiple of so that each operand's rows (its stored last axis, in
    ``layout``, of ``itemsize`` bytes) span a multiple of ``alignment[operand]`` bytes."""
    out: dict[str, int] = {}
    for operand, transposed in (("lhs", layout[0]), ("rhs", layout[1])):
        need = alignment.get(operand, 1)
        axis = DIMS[operand][0 if transposed else 1]
        out[axis] = math.lcm(out.get(axis, 1), need // math.gcd(need, itemsize))
    return out
