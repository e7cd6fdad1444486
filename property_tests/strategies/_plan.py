"""The buckets of ``problems()``: static signatures chosen so that the pairs of relations of the covering
design they can hold are held (``plan``), the plainest kept as shrink targets."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

from property_tests.strategies._static import Config, Static, walked_buckets
from property_tests.strategies.design import pairs_of, static_levels, static_rows

__all__ = ["HELD", "PLAIN_KEPT", "buckets", "plan"]

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
    first = {f: cfg.rules.layouts_of(f)[0] for f in cfg.families}
    walked = walked_buckets(dataclasses.replace(cfg, max_buckets=max(cfg.max_buckets, 8)))
    plain = sorted((s for s in walked if s.layout == first[s.family] and s.shards == 1 and not s.existing
                    and not s.batch), key=Static.cost)
    most = [s for s in plain if s.groups == max(cfg.group_counts)][:1]
    return list(dict.fromkeys(plain[:PLAIN_KEPT] + most))[:cfg.max_buckets]
