"""``problems()``: grouped GEMM problems a convention's real kernel takes, drawn compile-aware."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

import gmm_ref
from gmm_ref import families
from property_tests.strategies._common import BOOLEANS, SEEDS, check_bool, integers, resolve, sampled
from property_tests.strategies._config import config
from property_tests.strategies._static import (
    Config,
    Static,
    draw_free_static,
    layouts_of,
    storage_refusal,
    walked_buckets,
)
from property_tests.strategies.design import Cell, Design, design, pairs_of, static_levels, static_rows
from property_tests.strategies.sizes import draw_serving_sizes, draw_sizes, draw_span_sizes
from property_tests.strategies.values import (
    VALUE_KINDS,
    few,
    fill,
    fill_codes,
    poison,
    scaled_problem,
    unused_elements,
)

__all__ = ["HELD", "PLAIN_KEPT", "Covering", "CoveringCell", "buckets", "covering", "plan", "problems",
           "replay_refusal", "replays"]

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
    max_buckets: int | None = 8,
    multiple_of: Mapping[str, int] | None = None,
    zero_extents: Sequence[str] | None = None,
    quantizations: Sequence[tuple[Any, Any]] | None = None,
    storages: Mapping[str, Sequence[str]] | None = None,
    layouts: Sequence[str] | None = None,
    operand_alignment: int | Mapping[str, int] | None = None,
) -> SearchStrategy[gmm_ref.Problem]:
    """:class:`gmm_ref.Problem` instances that ``convention``'s real kernel takes.

    With a ``convention``, the problem carries that kernel's policies (tail,
    foreign rows, empty groups, existing-output policy) and satisfies its
    constraints (megablox: ragged extent % tm == 0; torch: 16-byte leading
    strides), so ``gmm_ref.arguments(problem)`` is a valid call and
    ``gmm_ref.reference(problem)`` its reference. ``convention=None`` draws any
    family, layout (transposed, packed), batch dims and policy, for
    reference-only tests.

    Static parameters (family, layout, batch shape, ``(M, K, N)``, G, shard
    count, dtypes, whether ``existing_out`` is passed) come from at most
    ``max_buckets`` fixed signatures per strategy, chosen from the covering
    design's so that each pair of static relations they can hold is held by
    three (docs/coverage.md, "What gst.problems reaches"; ``None``: drawn
    freely, as reference-only tests that compile nothing may prefer);
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
    ``zero_extents`` lists the axes (``"m"``, ``"k"``, ``"n"``) whose extent may be drawn 0 (None:
    every one the convention takes; ``()``: none).
    ``multiple_of`` (e.g. ``{"k": 32}``) adds a kernel's own multiple per axis
    to its convention's. ``quantizations`` narrows a scaled convention's
    ``(lhs, rhs)`` :class:`gmm_ref.Quantization` pairs to those a kernel takes
    (``(None, None)``: unscaled operands, where the convention takes them).
    ``storages`` (``{"rhs": ("contiguous", "slice", "chunk")}``) narrows how the
    operands of a convention whose arguments carry strides lie in memory, each to
    some of ``gmm_ref.problem.STORAGES`` (an operand not named: any of them).
    ``layouts`` narrows the layouts (``gmm_ref.layouts.LAYOUT_NAMES``: ``"plain"``,
    ``"lhsT"``, ``"rhsT+packed"``, ...) to those named, and the families to those
    with one of them. ``operand_alignment`` (``16``, or ``{"lhs": 16}``: bytes, a
    power of two) keeps each operand's byte offset into its buffer and every stride
    but its unit one (``gmm_ref.layouts.stored_geometry``) multiples of it: the
    extents its rows run along are drawn multiples, and storages that would break
    it for the drawn extents (a slice, a transposed view of odd rows) are not drawn.
    ``all_empty=True``: every group empty; where the sum must equal the
    extent (``allow_tail=False``), every group but one, which holds it all.

    Arguments are checked when the strategy is built (at draw time for those
    given as strategies): ``InvalidArgument`` names the argument. Limits:
    ``max_groups`` <= 4096, ``max_extent`` <= 2**31 - 1.

    Shrinks towards the simplest bucket (fewest groups, smallest shapes, no
    shards, no existing output), sizes of 0, one shard, exact values and
    the values of seed 0 (never all ones: equal weights in every group would hide a misrouted group).
    """
    drawer = _drawer(convention=convention, families=families, dtypes=dtypes, tiling=tiling,
                     min_groups=min_groups, max_groups=max_groups, max_extent=max_extent,
                     max_batch_dims=max_batch_dims, sharding=sharding, max_shards=max_shards,
                     existing_out=existing_out, values=values, allow_tail=allow_tail, all_empty=all_empty,
                     vary_out_dtype=vary_out_dtype, shapes=shapes, max_buckets=max_buckets, multiple_of=multiple_of,
                     zero_extents=zero_extents, quantizations=quantizations, storages=storages, layouts=layouts,
                     operand_alignment=operand_alignment)

    @st.composite
    def _draw(draw: Any) -> gmm_ref.Problem:
        return drawer(draw)

    return _draw()


@dataclass(frozen=True)
class CoveringCell:
    """One cell of a covering design and the strategy of its problems."""

    family: str
    cell: Cell
    strategy: SearchStrategy[gmm_ref.Problem]


@dataclass(frozen=True)
class Covering:
    """The covering designs of one set of ``problems()`` arguments, a design per family."""

    config: Config
    designs: dict[str, Design]
    cells: tuple[CoveringCell, ...]


def covering(**kwargs: Any) -> Covering:
    """The covering design of ``problems(**kwargs)``: per family, cells that together reach every pair
    of relations (``property_tests.strategies.design``) the convention can express, each with the
    strategy of its problems (static signature, group-size relation, shard and storage fixed; sizes
    and values free). Run every cell's strategy to reach every pair whatever the example budget."""
    kwargs.pop("max_buckets", None)
    unknown = set(kwargs) - set(inspect.signature(problems).parameters)
    if unknown:
        raise InvalidArgument(f"covering(): unknown arguments {sorted(unknown)}; it takes problems()'s")
    return _drawer(**kwargs).covering()


def replays(cov: Covering, cell: CoveringCell, n: int) -> SearchStrategy[tuple[gmm_ref.Problem, ...]]:
    """``n`` problems that one kernel gets one after the other: one of ``cell``'s strategy, then ``n - 1``
    with its operands, shapes, dtypes, group count and shard, group sizes drawn anew for the same extents
    (a kernel captured once in a CUDA graph and replayed with new sizes; elsewhere, a kernel that caches
    its launch plan by shape). A problem :func:`replay_refusal` names a reason for is drawn once: ``(problem,)``."""
    tail_ok = cov.config.rules.full_sums is False

    @st.composite
    def _draw(draw: Any) -> tuple[gmm_ref.Problem, ...]:
        first = draw(cell.strategy)
        if n <= 1 or replay_refusal(first) is not None:
            return (first,)
        offset = first.group_offset or 0
        return (first, *(first.replace(group_sizes=_sizes(draw, cov.config, cell.cell.static, "exact", tail_ok,
                                                          False, offset)) for _ in range(n - 1)))

    return _draw()


def replay_refusal(problem: gmm_ref.Problem) -> str | None:
    """Why :func:`replays` draws no other group sizes for ``problem``, or None."""
    if problem.group_sizes is None:
        return f"the {problem.family} family has no group sizes (every group is one whole matrix)"
    if problem.scaled:
        return "quantized operands: their block scales follow the group sizes, so other sizes need other operands"
    return None


def _drawer(*, convention: Any = None, families: Any = None, dtypes: Any = None, tiling: Any = None,
            min_groups: Any = 1, max_groups: Any = 8, max_extent: Any = None, max_batch_dims: Any = None,
            sharding: Any = None, max_shards: Any = 4, existing_out: Any = None,
            values: Any = ("exact", "normal", "wide", "poisoned"), allow_tail: Any = None, all_empty: Any = False,
            vary_out_dtype: Any = None, shapes: Any = None, max_buckets: Any = 8, multiple_of: Any = None,
            zero_extents: Any = None, quantizations: Any = None, storages: Any = None, layouts: Any = None,
            operand_alignment: Any = None) -> _Drawer:
    """A drawer for ``problems()``'s arguments, checked where they are values."""
    config_args = (convention, families, dtypes, tiling, min_groups, max_groups, max_extent,
                   max_batch_dims, sharding, max_shards, existing_out, shapes, max_buckets, vary_out_dtype,
                   multiple_of, zero_extents, quantizations, storages, layouts, operand_alignment)
    drawer = _Drawer(config_args, values, check_bool("allow_tail", allow_tail, allow_none=True),
                     check_bool("all_empty", all_empty))
    if drawer.fixed:
        drawer.config(_no_draw)  # concrete arguments are checked when the strategy is built
    if not isinstance(values, SearchStrategy):
        drawer.kinds(_no_draw)
    return drawer


def _no_draw(strategy: Any) -> Any:  # pragma: no cover - only reached if an argument were a strategy
    raise AssertionError(f"cannot draw from {strategy!r} while the strategy is built")


class _Drawer:
    """Draws one problem; validates the arguments on the first draw and keeps them when no
    argument is a strategy (validation and strategy building are costly per draw)."""

    def __init__(self, config_args: tuple, values: Any, allow_tail: Any, all_empty: bool) -> None:
        self.config_args = config_args
        self.values = values
        self.allow_tail = allow_tail
        self.all_empty = all_empty
        self.fixed = not any(isinstance(a, SearchStrategy) for a in config_args)
        self.memo: dict[str, Any] = {}

    def kinds(self, draw: Any) -> tuple[str, ...]:
        if "kinds" in self.memo:
            return self.memo["kinds"]
        kinds = resolve(draw, self.values)
        kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        if not kinds or any(v not in VALUE_KINDS for v in kinds):
            raise InvalidArgument(f"values={self.values!r}, but each must be one of {VALUE_KINDS}")
        if not isinstance(self.values, SearchStrategy):
            self.memo["kinds"] = kinds
        return kinds

    def config(self, draw: Any) -> Config:
        if "cfg" in self.memo:
            return self.memo["cfg"]
        cfg = config(draw, *self.config_args)
        if self.fixed:
            self.memo["cfg"] = cfg
        return cfg

    def static(self, draw: Any, cfg: Config) -> Static:
        if cfg.max_buckets is None:
            return draw_free_static(draw, cfg)
        if "buckets" in self.memo:
            return draw(self.memo["buckets"])
        bucket_strategy = sampled(buckets(cfg))
        if self.fixed:
            self.memo["buckets"] = bucket_strategy
        return draw(bucket_strategy)

    def tail_ok(self, cfg: Config) -> bool:
        full_sums, convention = cfg.rules.full_sums, cfg.convention
        if self.allow_tail and full_sums:
            raise InvalidArgument(
                f"allow_tail=True, but convention={convention!r} needs sum(group_sizes) equal to the extent")
        if self.all_empty and full_sums:
            raise InvalidArgument(
                f"all_empty=True, but convention={convention!r} needs sum(group_sizes) equal to the extent")
        return full_sums is False if self.allow_tail is None else bool(self.allow_tail)

    def __call__(self, draw: Any) -> gmm_ref.Problem:
        cfg = self.config(draw)
        kinds = self.kinds(draw)
        return _build(draw, cfg, self.static(draw, cfg), kinds, self.tail_ok(cfg), self.all_empty)

    def covering(self) -> Covering:
        if not self.fixed or isinstance(self.values, SearchStrategy):
            raise InvalidArgument("covering(): every argument must be a value, not a strategy")
        cfg, kinds = self.config(_no_draw), self.kinds(_no_draw)
        tail_ok = self.tail_ok(cfg)
        designs = {f: design(cfg, f, tail_ok, self.all_empty) for f in cfg.families}

        def strategy(cell: Cell) -> SearchStrategy[gmm_ref.Problem]:
            return st.composite(lambda draw: _build(draw, cfg, cell.static, kinds, tail_ok, self.all_empty, cell))()

        cells = tuple(CoveringCell(f, c, strategy(c)) for f, d in designs.items() for c in d.cells)
        return Covering(cfg, designs, cells)


def _policies(draw: Any, cfg: Config, family: str) -> dict[str, str]:
    if cfg.convention is None:
        return {
            "tail": draw(sampled(("zero", "undefined"))),
            "foreign": draw(sampled(("zero", "undefined"))),
            "empty": draw(sampled(("zero", "untouched", "undefined"))),
        }
    policies = cfg.rules.policies(family)
    del policies["existing_policy"]
    return policies


def _sizes(draw: Any, cfg: Config, s: Static, kind: str, tail_ok: bool, all_empty: bool, offset: int,
           span: str | None = None) -> np.ndarray | None:
    fam, g, b = s.family, s.groups, s.batch
    facts = families.get(fam)
    if not facts.takes_sizes:
        return None
    axis = "mkn".index(facts.ragged)
    extent, tile = s.mkn[axis], cfg.tiling[axis]
    if facts.serving:
        if all_empty:
            return np.zeros(g, np.int32)
        if span is None:  # a relation of those this extent and group count can show
            from property_tests.strategies.design import SPAN_LEVELS

            least = {"two_tiles": tile + 1, "several_odd": 2 * tile + 1, "edge_off_by_one": tile - 1}
            fit = [v for v in SPAN_LEVELS if extent >= least.get(v, 1) and (g >= 2 or v in ("full", "tail"))
                   and (g >= 3 or v != "empty_middle") and (tail_ok or v == "full")]
            span = "tail" if kind == "poisoned" and "tail" in fit else draw(sampled(tuple(fit) or ("full",)))
        return np.array(draw_serving_sizes(draw, fam, span, g, extent, tile, tail_ok), np.int32)
    pattern = "all_empty" if all_empty else None
    n_rows = math.prod(b) if s.sizes_batched else 1
    if span is not None and not all_empty:  # a cell of the covering design: its relation, sizes free around it
        rows = [draw_span_sizes(draw, span, g, extent, tile, tail_ok) for _ in range(n_rows)]
        return np.array(rows[0] if not s.sizes_batched else np.reshape(rows, (*b, g)), np.int32)
    # poisoned values and all_empty want the padding (all groups empty) where it is allowed
    rows = [draw_sizes(draw, g, extent, tile, tail_ok, pattern, want_tail=kind == "poisoned" or all_empty)
            for _ in range(n_rows)]
    if s.shards > 1 and draw(BOOLEANS):
        for r in rows:  # the shard's first group is empty; its rows go to a neighbour
            moved, r[offset] = r[offset], 0
            r[offset + 1 if offset + 1 < g else offset - 1] += moved
    return np.array(rows[0] if not s.sizes_batched else np.reshape(rows, (*b, g)), np.int32)


def _storages(cfg: Config, operand: str, rows: int, in_dtype: Any) -> tuple[str, ...]:
    allowed = cfg.storages[0 if operand == "lhs" else 1]
    return tuple(x for x in allowed if not storage_refusal(cfg, operand, x, rows, in_dtype))


def _build(draw: Any, cfg: Config, s: Static, kinds: tuple[str, ...], tail_ok: bool, all_empty: bool,
           cell: Cell | None = None) -> gmm_ref.Problem:
    fam, (lt, rt, packed) = s.family, s.layout
    m, k, n = s.mkn
    g, b = s.groups, s.batch
    local = g // s.shards
    if cell is not None:
        offset = cell.shard_index * local
    else:
        offset = draw(integers(0, s.shards - 1)) * local if s.shards > 1 else 0
    policies = _policies(draw, cfg, fam)
    kind = draw(sampled(kinds))
    sizes = _sizes(draw, cfg, s, kind, tail_ok, all_empty, offset, cell.span if cell is not None else None)
    if cell is not None:
        storage = cell.storage
    elif cfg.rules.strided:  # any layout the convention takes for these shapes
        storage = tuple(draw(sampled(_storages(cfg, op, rows, s.in_dtype))) for op, rows in (("lhs", m), ("rhs", k)))
    else:
        storage = ("contiguous", "contiguous")
    seed = draw(SEEDS)
    rng = np.random.default_rng(seed)
    value_kind = "normal" if kind == "poisoned" else kind
    facts = families.get(fam)  # unsharded families: local == g
    lead_l, lead_r = ((local,) if facts.is_grouped(op) else () for op in ("lhs", "rhs"))
    k_eff = k if not facts.ragged_contraction else max(int(np.max(sizes)) if sizes is not None and sizes.size else 0,
                                                       1)
    quants = _quantizations(draw, cfg, s)
    # codes of each operand's own element dtype (int8 activations may meet int4 weights)
    lhs, rhs = ((fill if q is None else fill_codes)(rng, (*lead, *b, *shape), s.in_dtype if q is None else q.elem,
                                                    value_kind, k_eff, s.out_dtype, seed)
                for q, lead, shape in ((quants[0], lead_l, (k, m) if lt else (m, k)),
                                       (quants[1], lead_r, (n, k) if rt else (k, n))))
    common: dict[str, Any] = dict(
        lhs_transposed=lt, rhs_transposed=rt, packed=packed, batch_ndim=len(b), out_dtype=s.out_dtype, storage=storage,
        convention=cfg.convention, tiling=cfg.tiling if (cfg.tiling_given or cfg.rules.default_tiling) else None,
        **policies,
    )
    if facts.groups == families.ALIGNED:
        common.update(alignment=cfg.tiling[0])
    elif facts.shardable:
        common.update(group_offset=offset, num_local_groups=local)
    # one Problem at the end (each construction validates): the output shape and the
    # unread elements come from the static parameters and a mask problem instead
    if s.existing:
        common.update(_existing(draw, cfg, s, rng, value_kind, k_eff, seed))
    if kind == "poisoned":  # only here, so that a kernel's NaN handling is judged in one mode
        lu, ru = unused_elements(fam, lhs.shape, rhs.shape, sizes, common)
        # lhs and rhs are fresh "normal" arrays, poisoned in place
        poison(rng, lhs, lu)
        poison(rng, rhs, ru)
        if draw(BOOLEANS):
            # a few NaN/Inf inside groups too: they must propagate within their group only
            poison(rng, lhs, few(rng, ~lu))
            poison(rng, rhs, few(rng, ~ru))
    if quants != (None, None):
        return scaled_problem(rng, fam, lhs, rhs, sizes, quants, value_kind, k_eff, common)
    return gmm_ref.Problem(fam, lhs, rhs, sizes, **common)


def _existing(draw: Any, cfg: Config, s: Static, rng: np.random.Generator, value_kind: str, k: int, seed: int
              ) -> dict[str, Any]:
    """An existing output (exact or normal values) and its policy: the convention's, or drawn."""
    fam, (m, _, n), b = s.family, s.mkn, s.batch
    ex_kind = "exact" if value_kind == "exact" else "normal"
    facts = families.get(fam)
    out_shape = facts.shape("out", m, 0, n, s.groups // s.shards, b)  # unsharded families: s.shards == 1
    policy = cfg.rules.existing_policy
    if cfg.convention is None:
        policy = "overwrite" if facts.serving else draw(sampled(("overwrite", "accumulate")))
    return dict(existing_out=fill(rng, out_shape, s.out_dtype, ex_kind, k, s.out_dtype, seed), existing_policy=policy)


def _quantizations(draw: Any, cfg: Config, s: Static) -> tuple[Any, Any]:
    """The (lhs, rhs) quantization of a scaled convention's problem (one whose codes are the bucket's input
    dtype); (None, None) for an unscaled convention."""
    if not cfg.rules.quantizations:
        return (None, None)
    pairs = cfg.rules.quantizations_for(s.family)
    if cfg.quantizations is not None:
        pairs = tuple(q for q in pairs if q in cfg.quantizations)
    if s.in_dtype not in cfg.rules.code_dtypes and (None, None) in pairs:
        return (None, None)  # a convention of scaled and unscaled operands: these are unscaled
    # the bucket's input dtype is the lhs's (the rhs's where the lhs is unscaled)
    mine = tuple(q for q in pairs if q != (None, None) and next(x for x in q if x is not None).elem == s.in_dtype)
    if not mine:
        raise InvalidArgument(f"convention={cfg.convention!r} has no quantization of {s.in_dtype} codes")
    return draw(sampled(mine))


# ------------------------------------------------------------------- buckets
# The buckets of problems(): static signatures chosen so that the pairs of relations of the covering design they
# can hold are held (plan), the plainest kept as shrink targets.
#: the plain signatures (smallest extents, no shards, no existing output) of the fewest group counts that every
#: bucket list keeps, so that failures shrink to a plain problem with few groups (and the one of the most groups,
#: past small per-group tables)
PLAIN_KEPT = 2
#: how many buckets hold each pair of the plan: a profile's 50 examples draw 6 to 8 of 8 buckets (Hypothesis
#: repeats its earlier choices), so a pair held by fewer may go undrawn
HELD = 3


def buckets(cfg: Config) -> tuple[Static, ...]:
    """A fixed, deterministic list of at most ``max_buckets`` static signatures, simplest first.

    The plain signatures of the fewest group counts (``PLAIN_KEPT``) and of the most, then, greedily, the
    signatures of the covering design's static pass (``design.static_rows``: K == N with a transposed rhs
    among them) or of the walk that bring the most pairs of static relations closer to being held ``HELD``
    times, then walked ones again; with ``shapes`` (which the design does not take), the walked list alone."""
    return plan(cfg)[0]


@functools.lru_cache(maxsize=256)
def plan(cfg: Config) -> tuple[tuple[Static, ...], frozenset[tuple[str, frozenset[tuple[str, str]]]]]:
    """The buckets of ``cfg`` and the (family, pair) of static relations of the covering design that ``HELD``
    of them hold: what a test of ``problems()`` draws if its examples reach all but ``HELD - 1`` buckets
    (empty with ``shapes``)."""
    walked = walked_buckets(cfg)
    if cfg.shapes is not None:
        return walked, frozenset()
    tail_ok = cfg.rules.full_sums is False
    rows = {fam: static_rows(cfg, fam, tail_ok) for fam in cfg.families}
    wanted = {(fam, p) for fam, rs in rows.items() for _, ps in rs for p in ps}

    def held(s: Static) -> set:
        return {(s.family, p) for p in pairs_of(static_levels(s, cfg))} & wanted

    chosen = _plain(cfg)
    count: Counter = Counter(p for s in chosen for p in held(s))
    pool = {s: held(s) for s in [s for rs in rows.values() for s, _ in rs] + list(walked)}
    def gain(s: Static) -> int:
        return sum(count[p] < HELD for p in pool[s])

    while len(chosen) < cfg.max_buckets:
        best = max(pool, key=gain, default=None)
        if best is None or not gain(best):
            break
        chosen.append(best)
        count.update(pool.pop(best))
    chosen += [s for s in walked if s not in chosen][:cfg.max_buckets - len(chosen)]
    chosen = list(dict.fromkeys(chosen))
    count = Counter(p for s in chosen for p in held(s))
    return tuple(sorted(chosen, key=Static.cost)), frozenset(p for p, c in count.items() if c >= HELD)


def _plain(cfg: Config) -> list[Static]:
    """The plain signatures (the family's first layout, no shards, batch or existing output, smallest
    extents) of the ``PLAIN_KEPT`` fewest group counts and of the most, as the walk makes them."""
    first = {f: layouts_of(cfg, f)[0] for f in cfg.families}
    walked = walked_buckets(dataclasses.replace(cfg, max_buckets=max(cfg.max_buckets, 8)))
    plain = sorted((s for s in walked if s.layout == first[s.family] and s.shards == 1 and not s.existing
                    and not s.batch), key=Static.cost)
    most = [s for s in plain if s.groups == max(cfg.group_counts)][:1]
    return list(dict.fromkeys(plain[:PLAIN_KEPT] + most))[:cfg.max_buckets]
