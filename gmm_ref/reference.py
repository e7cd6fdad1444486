"""The float64 (int64) reference: one exact block product per group, one rounding.

``compute(problem)`` returns a :class:`Reference` holding

- ``exact``: the result in float64 (int64 for integer inputs), before rounding;
- ``values``: ``exact`` rounded once to the output dtype;
- ``mask``: which elements the problem's policies define (only those are compared);
- ``bound(numerics)``: the per-element error bound of DESIGN.md section 2.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.layouts import blocks
from gmm_ref.numerics import U_REF, Numerics, gamma
from gmm_ref.problem import Problem

__all__ = ["Reference", "compute"]


def _wide(p: Problem) -> type:
    return np.int64 if _dt.is_integer(p.lhs.dtype) else np.float64


def _undefine_outside(p: Problem, mask: np.ndarray) -> None:
    """Rows (ragged_m) or columns (ragged_n) of no local group follow tail/foreign."""
    axis = -2 if p.family == "ragged_m" else -1
    g0, g1 = p.group_offset, p.group_offset + p.num_local_groups
    for bi in np.ndindex(*p.batch_shape):
        off = p.offsets_at(bi)
        spans = []
        if p.foreign == "undefined":
            spans += [(0, off[g0]), (off[g1], off[-1])]
        if p.tail == "undefined":
            spans.append((off[-1], p.ragged_extent))
        for lo, hi in spans:
            idx = [slice(None)] * 2
            idx[axis] = slice(int(lo), int(hi))
            mask[(*bi, *idx)] = False


def compute(p: Problem) -> Reference:
    wide = _wide(p)
    exact = np.zeros(p.out_shape, wide)
    mask = np.ones(p.out_shape, bool)
    accumulate = p.existing_out is not None and p.existing_policy == "accumulate"
    if p.existing_out is not None:
        exact[...] = p.existing_out.astype(wide)
    elif p.family in ("ragged_m", "ragged_n"):
        _undefine_outside(p, mask)
    for blk in blocks(p):
        if p.family == "ragged_k" and blk.k == 0:
            if p.empty == "undefined":
                mask[blk.out_index] = False
            elif p.empty == "untouched" and p.existing_out is None:
                mask[blk.out_index] = False
            elif p.empty == "zero" and not accumulate:
                exact[blk.out_index] = 0
            continue  # 'untouched' keeps existing_out; accumulate adds zero
        if blk.a.shape[0] == 0 or blk.b.shape[1] == 0:
            continue
        a = blk.a.astype(wide, copy=False)
        b = blk.b.astype(wide, copy=False)
        target = exact[blk.out_index]
        if accumulate:
            target += a @ b
        else:
            np.matmul(a, b, out=target)
    return Reference(p, exact, mask)


class Reference:
    """The reference result of one problem."""

    def __init__(self, problem: Problem, exact: np.ndarray, mask: np.ndarray):
        self.problem = problem
        self.exact = exact
        self.mask = mask

    @cached_property
    def values(self) -> np.ndarray:
        """``exact`` rounded once to the output dtype."""
        return _dt.round_to(self.exact, self.problem.out_dtype)

    def default_numerics(self) -> Numerics:
        p = self.problem
        return Numerics.default_for(p.lhs.dtype, p.rhs.dtype, p.out_dtype)

    def bound(self, numerics: Numerics | None = None) -> np.ndarray:
        """Per-element bound on ``|kernel - exact|`` for a kernel with these numerics."""
        p = self.problem
        numerics = numerics or self.default_numerics()
        if not isinstance(numerics, Numerics):
            raise TypeError(f"numerics: expected gmm_ref.Numerics, got {type(numerics).__name__}")
        out = np.zeros(p.out_shape, np.float64)
        if _dt.is_integer(p.out_dtype):
            return out  # integer arithmetic is exact (modulo wrap-around)
        fmt = _dt.float_format(p.out_dtype)
        u_in = numerics.u_in(p.lhs.dtype, p.rhs.dtype)
        u_acc = numerics.u_acc
        in_lim, sum_lim = numerics.exact_limits((p.lhs.dtype, p.rhs.dtype), p.out_dtype)
        accumulate = p.existing_out is not None and p.existing_policy == "accumulate"
        for blk in blocks(p):
            if blk.k == 0 and not accumulate:
                continue
            a = np.abs(blk.a.astype(np.float64))
            b = np.abs(blk.b.astype(np.float64))
            ab = a @ b
            k = blk.k
            operands = [a, b]
            if accumulate:
                ex = np.abs(p.existing_out[blk.out_index].astype(np.float64))
                ab = ab + ex
                operands.append(ex)
                k += 1
            with np.errstate(invalid="ignore", over="ignore"):
                bnd = (2 * u_in + gamma(k, u_acc) + gamma(k + 1, U_REF)) * ab
                bnd += fmt.unit_roundoff * np.abs(self.exact[blk.out_index]) + fmt.tiny
            if all(_integer_valued(x, in_lim) for x in operands):
                bnd = np.where(ab <= sum_lim, 0.0, bnd)
            out[blk.out_index] = bnd
        return out


def _integer_valued(x: np.ndarray, limit: float) -> bool:
    if x.size == 0:
        return True
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.isfinite(x)) and np.all(x == np.rint(x)) and np.max(x) <= limit)
