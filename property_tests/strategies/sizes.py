"""Group sizes biased to the cases that break kernels, and shardings of groups."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from gmm_ref import families
from property_tests.strategies._common import (
    BOOLEANS,
    MAX_EXTENT,
    MAX_GROUPS,
    SEEDS,
    SMALL_TILE,
    cached_extents,
    check_bool,
    check_int,
    concrete,
    integers,
    resolve,
    sampled,
)

__all__ = ["draw_serving_sizes", "draw_sizes", "draw_span_sizes", "group_sizes", "serving_end", "shardings"]

SHAPE_PATTERNS = ("free", "edges", "empty_run", "one_group", "all_empty")
PATTERNS = st.sampled_from(SHAPE_PATTERNS)
_LIST_LIMIT = 16  # more groups than this: free sizes come from one drawn seed, for speed
_EDGE_TILES = 64  # group ends are drawn near the first (and last) this many tile edges


def _edges(extent: int, tile: int) -> list[int]:
    """Group ends one below, at and one above tile edges: the first and last few tiles of the extent."""
    last = extent // tile + 1
    tiles = range(1, last + 1) if last <= 2 * _EDGE_TILES else [*range(1, _EDGE_TILES + 1),
                                                                   *range(last - _EDGE_TILES + 1, last + 1)]
    return sorted({e for j in tiles for d in (-1, 0, 1) if 0 <= (e := j * tile + d) <= extent})


def _seeded_size_lists(seed: int, g: int, extent: int, tile: int) -> tuple[list[int], list[int]]:
    """As :func:`_size_lists`, from a seed: drawing 64 sizes one by one costs ~10 ms."""
    rng = np.random.default_rng(seed)
    specials = [v for v in (1, tile - 1, tile, tile + 1) if 0 <= v <= extent] or [0]
    branch = rng.integers(0, 3, size=g)
    free = np.where(branch == 0, rng.integers(0, min(extent, 3) + 1, size=g),
                    np.where(branch == 1, rng.choice(specials, size=g), rng.integers(0, extent + 1, size=g)))
    edges = np.array(_edges(extent, tile) or [0])
    cuts = np.where(rng.random(size=g) < 0.5, rng.choice(edges, size=g), rng.integers(0, extent + 1, size=g))
    return free.tolist(), cuts.tolist()


@functools.lru_cache(maxsize=4096)
def _size_lists(g: int, extent: int, tile: int) -> tuple[SearchStrategy[list[int]], SearchStrategy[list[int]]]:
    """(free sizes, group ends near tile edges) for G groups over extent."""
    specials = sorted({v for v in (1, tile - 1, tile, tile + 1) if 0 <= v <= extent})
    elem = st.one_of(st.integers(0, min(extent, 3)), st.sampled_from(specials or [0]), st.integers(0, extent))
    edges = _edges(extent, tile) or [0]
    cut = st.one_of(st.sampled_from(edges), st.integers(0, extent))
    return st.lists(elem, min_size=g, max_size=g), st.lists(cut, min_size=g, max_size=g)


# --------------------------------------------------------------- group sizes
def _fit(sizes: list[int], extent: int) -> list[int]:
    """Clip cumulatively so that sum(sizes) <= extent (later groups lose rows first)."""
    out, left = [], extent
    for s in sizes:
        s = min(s, left)
        out.append(s)
        left -= s
    return out


def draw_sizes(draw: Any, g: int, extent: int, tile: int, allow_tail: bool, pattern: str | None = None,
               want_tail: bool = False) -> list[int]:
    if g == 0:
        return []
    # with a tail allowed, full shrinks towards False: sum(sizes) below the extent
    full = draw(BOOLEANS) if allow_tail and not want_tail else not allow_tail
    if pattern is None:
        pattern = draw(PATTERNS)
    if pattern == "all_empty":
        sizes = [0] * g
        if full and extent:
            sizes[draw(integers(0, g - 1))] = extent  # all but one empty
        return sizes
    if pattern == "one_group":
        sizes = [0] * g
        sizes[draw(integers(0, g - 1))] = extent if full else draw(integers(0, extent))
        return sizes
    seeded = g > _LIST_LIMIT and pattern in ("free", "edges", "empty_run")
    if pattern == "edges":
        if seeded:
            cuts = sorted(_seeded_size_lists(draw(SEEDS), g, extent, tile)[1])
        else:
            cuts = sorted(draw(_size_lists(g, extent, tile)[1]))
        if full:
            cuts[-1] = extent
        return [b - a for a, b in zip([0, *cuts[:-1]], cuts, strict=True)]
    if seeded:
        sizes = _fit(_seeded_size_lists(draw(SEEDS), g, extent, tile)[0], extent)
    else:
        sizes = _fit(draw(_size_lists(g, extent, tile)[0]), extent)
    keep = None
    if pattern == "empty_run":
        start = draw(integers(0, g - 1))
        stop = draw(integers(start + 1, g))
        if full and extent and stop - start == g:
            stop = g - 1 if start == 0 and g > 1 else stop
        for i in range(start, stop):
            sizes[i] = 0
        keep = [i for i in range(g) if not start <= i < stop]
    if full and sum(sizes) < extent:
        choices = keep if keep is not None else list(range(g))
        if choices:
            sizes[choices[draw(integers(0, len(choices) - 1))]] += extent - sum(sizes)
        else:  # the run covers every group: only extent == 0 fits
            sizes[0] += extent - sum(sizes)
    return sizes


def group_sizes(
    *,
    num_groups: int | SearchStrategy[int] | None = None,
    min_groups: int = 1,
    max_groups: int = 8,
    extent: int | SearchStrategy[int] | None = None,
    tile: int = SMALL_TILE,
    allow_tail: bool = True,
) -> SearchStrategy[np.ndarray]:
    """int32 sizes of G groups over a ragged extent, biased to the cases that break kernels.

    Drawn by patterns: free sizes (biased to 0..3, ``tile - 1``, ``tile``,
    ``tile + 1``), group ends one row either side of a tile edge, a run of
    empty groups (first, middle, last), one group holding everything, all
    groups empty (all but one when ``allow_tail=False``). With
    ``allow_tail=True`` the sum may fall below the extent (padding rows; 0
    when all are empty); otherwise it equals it. ``extent`` defaults to
    :func:`extents` around ``tile``. Shrinks towards ``min_groups`` groups,
    free sizes, and sizes of 0 (or ``[extent]`` when the sum must be full).
    Limits: ``num_groups`` / ``max_groups`` <= 4096, ``extent`` <= 2**31 - 1
    (sizes are int32); arguments are checked when the strategy is built.
    """
    lo = check_int("min_groups", min_groups, minimum=0, maximum=MAX_GROUPS)
    hi = check_int("max_groups", max_groups, minimum=0, maximum=MAX_GROUPS)
    t = check_int("tile", tile, minimum=1, maximum=MAX_EXTENT)
    tail = check_bool("allow_tail", allow_tail)
    if num_groups is None and lo > hi:
        raise InvalidArgument(f"min_groups={lo} is greater than max_groups={hi}")

    def checked(g: Any, e: Any) -> tuple[int, int]:
        g = check_int("num_groups", g, minimum=0, maximum=MAX_GROUPS)
        e = check_int("extent", e, minimum=0, maximum=MAX_EXTENT)
        if g == 0 and e and not tail:
            raise InvalidArgument(f"num_groups=0 and allow_tail=False, but extent={e} > 0 cannot be covered")
        return g, e

    if num_groups is not None and extent is not None and concrete(num_groups, extent):
        checked(num_groups, extent)
    elif num_groups is not None and concrete(num_groups):
        check_int("num_groups", num_groups, minimum=0, maximum=MAX_GROUPS)
    elif extent is not None and concrete(extent):
        check_int("extent", extent, minimum=0, maximum=MAX_EXTENT)

    @st.composite
    def _draw(draw: Any) -> Any:
        g = draw(integers(lo, hi)) if num_groups is None else resolve(draw, num_groups)
        e = cached_extents(t, 0, 3 * t + 1, 1)(draw) if extent is None else resolve(draw, extent)
        g, e = checked(g, e)
        return np.array(draw_sizes(draw, g, e, t, tail), np.int32)

    return _draw()


# ------------------------------------------------------------------ sharding
def shardings(
    *, num_groups: int | SearchStrategy[int], min_shards: int = 1, max_shards: int | None = None,
) -> SearchStrategy[tuple[int, int]]:
    """``(group_offset, num_local_groups)`` of one of S equal shards of ``num_groups`` groups.

    S is a divisor of G in ``[min_shards, max_shards]``; the shard index is
    any of the S. Shrinks towards one shard (``(0, num_groups)``), then the first.
    """
    lo = check_int("min_shards", min_shards, minimum=1, maximum=MAX_GROUPS)
    top = None if max_shards is None else check_int("max_shards", max_shards, minimum=1, maximum=MAX_GROUPS)

    def divisors(g: Any) -> tuple[int, ...]:
        g = check_int("num_groups", g, minimum=1, maximum=MAX_GROUPS)
        found = tuple(s for s in range(lo, min(g if top is None else top, g) + 1) if g % s == 0)
        if not found:
            raise InvalidArgument(
                f"min_shards={lo}, max_shards={max_shards}, but no shard count in that range divides num_groups={g}")
        return found

    if concrete(num_groups):
        divisors(num_groups)

    @st.composite
    def _draw(draw: Any) -> Any:
        g = resolve(draw, num_groups)
        s = draw(sampled(divisors(g)))
        local = g // s
        return draw(integers(0, s - 1)) * local, local

    return _draw()



# ------------------------------------------------------------ one relation
@functools.lru_cache(maxsize=4096)
def _cut_lists(total: int, n: int, tile: int) -> SearchStrategy[list[int]]:
    """``n`` cut points in ``[0, total]``, each a tile edge +- 1 or any."""
    edges = [e for e in _edges(total, tile) if 0 <= e <= total] or [0]
    return st.lists(st.one_of(st.sampled_from(edges), st.integers(0, total)), min_size=n, max_size=n)


@functools.lru_cache(maxsize=4096)
def _one_of_or_any(specials: tuple[int, ...], extent: int) -> SearchStrategy[int]:
    return st.one_of(st.sampled_from(specials), st.integers(0, extent))


def _split(draw: Any, total: int, n: int, tile: int) -> list[int]:
    """``n`` sizes summing to ``total``, cut points biased to tile edges +- 1."""
    if n <= 0:
        return []
    if n == 1:
        return [total]
    cuts = sorted(draw(_cut_lists(total, n - 1, tile)) if n <= _LIST_LIMIT + 1 else
                  np.random.default_rng(draw(SEEDS)).integers(0, total + 1, size=n - 1).tolist())
    return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


def _special(draw: Any, span: str, extent: int, tile: int, first: bool) -> tuple[int, int]:
    """[start, end) of a non-final group showing ``span`` (``first``: it is group 0, so it starts at 0)."""
    last_tile = (extent - 1) // tile
    if span == "edge_off_by_one":
        ends = [e for j in range(1, extent // tile + 2) for e in (j * tile - 1, j * tile + 1) if 1 <= e <= extent]
        end = draw(sampled(tuple(ends)))
        return (0 if first else draw(integers(0, end - 1))), end
    touch = {"one_tile": 1, "two_tiles": 2}.get(span) or draw(sampled(tuple(range(3, last_tile + 2, 2))))
    i = 0 if first else draw(integers(0, last_tile + 1 - touch))
    a = 0 if first else draw(integers(0, tile - 1))
    start = i * tile + a
    lo = (i + touch - 1) * tile + 1 if touch > 1 else start + 1
    hi = min((i + touch) * tile, extent)
    if start >= extent or lo > hi:  # the drawn start leaves too little: start the group on its tile's edge
        start, lo = i * tile, max((i + touch - 1) * tile + 1, i * tile + 1)
    return start, draw(integers(lo, hi))


def _least(span: str, tile: int) -> int:
    """The shortest extent that can show ``span`` in a non-final group."""
    return {"one_tile": 1, "two_tiles": tile + 1, "several_odd": 2 * tile + 1,
            "edge_off_by_one": tile - 1 if tile >= 2 else tile + 1}.get(span, 0)


def draw_span_sizes(draw: Any, span: str, g: int, extent: int, tile: int, allow_tail: bool) -> list[int]:
    """Sizes of ``g`` groups over ``extent`` that show the relation ``span`` (``design.SPAN_LEVELS``); the
    other groups vary freely, the sum falls short of the extent only for ``"tail"`` (or when a tail is
    allowed and drawn)."""
    least = _least(span, tile)
    if span == "tail":
        total = draw(integers(0, extent - 1))
    elif span == "full" or not allow_tail:
        total = extent
    else:
        total = draw(sampled((extent, draw(integers(least, extent)))))
    if span in ("full", "tail"):
        return _split(draw, total, g, tile)
    if span.startswith("empty_"):
        where = {"empty_first": 0, "empty_last": g - 1}.get(span)
        where = draw(integers(1, g - 2)) if where is None else where
        rest = _split(draw, total, g - 1, tile)
        return [*rest[:where], 0, *rest[where:]]
    j = draw(integers(0, g - 2))
    start, end = _special(draw, span, total, tile, j == 0)
    return [*_split(draw, start, j, tile), end - start, *_split(draw, total - end, g - 1 - j, tile)]


# ------------------------------------------------------------ the serving layouts
def serving_end(sizes: list[int], alignment: int) -> int:
    """The row after the last non-empty group of a ``padded_contiguous`` layout (each group at a multiple of
    ``alignment``)."""
    end = last = 0
    for s in sizes:
        end = -(-end // alignment) * alignment + s
        if s:
            last = end
    return last


def _serving_free(draw: Any, extent: int, tile: int) -> int:
    specials = sorted({v for v in (0, 1, tile - 1, tile, tile + 1, extent - 1, extent) if 0 <= v <= extent})
    return draw(_one_of_or_any(tuple(specials), extent))


def _serving_special(draw: Any, span: str, extent: int, tile: int) -> int:
    """The size of a non-final group showing ``span``: touching 1, 2 or an odd number >= 3 of tiles, or one
    row off a tile edge."""
    if span == "edge_off_by_one":
        return draw(sampled(tuple(v for j in range(extent // tile + 2) for v in (j * tile - 1, j * tile + 1)
                                  if 1 <= v <= extent)))
    touch = {"one_tile": 1, "two_tiles": 2}.get(span)
    if touch is None:
        touch = draw(sampled(tuple(range(3, (extent - 1) // tile + 2, 2))))
    return draw(integers((touch - 1) * tile + 1, min(touch * tile, extent)))


def draw_serving_sizes(draw: Any, family: str, span: str, g: int, extent: int, tile: int,
                       allow_tail: bool = True) -> list[int]:
    """Sizes of ``g`` groups of a serving layout showing the relation ``span`` (``design.SPAN_LEVELS``).

    ``masked``: each group's valid rows, in ``[0, extent]`` (``full``: every group full; ``tail``: some group
    with rows past its count). ``padded_contiguous``: sizes whose layout, each group starting at a multiple of
    ``tile`` (the alignment), fits ``extent`` rows (``full``: no padding row at all; ``tail``: some). Group
    sizes are biased to 0, 1, and one row either side of the alignment."""
    if g == 0:
        return []
    groups = families.get(family).groups  # COUNTS (masked) or ALIGNED (padded_contiguous)
    if span == "full" or not allow_tail:
        if groups == families.COUNTS:
            return [extent] * g
        # every group but the last a multiple of the alignment, the last ending at the extent
        sizes = [0] * g
        left = extent
        for i in range(g - 1):
            take = draw(integers(0, left // tile)) * tile
            sizes[i], left = take, left - take
        sizes[-1] = left
        return sizes
    special, where = None, None
    if span.startswith("empty_"):
        where = {"empty_first": 0, "empty_last": g - 1}.get(span)
        where = draw(integers(1, g - 2)) if where is None else where
        special = 0
    elif span != "tail":
        where = draw(integers(0, g - 2))
        special = _serving_special(draw, span, extent, tile)
    sizes = [_serving_free(draw, extent, tile) for _ in range(g)]
    if where is not None:
        sizes[where] = special
    if span == "tail" and groups == families.COUNTS:  # some group with rows past its count
        j = draw(integers(0, g - 1))
        sizes[j] = min(sizes[j], extent - 1)
    if groups == families.ALIGNED:
        # drop rows from the other groups, last first, until the aligned layout fits
        for i in reversed(range(g)):
            if serving_end(sizes, tile) <= extent:
                break
            if i == where:
                continue
            sizes[i] = 0
        if serving_end(sizes, tile) > extent:  # the special group alone: it starts at 0
            sizes = [0] * g
            if where is not None:
                sizes[where] = min(special, extent)
        if span == "tail" and sum(sizes) >= extent:  # some row of no group
            last = max(i for i in range(g) if sizes[i] or i == g - 1)
            sizes[last] = max(sizes[last] - 1, 0)
    return sizes
