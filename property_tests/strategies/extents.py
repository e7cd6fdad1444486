"""Extents (M, K, N) around tile edges, and kernel tilings."""

from __future__ import annotations

import functools
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from property_tests.strategies._common import (
    MAX_EXTENT,
    SMALL_TILE,
    check_int,
    concrete,
    extent_candidates,
    resolve,
    sampled,
)

__all__ = ["extents", "tilings"]

# ------------------------------------------------------------------- tilings
def tilings(*, min_tile: int = 8, max_tile: int = 512) -> SearchStrategy[tuple[int, int, int]]:
    """Kernel tilings ``(tm, tk, tn)`` of powers of two in ``[min_tile, max_tile]``.

    Shrinks towards ``(min_tile, min_tile, min_tile)`` rounded up to a power of two.
    """
    def powers(lo: Any, hi: Any) -> tuple[int, ...]:
        lo = check_int("min_tile", lo, minimum=1, maximum=MAX_EXTENT)
        hi = check_int("max_tile", hi, minimum=1, maximum=MAX_EXTENT)
        found = tuple(1 << e for e in range(31) if lo <= (1 << e) <= hi)
        if not found:
            raise InvalidArgument(f"min_tile={lo}, max_tile={hi}, but no power of two lies between them")
        return found

    if concrete(min_tile, max_tile):
        powers(min_tile, max_tile)

    @st.composite
    def _draw(draw: Any) -> Any:
        one = sampled(powers(resolve(draw, min_tile), resolve(draw, max_tile)))
        return (draw(one), draw(one), draw(one))

    return _draw()


# ------------------------------------------------------------------- extents
def extents(
    *, tile: int | SearchStrategy[int] = SMALL_TILE, min_value: int = 1, max_value: int | None = None,
    multiple_of: int = 1,
) -> SearchStrategy[int]:
    """One extent (M, K or N) drawn around a tile's edges.

    Biased to exact multiples of ``tile``, multiples +-1 (+-``multiple_of``
    when the kernel needs a multiple), values below one tile, and otherwise
    any multiple of ``multiple_of`` in ``[min_value, max_value]`` (default
    ``max_value``: three tiles). Shrinks towards the smallest such extent.
    """
    def checked(t: Any, lo: Any, hi: Any, mult: Any) -> tuple[int, int, int, int]:
        t = check_int("tile", t, minimum=1, maximum=MAX_EXTENT)
        lo = check_int("min_value", lo, minimum=0, maximum=MAX_EXTENT)
        hi = 3 * t + 1 if hi is None else check_int("max_value", hi, minimum=0, maximum=MAX_EXTENT)
        mult = check_int("multiple_of", mult, minimum=1, maximum=MAX_EXTENT)
        if lo > hi:
            raise InvalidArgument(f"min_value={lo} is greater than max_value={hi}")
        if not extent_candidates(t, lo, hi, mult):
            raise InvalidArgument(
                f"multiple_of={mult}, but no multiple of it lies in [min_value, max_value] = [{lo}, {hi}]")
        return t, lo, hi, mult

    if concrete(tile, min_value, max_value, multiple_of):
        checked(tile, min_value, max_value, multiple_of)

    @st.composite
    def _draw(draw: Any) -> Any:
        args = [resolve(draw, v) for v in (tile, min_value, max_value, multiple_of)]
        return draw(_extent_strategy(*checked(*args)))

    return _draw()


def _times(mult: int) -> Any:
    return lambda v: v * mult


@functools.lru_cache(maxsize=1024)
def _extent_strategy(tile: int, lo: int, hi: int, mult: int) -> SearchStrategy[int]:
    # the public extents() keeps one_of: the same choices as Extents, and the spans
    # (so the examples after the first few) it has always drawn
    cands = extent_candidates(tile, lo, hi, mult)
    below = [v for v in cands if v < tile] or cands
    edges = [v for v in cands if v >= tile - mult] or cands
    free = st.integers(-(-lo // mult), hi // mult).map(_times(mult))
    return st.one_of(st.sampled_from(below), st.sampled_from(edges), free)
