"""``routings()``: routed MoE problems (:class:`gmm_ref.Routing`) drawn where fused-MoE kernels break.

The static parameters (what a fused-MoE kernel compiles for: ``K``, ``N``, the global and local expert
counts, ``top_k``, the expert layout, the dtypes, ``mul_routed_weight``, and ``T`` where it is listed as static)
come from at most ``max_buckets`` fixed signatures (:class:`RoutedStatic`); the routing itself (``T`` unless
static, ``topk_ids``, the ``expert_map``'s choice of local experts, weights, values) varies freely. The cases
drawn (docs/routed.md, "Strategies"): experts with no slot, every token on one expert, more global experts than
256 and 512 (``K`` and ``N`` at their smallest there), ``top_k`` 1 to 8, tokens routed to experts of another
rank, a rank with no local expert at all, ``T = 0`` and ``T = 1``, expert counts that never fill a block of
``block_size``, runs of the last (highest) experts, zero and negative weights, peaked routers (a dominant slot
and a tail below half a unit in its last place), and NaN or Inf wherever no local
slot reads (rows of tokens routed to no local expert, weights of non-local slots, experts with no slot).
Shrinks towards few tokens, ``top_k = 1``, few experts, no expert parallelism and exact values.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

import gmm_ref
from gmm_ref import dtypes as _dt
from gmm_ref.routed.routing import EXPERT_LAYOUTS, ID_DTYPES, WEIGHT_DTYPES, peaked_weights
from property_tests.strategies._common import BOOLEANS, SEEDS, check_bool, check_int, integers, resolve, sampled
from property_tests.strategies.routed_design import RoutedCell, RoutedDesign, cell_ids, expert_map, pick, routed_design
from property_tests.strategies.values import VALUE_KINDS, fill, poison

__all__ = ["EP_KINDS", "ID_PATTERNS", "RoutedStatic", "routed_buckets", "routed_covering", "routed_replays",
           "routings", "topk_ids", "topk_weights"]

#: how the tokens choose their experts (shrinks towards the first): a few experts (the others get no slot),
#: every token on one expert, any expert, the last experts (ids past 256 and 512 where there are that many),
#: every expert's count below the block size
ID_PATTERNS = ("few", "one_expert", "free", "last", "under_block")
#: expert parallelism of a static signature: none (every expert local, no ``expert_map``), a quarter of the
#: experts local (at least one), no local expert at all (``E_local = 0``)
EP_KINDS = ("off", "part", "none")
#: the largest ``top_k`` and expert count drawn (kernels' routers: top_k <= 8 in every model served today)
MAX_TOP_K = 64
MAX_EXPERTS = 4096
MAX_TOKENS = 1 << 16

_DEFAULT_DTYPES = (("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32"),
                   ("bfloat16", "float32"))


@dataclass(frozen=True)
class RoutedStatic:
    """One static signature (bucket) of routed problems: what a fused-MoE kernel compiles for."""

    k: int
    n: int
    num_experts: int
    ep: str
    top_k: int
    layout: str
    in_dtype: np.dtype
    out_dtype: np.dtype
    weight_dtype: np.dtype
    id_dtype: np.dtype
    mul_routed_weight: bool
    #: ``T`` when it is static (``num_tokens`` listed), else None (drawn freely)
    tokens: int | None

    @property
    def num_local(self) -> int:
        return {"off": self.num_experts, "part": max(1, self.num_experts // 4), "none": 0}[self.ep]

    def cost(self) -> tuple:
        return (self.top_k, self.num_experts, EP_KINDS.index(self.ep), self.k + self.n, self.tokens or 0,
                self.mul_routed_weight, EXPERT_LAYOUTS.index(self.layout))


@dataclass(frozen=True)
class RoutedConfig:
    """The validated, hashable arguments of one ``routings()`` strategy."""

    shapes: tuple[tuple[int, int], ...]
    experts: tuple[int, ...]
    top_ks: tuple[int, ...]
    eps: tuple[str, ...]
    layouts: tuple[str, ...]
    dtype_pairs: tuple[tuple[np.dtype, np.dtype], ...]
    weight_dtypes: tuple[np.dtype, ...]
    id_dtypes: tuple[np.dtype, ...]
    muls: tuple[bool, ...]
    static_tokens: tuple[int, ...] | None
    max_buckets: int | None
    distinct: bool
    block_size: int


# ----------------------------------------------------------------------------------------------- checks
def _ints(name: str, value: Any, lo: int, hi: int) -> tuple[int, ...]:
    seq = (value,) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence) or not seq:
        raise InvalidArgument(f"{name}={value!r}, but it must be an int or a non-empty sequence of ints")
    return tuple(dict.fromkeys(check_int(name, v, minimum=lo, maximum=hi) for v in seq))


def _names(name: str, value: Any, allowed: Sequence[str]) -> tuple[str, ...]:
    seq = (value,) if isinstance(value, str) else value
    if not isinstance(seq, Sequence) or not seq or any(v not in allowed for v in seq):
        raise InvalidArgument(f"{name}={value!r}, but each must be one of {tuple(allowed)}")
    return tuple(dict.fromkeys(seq))


def _dtypes_of(name: str, value: Any, allowed: Sequence[np.dtype]) -> tuple[np.dtype, ...]:
    seq = [value] if isinstance(value, (str, np.dtype, type)) or not isinstance(value, Sequence) else value
    out = []
    for item in seq:
        try:
            d = np.dtype(item) if item in ("int64", np.int64) else _dt.as_dtype(item)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"{name}={value!r}, but {item!r} is not a dtype gmm_ref knows: {exc}") from None
        if d not in allowed:
            raise InvalidArgument(f"{name}={value!r}, but each must be one of {[str(a) for a in allowed]}")
        out.append(d)
    if not out:
        raise InvalidArgument(f"{name}={value!r}, but at least one dtype is needed")
    return tuple(dict.fromkeys(out))


def _dtype_pairs(value: Any) -> tuple[tuple[np.dtype, np.dtype], ...]:
    if value is None:
        value = _DEFAULT_DTYPES
    seq = [value] if isinstance(value, (str, np.dtype, type)) or not isinstance(value, Sequence) else value
    pairs = []
    for item in seq:
        try:
            i, o = ((_dt.as_dtype(item[0]), _dt.as_dtype(item[1])) if isinstance(item, tuple)
                    else (_dt.as_dtype(item),) * 2)
        except (TypeError, ValueError, IndexError) as exc:
            raise InvalidArgument(f"dtypes={value!r}, but {item!r} is not a dtype gmm_ref knows: {exc}") from None
        if (_dt.is_integer(i) or _dt.is_integer(o) or i not in _dt.INPUT_DTYPES or o not in _dt.OUTPUT_DTYPES):
            raise InvalidArgument(f"dtypes={value!r}, but ({i}, {o}) is not a float input/output pair a Routing "
                                  "takes (integer and scaled routed MoE are not modelled yet)")
        pairs.append((i, o))
    if not pairs:
        raise InvalidArgument("dtypes=(), but at least one dtype is needed")
    return tuple(dict.fromkeys(pairs))


def _shapes(value: Any) -> tuple[tuple[int, int], ...]:
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, (int, np.integer)) for v in value):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise InvalidArgument(f"shapes={value!r}, but it must be a non-empty sequence of (K, N)")
    out = []
    for s in value:
        if not isinstance(s, Sequence) or len(s) != 2:
            raise InvalidArgument(f"shapes={value!r}, but each must be a (K, N) pair, got {s!r}")
        out.append((check_int("shapes", s[0], minimum=0, maximum=1 << 14),
                    check_int("shapes", s[1], minimum=0, maximum=1 << 14)))
    return tuple(dict.fromkeys(sorted(out, key=sum)))


def _config(shapes: Any, num_experts: Any, top_k: Any, expert_parallel: Any, expert_layouts: Any, dtypes: Any,
            weight_dtypes: Any, id_dtypes: Any, mul_routed_weight: Any, num_tokens: Any, max_buckets: Any,
            distinct_experts: Any, block_size: Any) -> RoutedConfig:
    ep = check_bool("expert_parallel", expert_parallel, allow_none=True)
    mul = check_bool("mul_routed_weight", mul_routed_weight, allow_none=True)
    distinct = bool(check_bool("distinct_experts", distinct_experts))
    experts = _ints("num_experts", num_experts, 1, MAX_EXPERTS)
    top_ks = _ints("top_k", top_k, 1, MAX_TOP_K)
    if distinct and max(experts) < min(top_ks):
        raise InvalidArgument(f"top_k={top_k!r}, but with distinct_experts=True a token lists top_k different "
                              f"experts, more than the {max(experts)} of num_experts={num_experts!r}")
    static_tokens = None
    if num_tokens is not None and not isinstance(num_tokens, SearchStrategy):
        static_tokens = _ints("num_tokens", num_tokens, 0, MAX_TOKENS)
    buckets_n = None if max_buckets is None else check_int("max_buckets", max_buckets, minimum=1, maximum=256)
    return RoutedConfig(
        shapes=_shapes(shapes), experts=experts, top_ks=top_ks,
        eps=("off",) if ep is False else ("part", "none") if ep else EP_KINDS,
        layouts=_names("expert_layouts", expert_layouts, EXPERT_LAYOUTS),
        dtype_pairs=_dtype_pairs(dtypes),
        weight_dtypes=_dtypes_of("weight_dtypes", weight_dtypes, WEIGHT_DTYPES),
        id_dtypes=_dtypes_of("id_dtypes", id_dtypes, ID_DTYPES),
        muls=(False, True) if mul is None else (mul,),
        static_tokens=static_tokens, max_buckets=buckets_n, distinct=distinct,
        block_size=check_int("block_size", block_size, minimum=1, maximum=1 << 12))


def _fits(cfg: RoutedConfig, s: RoutedStatic) -> bool:
    return not cfg.distinct or s.top_k <= s.num_experts


def _small(cfg: RoutedConfig, s: RoutedStatic) -> RoutedStatic:
    """More experts than 256: ``K`` and ``N`` at their smallest (the point there is the alignment's scan)."""
    return dataclasses.replace(s, k=cfg.shapes[0][0], n=cfg.shapes[0][1]) if s.num_experts > 256 else s


#: each list's phase in the walk of :func:`routed_buckets` (shapes, experts, expert parallelism, top_k, layout,
#: dtypes, weight dtype, id dtype, mul_routed_weight, T): chosen so that the defaults put every top_k and
#: every expert count in a bucket with local experts
_SALTS = (0, 2, 1, 3, 4, 5, 6, 7, 8, 9)


@functools.lru_cache(maxsize=256)
def routed_buckets(cfg: RoutedConfig) -> tuple[RoutedStatic, ...]:
    """A fixed, deterministic list of static signatures, simplest first: one plain signature (the first of
    every list), then signatures walking every list with its own phase, so that once there are more buckets
    than a list has values each value is in some bucket."""
    lists = (cfg.shapes, cfg.experts, cfg.eps, cfg.top_ks, cfg.layouts, cfg.dtype_pairs, cfg.weight_dtypes,
             cfg.id_dtypes, cfg.muls, cfg.static_tokens or (None,))
    target = cfg.max_buckets or 8
    found: dict[RoutedStatic, None] = {}
    for j in range(target * 16):
        picks = [seq[0] if j == 0 else seq[(j + salt) % len(seq)] for salt, seq in zip(_SALTS, lists, strict=True)]
        (k, n), e, ep, top_k, layout, (i_dt, o_dt), w_dt, id_dt, mul, t = picks
        if ep == "none" and any(f.ep == "none" for f in found):  # one rank without experts is enough
            ep = next((x for x in cfg.eps if x != "none"), ep)
        s = _small(cfg, RoutedStatic(k, n, e, ep, top_k, layout, i_dt, o_dt, w_dt, id_dt, mul, t))
        if not _fits(cfg, s):  # the largest top_k these experts take
            fit = [x for x in cfg.top_ks if x <= e]
            if not fit:
                continue
            s = dataclasses.replace(s, top_k=max(fit))
        found.setdefault(s)
        if len(found) >= target:
            break
    return tuple(sorted(found, key=RoutedStatic.cost))


def _draw_free_static(draw: Any, cfg: RoutedConfig) -> RoutedStatic:
    e = draw(sampled(cfg.experts))
    tks = tuple(x for x in cfg.top_ks if x <= e or not cfg.distinct)
    if not tks:
        e = max(cfg.experts)
        tks = tuple(x for x in cfg.top_ks if x <= e)
    (k, n), (i_dt, o_dt) = draw(sampled(cfg.shapes)), draw(sampled(cfg.dtype_pairs))
    return _small(cfg, RoutedStatic(k, n, e, draw(sampled(cfg.eps)), draw(sampled(tks)),
                                    draw(sampled(cfg.layouts)), i_dt, o_dt, draw(sampled(cfg.weight_dtypes)),
                                    draw(sampled(cfg.id_dtypes)), draw(sampled(cfg.muls)),
                                    draw(sampled(cfg.static_tokens)) if cfg.static_tokens else None))


# --------------------------------------------------------------------------------------------- topk_ids
@functools.lru_cache(maxsize=1024)
def _free_tokens(max_tokens: int, block_size: int) -> SearchStrategy[int]:
    """``T`` biased to 0, 1, a few, and one either side of a block edge (shrinks to 0)."""
    edges = sorted({v for b in (block_size, 2 * block_size) for v in (b - 1, b, b + 1) if 0 <= v <= max_tokens})
    return st.one_of(integers(min(1, max_tokens), min(3, max_tokens)), sampled(tuple(edges) or (0,)),
                     integers(0, max_tokens))


def draw_ids(draw: Any, t: int, num_experts: int, top_k: int, distinct: bool, block_size: int,
             pattern: str | None = None) -> np.ndarray:
    """``[t, top_k]`` int64 expert ids of ``pattern`` (:data:`ID_PATTERNS`; drawn when None)."""
    e, need = num_experts, top_k if distinct else 1
    if pattern is None:
        pattern = draw(sampled(ID_PATTERNS))
    if pattern == "under_block" and -(-t * top_k // e) >= block_size:
        pattern = "free"  # too many slots for every expert to stay below a block
    if pattern in ("few", "last"):
        c = draw(integers(need, max(need, min(e, 8))))
        cands = np.arange(e - c, e) if pattern == "last" else None
    rng = np.random.default_rng(draw(SEEDS))
    if pattern == "few":
        cands = np.sort(rng.permutation(e)[:c]) if draw(BOOLEANS) else np.arange(c)
    if pattern in ("few", "last"):
        return pick(rng, t, top_k, cands, distinct)
    if pattern == "under_block":  # slot i to the (i + offset)-th expert of a permutation: at most ceil(t*k/e)
        perm = rng.permutation(e)
        return perm[(np.arange(t * top_k) + int(rng.integers(0, e))) % e].reshape(t, top_k)
    ids = pick(rng, t, top_k, np.arange(e), distinct)
    if pattern == "one_expert":  # every token lists expert x (in any slot; in every slot when repeats may be)
        x = draw(st.one_of(integers(0, e - 1), st.just(e - 1)))
        if not distinct and draw(BOOLEANS):
            return np.full((t, top_k), x, np.int64)
        ids = np.array([_with(row, x, rng) for row in ids], np.int64).reshape(t, top_k)
    if not distinct and top_k > 1 and t and draw(BOOLEANS):  # some token lists one expert twice
        row = int(rng.integers(0, t))
        ids[row, 1] = ids[row, 0]
    return ids


def _with(row: np.ndarray, x: int, rng: np.random.Generator) -> np.ndarray:
    """``row`` listing expert ``x`` once in a random slot, its other experts kept (distinct ones stay so)."""
    row = row.copy()
    if (row == x).any():
        return row
    row[int(rng.integers(0, len(row)))] = x
    return row


def topk_ids(*, num_tokens: int | SearchStrategy[int] | None = None, num_experts: int | SearchStrategy[int] = 8,
             top_k: int | SearchStrategy[int] = 2, distinct_experts: bool = True, dtype: Any = "int32",
             block_size: int = 16, max_tokens: int = 32) -> SearchStrategy[np.ndarray]:
    """``[T, top_k]`` expert ids in ``[0, num_experts)`` of one of :data:`ID_PATTERNS`.

    ``distinct_experts=True`` (vLLM's routers: ``torch.topk`` never repeats): every token lists ``top_k``
    different experts; False: a token may list one expert in several slots (and some token does, about half
    the time). ``num_tokens=None``: ``T`` drawn in ``[0, max_tokens]``, biased to 0, 1 and one either side of
    ``block_size`` and twice it. Shrinks towards few tokens, the first experts and the ``"few"`` pattern."""
    distinct = bool(check_bool("distinct_experts", distinct_experts))
    id_dtype = _dtypes_of("dtype", dtype, ID_DTYPES)[0]
    bs = check_int("block_size", block_size, minimum=1, maximum=1 << 12)
    hi = check_int("max_tokens", max_tokens, minimum=0, maximum=MAX_TOKENS)

    def checked(t: Any, e: Any, k: Any) -> tuple[int, int, int]:
        t = check_int("num_tokens", t, minimum=0, maximum=MAX_TOKENS)
        e = check_int("num_experts", e, minimum=1, maximum=MAX_EXPERTS)
        k = check_int("top_k", k, minimum=1, maximum=MAX_TOP_K)
        if distinct and k > e:
            raise InvalidArgument(f"top_k={k}, but with distinct_experts=True a token lists top_k different experts, "
                                  f"more than num_experts={e}")
        return t, e, k

    if all(not isinstance(v, SearchStrategy) for v in (num_experts, top_k)):
        checked(0 if num_tokens is None or isinstance(num_tokens, SearchStrategy) else num_tokens, num_experts, top_k)

    @st.composite
    def _draw(draw: Any) -> np.ndarray:
        e, k = resolve(draw, num_experts), resolve(draw, top_k)
        t = draw(_free_tokens(hi, bs)) if num_tokens is None else resolve(draw, num_tokens)
        t, e, k = checked(t, e, k)
        return draw_ids(draw, t, e, k, distinct, bs).astype(id_dtype)

    return _draw()


# ------------------------------------------------------------------------------------------------ values
def weights_of(rng: np.random.Generator, shape: tuple[int, int], dtype: np.dtype, kind: str) -> np.ndarray:
    """Routed weights: small integers in [-2, 2] (``exact``), else uniform in [-1, 1); about 1 in 6 is 0."""
    if kind == "exact":
        w = rng.integers(-2, 3, size=shape).astype(np.float64)
    else:
        w = rng.uniform(-1.0, 1.0, size=shape)
        w[rng.random(size=shape) < 1 / 6] = 0.0
    return _dt.round_to(w, dtype)


def peak(rng: np.random.Generator, weights: np.ndarray, ids: np.ndarray, repeats: bool, out_dtype: Any) -> None:
    """A peaked router, in place: :func:`gmm_ref.routed.routing.peaked_weights` (slot 0 holds the largest weight, the
    others a tail of its sign, each between a quarter and a half of a unit in the last place of slot 0's in the
    output dtype) with its signs and tails drawn; with ``repeats``, half the tokens list slot 0's expert in every
    slot. A combine that rounds every add of such a token to the output dtype drops each tail (past the bound from
    ``top_k = 8``), one that sums in float32 keeps them (docs/routed.md)."""
    t, k = weights.shape
    sign = rng.choice((-1.0, 1.0), size=t)
    tail = rng.choice((1.5, 1.75), size=(t, k - 1))
    weights[...] = peaked_weights(weights, sign, tail, out_dtype)
    if repeats:
        same = rng.random(t) < 0.5
        ids[same] = ids[same, :1]


def topk_weights(*, num_tokens: int | SearchStrategy[int], top_k: int | SearchStrategy[int],
                 dtype: Any = "float32", values: str = "normal") -> SearchStrategy[np.ndarray]:
    """``[T, top_k]`` routed weights of ``dtype``: ``values="exact"``: small integers in [-2, 2]; ``"normal"``:
    uniform in [-1, 1). Zeros and negative weights are drawn in both. Shrinks towards the weights of seed 0."""
    w_dtype = _dtypes_of("dtype", dtype, WEIGHT_DTYPES)[0]
    if values not in ("exact", "normal"):
        raise InvalidArgument(f"values={values!r}, but it must be 'exact' or 'normal'")

    @st.composite
    def _draw(draw: Any) -> np.ndarray:
        t = check_int("num_tokens", resolve(draw, num_tokens), minimum=0, maximum=MAX_TOKENS)
        k = check_int("top_k", resolve(draw, top_k), minimum=1, maximum=MAX_TOP_K)
        return weights_of(np.random.default_rng(draw(SEEDS)), (t, k), w_dtype, values)

    return _draw()


def _sig_limit(dtype: Any) -> float:
    return 2.0 ** (_dt.float_format(np.dtype(dtype)).mant + 1)


def _exact(rng: np.random.Generator, shape: tuple[int, ...], s: RoutedStatic) -> np.ndarray:
    """Small integers whose weighted sums over ``K`` and ``top_k`` stay exact in the output where they can."""
    lim = min(_sig_limit(s.out_dtype), _sig_limit(np.float32), _sig_limit(s.in_dtype)) / 2
    a = int(max(1, min(4, math.isqrt(int(lim // max(s.k * s.top_k * 2, 1))))))
    return rng.integers(-a, a + 1, size=shape, dtype=np.int8).astype(s.in_dtype)


def _build(draw: Any, cfg: RoutedConfig, s: RoutedStatic, kinds: tuple[str, ...], foreigns: tuple[str, ...],
           max_tokens: Any, cell: RoutedCell | None = None) -> gmm_ref.Routing:
    emap: np.ndarray | None = None
    if cell is not None:
        ids, emap = cell_ids(draw, cfg, cell)
        t = len(ids)
    elif s.tokens is not None:
        t = s.tokens
    elif isinstance(max_tokens, SearchStrategy):
        t = check_int("num_tokens", draw(max_tokens), minimum=0, maximum=MAX_TOKENS)
    else:
        t = draw(_free_tokens(max_tokens, cfg.block_size))
    if cell is None:
        ids = draw_ids(draw, t, s.num_experts, s.top_k, cfg.distinct, cfg.block_size)
    kind = draw(sampled(kinds))
    foreign = draw(sampled(foreigns))
    seed = draw(SEEDS)
    rng = np.random.default_rng(seed)
    if cell is None:
        emap = expert_map(draw, rng, s)
    value_kind = "normal" if kind == "poisoned" else kind
    e_shape = (s.num_local, s.n, s.k) if s.layout == "enk" else (s.num_local, s.k, s.n)
    if value_kind == "exact":
        tokens, experts = _exact(rng, (t, s.k), s), _exact(rng, e_shape, s)
    else:
        tokens = fill(rng, (t, s.k), s.in_dtype, value_kind, s.k, s.out_dtype, seed)
        experts = fill(rng, e_shape, s.in_dtype, value_kind, s.k, s.out_dtype, seed)
    weights = weights_of(rng, (t, s.top_k), s.weight_dtype, "exact" if value_kind == "exact" else "normal")
    if s.top_k > 1 and s.mul_routed_weight and t and draw(st.booleans()):  # a peaked router (drawn last)
        ids = ids.copy()
        # repeats (half the tokens on one expert) only outside a cell: they would change the cell's load
        peak(np.random.default_rng((seed, 1)), weights, ids, not cfg.distinct and cell is None, s.out_dtype)
    if kind == "poisoned":  # NaN / Inf wherever no local slot reads
        local = (emap.astype(np.int64)[ids] if emap is not None else ids) >= 0
        poison(rng, tokens, np.broadcast_to(~local.any(axis=1)[:, None], tokens.shape))
        poison(rng, weights, ~local if s.mul_routed_weight else np.ones(weights.shape, bool))
        used = np.zeros(s.num_local, bool)
        used[(emap.astype(np.int64)[ids] if emap is not None else ids)[local]] = True
        poison(rng, experts, np.broadcast_to(~used[:, None, None], experts.shape))
    return gmm_ref.Routing(tokens, experts, ids.astype(s.id_dtype), weights, expert_layout=s.layout, expert_map=emap,
                           mul_routed_weight=s.mul_routed_weight, out_dtype=s.out_dtype, foreign=foreign)


def routings(
    *,
    shapes: Sequence[tuple[int, int]] = ((4, 4), (16, 8), (32, 24)),
    num_experts: int | Sequence[int] = (8, 60, 257, 513),
    top_k: int | Sequence[int] = (1, 2, 3, 4, 8),
    expert_parallel: bool | None = None,
    expert_layouts: str | Sequence[str] = EXPERT_LAYOUTS,
    dtypes: Any = None,
    weight_dtypes: Any = ("float32",),
    id_dtypes: Any = ("int32", "int64"),
    mul_routed_weight: bool | None = None,
    num_tokens: int | Sequence[int] | SearchStrategy[int] | None = None,
    max_tokens: int = 40,
    distinct_experts: bool = True,
    block_size: int = 16,
    values: str | Sequence[str] = VALUE_KINDS,
    foreign: str | Sequence[str] = ("zero", "undefined"),
    max_buckets: int | None = 8,
    cell: RoutedCell | None = None,
) -> SearchStrategy[gmm_ref.Routing]:
    """:class:`gmm_ref.Routing` instances drawn where fused-MoE kernels break (module docstring).

    Static parameters, from at most ``max_buckets`` fixed signatures (``None``: drawn freely): ``shapes``
    (``(K, N)`` pairs; the smallest where there are more than 256 experts), ``num_experts`` (global; the
    defaults reach past 256 and 512, the one-block scans of ``moe_align_block_size``), ``top_k``,
    ``expert_parallel`` (True: always an ``expert_map``, a quarter of the experts local or none at all; False:
    never; None: either), ``expert_layouts`` (``"enk"``, ``"ekn"``), ``dtypes`` (input dtypes or ``(input,
    output)`` pairs), ``weight_dtypes``, ``id_dtypes`` (of ``topk_ids`` and ``expert_map``),
    ``mul_routed_weight`` (True, False, None: either) and ``num_tokens`` when it lists ints (a kernel compiled
    per ``T``). Otherwise ``T`` is free: drawn in ``[0, max_tokens]`` (biased to 0, 1 and one either side of
    ``block_size`` and twice it), or from ``num_tokens`` when it is a strategy.

    Free: the ids (:data:`ID_PATTERNS`), the local experts' placement, weights (zeros and negatives drawn;
    with ``mul_routed_weight`` and ``top_k >= 2`` half the routings are peaked routers, :func:`peak`: what a
    combine summing in the output dtype loses), ``foreign`` and the values:
    ``"exact"`` (small integers), ``"normal"``, ``"wide"`` (values.py's kinds),
    ``"poisoned"`` (normal values, NaN / Inf in every token row no local slot reads, every weight no local
    slot multiplies, every local expert no slot reads). ``distinct_experts=True``: no token lists one expert
    twice (vLLM's contract); False: repeats are drawn. ``block_size``: the alignment's block (BLOCK_SIZE_M) the
    ``"under_block"`` pattern and the token counts are drawn around.

    ``cell``: one cell of :func:`routed_covering` of the same arguments: its bucket, token counts and routed
    relations fixed (``property_tests.strategies.routed_design``), the rest free.

    Arguments are checked when the strategy is built: ``InvalidArgument`` names the argument. Shrinks towards
    the simplest bucket (smallest ``top_k``, fewest experts, no expert parallelism, smallest shape), few
    tokens, few experts and exact values.
    """
    cfg = _config(shapes, num_experts, top_k, expert_parallel, expert_layouts, dtypes, weight_dtypes, id_dtypes,
                  mul_routed_weight, num_tokens, max_buckets, distinct_experts, block_size)
    kinds = _names("values", values, VALUE_KINDS)
    foreigns = _names("foreign", foreign, ("zero", "undefined"))
    free_t: Any = num_tokens if isinstance(num_tokens, SearchStrategy) else check_int(
        "max_tokens", max_tokens, minimum=0, maximum=MAX_TOKENS)
    bucket_strategy = sampled(routed_buckets(cfg)) if cfg.max_buckets is not None else None

    if cell is not None and cell.static not in routed_buckets(cfg):
        raise InvalidArgument(f"cell={cell.describe()!r} is not a cell of routed_covering() of these arguments")

    @st.composite
    def _draw(draw: Any) -> gmm_ref.Routing:
        if cell is not None:
            return _build(draw, cfg, cell.static, kinds, foreigns, free_t, cell)
        s = draw(bucket_strategy) if bucket_strategy is not None else _draw_free_static(draw, cfg)
        return _build(draw, cfg, s, kinds, foreigns, free_t)

    return _draw()


def routed_covering(**kwargs: Any) -> RoutedDesign:
    """The covering design of routed relations of ``routings(**kwargs)`` (``values`` and ``foreign`` aside):
    cells that together reach every pair the configuration can show (``property_tests.strategies.routed_design``);
    draw each with ``routings(cell=cell, **kwargs)``. ``T`` must be static or free below ``max_tokens``, and the
    signatures bucketed (``max_buckets`` not None)."""
    kwargs = {k: v for k, v in kwargs.items() if k not in ("values", "foreign", "cell")}
    params = inspect.signature(routings).parameters
    unknown = set(kwargs) - set(params)
    if unknown:
        raise InvalidArgument(f"routed_covering(): unknown arguments {sorted(unknown)}; it takes routings()'s")
    full = {k: p.default for k, p in params.items() if k not in ("values", "foreign", "cell")} | kwargs
    max_tokens = full.pop("max_tokens")
    if isinstance(full["num_tokens"], SearchStrategy) or full["max_buckets"] is None:
        raise InvalidArgument("routed_covering() needs num_tokens as ints or None and max_buckets not None: its "
                              "cells fix the signature and the token count")
    cfg = _config(**full)
    tokens = tuple(range(check_int("max_tokens", max_tokens, minimum=0, maximum=MAX_TOKENS) + 1))
    return routed_design(routed_buckets(cfg), tokens, cfg.distinct, cfg.block_size)


def routed_replays(strategy: SearchStrategy[gmm_ref.Routing], n: int, *, distinct_experts: bool = True,
                   block_size: int = 16) -> SearchStrategy[tuple[gmm_ref.Routing, ...]]:
    """``n`` routings one kernel gets one after the other (a fused-MoE kernel captured once per decode batch size
    and replayed with each step's routing): one of ``strategy``, then ``n - 1`` with its shapes, dtypes, experts
    and expert map, and new ``topk_ids`` (each of its own :data:`ID_PATTERNS`, so that experts go empty and full
    from one call to the next) and weights, the tokens' rows rolled. A routing of no tokens is drawn once."""
    check_int("n", n, minimum=1, maximum=16)

    @st.composite
    def _draw(draw: Any) -> tuple[gmm_ref.Routing, ...]:
        first = draw(strategy)
        if n == 1 or first.num_tokens == 0:
            return (first,)
        out = [first]
        for i in range(1, n):
            ids = draw_ids(draw, first.num_tokens, first.num_experts, first.top_k, distinct_experts, block_size,
                           pattern=ID_PATTERNS[(i + ID_PATTERNS.index("few")) % len(ID_PATTERNS)])
            weights = None if first.topk_weights is None else np.roll(first.topk_weights, i, axis=0)
            out.append(dataclasses.replace(first, tokens=np.roll(first.tokens, i, axis=0),
                                           topk_ids=ids.astype(first.topk_ids.dtype), topk_weights=weights))
        return tuple(out)

    return _draw()
