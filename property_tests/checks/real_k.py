"""The ``real_k`` mode: the contraction depth of real MoE layers.

The drawn modes keep K small (at most 64, the ``scale`` mode 24): the relations they cover (K against the tile, a
remainder, an empty K group) show at any depth. What they never reach is a real layer's K: 1,536 to 7,168
(Qwen3, DeepSeek-V3, Kimi K2, Mixtral, gpt-oss), where a K loop runs for dozens of iterations. There a split-K
reduction, a multi-stage pipeline (a K loop of 2 iterations never fills a 3- or 4-stage one) and the accumulator's
precision go wrong: a kernel that sums in bfloat16 passes every small K and is off by whole units at K = 7,168.
This mode checks, in every family the kernel takes, one problem built for it per cell:

- K = 2,048 and K = 7,168 (4 groups, one of them empty), K = 4,097 (a remainder of one element past 4,096: no
  tile divides it) and 129 groups at K = 2,048 (past a table of 128 while the K loop is long); K is raised to the
  kernel's declared multiples (a kernel that needs K a multiple of 128 gets 4,224). A kernel that runs
  interpreted here (Triton's interpreter, Pallas interpret mode) gets the K = 4,097 cell alone, 32 rows of the
  ragged axis: each of its programs runs the K loop in Python (Triton's ragged-N ``grouped_mm_bf16`` took 350 s
  for three cells of 48 columns, about 40 s for this one);
- in the ragged-K family the groups split K (one group of more than half of it, one empty);
- M and N a few dozen (about 128 rows of the ragged axis in 4 groups, N = 32, raised to the kernel's multiples);
- normal values (unit variance, in the smallest floating input dtype the kernel takes), judged under the
  kernel's numerics by gmm_ref's per-element bound, which grows with K: a float32 accumulator passes at any K, a
  bfloat16 one fails; a convention of quantized operands only gets codes of small integers and normal scales;
- deterministic problems (seeded), no Hypothesis example drawn or shrunk.

A cell the kernel cannot take (its declared extents or group count) is left out with the reason; none: ``n/a``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter
from gmm_ref import families
from property_tests.checks.declared import (
    Unsupported,
    axis_multiple,
    both_quantized,
    built_problem,
    exact_pair,
    round_up,
    scaled_out,
)

__all__ = ["DEPTHS", "MANY_GROUPS", "RealKCell", "cells", "real_k_problem", "run_cells"]

#: (K, groups) of the cells: real layers' depths, one past a power of two, and many groups at a real depth
DEPTHS = ((2048, 4), (7168, 4), (4097, 4), (2048, 129))
#: the cell of a kernel that runs interpreted here: deep, and no tile divides it (its M and N stay at 32)
INTERPRETED_DEPTHS = ((4097, 4),)
#: the group count of the many-groups cell
MANY_GROUPS = 129
#: rows of the ragged axis (M or N) in 4 groups, and the other extents
_SIZES = (40, 0, 71, 17)
_SMALL = 32


@dataclass(frozen=True)
class RealKCell:
    """One cell: its family, K and group count."""

    family: str
    k: int
    groups: int

    def describe(self) -> str:
        return f"{self.family} K={self.k:,}" + (f" G={self.groups}" if self.groups != 4 else "")


def cells(adapter: KernelAdapter) -> tuple[RealKCell, ...]:
    """Every cell of the mode in ``adapter``'s families (whether it can take them or not); a kernel that runs
    interpreted here (``KernelAdapter.interpreted()``: each program's K loop is interpreted Python) gets
    :data:`INTERPRETED_DEPTHS` only."""
    depths = DEPTHS if adapter.interpreted() is None else INTERPRETED_DEPTHS
    return tuple(RealKCell(fam, k, g) for fam in adapter.families for k, g in depths)


def _split(total: int, groups: int, rng: np.random.Generator) -> np.ndarray:
    """Group sizes summing to ``total``: 4 groups as ``_SIZES`` says (scaled), or ``groups`` of 0 to 3 rows."""
    if groups == 4:
        sizes = np.array(_SIZES, np.int64) * total // sum(_SIZES)
    else:
        sizes = rng.integers(0, 4, groups)
        sizes = sizes * max(total // max(int(sizes.sum()), 1), 1)
    sizes[-1] += total - sizes.sum()
    return sizes


def real_k_problem(adapter: KernelAdapter, cell: RealKCell, seed: int = 0) -> gmm_ref.Problem | str:
    """The problem of ``cell`` for ``adapter``, or why it cannot take it (a sentence)."""
    if families.get(cell.family).groups == families.ALIGNED:
        return f"the {cell.family} layout's cells are not built yet (groups aligned to the tile)"
    quantizations = both_quantized(adapter, cell.family)
    if quantizations == []:
        return f"{adapter.convention} takes no quantization of both operands in the {cell.family} family"
    why = ""
    for quants in quantizations or [None]:
        problem = _build(adapter, cell, seed, quants)
        if not isinstance(problem, str):
            return problem
        why = why or problem
    return why


def _shape(adapter: KernelAdapter, cell: RealKCell, in_dt: np.dtype, quants: tuple[Any, Any] | None,
           rng: np.random.Generator) -> tuple[dict[str, int], np.ndarray | None] | str:
    """``({axis: extent}, group sizes)`` of ``cell``, or why the kernel's declared limits leave it out."""
    fam, limits, groups = families.get(cell.family), adapter.limits(), cell.groups
    mults = {a: axis_multiple(adapter, a, cell.family, in_dt) for a in "mkn"}
    for q in quants or ():
        mults["k"] = int(np.lcm.reduce([mults["k"], *(b for b in q.block[1:] if b)]))
    mkn = {"m": round_up(_SMALL, mults["m"]), "k": round_up(cell.k, mults["k"]), "n": round_up(_SMALL, mults["n"])}
    sizes: np.ndarray | None = None
    if fam.takes_sizes and not fam.serving:
        ax = fam.ragged
        rows = sum(_SIZES) if groups == 4 else 2 * groups
        if ax != "k" and adapter.interpreted() is not None:
            rows = _SMALL  # its cost grows with the grid: as few rows as the other axes
        mkn[ax] = mkn["k"] if ax == "k" else round_up(rows, mults[ax])
        sizes = _split(mkn[ax], groups, rng)
    elif fam.serving:  # masked: each group its own matrix, the first group_sizes[g] rows of it
        sizes = np.minimum(_split(mkn["m"] * groups // 2, groups, rng), mkn["m"])
    if limits.max_extent is not None and max(mkn["m"], mkn["n"]) > limits.max_extent:
        return f"{adapter.name} takes extents up to {limits.max_extent} (declared)"
    deepest = limits.max_k or limits.max_extent
    if deepest is not None and mkn["k"] > deepest:
        return f"{adapter.name} takes K up to {deepest} (declared)"
    if limits.max_groups is not None and groups > limits.max_groups:
        return f"{adapter.name} takes at most {limits.max_groups} groups (declared)"
    if groups < limits.min_groups:
        return f"{adapter.name} takes at least {limits.min_groups} groups"
    return mkn, sizes


def _build(adapter: KernelAdapter, cell: RealKCell, seed: int, quants: tuple[Any, Any] | None
           ) -> gmm_ref.Problem | str:
    """The problem of ``cell`` (scaled by ``quants`` where given), or why ``adapter`` cannot take it."""
    in_dt, out_dt = exact_pair(adapter) if quants is None else \
        (quants[0].elem, scaled_out(adapter, quants[0].elem))
    rng = np.random.default_rng(seed + cell.k + cell.groups)
    shape = _shape(adapter, cell, in_dt, quants, rng)
    if isinstance(shape, str):
        return shape
    mkn, sizes = shape

    def values(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if quants is not None:  # codes: small integers, exact in every code dtype
            return rng.integers(-2, 3, shape, dtype=np.int8).astype(dtype)
        return gmm_ref.round_to(rng.standard_normal(shape), dtype)

    resolve = f"gmm_kernels.resolve_kernel({adapter.name!r}, convention={adapter.convention!r})"
    cell_src = f"real_k.RealKCell({cell.family!r}, {cell.k}, {cell.groups})"
    return built_problem(adapter, cell.family, mkn, sizes, values=values, out_dtype=out_dt, quants=quants,
                         scales="normal", rng=rng, local=cell.groups, offset=0,
                         built_by=(["import gmm_kernels", "from property_tests.checks import real_k"],
                                   f"real_k.real_k_problem({resolve}, {cell_src}, seed={seed})"))


def run_cells(adapter: KernelAdapter, mode: Any, family: str | None,
              check: Callable[[KernelAdapter, gmm_ref.Problem, Any], None]) -> tuple[int, dict[str, list[str]]]:
    """Check (``check(adapter, problem, mode)``: the forward check) the problem of every cell ``adapter`` can take,
    in ``family`` or all of its families; (cells checked, {why: cells left out for it}). Raises the first failing
    cell's exception, or :class:`Unsupported` with the reasons when the kernel can take none."""
    __tracebackhide__ = True
    if adapter.routed:
        raise Unsupported(mode.routed_why)
    checked, left_out = 0, {}
    for cell in cells(adapter):
        if family is not None and cell.family != family:
            continue
        problem = real_k_problem(adapter, cell)
        if isinstance(problem, str):
            left_out.setdefault(problem, []).append(cell.describe())
            continue
        try:
            check(adapter, problem, mode)
        except Exception as exc:
            exc.add_note(f"The real_k mode's cell {cell.describe()}. Rebuild: {problem._built_by[1]}")  # type: ignore
            raise
        checked += 1
    if not checked:
        raise Unsupported(f"{adapter.name} takes none of the {mode.name} cells: " + "; ".join(left_out)
                          if left_out else f"no {mode.name} cell in the {family} family")
    return checked, left_out
