"""The ``large`` mode's strided cells: element offsets past 2**31 without 2**31 elements (docs/coverage.md, "Past
2**31 elements: the large mode").

A kernel that computes an element offset ``index * stride`` in int32 (a row of its token operand, a group of its
weights, a row or a group of its output) reads or writes the wrong memory once the product passes 2**31 - 1. With
contiguous operands that takes an operand of more than 2**31 elements (the large mode's full-size cell: several GiB,
and about 35 GB through jax's CPU ``ragged_dot``). A kernel that reads its operands through their strides meets the
same product on a small problem handed one operand as a view whose strided axis lies far apart: up to 64 rows (or
columns, or K indices) :data:`AXIS_STRIDE` = 2**26 elements apart (index 32 on lies past 2**31 - 1), or 4 groups
:data:`GROUP_STRIDE` = 2**30 apart (groups 2 and 3). The other axes of each index form one contiguous block (a
slice's layout: every stride a multiple of 16 bytes, one of them 1).

The view lies in one torch allocation of :data:`FRONT` + at most 2**32 elements (12 GiB of bfloat16 address space);
only its blocks and their margins are ever touched, so only they are committed (Linux commits a page when it is
first touched): a few MiB. The view starts :data:`FRONT` = 2**31 elements in, so an offset wrapped in int32 (at
least -2**31) lands inside the allocation: a read there finds zeros (untouched pages), a write there is lost, never
a crash. :data:`MARGIN` NaN elements lie on either side of each block: a write there is a write out of bounds
named by its index, a read there poisons the result.

Which cells a kernel gets (:func:`cells`): a convention whose lhs and rhs carry strides (``Convention.strided``:
``torch.grouped_mm``) gets, per family, the group axis of each grouped operand and the ragged axis of each operand
that has one; a convention whose kernel writes an output buffer in place (``out_argument``: vLLM's batched experts'
``C``) gets the same of that output. A kernel that copies its strided operands contiguous before its own
arithmetic (``KernelAdapter.copies_strided``) gets none of the operand cells: they would check the copy. jax arrays
have no strides: a jax kernel gets none. The reference is the small problem's (exact small integers), so a block
read at a wrapped offset (zeros) or a store lost there is a wrong element, reported with its group and row.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter
from gmm_kernels.sandbox import convert, device, guards, inputs, tamper
from gmm_ref import families
from gmm_ref.compare import REPRODUCE
from gmm_ref.dtypes import as_numpy
from gmm_ref.layouts import misalignment
from property_tests.checks.declared import axis_multiple, exact_pair, first_layout

__all__ = ["AXIS_STRIDE", "FRONT", "GROUP_STRIDE", "MARGIN", "MAX_BYTES", "StridedCell", "cell_problem", "cells",
           "check", "misaligned", "none_why", "past", "refusal", "reservation_refusal", "run_cells"]

#: elements between two indices of a strided ragged axis (rows, columns or K): index 32 is the first past 2**31 - 1
AXIS_STRIDE = 2**26
#: elements between two groups of a strided group axis: group 2 is the first past 2**31 - 1
GROUP_STRIDE = 2**30
#: elements of the allocation before the view: an offset wrapped in int32 (at least -2**31) lands in it
FRONT = 2**31
#: NaN elements on either side of each block, checked after the call
MARGIN = 4096
#: the most address space a cell reserves (bytes): 2**31 + 2**32 elements of a 2-byte dtype
MAX_BYTES = 12 * 2**30
#: the strided ragged axis's extent (at most; at least :data:`MIN_RAGGED`, where a kernel declares less), the other
#: axes' (raised to the kernel's multiples), the group count
RAGGED, MIN_RAGGED, SMALL, GROUPS = 64, 40, 32, 4
_PAST = 2**31


@dataclass(frozen=True)
class StridedCell:
    """One cell: the family, the operand (``lhs``, ``rhs``, ``out``) and its strided axis (``groups`` or the
    family's ragged axis, ``m``, ``n`` or ``k``)."""

    family: str
    operand: str
    axis: str

    @property
    def stride(self) -> int:
        return GROUP_STRIDE if self.axis == "groups" else AXIS_STRIDE

    def words(self) -> str:
        """What is strided: ``lhs rows (M)``, ``rhs groups``."""
        if self.axis == "groups":
            return f"{self.operand} groups"
        dim = families.DIMS[self.operand].index(self.axis)
        return f"{self.operand} {('rows', 'columns')[dim]} ({self.axis.upper()})"

    def describe(self) -> str:
        return f"{self.family} {self.words()} {self.stride:,} elements apart"


def cells(adapter: KernelAdapter) -> tuple[StridedCell, ...]:
    """Every strided cell of ``adapter``'s families (whether it can take them or not)."""
    conv = adapter.convention_facts
    operands = (("lhs", "rhs") if conv.strided else ()) + (("out",) if conv.out_argument is not None else ())
    if conv.framework != "torch":
        return ()
    out = []
    for name in adapter.families:
        fam = families.get(name)
        for op in operands:
            if fam.is_grouped(op):
                out.append(StridedCell(name, op, "groups"))
            if fam.ragged_dim(op) is not None:
                out.append(StridedCell(name, op, str(fam.ragged)))
    return tuple(out)


def none_why(adapter: KernelAdapter) -> str:
    """Why ``adapter`` has no strided cell at all."""
    conv = adapter.convention_facts
    if conv.framework != "torch":
        return (f"{conv.framework} arrays are dense (no strides): an element offset past 2**31 needs an operand of "
                "2**31 elements")
    return (f"{adapter.convention}'s operands carry no strides here (Convention.strided is False) and its kernel "
            "writes no output buffer in place: an element offset past 2**31 needs an operand of 2**31 elements")


def refusal(adapter: KernelAdapter, cell: StridedCell) -> str | None:
    """Why ``adapter`` gets no problem of ``cell`` whatever its shape, or None."""
    if cell.operand != "out" and adapter.copies_strided:
        return f"{adapter.name} copies its strided operands contiguous first ({adapter.copies_strided})"
    if families.get(cell.family).groups == families.ALIGNED:
        return f"the {cell.family} layout's cells are not built yet (groups aligned to the tile)"
    kinds = adapter.limits().storages.get(cell.operand, ("slice", "transposed"))
    if "slice" not in kinds:  # the view's other axes are those of a wider allocation: a slice of it
        return f"{adapter.name} declares it takes {cell.operand} contiguous only"
    lt, rt, _ = first_layout(adapter, cell.family)
    last = families.DIMS[cell.operand][0 if {"lhs": lt, "rhs": rt}.get(cell.operand) else 1]
    if "transposed" not in kinds and cell.axis == last:
        return f"{adapter.name} declares it takes {cell.operand} with a last stride of 1 only"
    return None


def cell_problem(adapter: KernelAdapter, family: str, seed: int = 0) -> gmm_ref.Problem | str:
    """The small problem of ``family``'s strided cells for ``adapter`` (the ragged axis 40 to 64 long, 4 groups, the
    other axes 32 raised to the kernel's multiples, exact small integers; an output buffer NaN), or why it cannot
    take it."""
    fam, rules, limits = families.get(family), adapter.convention_facts, adapter.limits()
    in_dt, out_dt = exact_pair(adapter)
    mults = {a: axis_multiple(adapter, a, family, in_dt) for a in "mkn"}
    mkn = {a: -(-SMALL // mults[a]) * mults[a] for a in "mkn"}
    ragged = 0
    if fam.ragged is not None:
        ragged = min(RAGGED, limits.max_extent or RAGGED) // mults[fam.ragged] * mults[fam.ragged]
        if ragged < MIN_RAGGED:
            return (f"{adapter.name} takes {fam.ragged.upper()} up to {limits.max_extent or RAGGED} in multiples of "
                    f"{mults[fam.ragged]}: at most {ragged}, and the cells need {MIN_RAGGED} or more")
        mkn[fam.ragged] = ragged
    if limits.max_extent is not None and max(mkn.values()) > limits.max_extent:
        return f"{adapter.name} takes extents up to {limits.max_extent} (declared)"
    if not limits.min_groups <= GROUPS <= (limits.max_groups or GROUPS):
        return f"{adapter.name} takes {limits.min_groups} to {limits.max_groups} groups (declared); the cells have 4"
    ends = [20, 36, (36 + ragged) // 2, ragged]
    sizes = {families.OFFSETS: np.diff([0, *ends]), families.COUNTS: np.array([ragged, 36, ends[2], 20]),
             families.WHOLE: None}[fam.groups]
    lt, rt, packed = first_layout(adapter, family)
    m, k, n = mkn.values()
    rng = np.random.default_rng(seed)

    def exact(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return rng.integers(-2, 3, shape, dtype=np.int8).astype(dtype)

    lhs = exact((*((GROUPS,) if fam.is_grouped("lhs") else ()), *((k, m) if lt else (m, k))), in_dt)
    rhs = exact((*((GROUPS,) if fam.is_grouped("rhs") else ()), *((n, k) if rt else (k, n))), in_dt)
    kwargs: dict[str, Any] = dict(lhs_transposed=lt, rhs_transposed=rt, packed=packed, out_dtype=out_dt,
                                  convention=adapter.convention, **rules.policies(family))
    if adapter.tiling is not None:
        kwargs["tiling"] = adapter.tiling
    if rules.existing_required:  # NaN where the kernel writes: a store lost at a wrapped offset stays NaN
        kwargs["existing_out"] = np.full(fam.shape("out", m, k, n, GROUPS), np.nan, np.float32).astype(out_dt)
    try:
        problem = gmm_ref.Problem(family, lhs, rhs, None if sizes is None else np.asarray(sizes, np.int32), **kwargs)
    except (ValueError, TypeError) as exc:
        return f"{adapter.convention} cannot express this cell: {exc}"
    why = adapter.supports(problem)
    return f"{adapter.name} declines it: {why}" if why else problem


# ------------------------------------------------------------------------------------------------ the view
def _position(conv: Any, operand: str) -> int | str:
    """Where ``operand``'s argument is: a position (lhs 0, rhs 1: ``Convention.strided``), or the output's name."""
    return {"lhs": 0, "rhs": 1}.get(operand, conv.out_argument)


def _argument(conv: Any, args: tuple, kwargs: dict, operand: str) -> Any:
    where = _position(conv, operand)
    if isinstance(where, int):
        return args[where]
    return conv.out_value(args, kwargs)


def _replace(conv: Any, args: tuple, kwargs: dict, operand: str, value: Any) -> tuple[tuple, dict]:
    where = _position(conv, operand)
    if isinstance(where, str):
        i = list(inspect.signature(conv.parse).parameters).index(where)
        if i >= len(args):
            return args, {**kwargs, where: value}
        where = i
    return (*args[:where], value, *args[where + 1:]), kwargs


def _operand(problem: gmm_ref.Problem, cell: StridedCell) -> np.ndarray:
    """The argument ``cell`` strides, as the problem's convention passes it (NumPy)."""
    conv = gmm_ref.conventions.get(problem.convention)
    return np.asarray(_argument(conv, *conv.arguments(problem), cell.operand))


def _elements(x: np.ndarray, axis: int, stride: int) -> int:
    """Elements of the allocation holding ``x`` with ``axis`` strided: the front, the span, the last margin."""
    block = int(np.prod([d for i, d in enumerate(x.shape) if i != axis], dtype=np.int64))
    return FRONT + (x.shape[axis] - 1) * stride + block + MARGIN


def _axis(problem: gmm_ref.Problem, cell: StridedCell) -> int:
    """The axis of the operand's argument that the cell strides."""
    fam = problem.family_facts
    lead = 1 if fam.is_grouped(cell.operand) else 0
    if cell.axis == "groups":
        return 0
    dim = families.DIMS[cell.operand].index(cell.axis)
    transposed = {"lhs": problem.lhs_transposed, "rhs": problem.rhs_transposed}.get(cell.operand, False)
    return lead + (1 - dim if transposed else dim)


def _view_strides(x: np.ndarray, axis: int, stride: int) -> tuple[list[int], int]:
    """(the strides, in elements, of a view of ``x`` whose ``axis`` lies ``stride`` elements apart and whose other axes
    form one contiguous block per index; that block's elements)."""
    strides, step = [0] * x.ndim, 1
    for i in reversed([i for i in range(x.ndim) if i != axis]):
        strides[i], step = step, step * x.shape[i]
    strides[axis] = stride
    return strides, step


def misaligned(adapter: KernelAdapter, cell: StridedCell, x: np.ndarray, axis: int) -> str | None:
    """Why the view of ``x`` that ``cell`` strides (:data:`FRONT` elements into its allocation) is not aligned as
    ``adapter`` declares its operand, or None."""
    need = adapter.limits().alignment.get(cell.operand)
    strides, _ = _view_strides(x, axis, cell.stride)
    bad = need and misalignment(x.shape, FRONT * x.itemsize, tuple(s * x.itemsize for s in strides), x.itemsize,
                                need)
    return f"{adapter.name} declares {cell.operand} aligned to {need} bytes: the view has {bad}" if bad else None


def _strided(x: np.ndarray, axis: int, stride: int) -> tuple[Any, Any, np.ndarray]:
    """(the allocation, a view of ``x``'s values whose ``axis`` lies ``stride`` elements apart and whose other axes
    form one contiguous block per index, the indices of every block's margins, one row per index)."""
    import torch

    strides, step = _view_strides(x, axis, stride)
    count = x.shape[axis]
    base = device.reserve(_elements(x, axis, stride), dtype=convert.torch_dtype(x.dtype))
    view = torch.as_strided(base, x.shape, tuple(strides), FRONT)
    view.copy_(convert.to_torch(np.ascontiguousarray(x), device=base.device))
    starts = FRONT + np.arange(count, dtype=np.int64)[:, None] * stride
    margins = np.concatenate([starts - MARGIN + np.arange(MARGIN), starts + step + np.arange(MARGIN)], axis=1)
    base[torch.from_numpy(margins.reshape(-1)).to(base.device)] = float("nan")
    return base, view, margins


def _index_words(problem: gmm_ref.Problem, cell: StridedCell, i: int) -> str:
    """How a report names index ``i`` of the strided axis: ``group 2``, ``row 33 (group 1)``."""
    if cell.axis == "groups":
        return f"group {i}"
    word = ("row", "column")[families.DIMS[cell.operand].index(cell.axis)]
    fam = problem.family_facts
    if fam.groups == families.OFFSETS and problem.group_sizes is not None:
        ends = np.cumsum(np.asarray(problem.group_sizes).reshape(-1))
        g = int(np.searchsorted(ends, i, side="right"))
        return f"{word} {i} (group {g})" if g < ends.size else f"{word} {i} (no group's)"
    return f"{word} {i} (of every group)"


def _margins_changed(base: Any, margins: np.ndarray, problem: gmm_ref.Problem, cell: StridedCell,
                     kernel: str) -> None:
    """``gmm_ref.Mismatch`` naming the first index whose block's margins the kernel wrote."""
    import torch

    held = base[torch.from_numpy(margins.reshape(-1)).to(base.device)].reshape(margins.shape).float().cpu().numpy()
    rows = np.flatnonzero(~np.isnan(held).all(axis=1))
    if rows.size:
        raise gmm_ref.Mismatch(f"{cell.operand}, {_index_words(problem, cell, int(rows[0]))}: kernel {kernel} wrote "
                               f"within {MARGIN} elements of its block of {cell.operand}, outside it ({rows.size} "
                               "blocks' margins changed)", kind="wrote_out_of_bounds")


def check(adapter: KernelAdapter, problem: gmm_ref.Problem, cell: StridedCell) -> None:
    """Run ``adapter`` on ``problem`` with ``cell``'s operand strided as the module says, its other arguments guarded
    copies (``gmm_kernels.sandbox.guards``); ``gmm_ref.Mismatch`` naming the group and row of the first wrong element
    (or of a block written past), or for a write past another buffer or to an input."""
    __tracebackhide__ = True
    conv = adapter.convention_facts
    numerics = adapter.numerics_for(problem)
    pristine = conv.arguments(problem)
    axis = _axis(problem, cell)
    with tamper.sealed(problem, adapter.name), guards.call(adapter.name) as call:
        args, kwargs = inputs.fresh(*pristine, convention=conv, guard=call)
        base, view, margins = _strided(np.asarray(_argument(conv, *pristine, cell.operand)), axis, cell.stride)
        args, kwargs = _replace(conv, args, kwargs, cell.operand, view)
        with convert.written_back():
            out = adapter.invoke(*args, **kwargs)
            device.synchronize()
    call.check()
    held = as_numpy(view.cpu(), name=f"{cell.operand} of {adapter.name}")
    inputs.modified(adapter.name, conv, pristine, _replace(conv, args, kwargs, cell.operand, held))
    _margins_changed(base, margins, problem, cell, adapter.name)
    if cell.operand == "out" or out is None:
        out = held if cell.operand == "out" else conv.out_value(args, kwargs)
    got = as_numpy(out, name=f"output of {adapter.name}", strict=True)
    ref = adapter.reference_for(problem)  # once the kernel has returned
    gmm_ref.assert_matches_reference(got, ref, numerics=numerics, kernel=adapter.name)


def past(cell: StridedCell, count: int) -> str:
    """The note's words for the indices of ``cell``'s axis whose offsets pass 2**31 - 1."""
    first = -(-_PAST // cell.stride)
    return (f"{cell.words()} {cell.stride:,} elements apart: index i at i * {cell.stride:,}, past 2**31 - 1 from "
            f"index {first} on, up to {(count - 1) * cell.stride:,}: an offset computed in int32 wraps there")


def run_cells(adapter: KernelAdapter, family: str | None, seed: int = 0) -> tuple[int, dict[str, list[str]]]:
    """Check every strided cell of ``adapter`` (in ``family``, or all its families) it can take; (cells checked,
    {why: cells left out for it}). Raises the first failing cell's exception, noted with the cell and how to
    rebuild it."""
    __tracebackhide__ = True
    checked, left_out = 0, {}
    problems: dict[str, gmm_ref.Problem | str] = {}
    for cell in cells(adapter):
        if family is not None and cell.family != family:
            continue
        why = refusal(adapter, cell)
        problem = problems.setdefault(cell.family, cell_problem(adapter, cell.family, seed)) if why is None else why
        if isinstance(problem, str):
            left_out.setdefault(problem, []).append(cell.describe())
            continue
        x, axis = _operand(problem, cell), _axis(problem, cell)
        why = misaligned(adapter, cell, x, axis) or reservation_refusal(_elements(x, axis, cell.stride), x.dtype)
        if why is not None:
            left_out.setdefault(why, []).append(cell.describe())
            continue
        try:
            check(adapter, problem, cell)
        except Exception as exc:
            # gmm_ref's script calls the kernel on the contiguous problem, which it passes: the note says instead
            exc.__notes__ = [n for n in getattr(exc, "__notes__", ()) if not n.startswith(REPRODUCE)]
            exc.add_note(f"The large mode's strided cell {cell.describe()} ({problem.describe()}): "
                         f"{past(cell, x.shape[axis])}. Rerun it:\n    import gmm_kernels\n    from property_tests "
                         f"import large_strided\n    k = gmm_kernels.resolve_kernel({adapter.name!r}, convention="
                         f"{adapter.convention!r})\n    large_strided.check(k, large_strided.cell_problem(k, "
                         f"{cell.family!r}, seed={seed}), large_strided.{cell!r})")
            raise
        checked += 1
    return checked, left_out


def reservation_refusal(elements: int, dtype: np.dtype) -> str | None:
    """Why ``elements`` of ``dtype`` cannot be reserved here (address space, not memory; at most
    :data:`MAX_BYTES`), or None."""
    import torch

    if elements * dtype.itemsize > MAX_BYTES:
        return (f"its {dtype} view would reserve {elements * dtype.itemsize / 2**30:.0f} GiB of address space (the "
                f"cells reserve at most {MAX_BYTES / 2**30:.0f} GiB)")
    try:  # reserved, not touched: committed page by page where written
        torch.empty(elements, dtype=convert.torch_dtype(dtype), device=device.selected())
    except (RuntimeError, MemoryError) as exc:
        return (f"cannot reserve {elements * dtype.itemsize / 2**30:.0f} GiB of address space here: "
                f"{str(exc).splitlines()[0]}")
    return None
