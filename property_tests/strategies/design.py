"""The covering design: the relations real grouped-GEMM bugs hide behind, and cells that cover every pair.

A *factor* is one relation and its levels (the table below); a *cell* fixes
one level of every factor, and so the static signature a kernel compiles for
plus the group-size pattern, shard and operand storage the examples of the
cell keep, while group sizes and values still vary freely inside it. A
:class:`Design` is a list of cells in which every pair of levels that the
convention can express together appears at least once (a greedy covering
array, deterministic for a seed); levels and pairs it cannot express are
listed with the reason. ``check_mode`` runs every cell of a mode's design, so
a run of any budget reaches every pair.

==============  =========================================================================
factor          levels
==============  =========================================================================
layout          the layouts of the family drawn (plain, lhsT, rhsT, packed, ...)
m, k, n         the extent against its tile: zero, below one tile, aligned (a tile
                multiple), unaligned (a multiple + or - the smallest step allowed: K prefers
                the minus side, a last tile almost full, M and N the plus side)
k_eq_n          K == N (square weights, where a transposed layout hides) or not
groups          one, few (2-4), more_than_tiles (more groups than tiles of the ragged
                extent), many (9-64, the many_groups mode)
sharded         whether the groups are split in S shards (``num_local_groups``; S the largest
                divisor of G up to ``max_shards``)
shard           which shard is local (``group_offset``): none, the first, a middle, the last
existing        an existing output passed or not
batch           no batch dims, one, one with per-batch group sizes
dtype           each (input, output) dtype pair
span            what the group sizes do: full, a tail past the last group, an empty
                first / middle / last group, a non-final group within one tile, across
                two tiles, across an odd number >= 3 of tiles, a group end one off a
                tile edge
lhs_storage,    (conventions whose arguments carry strides) contiguous, a transposed
rhs_storage     view, a slice of a wider buffer, a chunk of a split
==============  =========================================================================
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from gmm_ref import families
from gmm_ref.conventions.base import has_tail
from gmm_ref.layouts import layout_name
from gmm_ref.problem import Problem
from property_tests.strategies._common import pairs_of
from property_tests.strategies._static import Config, Static, axis_multiple, fits, layouts_of, storage_refusal

__all__ = ["EXTENT_LEVELS", "SPAN_LEVELS", "Cell", "Design", "Factor", "design", "observe", "pairs_of", "static_levels",
           "static_rows"]

EXTENT_LEVELS = ("zero", "below", "aligned", "unaligned")
GROUP_LEVELS = ("one", "few", "more_than_tiles", "many")
SHARD_LEVELS = ("none", "first", "middle", "last")
BATCH_LEVELS = ("none", "one", "batched_sizes")
SPAN_LEVELS = ("full", "tail", "empty_first", "empty_middle", "empty_last", "one_tile", "two_tiles",
               "several_odd", "edge_off_by_one")
_ATTEMPTS = 6


@dataclass(frozen=True)
class Factor:
    """One relation and its levels; ``static`` ones change what a kernel compiles for."""

    name: str
    levels: tuple[str, ...]
    static: bool


@dataclass(frozen=True)
class Cell:
    """One row of a design: a static signature plus the dynamic relations its examples keep."""

    static: Static
    shard_index: int
    span: str | None
    storage: tuple[str, str]
    levels: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        return " ".join(f"{f}={v}" for f, v in self.levels)


@dataclass(frozen=True)
class Design:
    """The cells of one (strategy configuration, family), the pairs they cover, and what cannot be expressed."""

    family: str
    factors: tuple[Factor, ...]
    cells: tuple[Cell, ...]
    pairs: frozenset[frozenset[tuple[str, str]]]
    inexpressible: tuple[tuple[str, str], ...]


# ------------------------------------------------------------------ the space
class _Space:
    """The factors of one configuration and the concrete values a (partial) row of levels implies."""

    def __init__(self, cfg: Config, family: str, tail_ok: bool, all_empty: bool, one_tile: bool = False) -> None:
        self.cfg, self.family, self.tail_ok, self.all_empty = cfg, family, tail_ok, all_empty
        self.one_tile = one_tile  # off the ragged axis, the smallest extent of a level first (cheaper examples)
        self.rules = cfg.rules
        self.facts = families.get(family)
        self.ragged = self.facts.ragged
        self.layouts = {layout_name(x): x for x in layouts_of(cfg, family)}
        self.dtypes = {f"{i}->{o}": (i, o) for i, o in cfg.dtype_pairs}
        self.factors = self._factors()
        self._memo: dict[frozenset, Any] = {}

    def _factors(self) -> tuple[Factor, ...]:
        cfg, rules = self.cfg, self.rules
        out = [Factor("dtype", tuple(self.dtypes), True), Factor("layout", tuple(self.layouts), True)]
        out += [Factor(axis, EXTENT_LEVELS, True) for axis in "mkn"]
        out.append(Factor("k_eq_n", ("yes", "no"), True))
        facts = self.facts
        if facts.takes_sizes:
            many = cfg.min_groups >= 9
            out.append(Factor("groups", ("many",) if many else GROUP_LEVELS[:3], True))
        else:
            out.append(Factor("groups", ("one", "few") if cfg.min_groups < 9 else ("many",), True))
        if rules.sharding and facts.shardable and cfg.sharding is not False:
            out.append(Factor("sharded", ("yes",) if cfg.sharding else ("no", "yes"), True))
            out.append(Factor("shard", SHARD_LEVELS[1:] if cfg.sharding else SHARD_LEVELS, False))
        if rules.existing_policy is not None and cfg.existing is not False:
            out.append(Factor("existing", ("yes",) if cfg.existing or rules.existing_required else ("no", "yes"),
                              True))
        nb = min(cfg.max_batch_dims, 1) if facts.batch_dims else 0
        if nb:
            levels = BATCH_LEVELS if facts.batched_sizes else BATCH_LEVELS[:2]
            out.append(Factor("batch", levels, True))
        if facts.takes_sizes and not self.all_empty:
            out.append(Factor("span", SPAN_LEVELS, False))
        if rules.strided:
            out += [Factor("lhs_storage", cfg.storages[0], False), Factor("rhs_storage", cfg.storages[1], False)]
        return tuple(out)

    # ------------------------------------------------------------- extents
    def tile(self, axis: str) -> int:
        return self.cfg.tiling["mkn".index(axis)]

    @functools.cache  # noqa: B019 - one space per design, dropped with it
    def extent_candidates(self, axis: str, level: str, in_dtype: Any, layout: Any = None) -> tuple[int, ...] | str:
        """Values of ``axis`` at ``level`` (first preferred) in ``layout`` (None: any), or why there are none."""
        t, u = self.tile(axis), axis_multiple(self.cfg, axis, self.family, in_dtype, layout)
        hi = self.cfg.max_extent
        name = self.rules.name
        if level == "zero":
            if axis in self.cfg.zero_extents:
                return (0,)
            who = name if axis not in self.rules.zero_extents else "the declared scope"
            return f"{who} takes no {axis.upper()} = 0"
        if level != "aligned" and u % t == 0:
            return f"{name} needs {axis.upper()} to be a multiple of {u} (the tile is {t}): always aligned"
        tiles = (3, 2, 1) if axis == self.ragged else (2, 1)
        if level == "below":
            cands = [v for v in (t // 2 // u * u, u, t - t % u - (u if t % u == 0 else 0)) if 0 < v < t]
        elif level == "aligned":  # a multiple of the tile and of the step: a multiple of their lcm
            cands = [j * math.lcm(t, u) for j in tiles]
        else:
            plus = [-(-(j * t + 1) // u) * u for j in tiles[1:] or tiles]
            minus = [((j + 1) * t - 1) // u * u for j in tiles[1:] or tiles]
            first, second = (minus, plus) if axis == "k" else (plus, minus)
            cands = [v for pair in itertools.zip_longest(first, second) for v in pair if v is not None]
        cands = [v for v in dict.fromkeys(cands) if 0 < v <= hi and _extent_level(v, t) == level]
        if self.one_tile and axis != self.ragged:
            cands.sort()
        if not cands:
            return f"no {axis.upper()} <= max_extent={hi} is {level} for a tile of {t} in steps of {u}"
        return tuple(cands)

    # -------------------------------------------------------------- values
    def values(self, row: dict[str, str]) -> dict[str, Any] | str:
        """Concrete values for the levels of ``row`` (a partial row checks what it can), or the reason
        the levels cannot go together."""
        key = frozenset(row.items())
        if key not in self._memo:
            self._memo[key] = self._values(row)
        return self._memo[key]

    def _values(self, row: dict[str, str]) -> dict[str, Any] | str:
        if "dtype" not in row:
            return {}
        in_dt, out_dt = self.dtypes[row["dtype"]]
        cands = {}
        for axis in "mkn":
            if axis in row:
                c = self.extent_candidates(axis, row[axis], in_dt, self.layouts.get(row.get("layout", "")))
                if isinstance(c, str):
                    return c
                cands[axis] = c
        last = "no combination of the extents fits"
        for combo in itertools.product(*cands.values()):
            ext = dict(zip(cands, combo, strict=True))
            found = self._with_extents(row, ext, in_dt, out_dt)
            if isinstance(found, dict):
                return found
            last = found
        return last

    def _with_extents(self, row: dict[str, str], ext: dict[str, int], in_dt: Any, out_dt: Any) -> dict | str:
        if "k_eq_n" in row and "k" in ext and "n" in ext and (ext["k"] == ext["n"]) != (row["k_eq_n"] == "yes"):
            return "K == N" if row["k_eq_n"] == "no" else "K != N"
        vals: dict[str, Any] = {"in": in_dt, "out": out_dt, **ext}
        extent = ext.get(self.ragged) if self.ragged else None
        for operand, rows in (("lhs", "m"), ("rhs", "k")):
            kind = row.get(f"{operand}_storage")
            if kind and rows in ext:
                why = storage_refusal(self.cfg, operand, kind, ext[rows], in_dt)
                if why:
                    return why
        if "groups" not in row:
            return vals
        if self.ragged and extent is None:
            return vals
        tile = self.tile(self.ragged) if self.ragged else 1
        for g in self._group_candidates(row["groups"], extent, tile):
            where = row.get("shard")
            sharded = row.get("sharded") or ("no" if where in (None, "none") else "yes")
            shard = self._shards(sharded, where, g)
            if isinstance(shard, str):
                continue
            why = self._span_refusal(row.get("span"), extent, tile, g)
            if why:
                continue
            full = dict(vals, g=g, shards=shard[0], shard_index=shard[1])
            if all(a in ext for a in "mkn") and not self._fits(row, full):
                continue
            return full
        return (f"no group count for groups={row['groups']} with sharded={row.get('sharded', 'no')}, "
                f"shard={row.get('shard')}, "
                f"span={row.get('span')} and a ragged extent of {extent} fits")

    def _group_candidates(self, level: str, extent: int | None, tile: int) -> list[int]:
        lo, hi = self.cfg.min_groups, self.cfg.max_groups
        if level == "one":
            cands = [1]
        elif level == "few":
            cands = [3, 2, 4]
        elif level == "many":
            cands = [17, 9, 33, 64, 12]
        else:  # more groups than tiles of the ragged extent
            tiles = -(-(extent or 0) // tile)
            cands = [tiles + 1, tiles + 2] if tiles + 1 >= 2 else [2, 3]
        return [g for g in cands if lo <= g <= hi]

    def _shards(self, sharded: str, where: str | None, g: int) -> tuple[int, int] | str:
        """(shard count S, local shard index): S the largest divisor of G up to ``max_shards``."""
        if sharded == "no":
            return (1, 0) if where in (None, "none") else "an unsharded problem has no shard position"
        divs = [s for s in range(2, min(g, self.cfg.max_shards) + 1) if g % s == 0]
        if not divs:
            return f"no shard count in [2, max_shards={self.cfg.max_shards}] divides {g} groups"
        s = divs[-1]
        if where == "none":
            return "a sharded problem has a local shard"
        if where == "middle" and s < 3:
            return f"{g} groups in {s} shards have no middle shard"
        return s, {"first": 0, "middle": s // 2, "last": s - 1, None: 0}[where]

    def _span_refusal(self, span: str | None, extent: int | None, tile: int, g: int) -> str | None:
        if span is None or extent is None:
            return None
        e = extent
        need = {"full": True, "tail": self.tail_ok and e >= 1, "empty_first": g >= 2, "empty_last": g >= 2,
                "empty_middle": g >= 3, "one_tile": g >= 2 and e >= 1, "two_tiles": g >= 2 and e >= tile + 1,
                "several_odd": g >= 2 and e >= 2 * tile + 1,
                "edge_off_by_one": g >= 2 and (e >= tile + 1 or (tile >= 2 and e >= tile - 1))}[span]
        return None if need else f"span={span} needs more groups or a longer ragged extent"

    def _fits(self, row: dict[str, str], v: dict[str, Any]) -> bool:
        return fits(self.static(row, v))

    def static(self, row: dict[str, str], v: dict[str, Any]) -> Static:
        batch = row.get("batch", "none")
        return Static(self.family, self.layouts[row["layout"]] if "layout" in row else (False, False, False),
                      () if batch == "none" else (2,), batch == "batched_sizes", (v["m"], v["k"], v["n"]),
                      v["g"], v["shards"], v["in"], v["out"], row.get("existing") == "yes")

    def cell(self, row: dict[str, str]) -> Cell | str:
        v = self.values(row)
        if isinstance(v, str):
            return v
        storage = (row.get("lhs_storage", "contiguous"), row.get("rhs_storage", "contiguous"))
        return Cell(self.static(row, v), v["shard_index"], row.get("span"), storage,
                    tuple((f.name, row[f.name]) for f in self.factors))


def _extent_level(v: int, t: int) -> str:
    if v == 0:
        return "zero"
    if v < t:
        return "below"
    return "aligned" if v % t == 0 else "unaligned"


# ------------------------------------------------------------- the generator
def _complete(space: _Space, row: dict[str, str], order: list[Factor]) -> dict[str, str] | None:
    """A full row extending ``row`` (first levels first), or None: a depth-first search."""
    if isinstance(space.values(row), str):
        return None
    todo = [f for f in order if f.name not in row]
    if not todo:
        return row
    f = todo[0]
    for level in f.levels:
        done = _complete(space, {**row, f.name: level}, todo)
        if done is not None:
            return done
    return None


def _candidate_pairs(space: _Space) -> tuple[set, list[tuple[str, str]]]:
    """The pairs whose levels each have a full row and agree with each other on their own (their
    own relations); the rest, with the reason, as inexpressible."""
    order = list(space.factors)
    singles, inexpressible = {}, []
    for f in order:
        for level in f.levels:
            singles[(f.name, level)] = ok = _complete(space, {f.name: level}, order) is not None
            if not ok:
                why = [w for d in space.dtypes if isinstance(w := space.values({"dtype": d, f.name: level}), str)]
                inexpressible.append((f"{f.name}={level}", why[0] if why else "no row takes it"))
    pairs = set()
    for f, g in itertools.combinations(order, 2):
        for a in f.levels:
            for b in g.levels:
                if not (singles[(f.name, a)] and singles[(g.name, b)]):
                    continue
                row = {f.name: a, g.name: b}
                whys = [w for d in space.dtypes
                        if isinstance(w := space.values({"dtype": d, **row}), str)] if "dtype" not in row else []
                why = space.values(row)
                if isinstance(why, str) or (whys and len(whys) == len(space.dtypes)):
                    inexpressible.append((f"{f.name}={a} & {g.name}={b}", why if isinstance(why, str) else whys[0]))
                else:
                    pairs.add(frozenset(row.items()))
    return pairs, inexpressible


def _greedy_row(space: _Space, uncovered: set, rng: random.Random, factors: list[Factor],
                base: dict[str, str], seed_pair: frozenset) -> dict[str, str] | None:
    """A row over ``factors`` extending ``base`` and ``seed_pair`` that covers many uncovered pairs (AETG)."""
    row = {**base, **dict(seed_pair)}
    order = [f for f in factors if f.name not in row]
    rng.shuffle(order)
    for f in order:
        scored = []
        for level in f.levels:
            cand = {**row, f.name: level}
            if isinstance(space.values(cand), str):
                continue
            gain = sum(frozenset({(f.name, level), (g, row[g])}) in uncovered for g in row)
            scored.append((gain, rng.random(), level))
        if not scored:
            return None
        row[f.name] = max(scored)[2]
    return _complete(space, row, list(space.factors))


def _best(space: _Space, uncovered: set, rng: random.Random, factors: list[Factor],
          bases: list[dict[str, str]]) -> dict[str, str] | None:
    names = {f.name for f in factors}
    best, best_gain = None, 0
    for base in bases:
        seeds = sorted((p for p in uncovered if all(f in names or base.get(f) == v for f, v in p)
                        and all(base.get(f, v) == v for f, v in p)), key=sorted)
        for _ in range(min(len(seeds), _ATTEMPTS if not base else 1)):
            row = _greedy_row(space, uncovered, rng, factors, base, rng.choice(seeds))
            gain = 0 if row is None else len(pairs_of(row) & uncovered)
            if gain > best_gain:
                best, best_gain = row, gain
    return best


def _cover(space: _Space, uncovered: set, wanted: set, inexpressible: list, rng: random.Random,
           factors: list[Factor], bases: list[dict[str, str]]) -> list[dict[str, str]]:
    """Rows covering ``uncovered``; a pair no full row takes leaves ``wanted`` for ``inexpressible``."""
    rows = []
    while uncovered:
        row = _best(space, uncovered, rng, factors, bases)
        if row is None:
            pair = min(uncovered, key=sorted)
            row = _complete(space, dict(pair), list(space.factors))
            if row is None:  # its own relations agree, but no full row takes it
                uncovered.discard(pair)
                wanted.discard(pair)
                (a, x), (b, y) = sorted(pair)
                inexpressible.append((f"{a}={x} & {b}={y}", "no full row takes both (other relations conflict)"))
                continue
        rows.append(row)
        uncovered -= pairs_of(row)
    return rows


def _without_redundant(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """``rows`` less those whose every pair another kept row covers (latest first: greedy rows cover less)."""
    counts: dict[frozenset, int] = {}
    for r in rows:
        for p in pairs_of(r):
            counts[p] = counts.get(p, 0) + 1
    keep = list(rows)
    for r in reversed(rows):
        ps = pairs_of(r)
        if all(counts[p] > 1 for p in ps):
            keep.remove(r)
            for p in ps:
                counts[p] -= 1
    return keep


def _parent_statics(cfg: Config, family: str, tail_ok: bool, all_empty: bool, seed: int) -> list[dict[str, str]]:
    """The static rows of the design with sharding and existing outputs left free (and groups not all
    empty): a mode that narrows them reuses those signatures first, so that a kernel compiles once
    for several modes. Derived from ``cfg`` alone, so every process builds the same design."""
    parent = dataclasses.replace(cfg, sharding=None if cfg.rules.sharding else cfg.sharding,
                                 existing=None if cfg.rules.existing_policy is not None else cfg.existing)
    if parent == cfg and not all_empty:
        return []
    d = design(parent, family, tail_ok, False, seed)
    names = {f.name for f in d.factors if f.static}
    return list(dict.fromkeys(tuple((k, v) for k, v in c.levels if k in names) for c in d.cells))


def _reuse(space: _Space, uncovered: set, rows: list, static_f: list[Factor]) -> list[dict[str, str]]:
    """Rows of ``rows`` (a parent design's signatures) that this space takes, picked greedily while
    each still covers an uncovered pair; ``uncovered`` loses what they cover."""
    levels = {f.name: set(f.levels) for f in static_f}
    fit = []
    for r in rows:
        row = {k: v for k, v in r if k in levels}
        if set(row) == set(levels) and all(v in levels[k] for k, v in row.items()) \
                and not isinstance(space.values(row), str):
            fit.append(row)
    out = []
    while fit and uncovered:
        gain, i = max((len(pairs_of(r) & uncovered), -i) for i, r in enumerate(fit))
        if gain == 0:
            break
        out.append(fit.pop(-i))
        uncovered -= pairs_of(out[-1])
    return out


@functools.lru_cache(maxsize=512)
def design(cfg: Config, family: str, tail_ok: bool, all_empty: bool, seed: int = 0) -> Design:
    """The covering design of one strategy configuration and family (cached; deterministic for ``seed``).

    Built in two passes so that kernels compile little: a covering array of the static factors
    first (each row one signature), then cells that reuse those signatures to cover every pair that
    involves a dynamic factor (group sizes, storage); a new signature only where none serves."""
    space = _Space(cfg, family, tail_ok, all_empty)
    wanted, inexpressible = _candidate_pairs(space)
    rng = random.Random(seed)
    static_f = [f for f in space.factors if f.static]
    static_names = {f.name for f in static_f}
    uncovered = {p for p in wanted if all(f in static_names for f, _ in p)}
    reused = _reuse(space, uncovered, _parent_statics(cfg, family, tail_ok, all_empty, seed), static_f)
    statics = reused + [{k: v for k, v in r.items() if k in static_names}
                        for r in _cover(space, uncovered, wanted, inexpressible, rng, static_f, [{}])]
    statics = _without_redundant(statics)
    dynamic_f = [f for f in space.factors if not f.static]
    uncovered = set(wanted)
    rows = []
    for base in statics:  # every signature once, with the dynamic levels that cover the most
        row = (_best(space, uncovered, rng, dynamic_f, [base]) if dynamic_f else None) or \
            _complete(space, dict(base), list(space.factors))
        rows.append(row)
        uncovered -= pairs_of(row)
    rows += _cover(space, uncovered, wanted, inexpressible, rng, dynamic_f or static_f, statics)
    cells = []
    for row in _without_redundant(rows):
        cell = space.cell(row)
        assert not isinstance(cell, str), cell
        cells.append(cell)
    return Design(family, space.factors, tuple(cells), frozenset(wanted), tuple(inexpressible))


# ------------------------------------------------------------ the static pass alone
@functools.lru_cache(maxsize=256)
def static_rows(cfg: Config, family: str, tail_ok: bool, seed: int = 0
                ) -> tuple[tuple[Static, frozenset[frozenset[tuple[str, str]]]], ...]:
    """The signatures of a covering array of the static factors alone (:func:`design`'s first pass), those
    covering the most pairs first, each with the pairs it holds: what ``problems()``'s buckets come from."""
    space = _Space(cfg, family, tail_ok, False, one_tile=True)
    space.factors = tuple(f for f in space.factors if f.static)
    wanted, inexpressible = _candidate_pairs(space)
    rows = _cover(space, set(wanted), wanted, inexpressible, random.Random(seed), list(space.factors), [{}])
    return tuple((space.static(r, space.values(r)), frozenset(pairs_of(r) & wanted)) for r in rows)


def static_levels(s: Static, cfg: Config) -> dict[str, frozenset[str]]:
    """The static relations :func:`observe` finds in every problem of signature ``s``."""
    t = cfg.tiling
    m, k, n = s.mkn
    g = s.groups
    groups = {"one"} if g == 1 else {"few"} if g <= 4 else {"many"} if g >= 9 else set()
    facts = families.get(s.family)
    if facts.ragged is not None and g > -(-s.mkn["mkn".index(facts.ragged)] // t["mkn".index(facts.ragged)]):
        groups.add("more_than_tiles")
    one = {"dtype": f"{np.dtype(s.in_dtype)}->{np.dtype(s.out_dtype)}", "layout": layout_name(s.layout),
           "m": _extent_level(m, t[0]), "k": _extent_level(k, t[1]), "n": _extent_level(n, t[2]),
           "k_eq_n": "yes" if k == n else "no", "sharded": "yes" if s.shards > 1 else "no",
           "existing": "yes" if s.existing else "no",
           "batch": "none" if not s.batch else "batched_sizes" if s.sizes_batched else "one"}
    return {**{f: frozenset({v}) for f, v in one.items()}, "groups": frozenset(groups)}


# ------------------------------------------------------------ observed relations
def _group_levels(sizes: np.ndarray, starts: np.ndarray, ends: np.ndarray, tile: int) -> set[str]:
    """The relations of one row of groups (``[start, end)`` each): empty first / middle / last groups, the tiles
    a non-final group touches, a group end one off a tile edge."""
    out = set()
    g = sizes.size
    if g >= 2 and sizes[0] == 0:
        out.add("empty_first")
    if g >= 2 and sizes[-1] == 0:
        out.add("empty_last")
    if g >= 3 and np.any(sizes[1:-1] == 0):
        out.add("empty_middle")
    for j in range(g - 1):
        if sizes[j] == 0:
            continue
        touched = (ends[j] - 1) // tile - starts[j] // tile + 1
        out.add("one_tile" if touched == 1 else "two_tiles" if touched == 2 else
                "several_odd" if touched % 2 else "several_even")
        if ends[j] % tile in (1, tile - 1):
            out.add("edge_off_by_one")
    return out


def _span_levels(sizes: np.ndarray, extent: int, tile: int) -> set[str]:
    out = set()
    for row in np.reshape(sizes, (-1, sizes.shape[-1])):
        ends = np.cumsum(row)
        out.add("tail" if ends[-1] < extent else "full")
        out |= _group_levels(row, ends - row, ends, tile)
    return out


def _serving_span_levels(p: Problem, tile: int) -> set[str]:
    """The span relations of a serving layout: each group's rows against the tile (the alignment)."""
    starts, ends = p.spans_at(())
    return {"tail" if has_tail(p) else "full"} | _group_levels(p.group_sizes, starts, ends, tile)


def observe(p: Problem, cfg: Config) -> dict[str, frozenset[str]]:
    """The relations a drawn problem exhibits, factor by factor (a factor may show several levels)."""
    facts = p.family_facts
    t = cfg.tiling
    out: dict[str, set[str]] = {
        "dtype": {f"{p.lhs.dtype}->{p.out_dtype}"},
        "layout": {layout_name((p.lhs_transposed, p.rhs_transposed, p.packed))},
        "m": {_extent_level(p.m, t[0])}, "k": {_extent_level(p.k, t[1])}, "n": {_extent_level(p.n, t[2])},
        "k_eq_n": {"yes" if p.k == p.n else "no"},
        "existing": {"yes" if p.existing_out is not None else "no"},
        "batch": {"none" if not p.batch_ndim else "batched_sizes" if p.group_sizes is not None
                  and p.group_sizes.ndim > 1 else "one"},
        "lhs_storage": {p.storage[0]}, "rhs_storage": {p.storage[1]},
    }
    g = p.num_groups
    groups = {"one"} if g == 1 else {"few"} if g <= 4 else set()
    if g >= 9:
        groups.add("many")
    axis = facts.ragged
    if axis is not None:
        tile = t["mkn".index(axis)]
        if g > -(-p.ragged_extent // tile):
            groups.add("more_than_tiles")
        out["span"] = (_serving_span_levels(p, tile) if facts.serving else
                       _span_levels(p.group_sizes, p.ragged_extent, tile))
        local = p.num_local_groups
        s = g // local if local else 1
        idx = p.group_offset // local if local else 0
        out["sharded"] = {"no"} if s == 1 else {"yes"}
        out["shard"] = {"none"} if s == 1 else {"first"} if idx == 0 else {"last"} if idx == s - 1 else {"middle"}
    out["groups"] = groups
    return {k: frozenset(v) for k, v in out.items()}

