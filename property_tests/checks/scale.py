"""The ``scale`` mode: group counts and row counts past the limits real kernels hard-code.

Real MoE shapes cross absolute limits that kernels bake in: Qwen3 routes to 128 experts, DeepSeek-V3 to 256,
Kimi K2 to 384, some models to 896; a prefill batch puts 65,536 rows and more through one call, and one hot
expert can hold more than 65,535 of them. Kernels put rows on a CUDA grid axis capped at 65,535 blocks, scan
experts in one block of 512 or 1,024 threads, keep weight-pointer tables of 128; they pass every test with a
few groups and a few hundred rows. The covering design reaches every *relation* between extents and tiles, at
small absolute sizes; this mode adds the absolute sizes, cheaply:

- per family the kernel takes (ragged M, N, K, batch, masked): one cell per group count just past a limit
  (129, 257, 384, 513, 896, 1,025; each group 1 to 3 rows of the ragged axis, every tenth one empty), one
  cell of 65,664 rows in one call of 3 groups, 65,600 of them in the middle group (past 65,535 in the call
  and in one group: a grid capped at 65,535 blocks of either drops rows); for a convention with sharded
  groups, 1,026 groups of which a shard of 513 (``group_offset`` 513);
- K and N a few dozen (24, raised to the multiples the kernel needs), so each operand is a few MiB and
  the exact reference costs milliseconds;
- exact values (small integers), so the check is bit for bit: a dropped, duplicated or misrouted row is a
  wrong row, named with its group; a convention of quantized operands only (FP8, MXFP8, NVFP4, int8/int4) gets
  the cells scaled, in the first of its quantizations the kernel takes: codes of small integers, block scales
  of 1 or 2 (the products stay exact), K a multiple of the scale blocks, so a scale read from another group's
  table fails as a wrong value;
- deterministic problems (seeded), one static signature per cell: no Hypothesis example is drawn or
  shrunk (a failing cell is already as small as it can be for the limit it crosses).

A kernel that runs interpreted here (``KernelAdapter.interpreted()``: Pallas interpret mode, Triton's
interpreter) gets the cell of :data:`INTERPRETED_GROUP_COUNTS` and the sharded one, not the others: each of
its grid steps costs milliseconds (megablox's 513 row tiles of the rows cell take 16 s, G = 896 3.4 s), and
1,025 groups cross 128, 256, 512 and 1,024 in one call. A cell the kernel cannot take (its declared extent or
group limits, a family, a dtype, a quantization it declines) is left out, and the result
says which and why (``pass (2; 2/8 cells)`` and a note); a kernel that can take none of them is ``n/a`` with
the reasons, never a pass that checked nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter
from gmm_ref import families
from property_tests.checks import scale_routed
from property_tests.checks.declared import (
    Unsupported,
    axis_multiple,
    both_quantized,
    built_problem,
    exact_pair,
    round_up,
    scaled_out,
)

__all__ = ["GROUP_COUNTS", "INTERPRETED_GROUP_COUNTS", "ROWS", "ScaleCell", "cells", "cells_detail", "run_cells",
           "scale_problem"]

#: group counts just past the limits kernels hard-code (128, 256, 512, 1,024 entries) and as real models have them
GROUP_COUNTS = (129, 257, 384, 513, 896, 1025)
#: rows of the ragged axis past 65,535 (a CUDA grid axis's limit of blocks, at one row per block)
ROWS = 65_600
#: K and N (the axes that are not ragged), raised to the kernel's multiples
SMALL = 24
#: the group count of a kernel that runs interpreted here: 1,025 crosses 128, 256, 512 and 1,024 in one call
INTERPRETED_GROUP_COUNTS = (1025,)
#: the shard of the sharded cell: 1,026 groups, 513 local ones from group 513
SHARDED = (1026, 513, 513)


@dataclass(frozen=True)
class ScaleCell:
    """One cell: its family, what it crosses (``kind``: ``groups``, ``rows``, ``sharded``) and its group count."""

    family: str
    kind: str
    groups: int

    def describe(self) -> str:
        if self.kind == "groups":
            return f"{self.family} G={self.groups:,}"
        if self.kind == "rows":
            return f"{self.family} {ROWS:,} rows in one group"
        total, local, offset = SHARDED
        return f"{self.family} sharded G={total:,}, {local} local from group {offset}"


def cells(adapter: KernelAdapter) -> tuple[ScaleCell, ...]:
    """Every cell of the mode in ``adapter``'s families (whether it can take them or not)."""
    out = []
    facts = adapter.convention_facts
    for fam in adapter.families:
        f = families.get(fam)
        out += [ScaleCell(fam, "groups", g) for g in GROUP_COUNTS]
        out.append(ScaleCell(fam, "rows", 3))
        if f.shardable and facts.sharding:
            out.append(ScaleCell(fam, "sharded", SHARDED[0]))
    return tuple(out)


def _sizes(cell: ScaleCell, rng: np.random.Generator) -> np.ndarray:
    """Group sizes of the ragged axis (before rounding the extent to a multiple)."""
    if cell.kind == "rows":  # the middle group holds them all (not group 0: offsets must be right too)
        return np.array([40, ROWS, 24], np.int64)
    sizes = rng.integers(1, 4, cell.groups)
    sizes[9::10] = 0  # empty groups among them, never the last
    sizes[-1] = max(sizes[-1], 1)
    return sizes


def _refusal(adapter: KernelAdapter, cell: ScaleCell) -> str | None:
    """Why ``adapter`` gets no problem of ``cell`` whatever its shape, or None."""
    if both_quantized(adapter, cell.family) == []:
        return f"{adapter.convention} takes no quantization of both operands in the {cell.family} family"
    if families.get(cell.family).groups == families.ALIGNED:
        return f"the {cell.family} layout's cells are not built yet (groups aligned to the tile)"
    how = adapter.interpreted()
    if how is not None and (cell.kind == "rows" or (cell.kind == "groups" and cell.groups
                                                     not in INTERPRETED_GROUP_COUNTS)):
        return (f"{adapter.name} runs interpreted here ({how}): it gets the "
                f"{', '.join(f'G={g:,}' for g in INTERPRETED_GROUP_COUNTS)} cell and the sharded one, where its "
                "convention has sharded groups")
    if cell.kind == "sharded" and "sharding" in adapter.limits().refuses:
        return f"{adapter.name} takes no sharded groups"
    return None


def _shape(adapter: KernelAdapter, cell: ScaleCell, rng: np.random.Generator, in_dt: np.dtype,
           quants: tuple[Any, Any] | None = None) -> tuple[dict[str, int], np.ndarray | None, int, int, int] | str:
    """``({axis: extent}, group sizes, groups in all, local groups, group offset)`` of ``cell``, or why the
    kernel's declared limits leave it out (``quants``: a scaled cell's K a multiple of its scale blocks')."""
    fam, limits = families.get(cell.family), adapter.limits()
    total, local, offset = (cell.groups, cell.groups, 0) if cell.kind != "sharded" else SHARDED
    mults = {a: axis_multiple(adapter, a, cell.family, in_dt) for a in "mkn"}
    for q in quants or ():
        mults["k"] = math.lcm(mults["k"], *(b for b in q.block[1:] if b))
    mkn = {a: round_up(SMALL, mults[a]) for a in "mkn"}
    sizes: np.ndarray | None = None
    if fam.takes_sizes and not fam.serving:
        sizes = _sizes(cell, rng)
        ax = fam.ragged
        extent = round_up(int(sizes.sum()), mults[ax])
        if not (limits.tail and not adapter.convention_facts.full_sums) or cell.kind == "rows":
            sizes[-1] += extent - sizes.sum()  # no rows past the last group
        elif extent == sizes.sum():
            extent += mults[ax]  # a tail too, where the kernel takes one
        mkn[ax] = extent
    elif fam.serving:  # masked: each group its own matrix, the first group_sizes[g] rows of it
        sizes = _sizes(cell, rng)
        mkn["m"] = round_up(int(sizes.max()), mults["m"])
    elif cell.kind == "rows":  # batch: G whole matrices; the rows cell is two of ROWS rows
        total = local = 2
        mkn["m"] = round_up(ROWS, mults["m"])
    if limits.max_extent is not None and max(mkn.values()) > limits.max_extent:
        return f"{adapter.name} takes extents up to {limits.max_extent} (declared)"
    if limits.max_groups is not None and total > limits.max_groups:
        return f"{adapter.name} takes at most {limits.max_groups} groups (declared)"
    if local < limits.min_groups:
        return f"{adapter.name} takes at least {limits.min_groups} groups"
    return mkn, sizes, total, local, offset


def scale_problem(adapter: KernelAdapter, cell: ScaleCell, seed: int = 0) -> gmm_ref.Problem | str:
    """The problem of ``cell`` for ``adapter``, or why it cannot take it (a sentence). A convention of quantized
    operands only gets the cell scaled, in the first of its quantizations the kernel takes."""
    why = _refusal(adapter, cell)
    if why is not None:
        return why
    candidates = both_quantized(adapter, cell.family)
    for quants in candidates or [None]:
        problem = _build(adapter, cell, seed, quants)
        if not isinstance(problem, str):
            return problem
        why = why or problem  # the first quantization's reason, where none is taken
    return why


def _build(adapter: KernelAdapter, cell: ScaleCell, seed: int, quants: tuple[Any, Any] | None
           ) -> gmm_ref.Problem | str:
    """The problem of ``cell`` (scaled by ``quants`` where given), or why ``adapter`` cannot take it."""
    in_dt, out_dt = exact_pair(adapter) if quants is None else (quants[0].elem, scaled_out(adapter, quants[0].elem))
    rng = np.random.default_rng(seed + cell.groups)
    shape = _shape(adapter, cell, rng, in_dt, quants)
    if isinstance(shape, str):
        return shape
    (m, k, n), sizes, _total, local, offset = shape[0].values(), *shape[1:]

    def exact(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return rng.integers(-2, 3, shape, dtype=np.int8).astype(dtype)  # exact in every code dtype too

    resolve = f"gmm_kernels.resolve_kernel({adapter.name!r}, convention={adapter.convention!r})"
    cell_src = f"scale.ScaleCell({cell.family!r}, {cell.kind!r}, {cell.groups})"
    # scales of 1 or 2: the products stay exact (the strategies' exact kind)
    return built_problem(adapter, cell.family, {"m": m, "k": k, "n": n}, sizes, values=exact, out_dtype=out_dt,
                         quants=quants, scales="exact", rng=rng, local=local, offset=offset,
                         built_by=(["import gmm_kernels", "from property_tests.checks import scale"],
                                   f"scale.scale_problem({resolve}, {cell_src}, seed={seed})"))


def run_cells(adapter: KernelAdapter, mode: Any, family: str | None,
              check: Callable[[KernelAdapter, gmm_ref.Problem, Any], None]) -> tuple[int, dict[str, list[str]]]:
    """Check (``check(adapter, problem, mode)``: the checking loop's forward check; a routed kernel's: its routed
    check of each routing of ``scale_routed``) the problem of every cell of ``mode`` (``Mode.cells``) the kernel
    can take, in ``family`` or all of its families; (cells checked,
    {why: cells left out for it}). Raises the first failing cell's exception (its problem attached), or
    :class:`Unsupported` with the reasons when the kernel can take none."""
    __tracebackhide__ = True
    why = mode.applicable(adapter, family)
    if why is not None:
        raise Unsupported(why)
    checked, left_out = 0, {}
    if adapter.routed:  # a routed MoE kernel: routings past the same limits (property_tests.checks.scale_routed)
        checked, left_out = scale_routed.run_cells(adapter, mode, check)
    for cell in () if adapter.routed else cells(adapter):
        if family is not None and cell.family != family:
            continue
        problem = scale_problem(adapter, cell)
        if isinstance(problem, str):
            left_out.setdefault(problem, []).append(cell.describe())
            continue
        check(adapter, problem, mode)
        checked += 1
    if not checked:
        raise Unsupported(f"{adapter.name} takes none of the {mode.name} cells: " + "; ".join(left_out)
                          if left_out else f"no {mode.name} cell in the {family} family")
    return checked, left_out


def cells_detail(left_out: dict[str, list[str]]) -> str:
    """A passing cells mode's detail: the cells left out, and why."""
    return "left out: " + "; ".join(f"{', '.join(cells)} ({why})" for why, cells in left_out.items()) \
        if left_out else ""
