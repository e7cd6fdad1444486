"""Static signatures (buckets): the few shapes, layouts and dtypes a strategy draws, so kernels compile little."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from gmm_ref import families
from gmm_ref.conventions import Convention
from gmm_ref.layouts import aligned_multiples, misalignment, named, stored_geometry
from gmm_ref.problem import STORAGES
from property_tests.strategies._common import BOOLEANS, Extents, cached_extents, extent_candidates, integers, sampled

__all__ = ["MAX_ELEMENTS", "Config", "Static", "axis_multiple", "draw_free_static", "fits", "layouts_of",
           "storage_refusal", "walked_buckets"]

MAX_ELEMENTS = 1 << 20  # per buffer; keeps drawing fast


@dataclass(frozen=True)
class Static:
    """One static signature (bucket): what a kernel compiles for."""

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
class Config:
    """The validated, hashable arguments of one ``problems()`` strategy."""

    convention: str | None
    rules: Convention
    multiples: tuple[tuple[str, int], ...]
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
    #: the axes whose extent may be 0 (the convention's, narrowed by ``zero_extents``)
    zero_extents: tuple[str, ...] = ("m", "k", "n")
    #: the (lhs, rhs) quantizations drawn, narrowed from the convention's (None: all of them)
    quantizations: tuple[tuple[Any, Any], ...] | None = None
    #: the storages (``gmm_ref.problem.STORAGES``) each operand, lhs then rhs, may be drawn in (a convention whose
    #: arguments carry strides)
    storages: tuple[tuple[str, ...], tuple[str, ...]] = (STORAGES, STORAGES)
    #: the layouts (``gmm_ref.layouts.LAYOUT_NAMES``) drawn, narrowed from the convention's (None: all of them)
    layouts: tuple[str, ...] | None = None
    #: the bytes each operand's offset and strides (lhs, rhs) are multiples of (1: any)
    alignment: tuple[int, int] = (1, 1)


def axis_multiple(cfg: Config, axis: str, family: str, in_dtype: Any,
                  layout: tuple[bool, bool, bool] | None = None) -> int:
    """What ``axis`` must be a multiple of: the convention's rule, the kernel's declared multiple, and what makes the
    rows of an operand stored along it aligned (in ``layout``; None: the least any of the family's layouts needs)."""
    mult = math.lcm(cfg.rules.axis_multiple(axis, family, cfg.tiling, in_dtype), dict(cfg.multiples).get(axis, 1))
    if cfg.alignment == (1, 1):
        return mult
    need = dict(zip(("lhs", "rhs"), cfg.alignment, strict=True))
    item = np.dtype(in_dtype).itemsize
    rows = [aligned_multiples(x, item, need).get(axis, 1) for x in ((layout,) if layout else layouts_of(cfg, family))]
    return math.lcm(mult, math.gcd(*rows) or 1)


def layouts_of(cfg: Config, family: str) -> tuple[tuple[bool, bool, bool], ...]:
    """The layouts of ``family`` drawn: the convention's, narrowed to those asked for."""
    return named(cfg.rules.layouts_of(family), cfg.layouts)


def storage_refusal(cfg: Config, operand: str, kind: str, rows: int, in_dtype: Any) -> str | None:
    """Why ``operand`` with ``rows`` rows cannot be drawn stored as ``kind``: the convention's stride rules, or the
    alignment asked for (its rows being aligned, :func:`axis_multiple`: a transposed view's stride is its rows', a
    slice's rows are wider than its own)."""
    why = cfg.rules.storage_refusal(operand, kind, rows, in_dtype)
    need = cfg.alignment[0 if operand == "lhs" else 1]
    if why or need == 1:
        return why
    item = np.dtype(in_dtype).itemsize
    shape = (2, rows, need // math.gcd(need, item))  # two matrices of the narrowest aligned rows stand for all
    bad = misalignment(shape, *stored_geometry(shape, item, kind), item, need)
    return None if bad is None else f"{operand} stored {kind} with {rows} rows has {bad}, not a multiple of {need}"


def _axis_candidates(cfg: Config, family: str, in_dtype: Any, layout: Any = None) -> list[list[int]]:
    out = []
    for i, axis in enumerate("mkn"):
        mult = axis_multiple(cfg, axis, family, in_dtype, layout)
        cands = extent_candidates(cfg.tiling[i], 1, cfg.max_extent, mult)
        if not cands:
            raise InvalidArgument(
                f"max_extent={cfg.max_extent}, but convention={cfg.convention!r} needs {axis.upper()} to be a "
                f"multiple of {mult} for family {family!r} and dtype {np.dtype(in_dtype)} (tiling={cfg.tiling})"
            )
        out.append(cands)
    return out


def _shard_options(cfg: Config, family: str, g: int) -> list[int]:
    if not cfg.rules.sharding or not families.get(family).shardable or cfg.sharding is False:
        return [1]
    divs = [s for s in range(1, min(g, cfg.max_shards) + 1) if g % s == 0]
    if cfg.sharding:
        divs = [s for s in divs if s > 1]
    return divs


def _existing_options(cfg: Config) -> list[bool]:
    if cfg.rules.existing_policy is None or cfg.existing is False:
        return [False]
    return [True] if cfg.existing or cfg.rules.existing_required else [False, True]


def fits(s: Static) -> bool:
    m, k, n = s.mkn
    b = math.prod(s.batch)
    facts = families.get(s.family)
    per = [math.prod(facts.shape(op, m, k, n, s.groups)) for op in ("lhs", "rhs", "out")]
    return max(per) * b <= MAX_ELEMENTS


@functools.lru_cache(maxsize=256)
def walked_buckets(cfg: Config) -> tuple[Static, ...]:
    """Up to ``max_buckets`` signatures walked from every parameter's list, each with its own phase, simplest
    first (what ``problems.buckets`` fills with and shrinks to, and the buckets of ``shapes``)."""
    target = cfg.max_buckets
    found: dict[Static, None] = {}
    counts = cfg.group_counts
    # first one plain signature (smallest extents, no shards, no existing output) per
    # group count, so that failures shrink to a plain problem with few groups; then mixed
    n_plain = min(len(counts), max(1, target // 2))
    plain = counts[:n_plain - 1] + counts[-1:]
    for j in range(target * 8):
        if j < n_plain:
            g = plain[j]

            def pick(seq: Any, salt: int = 0) -> Any:
                return seq[0]
        else:
            # walk every parameter's list with its own phase so that the mixed
            # buckets cover each value once there are as many buckets as values
            r = j - n_plain
            g = counts[(r + 1) % len(counts)]

            def pick(seq: Any, salt: int = 0, r: int = r) -> Any:
                return seq[(r + 1 + salt) % len(seq)]
        fam = cfg.families[j % len(cfg.families)]
        in_dt, out_dt = cfg.dtype_pairs[(j // len(cfg.families)) % len(cfg.dtype_pairs)]
        layout = pick(layouts_of(cfg, fam))
        shards = _shard_options(cfg, fam, g)
        if not shards:
            continue
        if cfg.shapes is not None:
            mkn = pick(cfg.shapes)
        else:
            mkn = tuple(pick(c, salt) for salt, c in enumerate(_axis_candidates(cfg, fam, in_dt, layout), 2))
        facts = families.get(fam)
        nb = pick(list(range(cfg.max_batch_dims + 1)), 5) if facts.batch_dims else 0
        batch = (2,) * nb
        s = Static(fam, layout, batch, bool(nb and facts.batched_sizes and j % 2),
                    mkn, g, pick(shards, 6), in_dt, out_dt, pick(_existing_options(cfg), 7))
        if not fits(s):  # too big for this G: the smallest extents instead
            small = (min(cfg.shapes, key=sum) if cfg.shapes is not None
                     else tuple(c[0] for c in _axis_candidates(cfg, fam, in_dt, layout)))
            s = dataclasses.replace(s, mkn=small)
            if not fits(s):
                continue
        found.setdefault(s)
        if len(found) >= target:
            break
    if not found:
        raise InvalidArgument(
            f"max_groups/max_extent/shapes: no problem of convention={cfg.convention!r} fits "
            f"{MAX_ELEMENTS} elements per buffer"
        )
    return tuple(sorted(found, key=Static.cost))


@functools.lru_cache(maxsize=64)
def _free_groups(cfg: Config) -> tuple[SearchStrategy[int], SearchStrategy[int]]:
    """(any G, a G that some shard count of at least 2 divides), built once per config."""
    ms = cfg.max_shards
    any_g = integers(cfg.min_groups, cfg.max_groups)
    return any_g, any_g.filter(lambda x: any(x % d == 0 for d in range(2, min(x, ms) + 1)))


@functools.lru_cache(maxsize=256)
def _free_extents(cfg: Config, family: str, in_dtype: Any, layout: Any) -> tuple[Extents, ...] | str:
    """The M, K and N strategies for a family, input dtype and layout, or why there are none."""
    out = []
    for i, axis in enumerate("mkn"):
        mult = axis_multiple(cfg, axis, family, in_dtype, layout)
        if not extent_candidates(cfg.tiling[i], 1, cfg.max_extent, mult):
            return f"max_extent={cfg.max_extent}, but {axis.upper()} must be a multiple of {mult}"
        out.append(cached_extents(cfg.tiling[i], 1, cfg.max_extent, mult))
    return tuple(out)


@functools.lru_cache(maxsize=16)
def _batch_shapes(nb: int) -> SearchStrategy[list[int]]:
    return st.lists(integers(1, 3), min_size=nb, max_size=nb)


def draw_free_static(draw: Any, cfg: Config) -> Static:
    fam = draw(sampled(cfg.families))
    in_dt, out_dt = draw(sampled(cfg.dtype_pairs))
    layout = draw(sampled(layouts_of(cfg, fam)))
    any_g, sharded_g = _free_groups(cfg)
    facts = families.get(fam)
    g = draw(sharded_g if cfg.sharding and facts.takes_sizes else any_g)
    shard_count = draw(sampled(tuple(_shard_options(cfg, fam, g))))
    if cfg.shapes is not None:
        mkn = draw(sampled(cfg.shapes))
    else:
        axes = _free_extents(cfg, fam, in_dt, layout)
        if isinstance(axes, str):
            raise InvalidArgument(axes)
        mkn = (axes[0](draw), axes[1](draw), axes[2](draw))
    nb = draw(integers(0, cfg.max_batch_dims)) if facts.batch_dims else 0
    batch = tuple(draw(_batch_shapes(nb)))
    batched = bool(nb) and facts.batched_sizes and draw(BOOLEANS)
    existing = draw(sampled(tuple(_existing_options(cfg))))
    s = Static(fam, layout, batch, batched, mkn, g, shard_count, in_dt, out_dt, existing)
    if not fits(s):
        raise InvalidArgument(f"max_extent={cfg.max_extent}, max_groups: a drawn problem exceeds "
                              f"{MAX_ELEMENTS} elements per buffer; lower them")
    return s
