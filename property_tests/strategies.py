"""Public Hypothesis strategies for grouped GEMM edge cases (``from property_tests import strategies as gst``).

The strategies draw the cases that broke real kernels and that nobody writes by
hand: empty groups side by side, every group empty, one group holding every row,
group boundaries one row either side of a tile edge, K remainders, padding rows
full of NaN, a shard whose first group is empty. Failures shrink towards few
groups, small sizes and small integer values.

*Compile-aware*: :func:`problems` takes its static (recompiling) parameters,
i.e. family, layout, shapes, group count, dtypes and whether an output is
passed, from a small fixed list of *buckets* per strategy (``max_buckets``),
while group sizes, the shard offset and the values vary freely. N examples
against a jitted kernel therefore compile at most ``max_buckets`` times.

Importing this module needs neither jax nor torch, and has no side effects.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

import gmm_ref
from gmm_ref import dtypes as _dt
from gmm_ref.layouts import blocks as _blocks

__all__ = [
    "CONVENTION_RULES",
    "VALUE_KINDS",
    "ConventionRules",
    "extents",
    "group_sizes",
    "problems",
    "shardings",
    "tilings",
]

VALUE_KINDS = ("exact", "normal", "wide", "poisoned")
_VALUE_ALIASES = {"integers": "exact", "poison": "poisoned"}
_SMALL_TILE = 8  # the tile edges drawn around when no tiling is given
_MAX_ELEMENTS = 1 << 20  # per buffer; keeps drawing fast
_LIST_LIMIT = 16  # more groups than this: free sizes come from one drawn seed, for speed
_SHAPE_PATTERNS = ("free", "edges", "empty_run", "one_group", "all_empty")

_F32, _F16, _F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
_BF16 = np.dtype(gmm_ref.round_to(np.zeros(1), "bfloat16").dtype)
_I8, _I32 = np.dtype(np.int8), np.dtype(np.int32)


# --------------------------------------------------------------- convention rules
@dataclass(frozen=True)
class ConventionRules:
    """What one convention's real kernel takes and the policies it has.

    ``layouts`` per family are ``(lhs_transposed, rhs_transposed, packed)``;
    ``multiple_of`` maps an axis (``"m"``, ``"k"``, ``"n"`` or ``"ragged"``) to
    what its extent must be a multiple of: an int, ``"tm"``/``"tk"``/``"tn"``
    (that tile), or ``"16B"`` (16 bytes of the input dtype).
    """

    families: tuple[str, ...]
    layouts: dict[str, tuple[tuple[bool, bool, bool], ...]]
    dtypes: tuple[tuple[np.dtype, np.dtype], ...]
    tail: str = "zero"
    foreign: str = "zero"
    empty: str = "zero"
    existing_policy: str | None = None  # None: takes no existing output
    sharding: bool = False
    max_batch_dims: int = 0
    full_sums: bool = False  # sum(group_sizes) must equal the ragged extent
    multiple_of: tuple[tuple[str, Any], ...] = ()
    default_tiling: tuple[int, int, int] | None = None
    default_families: tuple[str, ...] | None = None


_PLAIN = ((False, False, False),)
_TRANSPOSES = tuple((lt, rt, False) for lt in (False, True) for rt in (False, True))


def _packed_layouts(family: str) -> tuple[tuple[bool, bool, bool], ...]:
    out = []
    for lt, rt in ((False, False), (False, True), (True, False), (True, True)):
        ragged_last = {
            "ragged_m": lt,
            "ragged_n": not rt,
            "ragged_k": (not lt) or rt,
            "batch": False,
        }[family]
        out.append((lt, rt, ragged_last))
    return tuple(out)


def _any_layouts(family: str) -> tuple[tuple[bool, bool, bool], ...]:
    return tuple(dict.fromkeys(_TRANSPOSES + tuple(x for x in _packed_layouts(family) if x[2])))


_FAMS = gmm_ref.FAMILIES
CONVENTION_RULES: dict[str | None, ConventionRules] = {
    "ragged_dot": ConventionRules(
        families=("ragged_m",), layouts={"ragged_m": _PLAIN},
        dtypes=((_F32, _F32), (_BF16, _BF16), (_BF16, _F32), (_F16, _F16), (_F16, _F32), (_I8, _I32)),
    ),
    "ragged_dot_general": ConventionRules(
        families=("ragged_m", "ragged_k", "batch"), layouts={f: _TRANSPOSES for f in _FAMS},
        dtypes=((_F32, _F32), (_BF16, _BF16), (_BF16, _F32), (_F16, _F16), (_F16, _F32), (_I8, _I32)),
        max_batch_dims=1,
    ),
    "megablox.gmm": ConventionRules(
        families=("ragged_m",), layouts={"ragged_m": ((False, False, False), (False, True, False))},
        dtypes=((_F32, _F32), (_BF16, _F32), (_BF16, _BF16)),
        tail="undefined", foreign="zero", existing_policy="overwrite", sharding=True,
        multiple_of=(("ragged", "tm"),), default_tiling=(128, 128, 128),
    ),
    "megablox.tgmm": ConventionRules(
        families=("ragged_k",), layouts={"ragged_k": _PLAIN},
        dtypes=((_F32, _F32), (_BF16, _F32), (_BF16, _BF16)),
        empty="zero", existing_policy="accumulate", sharding=True,
        # megablox's tgmm calls the ragged (contracting) axis m and tiles it by tm
        multiple_of=(("ragged", "tm"),), default_tiling=(128, 128, 128),
    ),
    "torch.grouped_mm": ConventionRules(
        families=_FAMS, layouts={f: _PLAIN for f in _FAMS},
        dtypes=((_F32, _F32), (_BF16, _BF16), (_F16, _F16)),
        tail="undefined", empty="zero",
        # every operand's and the output's leading stride is a multiple of 16 bytes
        multiple_of=(("k", "16B"), ("n", "16B")),
    ),
    "te.grouped_gemm": ConventionRules(
        families=("ragged_m", "ragged_n", "ragged_k"),
        layouts={f: tuple(x for x in _packed_layouts(f)) for f in _FAMS},
        dtypes=((_BF16, _BF16), (_F16, _F16), (_F32, _F32), (_BF16, _F32)),
        full_sums=True, default_families=("ragged_m", "ragged_k"),
    ),
    None: ConventionRules(
        families=_FAMS, layouts={f: _any_layouts(f) for f in _FAMS},
        dtypes=((_F32, _F32), (_BF16, _F32), (_BF16, _BF16), (_F16, _F16), (_F64, _F64), (_I8, _I32)),
        existing_policy="any", sharding=True, max_batch_dims=1,
    ),
}


# ------------------------------------------------------------------- helpers
def _resolve(draw, value):
    return draw(value) if isinstance(value, SearchStrategy) else value


def _check_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{name}={value!r}, but it must be an int")
    if minimum is not None and value < minimum:
        raise InvalidArgument(f"{name}={value!r}, but it must be at least {minimum}")
    return int(value)


def _check_tiling(value: Any, name: str = "tiling") -> tuple[int, int, int]:
    try:
        t = tuple(value)
    except TypeError:
        raise InvalidArgument(f"{name}={value!r}, but it must be three positive ints (tm, tk, tn)") from None
    if len(t) != 3 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0 for v in t):
        raise InvalidArgument(f"{name}={value!r}, but it must be three positive ints (tm, tk, tn)")
    return tuple(int(v) for v in t)


def _extent_candidates(tile: int, lo: int, hi: int, mult: int) -> list[int]:
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


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


# ------------------------------------------------------------------- tilings
def tilings(*, min_tile: int = 8, max_tile: int = 512) -> SearchStrategy[tuple[int, int, int]]:
    """Kernel tilings ``(tm, tk, tn)`` of powers of two in ``[min_tile, max_tile]``.

    Shrinks towards ``(min_tile, min_tile, min_tile)`` rounded up to a power of two.
    """
    @st.composite
    def _draw(draw):
        lo = _check_int("min_tile", _resolve(draw, min_tile), minimum=1)
        hi = _check_int("max_tile", _resolve(draw, max_tile), minimum=1)
        powers = [1 << e for e in range(0, 31) if lo <= (1 << e) <= hi]
        if not powers:
            raise InvalidArgument(f"min_tile={lo}, max_tile={hi}, but no power of two lies between them")
        one = _sampled(tuple(powers))
        return (draw(one), draw(one), draw(one))

    return _draw()


# ------------------------------------------------------------------- extents
def extents(
    *, tile: int | SearchStrategy[int] = _SMALL_TILE, min_value: int = 1, max_value: int | None = None,
    multiple_of: int = 1,
) -> SearchStrategy[int]:
    """One extent (M, K or N) drawn around a tile's edges.

    Biased to exact multiples of ``tile``, multiples +-1 (+-``multiple_of``
    when the kernel needs a multiple), values below one tile, and otherwise
    any multiple of ``multiple_of`` in ``[min_value, max_value]`` (default
    ``max_value``: three tiles). Shrinks towards the smallest such extent.
    """
    @st.composite
    def _draw(draw):
        t = _check_int("tile", _resolve(draw, tile), minimum=1)
        lo = _check_int("min_value", _resolve(draw, min_value), minimum=0)
        hi = 3 * t + 1 if max_value is None else _check_int("max_value", _resolve(draw, max_value), minimum=0)
        mult = _check_int("multiple_of", _resolve(draw, multiple_of), minimum=1)
        if lo > hi:
            raise InvalidArgument(f"min_value={lo} is greater than max_value={hi}")
        cands = _extent_candidates(t, lo, hi, mult)
        if not cands:
            raise InvalidArgument(
                f"multiple_of={mult}, but no multiple of it lies in [min_value, max_value] = [{lo}, {hi}]"
            )
        return draw(_extent_strategy(t, lo, hi, mult))

    return _draw()


_BOOLEANS = st.booleans()
_SEEDS = st.integers(0, 2**32 - 1)
_PATTERNS = st.sampled_from(_SHAPE_PATTERNS)
_PARTS = st.integers(0, 2)


@functools.lru_cache(maxsize=4096, typed=True)
def _integers(lo: int, hi: int) -> SearchStrategy[int]:
    # strategies are built once and reused: a fresh one costs validation on every draw
    return st.integers(lo, hi)


def _sampled(elements: tuple) -> SearchStrategy:
    # keyed by the element types too: (True, False) == (1, 0), but must not share a strategy
    return _sampled_typed(elements, _types(elements))


def _types(x: Any) -> Any:
    return (tuple, tuple(_types(v) for v in x)) if type(x) is tuple else type(x)


@functools.lru_cache(maxsize=1024)
def _sampled_typed(elements: tuple, types: Any) -> SearchStrategy:
    return st.sampled_from(elements)


class _Extents:
    """Draws one extent: a part (below one tile, around tile edges, any multiple of
    ``mult``), then a value in it. The same choices as ``one_of`` of the three parts,
    at fewer nested draws; shrinks towards the smallest candidate."""

    __slots__ = ("parts",)

    def __init__(self, tile: int, lo: int, hi: int, mult: int) -> None:
        cands = _extent_candidates(tile, lo, hi, mult)
        below = tuple(v for v in cands if v < tile) or tuple(cands)
        edges = tuple(v for v in cands if v >= tile - mult) or tuple(cands)
        self.parts = (_sampled(below), _sampled(edges), _integers(-(-lo // mult), hi // mult), mult)

    def __call__(self, draw) -> int:
        below, edges, free, mult = self.parts
        part = draw(_PARTS)
        return draw(below) if part == 0 else draw(edges) if part == 1 else draw(free) * mult


@functools.lru_cache(maxsize=1024)
def _extents(tile: int, lo: int, hi: int, mult: int) -> _Extents:
    # built once per argument tuple: building strategies inside a draw is slow
    return _Extents(tile, lo, hi, mult)


def _times(mult: int):
    return lambda v: v * mult


@functools.lru_cache(maxsize=1024)
def _extent_strategy(tile: int, lo: int, hi: int, mult: int) -> SearchStrategy[int]:
    # the public extents() keeps one_of: the same choices as _Extents, and the spans
    # (so the examples after the first few) it has always drawn
    cands = _extent_candidates(tile, lo, hi, mult)
    below = [v for v in cands if v < tile] or cands
    edges = [v for v in cands if v >= tile - mult] or cands
    free = st.integers(-(-lo // mult), hi // mult).map(_times(mult))
    return st.one_of(st.sampled_from(below), st.sampled_from(edges), free)


def _seeded_size_lists(seed: int, g: int, extent: int, tile: int):
    """As :func:`_size_lists`, from a seed: drawing 64 sizes one by one costs ~10 ms."""
    rng = np.random.default_rng(seed)
    specials = [v for v in (1, tile - 1, tile, tile + 1) if 0 <= v <= extent] or [0]
    branch = rng.integers(0, 3, size=g)
    free = np.where(branch == 0, rng.integers(0, min(extent, 3) + 1, size=g),
                    np.where(branch == 1, rng.choice(specials, size=g), rng.integers(0, extent + 1, size=g)))
    edges = np.array([j * tile + d for j in range(1, extent // tile + 2) for d in (-1, 0, 1)])
    edges = edges[(edges >= 0) & (edges <= extent)]
    edges = edges if edges.size else np.zeros(1, int)
    cuts = np.where(rng.random(size=g) < 0.5, rng.choice(edges, size=g), rng.integers(0, extent + 1, size=g))
    return free.tolist(), cuts.tolist()


@functools.lru_cache(maxsize=4096)
def _size_lists(g: int, extent: int, tile: int) -> tuple[SearchStrategy[list[int]], SearchStrategy[list[int]]]:
    """(free sizes, group ends near tile edges) for G groups over extent."""
    specials = sorted({v for v in (1, tile - 1, tile, tile + 1) if 0 <= v <= extent})
    elem = st.one_of(st.integers(0, min(extent, 3)), st.sampled_from(specials or [0]), st.integers(0, extent))
    edges = sorted({j * tile + d for j in range(1, extent // tile + 2) for d in (-1, 0, 1)})
    edges = [e for e in edges if 0 <= e <= extent] or [0]
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


def _draw_sizes(draw, g: int, extent: int, tile: int, allow_tail: bool, pattern: str | None = None,
                want_tail: bool = False) -> list[int]:
    if g == 0:
        return []
    # with a tail allowed, full shrinks towards False: sum(sizes) below the extent
    full = draw(_BOOLEANS) if allow_tail and not want_tail else not allow_tail
    if pattern is None:
        pattern = draw(_PATTERNS)
    if pattern == "all_empty":
        sizes = [0] * g
        if full and extent:
            sizes[draw(_integers(0, g - 1))] = extent  # all but one empty
        return sizes
    if pattern == "one_group":
        sizes = [0] * g
        sizes[draw(_integers(0, g - 1))] = extent if full else draw(_integers(0, extent))
        return sizes
    seeded = g > _LIST_LIMIT and pattern in ("free", "edges", "empty_run")
    if pattern == "edges":
        if seeded:
            cuts = sorted(_seeded_size_lists(draw(_SEEDS), g, extent, tile)[1])
        else:
            cuts = sorted(draw(_size_lists(g, extent, tile)[1]))
        if full:
            cuts[-1] = extent
        return [b - a for a, b in zip([0] + cuts[:-1], cuts)]
    if seeded:
        sizes = _fit(_seeded_size_lists(draw(_SEEDS), g, extent, tile)[0], extent)
    else:
        sizes = _fit(draw(_size_lists(g, extent, tile)[0]), extent)
    keep = None
    if pattern == "empty_run":
        start = draw(_integers(0, g - 1))
        stop = draw(_integers(start + 1, g))
        if full and extent and stop - start == g:
            stop = g - 1 if start == 0 and g > 1 else stop
        for i in range(start, stop):
            sizes[i] = 0
        keep = [i for i in range(g) if not start <= i < stop]
    if full and sum(sizes) < extent:
        choices = keep if keep is not None else list(range(g))
        if choices:
            sizes[choices[draw(_integers(0, len(choices) - 1))]] += extent - sum(sizes)
        else:  # the run covers every group: only extent == 0 fits
            sizes[0] += extent - sum(sizes)
    return sizes


def group_sizes(
    *,
    num_groups: int | SearchStrategy[int] | None = None,
    min_groups: int = 1,
    max_groups: int = 8,
    extent: int | SearchStrategy[int] | None = None,
    tile: int = _SMALL_TILE,
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
    """
    @st.composite
    def _draw(draw):
        lo = _check_int("min_groups", min_groups, minimum=0)
        hi = _check_int("max_groups", max_groups, minimum=0)
        t = _check_int("tile", tile, minimum=1)
        if num_groups is None:
            if lo > hi:
                raise InvalidArgument(f"min_groups={lo} is greater than max_groups={hi}")
            g = draw(_integers(lo, hi))
        else:
            g = _check_int("num_groups", _resolve(draw, num_groups), minimum=0)
        if extent is None:
            e = _extents(t, 0, 3 * t + 1, 1)(draw)
        else:
            e = _check_int("extent", _resolve(draw, extent), minimum=0)
        if g == 0 and e and not allow_tail:
            raise InvalidArgument(f"num_groups=0 and allow_tail=False, but extent={e} > 0 cannot be covered")
        return np.array(_draw_sizes(draw, g, e, t, bool(allow_tail)), np.int32)

    return _draw()


# ------------------------------------------------------------------ sharding
def shardings(
    *, num_groups: int | SearchStrategy[int], min_shards: int = 1, max_shards: int | None = None,
) -> SearchStrategy[tuple[int, int]]:
    """``(group_offset, num_local_groups)`` of one of S equal shards of ``num_groups`` groups.

    S is a divisor of G in ``[min_shards, max_shards]``; the shard index is
    any of the S. Shrinks towards one shard (``(0, num_groups)``), then the first.
    """
    @st.composite
    def _draw(draw):
        g = _check_int("num_groups", _resolve(draw, num_groups), minimum=1)
        lo = _check_int("min_shards", min_shards, minimum=1)
        hi = g if max_shards is None else _check_int("max_shards", max_shards, minimum=1)
        divisors = [s for s in range(lo, min(hi, g) + 1) if g % s == 0]
        if not divisors:
            raise InvalidArgument(
                f"min_shards={lo}, max_shards={max_shards}, but no shard count in that range divides "
                f"num_groups={g}"
            )
        s = draw(_sampled(tuple(divisors)))
        local = g // s
        return draw(_integers(0, s - 1)) * local, local

    return _draw()


# --------------------------------------------------------------- static buckets
@dataclass(frozen=True)
class _Static:
    family: str
    layout: tuple[bool, bool, bool]
    batch: tuple[int, ...]
    sizes_batched: bool
    mkn: tuple[int, int, int]
    groups: int
    shards: int
    in_dtype: np.dtype
    out_dtype: np.dtype
    existing: bool

    def cost(self) -> tuple:
        return (self.groups, self.shards, sum(self.mkn), len(self.batch), self.existing,
                sum(self.layout), self.family)


@dataclass(frozen=True)
class _Config:
    convention: str | None
    families: tuple[str, ...]
    dtype_pairs: tuple[tuple[np.dtype, np.dtype], ...]
    tiling: tuple[int, int, int]
    tiling_given: bool
    group_counts: tuple[int, ...]
    min_groups: int
    max_groups: int
    max_extent: int
    max_batch_dims: int
    sharding: bool | None
    max_shards: int
    existing: bool | None
    shapes: tuple[tuple[int, int, int], ...] | None
    max_buckets: int | None


def _axis_multiple(rules: ConventionRules, axis: str, family: str, tiling, in_dtype) -> int:
    ragged = {"ragged_m": "m", "ragged_n": "n", "ragged_k": "k"}.get(family)
    mult = 1
    for name, req in rules.multiple_of:
        if name == axis or (name == "ragged" and axis == ragged):
            if req == "16B":
                v = max(1, 16 // np.dtype(in_dtype).itemsize)
            elif isinstance(req, str):
                v = tiling["mkn".index(req[1])]
            else:
                v = int(req)
            mult = _lcm(mult, v)
    return mult


def _axis_candidates(cfg: _Config, family: str, in_dtype) -> list[list[int]]:
    rules = CONVENTION_RULES[cfg.convention]
    out = []
    for i, axis in enumerate("mkn"):
        mult = _axis_multiple(rules, axis, family, cfg.tiling, in_dtype)
        cands = _extent_candidates(cfg.tiling[i], 1, cfg.max_extent, mult)
        if not cands:
            raise InvalidArgument(
                f"max_extent={cfg.max_extent}, but convention={cfg.convention!r} needs {axis.upper()} to be a "
                f"multiple of {mult} for family {family!r} and dtype {np.dtype(in_dtype)} (tiling={cfg.tiling})"
            )
        out.append(cands)
    return out


def _layouts(cfg: _Config, family: str) -> tuple[tuple[bool, bool, bool], ...]:
    return CONVENTION_RULES[cfg.convention].layouts[family]


def _shard_options(cfg: _Config, family: str, g: int) -> list[int]:
    rules = CONVENTION_RULES[cfg.convention]
    if not rules.sharding or family == "batch" or cfg.sharding is False:
        return [1]
    divs = [s for s in range(1, min(g, cfg.max_shards) + 1) if g % s == 0]
    if cfg.sharding:
        divs = [s for s in divs if s > 1]
    return divs


def _existing_options(cfg: _Config) -> list[bool]:
    rules = CONVENTION_RULES[cfg.convention]
    if rules.existing_policy is None or cfg.existing is False:
        return [False]
    return [True] if cfg.existing else [False, True]


def _fits(s: _Static) -> bool:
    m, k, n = s.mkn
    b = math.prod(s.batch)
    g = s.groups
    per = {"ragged_m": (m * k, g * k * n, m * n), "ragged_n": (g * m * k, k * n, m * n),
           "ragged_k": (m * k, k * n, g * m * n), "batch": (g * m * k, g * k * n, g * m * n)}[s.family]
    return max(per) * b <= _MAX_ELEMENTS


@functools.lru_cache(maxsize=256)
def _buckets(cfg: _Config) -> tuple[_Static, ...]:
    """A fixed, deterministic list of static signatures, simplest first."""
    target = cfg.max_buckets
    found: dict[_Static, None] = {}
    counts = cfg.group_counts
    # first one plain signature (smallest extents, no shards, no existing output) per
    # group count, so that failures shrink to a plain problem with few groups; then mixed
    n_plain = min(len(counts), max(1, target // 2))
    plain = counts[:n_plain - 1] + counts[-1:]
    for j in range(target * 8):
        if j < n_plain:
            g = plain[j]

            def pick(seq, salt=0):
                return seq[0]
        else:
            # walk every parameter's list with its own phase so that the mixed
            # buckets cover each value once there are as many buckets as values
            r = j - n_plain
            g = counts[(r + 1) % len(counts)]

            def pick(seq, salt=0, r=r):
                return seq[(r + 1 + salt) % len(seq)]
        fam = cfg.families[j % len(cfg.families)]
        in_dt, out_dt = cfg.dtype_pairs[(j // len(cfg.families)) % len(cfg.dtype_pairs)]
        layout = pick(_layouts(cfg, fam))
        shards = _shard_options(cfg, fam, g)
        if not shards:
            continue
        if cfg.shapes is not None:
            mkn = pick(cfg.shapes)
        else:
            mkn = tuple(pick(c, salt) for salt, c in enumerate(_axis_candidates(cfg, fam, in_dt), 2))
        nb = pick(list(range(cfg.max_batch_dims + 1)), 5)
        batch = (2,) * nb if fam != "batch" else (2,) * nb
        s = _Static(fam, layout, batch, bool(nb and fam in ("ragged_m", "ragged_k") and j % 2),
                    mkn, g, pick(shards, 6), in_dt, out_dt, pick(_existing_options(cfg), 7))
        if not _fits(s):  # too big for this G: the smallest extents instead
            small = (min(cfg.shapes, key=sum) if cfg.shapes is not None
                     else tuple(c[0] for c in _axis_candidates(cfg, fam, in_dt)))
            s = dataclasses.replace(s, mkn=small)
            if not _fits(s):
                continue
        found.setdefault(s)
        if len(found) >= target:
            break
    if not found:
        raise InvalidArgument(
            f"max_groups/max_extent/shapes: no problem of convention={cfg.convention!r} fits "
            f"{_MAX_ELEMENTS} elements per buffer"
        )
    return tuple(sorted(found, key=_Static.cost))


@functools.lru_cache(maxsize=64)
def _free_groups(cfg: _Config) -> tuple[SearchStrategy[int], SearchStrategy[int]]:
    """(any G, a G that some shard count of at least 2 divides), built once per config."""
    ms = cfg.max_shards
    any_g = _integers(cfg.min_groups, cfg.max_groups)
    return any_g, any_g.filter(lambda x: any(x % d == 0 for d in range(2, min(x, ms) + 1)))


@functools.lru_cache(maxsize=256)
def _free_extents(cfg: _Config, family: str, in_dtype) -> tuple[_Extents, ...] | str:
    """The M, K and N strategies for a family and input dtype, or why there are none."""
    out = []
    for i, axis in enumerate("mkn"):
        mult = _axis_multiple(CONVENTION_RULES[cfg.convention], axis, family, cfg.tiling, in_dtype)
        if not _extent_candidates(cfg.tiling[i], 1, cfg.max_extent, mult):
            return f"max_extent={cfg.max_extent}, but {axis.upper()} must be a multiple of {mult}"
        out.append(_extents(cfg.tiling[i], 1, cfg.max_extent, mult))
    return tuple(out)


@functools.lru_cache(maxsize=16)
def _batch_shapes(nb: int) -> SearchStrategy[list[int]]:
    return st.lists(_integers(1, 3), min_size=nb, max_size=nb)


def _draw_free_static(draw, cfg: _Config) -> _Static:
    fam = draw(_sampled(cfg.families))
    in_dt, out_dt = draw(_sampled(cfg.dtype_pairs))
    layout = draw(_sampled(_layouts(cfg, fam)))
    any_g, sharded_g = _free_groups(cfg)
    g = draw(sharded_g if cfg.sharding and fam != "batch" else any_g)
    shard_count = draw(_sampled(tuple(_shard_options(cfg, fam, g))))
    if cfg.shapes is not None:
        mkn = draw(_sampled(cfg.shapes))
    else:
        axes = _free_extents(cfg, fam, in_dt)
        if isinstance(axes, str):
            raise InvalidArgument(axes)
        mkn = (axes[0](draw), axes[1](draw), axes[2](draw))
    nb = draw(_integers(0, cfg.max_batch_dims))
    batch = tuple(draw(_batch_shapes(nb)))
    batched = bool(nb) and fam in ("ragged_m", "ragged_k") and draw(_BOOLEANS)
    existing = draw(_sampled(tuple(_existing_options(cfg))))
    s = _Static(fam, layout, batch, batched, mkn, g, shard_count, in_dt, out_dt, existing)
    if not _fits(s):
        raise InvalidArgument(f"max_extent={cfg.max_extent}, max_groups: a drawn problem exceeds "
                              f"{_MAX_ELEMENTS} elements per buffer; lower them")
    return s


# ------------------------------------------------------------------ values
def _sig_limit(dtype) -> float:
    dtype = np.dtype(dtype)
    if _dt.is_integer(dtype):
        return float(np.iinfo(dtype).max)
    return 2.0 ** (_dt.float_format(dtype).mant + 1)


def _fill(rng: np.random.Generator, shape, dtype, kind: str, k: int, out_dtype, seed: int) -> np.ndarray:
    dtype = np.dtype(dtype)
    if _dt.is_integer(dtype) and kind != "exact" and seed != 0:
        # the whole int8 range: int32 accumulation stays exact (K < 2**17), while a kernel
        # that accumulates or stores in a narrower integer wraps
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if kind == "exact" or _dt.is_integer(dtype):
        if seed == 0:
            return np.ones(shape, dtype)
        lim = min(_sig_limit(out_dtype), _sig_limit(np.float32), _sig_limit(dtype)) / 2
        a = int(max(1, min(4, math.isqrt(int(lim // max(k, 1))))))
        # |v| <= 4: int8 holds them and every dtype represents them exactly
        return rng.integers(-a, a + 1, size=shape, dtype=np.int8).astype(dtype)
    if kind == "normal":
        return rng.standard_normal(size=shape, dtype=np.float32).astype(dtype, copy=False)
    # wide: log-uniform magnitudes from the input's subnormals to where K products
    # of two of them reach the output's overflow threshold
    fin, fout = _dt.float_format(dtype), _dt.float_format(out_dtype)
    lo = fin.emin - fin.mant
    hi = min(fin.emax, int(math.floor(0.5 * (math.log2(fout.max_finite) - math.log2(max(k, 1))))))
    hi = max(hi, lo)
    if fin.has_inf and dtype.itemsize in (2, 4):
        return _wide_bits(rng, shape, dtype, fin, hi - lo)
    exp = rng.integers(lo, hi + 1, size=shape)
    # mantissas near 2 at the top exponent would round past the largest finite value
    mag = np.minimum(np.ldexp(rng.uniform(1.0, 2.0, size=shape), exp), fin.max_finite)
    mag[rng.random(size=shape) < 0.1] = 0.0
    mag = np.where(rng.random(size=shape) < 0.5, -mag, mag)
    return mag.astype(np.float32).astype(dtype) if dtype != _F64 else mag


def _wide_bits(rng: np.random.Generator, shape, dtype: np.dtype, fin, span: int) -> np.ndarray:
    """``wide`` values built as bit patterns: exponent ``emin - mant + d`` for a uniform
    ``d`` in ``[0, span]`` (subnormals below ``emin``), uniform mantissa and sign, ~10% zeros.

    No float arithmetic, so no slow subnormal operations or narrowing casts, few
    temporaries, and never a rounding past the largest finite value.
    """
    mant, width = fin.mant, 8 * dtype.itemsize
    u32 = np.uint32
    n = math.prod(shape)
    r = rng.integers(0, 1 << 32, size=n, dtype=u32)  # mantissa, sign, zero-or-not
    d = rng.integers(0, span + 1, size=n, dtype=u32)  # exponent above the smallest subnormal's
    zero = r < u32(26 << 24)  # top byte below 26: ~10%
    sign = r >> u32(mant)
    sign &= u32(1)
    sign <<= u32(width - 1)
    r &= u32((1 << mant) - 1)
    r |= u32(1 << mant)  # the significand 1.m as an integer
    shift = np.minimum(d, u32(mant))
    np.subtract(u32(mant), shift, out=shift)  # d < mant: a subnormal, shifted right
    r >>= shift
    del shift
    np.maximum(d, u32(mant), out=d)
    d -= u32(mant)
    d <<= u32(mant)  # the exponent field; 0 for subnormals
    r += d  # a normal's implicit bit carries into the exponent field
    del d
    r |= sign
    r[zero] = 0
    bits = r if width == 32 else r.astype(np.uint16)
    return bits.view(dtype).reshape(shape)


def _unused(family: str, lhs_shape, rhs_shape, sizes, common: dict) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the lhs and rhs elements that no (local) group reads."""
    lm = np.zeros(lhs_shape, np.int8)
    rm = np.zeros(rhs_shape, np.int8)
    q = gmm_ref.Problem(family, lm, rm, sizes, **{**common, "out_dtype": np.int32, "existing_out": None,
                                                  "existing_policy": "overwrite"})
    for blk in _blocks(q):
        # blocks are views of the buffers; an empty group's weights reach no output element
        if blk.b.shape[1] > 0:
            blk.a[...] = 1
        if blk.a.shape[0] > 0:
            blk.b[...] = 1
    return lm == 0, rm == 0


def _few(rng: np.random.Generator, where: np.ndarray, most: int = 2) -> np.ndarray:
    """A mask of at most ``most`` positions chosen among ``where``."""
    picked = np.zeros(where.shape, bool)
    flat = np.flatnonzero(where)
    if flat.size:
        picked.flat[rng.choice(flat, size=min(most, flat.size), replace=False)] = True
    return picked


def _poison(rng: np.random.Generator, arr: np.ndarray, unused: np.ndarray) -> None:
    """NaN or +-Inf (where the dtype has them) in every element of ``arr`` that ``unused`` marks, in place."""
    if _dt.is_integer(arr.dtype):
        return
    count = int(np.count_nonzero(unused))
    if not count:
        return
    has_inf = _dt.float_format(arr.dtype).has_inf
    choices = np.array([np.nan, np.inf, -np.inf] if has_inf else [np.nan])
    arr[unused] = choices[rng.integers(0, len(choices), size=count)].astype(arr.dtype)


# ------------------------------------------------------------------- problems
def _dtype_pairs(value: Any, rules: ConventionRules, convention, vary_out_dtype) -> tuple:
    if value is None:
        pairs = rules.dtypes
    else:
        if isinstance(value, (str, np.dtype, type)) or not isinstance(value, Sequence):
            value = [value]
        pairs = []
        for item in value:
            try:
                if isinstance(item, tuple):
                    i, o = (_dt.as_dtype(x) for x in item)
                else:
                    i = _dt.as_dtype(item)
                    o = _I32 if _dt.is_integer(i) else i
            except (TypeError, ValueError) as exc:
                raise InvalidArgument(f"dtypes={value!r}, but {item!r} is not a dtype gmm_ref knows: {exc}") from None
            pairs.append((i, o))
        allowed_in = {i for i, _ in rules.dtypes}
        for i, o in pairs:
            if convention is not None and i not in allowed_in:
                raise InvalidArgument(
                    f"dtypes={value!r}, but convention={convention!r} takes inputs of "
                    f"{sorted(str(d) for d in allowed_in)} only"
                )
            if convention == "torch.grouped_mm" and o != i:
                raise InvalidArgument(f"dtypes={value!r}, but torch.grouped_mm needs out_dtype equal to the input dtype")
            if _dt.is_integer(i) != _dt.is_integer(o) or i not in _dt.INPUT_DTYPES or o not in _dt.OUTPUT_DTYPES:
                raise InvalidArgument(f"dtypes={value!r}, but ({i}, {o}) is not an input/output pair gmm_ref takes")
    if vary_out_dtype is not None:
        chosen = [pr for pr in pairs if (pr[0] != pr[1]) == bool(vary_out_dtype)]
        if not chosen:
            raise InvalidArgument(
                f"vary_out_dtype={vary_out_dtype!r}, but no dtype pair of {[tuple(map(str, p)) for p in pairs]} "
                "has " + ("an output dtype other than its input" if vary_out_dtype else "out_dtype == input")
            )
        pairs = chosen
    return tuple(dict.fromkeys(pairs))


def _config(draw, convention, families, dtypes, tiling, min_groups, max_groups, max_extent, max_batch_dims,
            sharding, max_shards, existing_out, shapes, max_buckets, vary_out_dtype) -> _Config:
    if convention not in CONVENTION_RULES:
        raise InvalidArgument(f"convention={convention!r}, but it must be None or one of {gmm_ref.CONVENTIONS}")
    rules = CONVENTION_RULES[convention]
    if families is None:
        fams = rules.default_families or rules.families
    else:
        fams = (families,) if isinstance(families, str) else tuple(families)
        if not fams:
            raise InvalidArgument("families=(), but at least one family is needed")
        for f in fams:
            if f not in rules.families:
                raise InvalidArgument(
                    f"families={families!r}, but convention={convention!r} expresses only {rules.families}"
                )
    fams = tuple(dict.fromkeys(fams))
    pairs = _dtype_pairs(_resolve(draw, dtypes), rules, convention, vary_out_dtype)
    t = _resolve(draw, tiling)
    given_t = t is not None
    t = _check_tiling(t) if given_t else (rules.default_tiling or (_SMALL_TILE,) * 3)
    lo = _check_int("min_groups", _resolve(draw, min_groups), minimum=1)
    hi = _check_int("max_groups", _resolve(draw, max_groups), minimum=1)
    if lo > hi:
        raise InvalidArgument(f"min_groups={lo} is greater than max_groups={hi}")
    counts = tuple(sorted({v for v in (lo, 2, 3, 4, hi) if lo <= v <= hi}))
    me = _resolve(draw, max_extent)
    me = 2 * max(t) + 16 if me is None else _check_int("max_extent", me, minimum=1)
    mbd = _resolve(draw, max_batch_dims)
    mbd = rules.max_batch_dims if mbd is None else _check_int("max_batch_dims", mbd, minimum=0)
    if mbd > rules.max_batch_dims:
        raise InvalidArgument(
            f"max_batch_dims={mbd}, but convention={convention!r} takes at most {rules.max_batch_dims} batch dims"
        )
    sh = _resolve(draw, sharding)
    if sh is not None and not isinstance(sh, bool):
        raise InvalidArgument(f"sharding={sh!r}, but it must be None, True or False")
    if sh and not rules.sharding:
        raise InvalidArgument(f"sharding=True, but convention={convention!r} has no group_offset (no sharded groups)")
    if sh and hi < 2:
        raise InvalidArgument(f"sharding=True, but max_groups={hi} leaves nothing to shard (needs >= 2)")
    if sh and fams == ("batch",):
        raise InvalidArgument("sharding=True, but families=('batch',) has no sharding")
    ms = _check_int("max_shards", _resolve(draw, max_shards), minimum=1)
    if sh and ms < 2:
        raise InvalidArgument(f"sharding=True, but max_shards={ms} allows only one shard")
    if sh:
        counts = tuple(c for c in counts if any(c % s == 0 for s in range(2, ms + 1))) or counts
    ex = _resolve(draw, existing_out)
    if ex is not None and not isinstance(ex, bool):
        raise InvalidArgument(f"existing_out={ex!r}, but it must be None, True or False")
    if ex and rules.existing_policy is None:
        raise InvalidArgument(f"existing_out=True, but convention={convention!r} takes no existing output")
    shp = _resolve(draw, shapes)
    if shp is not None:
        try:
            shp = tuple(tuple(int(v) for v in s) for s in shp)
        except (TypeError, ValueError):
            raise InvalidArgument(f"shapes={shapes!r}, but it must be a sequence of (M, K, N) tuples") from None
        if not shp or any(len(s) != 3 or min(s) < 0 for s in shp):
            raise InvalidArgument(f"shapes={shapes!r}, but it must be a non-empty sequence of (M, K, N) >= 0")
        for s in shp:
            for f in fams:
                for i_dt, _ in pairs:
                    for i, axis in enumerate("mkn"):
                        mult = _axis_multiple(rules, axis, f, t, i_dt)
                        if s[i] % mult:
                            raise InvalidArgument(
                                f"shapes={shapes!r}, but convention={convention!r} needs {axis.upper()} to be a "
                                f"multiple of {mult} (family {f!r}, dtype {i_dt}, tiling={t}); {s} is not"
                            )
    mb = _resolve(draw, max_buckets)
    if mb == "auto":
        mb = None if convention is None else 8
    if mb is not None:
        mb = _check_int("max_buckets", mb, minimum=1)
    return _Config(convention, fams, pairs, t, given_t, counts, lo, hi, me, mbd, sh, ms, ex, shp, mb)


def problems(
    *,
    convention: str | None = None,
    families: Sequence[str] | None = None,
    dtypes: Any = None,
    tiling: tuple[int, int, int] | SearchStrategy[tuple[int, int, int]] | None = None,
    min_groups: int = 1,
    max_groups: int = 8,
    max_extent: int | None = None,
    max_batch_dims: int | None = None,
    sharding: bool | None = None,
    max_shards: int = 4,
    existing_out: bool | None = None,
    values: str | Sequence[str] | SearchStrategy[str] = ("exact", "normal", "wide", "poisoned"),
    allow_tail: bool | None = None,
    all_empty: bool = False,
    vary_out_dtype: bool | None = None,
    shapes: Sequence[tuple[int, int, int]] | None = None,
    max_buckets: int | None | str = "auto",
) -> SearchStrategy[gmm_ref.Problem]:
    """:class:`gmm_ref.Problem` instances that ``convention``'s real kernel takes.

    With a ``convention``, the problem carries that kernel's policies (tail,
    foreign rows, empty groups, existing-output policy) and satisfies its
    constraints (megablox: ragged extent % tm == 0; torch: 16-byte leading
    strides), so ``problem.arguments()`` is a valid call and
    ``problem.reference()`` its reference. ``convention=None`` draws any
    family, layout (transposed, packed), batch dims and policy, for
    reference-only tests.

    Static parameters (family, layout, batch shape, ``(M, K, N)``, G, shard
    count, dtypes, whether ``existing_out`` is passed) come from at most
    ``max_buckets`` fixed signatures per strategy (``None``: drawn freely;
    the default ``"auto"`` is 8 with a convention, free without one);
    extents sit around the edges of ``tiling`` (multiples, +-1, below one
    tile) unless ``shapes`` lists them. Group sizes (see :func:`group_sizes`),
    the shard offset and values vary freely. ``dtypes`` lists input dtypes or
    ``(input, output)`` pairs. ``values`` kinds: ``"exact"`` (small integers,
    so the bound is 0 and kernels must match bit for bit), ``"normal"``,
    ``"wide"`` (subnormals up to values whose products near the output's
    overflow), ``"poisoned"`` (normal values, NaN/Inf in every element no group
    reads). ``sharding``/``existing_out``: True always, False never, None
    either (where the convention has them). ``allow_tail=None`` allows
    ``sum(sizes) <`` extent unless the convention needs full sums.

    Shrinks towards the simplest bucket (fewest groups, smallest shapes, no
    shards, no existing output), sizes of 0, one shard, exact values and
    seed 0 (all-ones operands).
    """
    value_kinds = values
    config_args = (convention, families, dtypes, tiling, min_groups, max_groups, max_extent,
                   max_batch_dims, sharding, max_shards, existing_out, shapes, max_buckets, vary_out_dtype)
    fixed = not any(isinstance(a, SearchStrategy) for a in config_args)
    memo: dict[str, Any] = {}  # validated on the first draw, where no argument is a strategy

    def _kinds(draw) -> tuple[str, ...]:
        kinds = _resolve(draw, value_kinds)
        kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        kinds = tuple(_VALUE_ALIASES.get(v, v) for v in kinds)
        if not kinds or any(v not in VALUE_KINDS for v in kinds):
            raise InvalidArgument(f"values={value_kinds!r}, but each must be one of {VALUE_KINDS}")
        return kinds

    @st.composite
    def _draw(draw):
        if "cfg" in memo:
            cfg = memo["cfg"]
        else:
            cfg = _config(draw, *config_args)
            if fixed:
                memo["cfg"] = cfg
        rules = CONVENTION_RULES[convention]
        if "kinds" in memo:
            kinds = memo["kinds"]
        else:
            kinds = _kinds(draw)
            if not isinstance(value_kinds, SearchStrategy):
                memo["kinds"] = kinds
        tail_ok = rules.full_sums is False if allow_tail is None else bool(allow_tail)
        if allow_tail and rules.full_sums:
            raise InvalidArgument(
                f"allow_tail=True, but convention={convention!r} needs sum(group_sizes) equal to the extent"
            )
        if all_empty and rules.full_sums:
            raise InvalidArgument(
                f"all_empty=True, but convention={convention!r} needs sum(group_sizes) equal to the extent"
            )
        if cfg.max_buckets is None:
            s = _draw_free_static(draw, cfg)
        elif "buckets" in memo:
            s = draw(memo["buckets"])
        else:
            buckets = _sampled(_buckets(cfg))
            if fixed:
                memo["buckets"] = buckets
            s = draw(buckets)
        return _build(draw, cfg, rules, s, kinds, tail_ok, all_empty)

    return _draw()


def _build(draw, cfg: _Config, rules: ConventionRules, s: _Static, kinds, tail_ok: bool, all_empty: bool):
    fam, (lt, rt, packed) = s.family, s.layout
    m, k, n = s.mkn
    g, b = s.groups, s.batch
    tm, tk, tn = cfg.tiling
    local = g // s.shards
    offset = draw(_integers(0, s.shards - 1)) * local if s.shards > 1 else 0
    policies: dict[str, Any] = {"tail": rules.tail, "foreign": rules.foreign, "empty": rules.empty}
    if fam == "batch":
        policies["tail"] = "zero"  # no ragged axis, so no tail: the front-ends' default
    if cfg.convention is None:
        policies = {
            "tail": draw(_sampled(("zero", "undefined"))),
            "foreign": draw(_sampled(("zero", "undefined"))),
            "empty": draw(_sampled(("zero", "untouched", "undefined"))),
        }
    kind = draw(_sampled(kinds))
    sizes = None
    if fam != "batch":
        extent, tile = {"ragged_m": (m, tm), "ragged_n": (n, tn), "ragged_k": (k, tk)}[fam]
        pattern = "all_empty" if all_empty else None
        n_rows = math.prod(b) if s.sizes_batched else 1
        # poisoned values want padding to poison: a sum below the extent where allowed
        rows = [_draw_sizes(draw, g, extent, tile, tail_ok or all_empty, pattern, want_tail=kind == "poisoned")
                for _ in range(n_rows)]
        if s.shards > 1 and draw(_BOOLEANS):
            for r in rows:  # the shard's first group is empty; its rows go to a neighbour
                moved, r[offset] = r[offset], 0
                r[offset + 1 if offset + 1 < g else offset - 1] += moved
        sizes = np.array(rows[0] if not s.sizes_batched else np.reshape(rows, (*b, g)), np.int32)
    seed = draw(_SEEDS)
    rng = np.random.default_rng(seed)
    value_kind = "normal" if kind == "poisoned" else kind
    lhs_shape = (k, m) if lt else (m, k)
    rhs_shape = (n, k) if rt else (k, n)
    lead_l = (local,) if fam == "ragged_n" else (g,) if fam == "batch" else ()
    lead_r = (local,) if fam == "ragged_m" else (g,) if fam == "batch" else ()
    k_eff = k if fam != "ragged_k" else max(int(np.max(sizes)) if sizes is not None and sizes.size else 0, 1)
    lhs = _fill(rng, (*lead_l, *b, *lhs_shape), s.in_dtype, value_kind, k_eff, s.out_dtype, seed)
    rhs = _fill(rng, (*lead_r, *b, *rhs_shape), s.in_dtype, value_kind, k_eff, s.out_dtype, seed)
    common = dict(
        lhs_transposed=lt, rhs_transposed=rt, packed=packed, batch_ndim=len(b), out_dtype=s.out_dtype,
        convention=cfg.convention, tiling=cfg.tiling if (cfg.tiling_given or rules.default_tiling) else None,
        **policies,
    )
    if fam != "batch":
        common.update(group_offset=offset, num_local_groups=local)
    # one Problem at the end (each construction validates): the output shape and the
    # unread elements come from the static parameters and a mask problem instead
    if s.existing:
        ex_kind = "exact" if value_kind == "exact" else "normal"
        out_shape = (*b, m, n) if fam in ("ragged_m", "ragged_n") else (g if fam == "batch" else local, *b, m, n)
        ex = _fill(rng, out_shape, s.out_dtype, ex_kind, k_eff, s.out_dtype, seed)
        policy = rules.existing_policy
        if policy == "any":
            policy = draw(_sampled(("overwrite", "accumulate")))
        common.update(existing_out=ex, existing_policy=policy)
    if kind == "poisoned":  # only here, so that a kernel's NaN handling is judged in one mode
        lu, ru = _unused(fam, lhs.shape, rhs.shape, sizes, common)
        # lhs and rhs are fresh "normal" arrays, poisoned in place
        _poison(rng, lhs, lu)
        _poison(rng, rhs, ru)
        if draw(_BOOLEANS):
            # a few NaN/Inf inside groups too: they must propagate within their group only
            _poison(rng, lhs, _few(rng, ~lu))
            _poison(rng, rhs, _few(rng, ~ru))
    return gmm_ref.Problem(fam, lhs, rhs, sizes, **common)
