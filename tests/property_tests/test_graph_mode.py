"""The ``graph`` mode: one shape, several group-size vectors checked in turn on the same kernel.

A kernel that keeps the group sizes of its first call (a launch plan cached by shape or by its operands, a
CUDA graph captured once and replayed) is right on every first call, so the modes of one call per problem
pass it; the graph mode fails it and says which call used stale group sizes.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest
from hypothesis import given, settings

import gmm_ref
from gmm_kernels import Status, resolve_kernel
from property_tests.checks import failures
from property_tests.checks.check import check_example, check_mode
from property_tests.checks.modes import ALL_MODES, MODES, Mode
from property_tests.strategies.problems import covering, replay_refusal, replays
from tests.corpus import broken_kernels as bk

pytest.importorskip("jax")


def _kernel(fn, convention="ragged_dot"):
    return resolve_kernel(fn, convention=convention, option="kernel")


@pytest.fixture(autouse=True)
def _no_plans_kept():
    bk._PLANS.clear()  # each check starts as a fresh process would
    yield
    bk._PLANS.clear()


def test_the_graph_mode_is_one_object_with_its_replays():
    assert [m for m, mode in ALL_MODES.items() if mode.replays > 1] == ["graph"]
    assert MODES["graph"].replays == 4
    assert not MODES["graph"].changes_shapes  # the exact mode's compiled shapes serve it


def test_the_field_checks_it_not_the_name():
    twice = Mode("twice", "exact values, two group-size vectors per shape", {"values": "exact"}, replays=2)
    result = check_mode(_kernel(bk.ragged_dot_replays_last_plan), twice, profile="gmm-ci")
    assert result.status is Status.FAILED and "stale group sizes" in result.detail, result.detail
    once = Mode("graph", "the name alone, one call per problem", {"values": "exact"})
    assert check_mode(_kernel(bk.ragged_dot_replays_last_plan), once, profile="gmm-ci").status is Status.PASSED


def test_the_strategy_draws_one_shape_and_several_group_sizes():
    cov = covering(convention="ragged_dot", values="exact")
    seen = []

    @settings(max_examples=20, database=None, deadline=None)
    @given(problems=replays(cov, cov.cells[-1], 4))
    def prop(problems):
        first = problems[0]
        assert len(problems) == 4
        for p in problems[1:]:
            # the same operands and shapes: only the sizes change
            assert np.array_equal(p.lhs, first.lhs) and np.array_equal(p.rhs, first.rhs)
            assert p.group_sizes.shape == first.group_sizes.shape and p.out_dtype == first.out_dtype
            assert int(p.group_sizes.sum()) <= p.lhs.shape[0]
        seen.append(len({tuple(p.group_sizes.tolist()) for p in problems}))

    prop()
    assert max(seen) > 1  # new group sizes are drawn, not the first ones repeated


def test_the_graph_mode_fails_a_kernel_that_keeps_its_first_group_sizes():
    result = check_mode(_kernel(bk.ragged_dot_replays_last_plan), "graph", profile="gmm-ci")
    assert result.status is Status.FAILED, result.detail
    m = re.search(r"^call (\d) \(draw (\d)\) of one shape in the same buffers: (group \d+|tail) .* \[group "
                  r"sizes (\[[^]]*\]); the first call's (\[[^]]*\]) passed: stale group sizes or contents of an "
                  r"earlier call \(a plan kept by shape, a result kept by the buffers' addresses, a replayed "
                  r"graph\)\?\]$", result.detail)
    assert m is not None, result.detail
    assert int(m[1]) == int(m[2]) + 1 >= 2 and m[4] != m[5]
    notes = "\n".join(result.error.__notes__)
    assert re.search(r"Call \d \(draw \d\) of one shape, in the same buffers with new contents, on the same "
                     r"kernel: the calls before it passed with group sizes .*; this one, with \[.*\], failed: stale "
                     r"group sizes", notes), notes
    assert "for j, sizes in enumerate([" in notes and "problem.replace(group_sizes=" in notes  # the calls before


def test_the_reproducer_of_a_stale_call_raises_the_report(tmp_path):
    result = check_mode(_kernel(bk.ragged_dot_replays_last_plan), "graph", profile="gmm-ci")
    script = next(n for n in result.error.__notes__ if "```python" in n).split("```python")[1].split("```")[0]
    bk._PLANS.clear()  # a fresh process: only the script's own calls
    with pytest.raises(AssertionError, match="group"):
        exec(compile(script, str(tmp_path / "repro.py"), "exec"), {"__name__": "__main__"})
    alone = re.sub(r"    for j, sizes in .*\n        kernel\.run\(.*\n", "", script)  # the failing call alone
    assert alone != script
    bk._PLANS.clear()
    exec(compile(alone, str(tmp_path / "alone.py"), "exec"), {"__name__": "__main__"})


@pytest.mark.parametrize("mode", ["exact", "normal", "poisoned"])
def test_one_call_per_problem_does_not_catch_it(mode):
    """Why the mode exists: consecutive problems bring new operands, so every call is a first call."""
    result = check_mode(_kernel(bk.ragged_dot_replays_last_plan), mode, profile="gmm-ci")
    assert result.status is Status.PASSED, result.detail


def test_the_graph_mode_fails_a_plan_cached_by_shape():
    result = check_mode(_kernel(bk.ragged_dot_plan_cached_by_shape), "graph", profile="gmm-ci")
    assert result.status is Status.FAILED and "stale group sizes" in result.detail, result.detail


@pytest.mark.parametrize("kernel", [bk.ragged_dot_correct, "jax.ragged_dot"])
def test_correct_kernels_pass(kernel):
    adapter = _kernel(kernel) if callable(kernel) else resolve_kernel(kernel, option="kernel")
    result = check_mode(adapter, "graph", profile="gmm-ci")
    assert result.status is Status.PASSED and result.examples > 0, result.detail


def test_a_family_without_group_sizes_is_not_applicable():
    result = check_mode(_kernel(bk.ragged_dot_correct), "graph", family="batch", profile="gmm-ci")
    assert result.status is Status.UNSUPPORTED
    assert result.detail == "the batch family has no group sizes (every group is one whole matrix)"


def test_a_first_call_names_nothing_before_it():
    assert failures.replayed(()) == {}
    assert failures.replayed(([1, 2],)) == {"before": ([1, 2],)}


def test_quantized_operands_are_not_replayed():
    """Their block scales follow the group sizes: a convention of scaled operands only is n/a; one of scaled
    and unscaled operands (a serving layout) replays its unscaled problems and declines the scaled ones."""
    only = check_mode(_kernel(bk.CORRECT["qwix.ragged_dot"], "qwix.ragged_dot"), "graph", profile="gmm-ci")
    assert only.status is Status.UNSUPPORTED
    assert only.detail == ("qwix.ragged_dot takes quantized operands only: their block scales follow the group "
                           "sizes, so other sizes need other operands")
    cov = covering(convention="deep_gemm.m_grouped_masked", values="exact")
    scaled = [c for c in cov.cells if c.cell.static.in_dtype.itemsize == 1]
    assert scaled, "the serving layout draws scaled problems"

    @settings(max_examples=3, database=None, deadline=None)
    @given(problems=replays(cov, scaled[0], 4))
    def prop(problems):
        assert len(problems) == 1 and problems[0].scaled
        assert replay_refusal(problems[0]).startswith("quantized operands")

    prop()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed: the serving layout's correct twin is a torch function")
def test_a_serving_layout_replays_its_unscaled_problems():
    mixed = check_mode(_kernel(bk.CORRECT["deep_gemm.m_grouped_masked"], "deep_gemm.m_grouped_masked"), "graph",
                       profile="gmm-ci", max_examples=6)
    assert mixed.status is Status.PASSED and mixed.examples > 0, mixed.detail


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed: the cheating kernels are torch.grouped_mm kernels")
def test_the_reproducer_of_a_result_kept_by_address_raises_the_report(tmp_path):
    """The graph mode's calls reuse the first call's buffers; so do the reproducer's (``recycling``). One example
    of fixed calls, not a search: the kernel keeps results across examples too, where an allocator handing an
    address out again decides which call fails first."""
    from tests.corpus import cheating_kernels as ck

    rng = np.random.default_rng(0)
    lhs, rhs = rng.standard_normal((12, 8)).astype(np.float32), rng.standard_normal((3, 8, 4)).astype(np.float32)
    calls = tuple(gmm_ref.Problem("ragged_m", lhs, rhs, np.array(sizes, np.int32), out_dtype=np.float32)
                  for sizes in ([4, 4, 4], [2, 7, 3], [12, 0, 0], [0, 5, 6]))
    adapter = resolve_kernel(ck.cached_by_address, convention="torch.grouped_mm")
    ck.forget_kept_results()  # a fresh process: its first call keeps nothing stale
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_example(adapter, MODES["graph"], calls)
    failures.finish(info.value, adapter, "graph")
    assert "Call 2 (draw 1) of one shape, in the same buffers" in "\n".join(info.value.__notes__)
    script = next(n for n in info.value.__notes__ if "```python" in n).split("```python")[1].split("```")[0]
    assert "with recycling():" in script
    ck.forget_kept_results()
    with pytest.raises(AssertionError, match="group"):
        exec(compile(script, str(tmp_path / "repro.py"), "exec"), {"__name__": "__main__"})
    ck.forget_kept_results()
    alone = script.replace("with recycling():", "if True:")  # fresh buffers each call: nothing kept shows
    exec(compile(alone, str(tmp_path / "alone.py"), "exec"), {"__name__": "__main__"})
