"""The ``scale`` mode's cells for a routed MoE kernel (``gmm_kernels.base.RoutedKernelAdapter``; docs/routed.md).

The limits fused-MoE kernels hard-code are the grouped ones (``property_tests.checks.scale``) in routed words: slots
(``T * top_k``) past a CUDA grid axis of 65,535 blocks in one call and in one hot expert, experts past the one-block
scans of ``moe_align_block_size``'s variants (256, 512 and 1,024 threads) and past per-expert tables of 128, and
other ranks' experts (an ``expert_map``) among them. The routed strategies draw up to 513 experts but at most 40
tokens, and never 1,025 experts; each cell here is one seeded routing:

- ``slots``: T = 8,200 tokens x top_k = 8: 65,600 slots in one call, 8 experts of 8,200 slots each;
- ``hot``: T = 65,664, top_k = 1, 3 experts; expert 1 holds 65,600 of the slots (past 65,535 in the call and in
  one expert), experts 0 and 2 hold 40 and 24, the tokens of the three shuffled;
- ``experts``: E = 257, 513 and 1,025 experts, every one holding 1 to 3 slots (top_k = 8, the experts of a token
  consecutive in a shuffled order of the experts);
- ``expert_map``: 1,026 global experts of which 513 are local (global 513 to 1,025, local 0 to 512), the slots
  as in ``experts``: blocks of other ranks' experts (zeros), local ids past 128 and 512, global ids past 1,024;
- ``offsets``: T = 16 x top_k = 4 on 8 experts, the per-slot output's rows 2**26 elements apart: flat slot offsets
  past 2**31 (an int32 ``token * top_k + slot`` times the row stride wraps), 64 rows written
  (``property_tests.checks.scale_offsets``, which runs this cell: a kernel writing a per-slot torch output only).

Values are exact: tokens and experts small integers in [-2, 2], weights in {-2, -1, 1, 2} multiplied in
(``mul_routed_weight``), so every slot value is a sum of at most 24 products below 2**8, exact in every input
dtype; token column 0 is 1 and expert row 0 is (1, 0, ..., 0), so column 0 of every local slot is its weight:
never 0, so even a slot a kernel leaves at zero is a wrong element. K = N = 24. The input dtype is the smallest
floating one the convention takes (its output equal to it first), as for the grouped cells; the metadata is built
by the convention as for any routing (``RoutedConvention.arguments``). A backward kernel's cell is the routing's
backward (``gmm_ref.RoutedBackward``, unweighted where its convention never multiplies the weights in): an exact
cotangent whose column 0 is 1 against experts whose column 0 is ``(1, 0, ..., 0)`` too, so that element 0 of every
local slot's input gradient is 1 and element (0, 0) of every expert's gradient its slot count, never 0.

A kernel that runs interpreted here (``KernelAdapter.interpreted()``) gets :func:`interpreted_cells` only: the
``expert_map`` cell, which crosses every expert limit above in one call (global ids past 256, 512 and 1,024, local
ids past 128 and 512, other ranks' experts) in about 1,030 programs, and the ``offsets`` cell (4 live programs,
about 0.1 s). The slot cells are left out for it, as the
grouped rows cell is: one interpreted program per block of 16 slots makes 4,100 programs (vLLM's kernel: 31 s
alone, 89 s under load, against 20 s for the ``expert_map`` cell; docs/coverage.md). A convention without an
expert map (``RoutedConvention.expert_parallel`` False) gets the ``experts`` cell of 1,025 instead. K and N are
the convention's declared extent nearest 24 where it takes only some (``RoutedConvention.extents``). A cell a
kernel declines (``supports``) is left out with its reason.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter
from property_tests.checks import scale_offsets

__all__ = ["EXPERT_COUNTS", "EXPERT_MAP", "HOT", "INTERPRETED_CELLS", "OFFSETS", "SLOTS", "RoutedCell", "cells",
           "interpreted_cells", "scale_routing"]

#: T x top_k of the ``slots`` cell: 65,600 slots in one call
SLOTS = (8_200, 8)
#: the ``hot`` cell's slots per expert (top_k = 1): 65,600 in expert 1, between 40 and 24
HOT = (40, 65_600, 24)
#: the ``experts`` cells' expert counts: past one-block scans of 256, 512 and 1,024 threads
EXPERT_COUNTS = (257, 513, 1025)
#: the ``expert_map`` cell: 1,026 global experts, the 513 from global expert 513 on this rank
EXPERT_MAP = (1026, 513, 513)
#: K and N (or the convention's declared extent nearest them)
SMALL = 24
#: the top_k of the experts cells
TOP_K = 8
#: the ``offsets`` cell's experts
OFFSET_EXPERTS = 8


@dataclass(frozen=True)
class RoutedCell:
    """One routed cell: what it crosses (``kind``: ``slots``, ``hot``, ``experts``, ``expert_map``) and its global
    expert count."""

    kind: str
    experts: int

    def describe(self) -> str:
        if self.kind == "slots":
            return f"T={SLOTS[0]:,} x top_k={SLOTS[1]} ({SLOTS[0] * SLOTS[1]:,} slots)"
        if self.kind == "hot":
            return f"T={sum(HOT):,} x top_k=1, {HOT[1]:,} slots in expert 1"
        if self.kind == "experts":
            return f"E={self.experts:,}"
        if self.kind == "offsets":
            t, k = scale_offsets.SHAPE
            return f"T={t} x top_k={k}, C's rows {scale_offsets.ROW_STRIDE:,} elements apart (offsets past 2**31)"
        if self.kind == "token_offsets":
            t, k = scale_offsets.A_SHAPE
            return f"T={t} x top_k={k}, A's rows {scale_offsets.ROW_STRIDE:,} elements apart (offsets past 2**31)"
        total, local, first = EXPERT_MAP
        return f"E={total:,} with an expert_map ({local} local from expert {first})"


#: the ``offsets`` cells (``property_tests.checks.scale_offsets``): the per-slot output's rows apart, the tokens'
OFFSETS = RoutedCell("offsets", OFFSET_EXPERTS)
TOKEN_OFFSETS = RoutedCell("token_offsets", OFFSET_EXPERTS)
#: the cells of a kernel that runs interpreted here
INTERPRETED_CELLS = (RoutedCell("expert_map", EXPERT_MAP[0]), OFFSETS, TOKEN_OFFSETS)


def cells(adapter: KernelAdapter) -> tuple[RoutedCell, ...]:
    """Every routed cell (whether ``adapter`` can take them or not)."""
    return (RoutedCell("slots", 8), RoutedCell("hot", 3), *(RoutedCell("experts", e) for e in EXPERT_COUNTS),
            RoutedCell("expert_map", EXPERT_MAP[0]), OFFSETS, TOKEN_OFFSETS)


def _pair(adapter: KernelAdapter) -> tuple[np.dtype, np.dtype] | str:
    """The smallest floating (input, output) pair of the convention the kernel takes, an output equal to it first."""
    pairs = sorted(adapter.convention_facts.dtype_pairs, key=lambda p: (p[0].itemsize, p[0] != p[1], str(p[0])))
    for i, o in pairs:
        if adapter.dtype_refusal(i, i, o) is None:
            return i, o
    return f"{adapter.name} takes none of its convention's dtype pairs here"


def _ids(cell: RoutedCell, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """``topk_ids`` of ``cell`` (each token's experts distinct) and its ``expert_map`` (or None)."""
    if cell.kind in ("slots", "offsets", "token_offsets"):
        t, k = {"slots": SLOTS, "offsets": scale_offsets.SHAPE, "token_offsets": scale_offsets.A_SHAPE}[cell.kind]
        return ((np.arange(t)[:, None] + np.arange(k)) % cell.experts).astype(np.int32), None
    if cell.kind == "hot":
        return rng.permutation(np.repeat(np.arange(3), HOT)).astype(np.int32)[:, None], None
    order = rng.permutation(cell.experts)
    slots = -(-2 * cell.experts // TOP_K) * TOP_K  # about 2 slots an expert, each expert at least one
    ids = order[np.arange(slots) % cell.experts].reshape(-1, TOP_K).astype(np.int32)
    if cell.kind == "experts":
        return ids, None
    total, local, first = EXPERT_MAP
    emap = np.full(total, -1, np.int32)
    emap[first:first + local] = np.arange(local)
    return ids, emap


def _exact(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return rng.integers(-2, 3, shape, dtype=np.int8).astype(np.float32).astype(dtype)


def interpreted_cells(adapter: KernelAdapter) -> tuple[RoutedCell, ...]:
    """The cells of ``adapter`` where it runs interpreted: :data:`INTERPRETED_CELLS`, or for a convention without
    an expert map the ``experts`` cell of the most experts (1,025: past every scan limit too)."""
    if adapter.convention_facts.expert_parallel is False:
        return (RoutedCell("experts", EXPERT_COUNTS[-1]), OFFSETS, TOKEN_OFFSETS)
    return INTERPRETED_CELLS


def _extents(adapter: KernelAdapter) -> tuple[int, int]:
    """(K, N): :data:`SMALL` both, or the convention's declared extent nearest it where it takes only some."""
    declared = adapter.convention_facts.extents
    if not declared:
        return SMALL, SMALL
    return min(declared, key=lambda kn: (abs(kn[0] - SMALL) + abs(kn[1] - SMALL), kn))


def scale_routing(adapter: KernelAdapter, cell: RoutedCell, seed: int = 0) -> gmm_ref.Routing | str:
    """The routing of ``cell`` for ``adapter``, or why it cannot take it (a sentence)."""
    how = adapter.interpreted()
    only = interpreted_cells(adapter)
    if how is not None and cell not in only:
        return (f"{adapter.name} runs interpreted here ({how}): it gets the "
                f"{' and '.join(c.describe() for c in only)} cell{'s' * (len(only) > 1)} only")
    pair = _pair(adapter)
    if isinstance(pair, str):
        return pair
    if cell.kind in ("offsets", "token_offsets") and (
            why := scale_offsets.refusal(adapter, "C" if cell.kind == "offsets" else "A")):
        return why
    conv = adapter.convention_facts
    rng = np.random.default_rng(seed + zlib.crc32(cell.describe().encode()))
    ids, emap = _ids(cell, rng)
    t, local = ids.shape[0], cell.experts if emap is None else int((emap >= 0).sum())
    k, n = _extents(adapter)
    layout = conv.expert_layouts[0]
    tokens = _exact(rng, (t, k), pair[0])
    tokens[:, 0] = 1
    experts = _exact(rng, (local, n, k) if layout == "enk" else (local, k, n), pair[0])
    row0 = experts[:, 0, :] if layout == "enk" else experts[:, :, 0]
    row0[:] = 0
    row0[:, 0] = 1  # output column 0 of every slot: tokens[:, 0] * 1 = 1, times the slot's weight
    weights = rng.choice(np.array([-2, -1, 1, 2], np.float32), ids.shape).astype(conv.weight_dtypes[0])
    try:
        routing = gmm_ref.Routing(tokens, experts, ids, weights, expert_layout=layout, expert_map=emap,
                                  mul_routed_weight=conv.mul_routed_weight is not False, out_dtype=pair[1],
                                  foreign=conv.foreign)
        if conv.backward:
            routing = _backward(rng, routing, conv.accumulates)
    except (ValueError, TypeError) as exc:
        return f"{adapter.convention} cannot express this cell: {exc}"
    why = adapter.supports(routing)
    return f"{adapter.name} declines it: {why}" if why else routing


def _backward(rng: np.random.Generator, r: gmm_ref.Routing, existing: bool) -> gmm_ref.RoutedBackward:
    """``r`` with an exact cotangent (small integers, column 0 all 1) and, for a kernel that adds into one, an
    existing gradient (small integers); each expert's column 0 is ``(1, 0, ..., 0)`` as its row 0 is, so element
    0 of every local slot's input gradient is 1 and element (0, 0) of an expert's gradient its slot count."""
    experts = np.array(r.experts)
    (experts[:, :, 0] if r.expert_layout == "enk" else experts[:, 0, :])[:, 1:] = 0
    dy = _exact(rng, (r.num_tokens, r.top_k, r.n), np.dtype(r.out_dtype))
    dy[:, :, 0] = 1
    ex = _exact(rng, experts.shape, experts.dtype) if existing else None
    return gmm_ref.RoutedBackward.of(dataclasses.replace(r, experts=experts), dy, ex)


def _rebuild(adapter: KernelAdapter, cell: RoutedCell, seed: int) -> str:
    return (f"Scale cell {cell.describe()}; rebuild it with: from property_tests.checks import scale_routed; "
            f"scale_routed.scale_routing(gmm_kernels.resolve_kernel({adapter.name!r}), "
            f"scale_routed.RoutedCell({cell.kind!r}, {cell.experts}), seed={seed})")


def run_cells(adapter: KernelAdapter, mode: Any, check: Callable[[KernelAdapter, gmm_ref.Routing, Any], None],
              seed: int = 0) -> tuple[int, dict[str, list[str]]]:
    """Check (``check(adapter, routing, mode)``: the routed check) the routing of every cell the kernel can take;
    (cells checked, {why: cells left out for it}). Raises the first failing cell's exception, which names the
    token, slot and expert of the first wrong element, noted with the cell and how to rebuild it; ``[]`` left out
    and nothing checked: the caller says the kernel takes none."""
    __tracebackhide__ = True
    checked, left_out = 0, {}
    for cell in cells(adapter):
        routing = scale_routing(adapter, cell, seed)
        if isinstance(routing, str):
            left_out.setdefault(routing, []).append(cell.describe())
            continue
        try:
            if cell.kind in ("offsets", "token_offsets"):
                scale_offsets.check(adapter, routing, mode, "C" if cell.kind == "offsets" else "A")
            else:
                check(adapter, routing, mode)
        except Exception as exc:
            exc.add_note(_rebuild(adapter, cell, seed))
            raise
        checked += 1
    return checked, left_out
