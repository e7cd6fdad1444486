"""Shared helpers of the strategies: argument checks, cached strategy objects, and the one way an extent is drawn
around tile edges (:class:`Extents`), which the public ``extents()`` and the static signatures both use."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from gmm_ref import as_tiling

__all__ = ["BOOLEANS", "MAX_EXTENT", "MAX_GROUPS", "SEEDS", "SMALL_TILE", "Extents", "cached_extents", "check_bool",
           "check_int", "check_tiling", "concrete", "extent_candidates", "integers", "pairs_of", "resolve", "sampled"]

SMALL_TILE = 8  # the tile edges drawn around when no tiling is given
#: the largest extent a strategy draws around (group sizes are int32 in every kernel API)
MAX_EXTENT = 2**31 - 1
#: the most groups a strategy draws (each group costs a list element per draw)
MAX_GROUPS = 4096
BOOLEANS = st.booleans()
SEEDS = st.integers(0, 2**32 - 1)
PARTS = st.integers(0, 2)


def resolve(draw: Any, value: Any) -> Any:
    """``value``, or a draw from it when it is a strategy."""
    return draw(value) if isinstance(value, SearchStrategy) else value


def concrete(*values: Any) -> bool:
    """No value is a strategy: the arguments can be checked when the strategy is built."""
    return not any(isinstance(v, SearchStrategy) for v in values)


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{name}={value!r}, but it must be an int")
    if minimum is not None and value < minimum:
        raise InvalidArgument(f"{name}={value!r}, but it must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(f"{name}={value!r}, but it must be at most {maximum}")
    return int(value)


def check_bool(name: str, value: Any, *, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        expected = "None, True or False" if allow_none else "True or False"
        raise InvalidArgument(f"{name}={value!r}, but it must be {expected}")
    return bool(value)


def check_tiling(value: Any, name: str = "tiling") -> tuple[int, int, int]:
    if isinstance(value, str):
        raise InvalidArgument(f"{name}={value!r}, but it must be three positive ints (tm, tk, tn)")
    try:
        return as_tiling(value, name=name)
    except ValueError:
        raise InvalidArgument(f"{name}={value!r}, but it must be three positive ints (tm, tk, tn)") from None


@functools.lru_cache(maxsize=4096, typed=True)
def integers(lo: int, hi: int) -> SearchStrategy[int]:
    # strategies are built once and reused: a fresh one costs validation on every draw
    return st.integers(lo, hi)


def sampled(elements: tuple) -> SearchStrategy:
    # keyed by the element types too: (True, False) == (1, 0), but must not share a strategy
    return _sampled_typed(elements, _types(elements))


def _types(x: Any) -> Any:
    return (tuple, tuple(_types(v) for v in x)) if type(x) is tuple else type(x)


@functools.lru_cache(maxsize=1024)
def _sampled_typed(elements: tuple, types: Any) -> SearchStrategy:
    return st.sampled_from(elements)


def extent_candidates(tile: int, lo: int, hi: int, mult: int) -> list[int]:
    """Extents around tile edges: below one tile, exact multiples and multiples +-1 (or +-mult)."""
    cands = {1, 2, mult, 2 * mult, max(1, tile // 2), tile // 2 + 1}
    for j in (1, 2, 3):
        for d in (-mult, -1, 0, 1, mult):
            cands.add(j * tile + d)
    out = sorted(v for v in cands if lo <= v <= hi and v % mult == 0)
    if not out:
        first = -(-lo // mult) * mult
        if first <= hi:
            out = [first]
    return out


class Extents:
    """Draws one extent: a part (below one tile, around tile edges, any multiple of
    ``mult``), then a value in it. The same choices as ``one_of`` of the three parts,
    at fewer nested draws; shrinks towards the smallest candidate."""

    __slots__ = ("parts",)

    def __init__(self, tile: int, lo: int, hi: int, mult: int) -> None:
        cands = extent_candidates(tile, lo, hi, mult)
        below = tuple(v for v in cands if v < tile) or tuple(cands)
        edges = tuple(v for v in cands if v >= tile - mult) or tuple(cands)
        self.parts = (sampled(below), sampled(edges), integers(-(-lo // mult), hi // mult), mult)

    def __call__(self, draw: Any) -> int:
        below, edges, free, mult = self.parts
        part = draw(PARTS)
        return draw(below) if part == 0 else draw(edges) if part == 1 else draw(free) * mult


@functools.lru_cache(maxsize=1024)
def cached_extents(tile: int, lo: int, hi: int, mult: int) -> Extents:
    # built once per argument tuple: building strategies inside a draw is slow
    return Extents(tile, lo, hi, mult)


def pairs_of(levels: dict[str, Any]) -> set[frozenset[tuple[str, str]]]:
    """Every pair of (factor, level) of a row of a covering design; a factor may hold a set of observed levels."""
    items = [(f, v if isinstance(v, (set, frozenset)) else {v}) for f, v in levels.items()]
    out = set()
    for (f, a), (g, b) in itertools.combinations(items, 2):
        out.update(frozenset({(f, x), (g, y)}) for x in a for y in b)
    return out
