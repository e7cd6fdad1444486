"""The order a ``gmm-quick`` run checks a mode's cells in: the cells most likely to fail first.

Measured on the project's broken-kernel corpus (``tests/corpus/broken_kernels.py``) by
``benchmarks/cell_order.py``, which runs every broken kernel on one example of every cell of every mode's
covering design and counts, per cell, the broken kernels (each a bug class seen in real kernels) it caught.
A design's cells are a convention's own, so what carries over to any kernel is the cells' *relations*
(``factor=level``, ``property_tests.strategies.design``): :data:`RELATION_WEIGHTS` holds each relation's lift,
the mean number of broken kernels a cell holding it caught less the mean of its (convention, mode, family)'s
cells, averaged over the designs it appears in. A cell's score is the sum of its relations' weights (a
relation the corpus never saw weighs 0); cells run highest score first, ties in the design's order. Only the
order changes: every cell still runs, and a cell keeps its own seed.
"""

from __future__ import annotations

from collections.abc import Sequence

from property_tests.strategies.design import Cell

__all__ = ["RELATION_WEIGHTS", "order", "score"]

#: relation -> lift in broken kernels caught per cell (``python benchmarks/cell_order.py`` prints this table;
#: measured on the 43 kernels of BROKEN and BROKEN_GRADIENTS, 25,859 cells: docs/speed.md, "Tiers")
RELATION_WEIGHTS: dict[str, float] = {
    'dtype=float16->float32': 2.567,
    'dtype=int8->int32': 0.623,
    'dtype=int4->bfloat16': 0.496,
    'dtype=int4->float32': 0.44,
    'dtype=bfloat16->float32': 0.297,
    'span=two_tiles': 0.285,
    'dtype=float8_e5m2->float32': 0.269,
    'm=aligned': 0.235,
    'span=one_tile': 0.221,
    'n=aligned': 0.211,
    'k=unaligned': 0.206,
    'm=unaligned': 0.186,
    'shard=middle': 0.158,
    'span=edge_off_by_one': 0.157,
    'rhs_storage=chunk': 0.147,
    'shard=last': 0.145,
    'groups=more_than_tiles': 0.141,
    'span=tail': 0.137,
    'k_eq_n=yes': 0.128,
    'n=unaligned': 0.116,
    'dtype=float4_e2m1fn->float32': 0.104,
    'dtype=float8_e5m2->bfloat16': 0.096,
    'rhs_storage=slice': 0.092,
    'lhs_storage=transposed': 0.089,
    'lhs_storage=slice': 0.088,
    'k=aligned': 0.072,
    'k=below': 0.065,
    'span=empty_first': 0.048,
    'span=several_odd': 0.048,
    'existing=no': 0.044,
    'layout=rhsT': 0.04,
    'lhs_storage=chunk': 0.038,
    'n=below': 0.031,
    'sharded=yes': 0.01,
    'span=empty_middle': 0.006,
    'existing=yes': -0.018,
    'layout=plain': -0.027,
    'm=below': -0.028,
    'rhs_storage=transposed': -0.03,
    'sharded=no': -0.03,
    'shard=none': -0.03,
    'dtype=float4_e2m1fn->bfloat16': -0.05,
    'dtype=int8->bfloat16': -0.079,
    'dtype=float32->float32': -0.112,
    'k_eq_n=no': -0.119,
    'rhs_storage=contiguous': -0.122,
    'dtype=int8->float32': -0.125,
    'lhs_storage=contiguous': -0.146,
    'span=empty_last': -0.17,
    'dtype=bfloat16->bfloat16': -0.198,
    'shard=first': -0.257,
    'groups=one': -0.428,
    'span=full': -0.43,
    'dtype=float16->float16': -0.455,
    'dtype=float8_e4m3fn->float32': -0.468,
    'k=zero': -0.615,
    'n=zero': -0.798,
    'm=zero': -0.798,
}


def score(cell: Cell) -> float:
    """The sum of the cell's relations' weights (:data:`RELATION_WEIGHTS`)."""
    return sum(RELATION_WEIGHTS.get(f"{factor}={level}", 0.0) for factor, level in cell.levels)


def order(cells: Sequence[Cell]) -> list[int]:
    """The indices of ``cells`` in the order to run them: highest :func:`score` first, ties as given."""
    return sorted(range(len(cells)), key=lambda i: (-score(cells[i]), i))
