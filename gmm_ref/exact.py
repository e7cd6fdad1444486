"""The float64 (int64) reference: one exact block product per group, one rounding.

``reference(problem)`` returns a :class:`Reference` holding

- ``exact``: the result in float64 (int64 for integer inputs), before rounding;
- ``values``: ``exact`` rounded once to the output dtype;
- ``mask``: which elements the problem's policies define (only those are compared);
- ``bound(numerics)``: the per-element error bound (docs/numerics.md).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.layouts import blocks
from gmm_ref.numerics import Numerics, default_numerics, error_bound
from gmm_ref.problem import Problem
from gmm_ref.scaled.model import rounded_product

__all__ = ["Reference", "reference"]


def _wide(p: Problem) -> type:
    return np.int64 if _dt.is_integer(p.lhs.dtype) and not p.scaled else np.float64


def _undefine_outside(p: Problem, mask: np.ndarray) -> None:
    """Rows (ragged_m) or columns (ragged_n) of no local group follow tail/foreign; so do the rows of no group of
    the serving layouts (past a group's valid count, padding between groups, past the last group)."""
    facts = p.family_facts
    if facts.serving:
        if p.tail == "undefined":
            covered = np.zeros(mask.shape, bool)
            starts, ends = p.spans_at(())
            for g in range(p.num_groups):
                covered[facts.index("out", g, int(starts[g]), int(ends[g]))] = True
            mask &= covered
        return
    axis = -2 if facts.ragged_dim("out") == 0 else -1
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


class _Scratch:
    """Reusable conversion buffers, so that no block allocates (or page-faults) anew."""

    def __init__(self, dtype: type):
        self.dtype = np.dtype(dtype)
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, role: str, shape: tuple[int, int]) -> np.ndarray:
        n = shape[0] * shape[1]
        buf = self._bufs.get(role)
        if buf is None or buf.size < n:
            buf = self._bufs[role] = np.empty(max(n, 1), self.dtype)
        return buf[:n].reshape(shape)

    def wide(self, role: str, x: np.ndarray) -> np.ndarray:
        """``x`` in the wide dtype: itself if it already is, else a converted copy in a buffer."""
        if x.dtype == self.dtype:
            return x
        out = self.get(role, x.shape)
        np.copyto(out, x, casting="unsafe")  # exact: every input value is representable
        return out


# Rows of lhs converted at once: bounds the scratch memory (~4 MiB at K=512) while
# keeping every BLAS call large enough to run at full speed.
CHUNK_ELEMENTS = 1 << 19


def _product(a: np.ndarray, b: np.ndarray, target: np.ndarray, accumulate: bool, scratch: _Scratch) -> None:
    """``target = a @ b`` (or ``+=``), exactly-converted inputs, no full-size temporaries."""
    wb = scratch.wide("b", b)
    m, k = a.shape
    rows = max(1, CHUNK_ELEMENTS // max(k, 1))
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        wa = scratch.wide("a", a[r0:r1])
        if accumulate:
            tmp = scratch.get("t", (r1 - r0, b.shape[1]))
            np.matmul(wa, wb, out=tmp)
            target[r0:r1] += tmp
        else:
            np.matmul(wa, wb, out=target[r0:r1])


def reference(p: Problem) -> Reference:
    """The reference of ``p``: exact values (float64/int64), defined-mask; rounding and bound lazily."""
    if not isinstance(p, Problem):
        raise TypeError(f"problem: expected a gmm_ref.Problem, got {type(p).__name__}")
    wide = _wide(p)
    exact = np.zeros(p.out_shape, wide)
    mask = np.ones(p.out_shape, bool)
    accumulate = p.existing_out is not None and p.existing_policy == "accumulate"
    if p.existing_out is not None:
        np.copyto(exact, p.existing_out, casting="unsafe")
    elif p.family_facts.ragged_out:
        _undefine_outside(p, mask)
    jobs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for blk in blocks(p):
        if p.family_facts.ragged_contraction and blk.k == 0:
            if p.empty == "undefined" or (p.empty == "untouched" and p.existing_out is None):
                mask[blk.out_index] = False
            elif p.empty == "zero" and not accumulate:
                exact[blk.out_index] = 0
            continue  # 'untouched' keeps existing_out; accumulate adds zero
        if blk.a.shape[0] == 0 or blk.b.shape[1] == 0:
            continue
        target = exact[blk.out_index]
        if blk.k == 0:  # K = 0: the product is an exact zero
            if not accumulate:
                target[...] = 0
            continue
        jobs.append((blk.a, blk.b, target))
    _run_products(jobs, accumulate, wide)
    return Reference(p, exact, mask)


# Below this many multiply-adds the products run in this thread (threads cost more than they save).
PARALLEL_MIN_MACS = 1 << 27


def _run_products(jobs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], accumulate: bool, wide: type) -> None:
    """Every block product; large problems of several groups run on one thread per core, each
    with single-threaded BLAS: small per-group GEMMs and the conversions to float64 scale far
    better that way than inside one multi-threaded BLAS call. Targets are disjoint."""
    def work(part: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        scratch = _Scratch(wide)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf inputs propagate as IEEE says
            for a, b, target in part:
                _product(a, b, target, accumulate, scratch)

    workers = min(os.cpu_count() or 1, 4, len(jobs))
    macs = sum(a.shape[0] * a.shape[1] * b.shape[1] for a, b, _ in jobs)
    limits = _single_threaded_blas() if workers > 1 and macs >= PARALLEL_MIN_MACS else None
    if limits is None:
        work(jobs)
        return
    parts: list[list] = [[] for _ in range(workers)]
    loads = [0] * workers
    for job in sorted(jobs, key=lambda j: -j[0].shape[0] * j[0].shape[1] * j[1].shape[1]):
        i = loads.index(min(loads))  # largest first onto the least loaded worker
        parts[i].append(job)
        loads[i] += job[0].shape[0] * job[0].shape[1] * job[1].shape[1]
    with limits, ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, parts))


def _single_threaded_blas() -> Any:
    """A context limiting BLAS to one thread (threadpoolctl), or None when it is not installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=1, user_api="blas")


def _round_scaled(p: Problem, exact: np.ndarray, values: np.ndarray) -> None:
    """Each group's finite results of a scaled problem from its exact sum, rounded once (the float64 ``exact``
    rounds each product and sum; rounding that again could differ in the last place)."""
    for blk in blocks(p):
        if blk.k == 0 or blk.a.shape[0] == 0 or blk.b.shape[1] == 0:
            continue
        finite = np.isfinite(blk.a).all(axis=1)[:, None] & np.isfinite(blk.b).all(axis=0)[None, :]
        a = np.nan_to_num(blk.a, nan=0.0, posinf=0.0, neginf=0.0)
        b = np.nan_to_num(blk.b, nan=0.0, posinf=0.0, neginf=0.0)
        rounded = rounded_product(a, b, p.out_dtype)
        if rounded is None:
            continue
        target = values[blk.out_index]
        ok = finite & np.isfinite(exact[blk.out_index])
        target[ok] = rounded[ok].astype(values.dtype)


class Reference:
    """The reference result of one problem: ``exact`` (float64/int64), ``mask``, and lazily
    ``values`` (rounded once to the output dtype) and ``bound(numerics)``."""

    def __init__(self, problem: Problem, exact: np.ndarray, mask: np.ndarray):
        self.problem = problem
        self.exact = exact
        self.mask = mask

    @cached_property
    def values(self) -> np.ndarray:
        """``exact`` rounded once to the output dtype (for a scaled problem, the exact sum rounded once)."""
        values = _dt.round_to(self.exact, self.problem.out_dtype)
        if self.problem.scaled:
            _round_scaled(self.problem, self.exact, values)
        return values

    def default_numerics(self) -> Numerics:
        return default_numerics(self.problem)

    def bound(self, numerics: Numerics | None = None) -> np.ndarray:
        """Per-element bound on ``|kernel - exact|`` for a kernel with these numerics
        (default: exact products, an accumulator as wide as float32 or the widest dtype)."""
        return error_bound(self.problem, self.exact, numerics or self.default_numerics())
