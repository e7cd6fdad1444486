"""The covering design of routed relations: where fused-MoE kernels break, and cells that cover every pair.

A routed kernel sorts its slots by expert into blocks of ``block_size`` (``moe_align_block_size``), scans the
expert ids, and skips or masks what its rank does not own; its bugs hide behind the relations below. A *cell*
fixes one static signature (a bucket of ``routings()``, so its experts, ``top_k`` and expert parallelism) and one
level of every dynamic relation; :func:`routed_design` picks cells greedily until every pair of levels that some
cell can show together is covered (every bucket in at least one cell), and :func:`observe_routing` reads the
levels back from any routing, so a run counts the pairs its examples really reached.

==========  =================================================================================================
factor      levels
==========  =================================================================================================
experts     the global expert count: few (<= 8), many (<= 256), past_256 (257-512, a second scan block of the
            alignment), past_512
top_k       one, several
ep          expert parallelism: off, part (some experts local), none (no local expert)
slots       T * top_k against the block: zero, below (under one block), aligned (a multiple), unaligned
load        what one local expert gets (a routing shows every level its local experts have): none (no slot),
            one (a single slot), one_block (2 to block_size slots: they fit one block, a full one at most),
            many_blocks (more than block_size: a second block, partial, follows a full one)
last        whether a slot lists the last (highest) global expert: hit, missed
==========  =================================================================================================

A rank without local experts has no ``load``. Inside a cell the tokens, the other slots' experts, the expert
map, the weights and the values stay free.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import gmm_ref
from property_tests.strategies._common import BOOLEANS, SEEDS, integers, pairs_of, sampled

__all__ = ["LAST_LEVELS", "LOAD_LEVELS", "SLOT_LEVELS", "RoutedCell", "RoutedDesign", "cell_ids", "count_range",
           "expert_map", "observe_routing", "pick", "routed_design", "static_of"]

SLOT_LEVELS = ("zero", "below", "aligned", "unaligned")
LOAD_LEVELS = ("none", "one", "one_block", "many_blocks")
LAST_LEVELS = ("hit", "missed")
#: every factor and its levels, in the order a cell describes them
FACTORS = (("experts", ("few", "many", "past_256", "past_512")), ("top_k", ("one", "several")),
           ("ep", ("off", "part", "none")), ("slots", SLOT_LEVELS), ("load", LOAD_LEVELS), ("last", LAST_LEVELS))


@dataclass(frozen=True)
class RoutedCell:
    """One cell: a static signature (a ``routings()`` bucket), its dynamic levels (``load`` None on a rank
    without local experts) and the token counts that show them."""

    static: Any  # routing.RoutedStatic (that module builds on this one)
    slots: str
    load: str | None
    last: str
    tokens: tuple[int, ...]

    def levels(self) -> dict[str, str]:
        out = dict(static_of(self.static.num_experts, self.static.top_k, self.static.ep),
                   slots=self.slots, last=self.last)
        if self.load is not None:
            out["load"] = self.load
        return out

    def describe(self) -> str:
        return " ".join(f"{f}={v}" for f, v in self.levels().items())


@dataclass(frozen=True)
class RoutedDesign:
    """The cells of one ``routings()`` configuration, the pairs they cover, and the pairs no cell can show."""

    family: str
    cells: tuple[RoutedCell, ...]
    pairs: frozenset[frozenset[tuple[str, str]]]
    inexpressible: tuple[tuple[str, str], ...]


def _experts_level(e: int) -> str:
    return "few" if e <= 8 else "many" if e <= 256 else "past_256" if e <= 512 else "past_512"


def static_of(num_experts: int, top_k: int, ep: str) -> dict[str, str]:
    """The static levels of a signature."""
    return {"experts": _experts_level(num_experts), "top_k": "one" if top_k == 1 else "several", "ep": ep}


def slots_level(slots: int, block: int) -> str:
    return "zero" if slots == 0 else "below" if slots < block else "aligned" if slots % block == 0 else "unaligned"


def load_level(count: int, block: int) -> str:
    if count <= 1:
        return ("none", "one")[count]
    return "one_block" if count <= block else "many_blocks"


def observe_routing(r: gmm_ref.Routing, block: int) -> dict[str, frozenset[str]]:
    """The levels ``r`` shows (a set per dynamic factor; its local experts' loads all counted)."""
    ep = "off" if r.expert_map is None else "none" if r.num_local_experts == 0 else "part"
    ids = np.asarray(r.topk_ids, np.int64)
    seen: dict[str, frozenset[str]] = {k: frozenset({v}) for k, v in static_of(r.num_experts, r.top_k, ep).items()}
    seen["slots"] = frozenset({slots_level(ids.size, block)})
    seen["last"] = frozenset({"hit" if (ids == r.num_experts - 1).any() else "missed"})
    if r.num_local_experts:
        counts = np.bincount(ids.ravel(), minlength=r.num_experts)
        local = np.arange(r.num_experts) if r.expert_map is None else np.flatnonzero(
            np.asarray(r.expert_map, np.int64) >= 0)
        seen["load"] = frozenset(load_level(int(c), block) for c in counts[local])
    return seen


def count_range(s: Any, distinct: bool, block: int, t: int, load: str | None, last: str) -> tuple[int, int] | None:
    """The slots one local expert (not the last) can get in a routing of ``t`` tokens showing ``load`` and
    ``last``, the other slots going to the other experts; None where no count can (the last expert hit needs a
    slot of its own; a token lists ``top_k`` different experts where ``distinct``)."""
    n, k, e = t * s.top_k, s.top_k, s.num_experts
    if last == "hit" and n == 0:
        return None
    if load is None:  # no local expert: only the last expert's slot to place
        pool = e - (last == "missed")
        return (0, 0) if n == 0 or pool >= (k if distinct else 1) else None
    if e < 2 or (s.ep == "part" and s.num_local < 1):
        return None
    lo, hi = {"none": (0, 0), "one": (1, 1), "one_block": (2, block), "many_blocks": (max(block + 1, 2), n)}[load]
    hi = min(hi, t if distinct else n, n - 1 if last == "hit" else n)
    pool = e - 1 - (last == "missed")  # the experts the other slots may list
    if distinct:
        if pool < k - 1:
            return None
        if pool < k:  # every token must list the expert
            lo = max(lo, t)
    elif pool < 1:
        lo = max(lo, n)
    return (lo, hi) if lo <= hi else None


def _candidates(buckets: Sequence[Any], tokens: Sequence[int], distinct: bool,
                block: int) -> list[RoutedCell]:
    out = []
    for s in buckets:
        ts = (s.tokens,) if s.tokens is not None else tuple(tokens)
        loads: tuple[str | None, ...] = (None,) if s.ep == "none" else LOAD_LEVELS
        for slots in SLOT_LEVELS:
            for load in loads:
                for last in LAST_LEVELS:
                    fit = tuple(t for t in ts if slots_level(t * s.top_k, block) == slots
                                and count_range(s, distinct, block, t, load, last) is not None)
                    if fit:
                        out.append(RoutedCell(s, slots, load, last, fit))
    return out


def _pick(cands: list[RoutedCell], uncovered: set, among: list[int]) -> int:
    """The candidate of ``among`` covering the most uncovered pairs (the first among equals)."""
    return max(among, key=lambda i: (len(pairs_of(cands[i].levels()) & uncovered), -i))


@functools.lru_cache(maxsize=256)
def routed_design(buckets: tuple[Any, ...], tokens: tuple[int, ...], distinct: bool, block: int) -> RoutedDesign:
    """The cells over ``buckets`` (``routings()``'s static signatures, each in one cell at least) and the free
    token counts ``tokens``: greedy, deterministic, every pair some candidate cell shows covered."""
    cands = _candidates(buckets, tokens, distinct, block)
    wanted: set = set().union(*(pairs_of(c.levels()) for c in cands)) if cands else set()
    uncovered, chosen = set(wanted), []
    for s in buckets:
        mine = [i for i, c in enumerate(cands) if c.static == s]
        if mine:
            chosen.append(_pick(cands, uncovered, mine))
            uncovered -= pairs_of(cands[chosen[-1]].levels())
    while uncovered:
        chosen.append(_pick(cands, uncovered, list(range(len(cands)))))
        uncovered -= pairs_of(cands[chosen[-1]].levels())
    cells = tuple(cands[i] for i in dict.fromkeys(chosen))
    every = {frozenset({(f, a), (g, b)}) for i, (f, fa) in enumerate(FACTORS) for g, gb in FACTORS[i + 1:]
             for a in fa for b in gb}
    statics = {v for c in cells for v in c.levels().items() if v[0] in ("experts", "top_k", "ep")}
    lost = sorted((sorted(p) for p in every - wanted if all(v in statics or v[0] not in ("experts", "top_k", "ep")
                                                             for v in p)), key=str)
    inexpressible = tuple((f"{a}={x} & {b}={y}", "no signature and token count drawn shows both")
                          for (a, x), (b, y) in lost)
    return RoutedDesign("routed", cells, frozenset(wanted), inexpressible)


# ------------------------------------------------------------------------------ drawing a cell
def pick(rng: np.random.Generator, t: int, top_k: int, cands: np.ndarray, distinct: bool) -> np.ndarray:
    """``[t, top_k]`` experts chosen among ``cands`` (each token's distinct when ``distinct``)."""
    if not distinct:
        return cands[rng.integers(0, len(cands), size=(t, top_k))]
    if t * len(cands) > 1 << 20:  # many tokens and experts: one choice per token, not a [t, E] sort
        return np.array([rng.choice(cands, top_k, replace=False) for _ in range(t)], np.int64).reshape(t, top_k)
    order = np.argsort(rng.random((t, len(cands))), axis=1)[:, :top_k]
    return cands[order]


def expert_map(draw: Any, rng: np.random.Generator, s: Any) -> np.ndarray | None:
    """global -> local: a contiguous range of experts (vLLM's linear placement), a scattered subset in order,
    or a scattered subset in any order; all -1 for a rank without local experts."""
    if s.ep == "off":
        return None
    e, local = s.num_experts, s.num_local
    emap = np.full(e, -1, np.int64)
    how = draw(sampled(("range", "scattered", "permuted")))
    if how == "range":
        start = draw(integers(0, e - local))
        emap[start:start + local] = np.arange(local)
    else:
        chosen = np.sort(rng.permutation(e)[:local])
        emap[chosen] = np.arange(local) if how == "scattered" else rng.permutation(local)
    return emap.astype(s.id_dtype)


def cell_ids(draw: Any, cfg: Any, cell: RoutedCell) -> tuple[np.ndarray, np.ndarray | None]:
    """The ids and expert map of one routing of ``cell``: one local expert (not the last) gets a count of the
    cell's ``load``, the last expert is hit or missed as it says, the other slots list other experts (a few of
    them, or any)."""
    s, t = cell.static, draw(sampled(cell.tokens))
    e, k = s.num_experts, s.top_k
    rng = np.random.default_rng(draw(SEEDS))
    emap = expert_map(draw, rng, s)
    if emap is not None and s.num_local and (np.flatnonzero(emap.astype(np.int64) >= 0) == e - 1).all():
        emap = np.roll(emap, -1)  # its one local expert off the last: the load is placed on another
    lo, hi = count_range(s, cfg.distinct, cfg.block_size, t, cell.load, cell.last)  # type: ignore[misc]
    c, x = draw(integers(lo, hi)), -1
    if cell.load is not None:
        local = np.arange(e) if emap is None else np.flatnonzero(emap.astype(np.int64) >= 0)
        local = local[local != e - 1]
        x = int(local[draw(integers(0, len(local) - 1))])
    pool = np.setdiff1d(np.arange(e), [x, e - 1] if cell.last == "missed" else [x])
    if draw(BOOLEANS):  # a few experts take the other slots (the rest get none)
        pool = np.sort(rng.permutation(pool)[:max(k, min(len(pool), draw(integers(1, 8))))])
    if cfg.distinct:
        has = np.zeros(t, bool)
        has[rng.choice(t, c, replace=False)] = True
        ids = np.empty((t, k), np.int64)
        if not has.all():
            ids[~has] = pick(rng, int((~has).sum()), k, pool, True)
        if has.any():
            part = pick(rng, int(has.sum()), k - 1, pool, True)
            ids[has] = [np.insert(row, int(rng.integers(0, k)), x) for row in part]
    else:
        ids = pick(rng, t, k, pool, False)
        ids.ravel()[rng.choice(t * k, c, replace=False)] = x
    if cell.last == "hit" and not (ids == e - 1).any():
        free = np.flatnonzero(ids.ravel() != x)
        ids.ravel()[free[int(rng.integers(0, len(free)))]] = e - 1
    return ids, emap
