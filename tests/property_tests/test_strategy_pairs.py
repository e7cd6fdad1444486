"""The public strategy reaches the pairs of relations its plan holds.

A downstream repository draws ``@given(gst.problems(convention=C))`` under the ``gmm-ci`` profile. Its
static signatures (buckets) are chosen from the covering design's static pass (``design.static_rows``)
so that together they hold as many pairs of static relations as ``max_buckets`` allows
(``_static.plan``): every pair of that plan must be drawn, a transposed square rhs among them. No
kernel is called: the relations are observed on the drawn problems, as ``gmm-harness coverage`` does.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from gmm_ref import conventions
from property_tests import strategies as gst
from property_tests.checks.profiles import profile
from property_tests.strategies._static import walked_buckets
from property_tests.strategies.design import observe, pairs_of, static_levels, static_rows
from property_tests.strategies.problems import _drawer, plan


def _describe(pairs) -> list[str]:
    return sorted(f"{fam}: " + " & ".join(f"{f}={v}" for f, v in sorted(p)) for fam, p in pairs)


def _downstream_draws(convention: str, **kwargs) -> set:
    """The (family, pair) of relations a downstream ``@given(gst.problems(...))`` test draws under gmm-ci."""
    cfg = _drawer(convention=convention, **kwargs).config(None)
    reached: set = set()

    @settings(profile("gmm-ci"), database=None)
    @given(gst.problems(convention=convention, **kwargs))
    def test_my_kernel(problem):  # as a downstream test names it
        reached.update((problem.family, p) for p in pairs_of(observe(problem, cfg)))

    test_my_kernel()
    return reached


@pytest.mark.parametrize("convention", conventions.names())
def test_a_downstream_test_under_the_ci_profile_draws_every_pair_of_the_plan(convention):
    cfg = _drawer(convention=convention).config(None)
    _, wanted = plan(cfg)
    assert wanted, f"{convention}: an empty plan"
    missing = wanted - _downstream_draws(convention)
    assert not missing, (f"{convention}: gst.problems drew {len(wanted) - len(missing)}/{len(wanted)} pairs of its "
                         f"plan; never drawn:\n  " + "\n  ".join(_describe(missing)))


def test_a_transposed_square_rhs_is_drawn_alone_and_with_every_static_relation_bugs_hid_behind():
    # the pairs the walked buckets never drew: their K and N came from lists walked with phases one apart,
    # so K == N only in the plain buckets (no transposed rhs, no shards, no existing output)
    reached = _downstream_draws("megablox.gmm")
    named = {frozenset({("layout", "rhsT"), ("k_eq_n", "yes")}), frozenset({("k_eq_n", "yes"), ("sharded", "yes")}),
             frozenset({("k_eq_n", "yes"), ("existing", "yes")}), frozenset({("k", "unaligned"), ("k_eq_n", "yes")})}
    assert not {("ragged_m", p) for p in named} - reached, _describe({("ragged_m", p) for p in named} - reached)


def test_the_buckets_hold_more_of_the_design_than_the_walked_ones_and_keep_plain_shrink_targets():
    now = before = 0
    for convention in ("megablox.gmm", "ragged_dot", "torch.grouped_mm", "deep_gemm.m_grouped_masked"):
        cfg = _drawer(convention=convention).config(None)
        chosen, planned = plan(cfg)
        wanted = {(f, p) for f in cfg.families for _, ps in static_rows(cfg, f, cfg.rules.full_sums is False)
                  for p in ps}

        def held(signatures, cfg=cfg, wanted=wanted):
            return {(s.family, p) for s in signatures for p in pairs_of(static_levels(s, cfg))} & wanted

        assert len(chosen) <= cfg.max_buckets and planned <= held(chosen)
        now, before = now + len(held(chosen)), before + len(held(walked_buckets(cfg)))
        # the simplest bucket first: the fewest groups, the smallest extents, plain
        first = chosen[0]
        assert first.groups == min(cfg.group_counts) and not first.existing and first.shards == 1, first
        assert first.layout == cfg.rules.layouts_of(first.family)[0], first
        assert first.mkn == min((s.mkn for s in walked_buckets(cfg)), key=sum), first
    assert now > before  # pairs held at least once (a convention of four families may hold a few less)


def test_few_buckets_keep_the_plain_ones_first():
    cfg = _drawer(convention="megablox.gmm", max_buckets=2).config(None)
    chosen, _ = plan(cfg)
    assert len(chosen) == 2 and all(s.shards == 1 and not s.existing and not any(s.layout) for s in chosen)
    assert [s.groups for s in chosen] == [1, 2]
    chosen, _ = plan(_drawer(convention="megablox.gmm", max_buckets=3).config(None))
    assert len(chosen) == 3 and [s.groups for s in chosen][:2] == [1, 2]


def test_given_shapes_keep_thewalked_buckets():
    cfg = _drawer(convention="ragged_dot", shapes=[(8, 8, 8), (16, 8, 24)]).config(None)
    assert plan(cfg) == (walked_buckets(cfg), frozenset())
