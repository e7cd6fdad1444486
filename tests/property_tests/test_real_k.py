"""The ``real_k`` mode (``property_tests.checks.real_k``): the K of real MoE layers, in every run.

A kernel that adds its partial sums in bfloat16 once K passes a few hundred passes every drawn mode (their K is at
most 64) and fails here; the float32-accumulating kernel passes at K = 7,168, so the bound stays tight there.
"""

from __future__ import annotations

import re

import pytest

from gmm_kernels import Status, get, resolve_kernel
from property_tests.checks import real_k
from property_tests.checks.check import check_kernel, check_mode
from property_tests.checks.modes import MODES
from tests.corpus.broken_kernels import grouped_mm_bf16_sums_past_256, grouped_mm_correct

pytest.importorskip("torch", reason="the kernels here are torch.grouped_mm kernels")


def test_the_cells_reach_real_depths():
    assert "real_k" in MODES and MODES["real_k"].cells
    adapter = get("torch.grouped_mm")
    ks = {c.k for c in real_k.cells(adapter)}
    assert {2048, 7168} <= ks and any(all(k % t for t in (2, 3, 16, 32, 64, 128)) for k in ks)
    problem = real_k.real_k_problem(adapter, real_k.RealKCell("ragged_m", 7168, 4))
    assert problem.lhs.shape[-1] == 7168 and problem.rhs.shape == (4, 7168, 32)
    many = real_k.real_k_problem(adapter, real_k.RealKCell("ragged_k", 2048, 129))
    assert many.group_sizes.shape == (129,) and int(many.group_sizes.sum()) == 2048


def test_a_bfloat16_accumulator_fails_and_float32_passes_at_k_7168():
    fn = resolve_kernel(grouped_mm_bf16_sums_past_256, convention="torch.grouped_mm")
    for mode in ("normal", "exact"):  # their K is too small to show it
        assert check_mode(fn, mode, profile="gmm-ci").status is Status.PASSED
    result = check_mode(fn, "real_k")
    assert result.status is Status.FAILED, result
    assert re.match(r"group \d+ \(rows \[", result.detail), result.detail
    assert "The real_k mode's cell ragged_m K=2,048" in "\n".join(result.error.__notes__)

    honest = check_mode(resolve_kernel(grouped_mm_correct, convention="torch.grouped_mm"), "real_k")
    assert honest.status is Status.PASSED and honest.examples == 16, honest


def test_a_kernel_run_interpreted_gets_one_deep_cell():
    adapter = get("megablox.gmm")
    assert adapter.interpreted() is not None
    assert [c.k for c in real_k.cells(adapter)] == [k for k, _ in real_k.INTERPRETED_DEPTHS] * len(adapter.families)


def test_the_default_run_checks_it_and_raises_naming_the_cell():
    from property_tests.checks.check import _modes

    assert "real_k" in _modes(None)
    with pytest.raises(AssertionError, match="real_k"):
        check_kernel(grouped_mm_bf16_sums_past_256, convention="torch.grouped_mm", modes=["real_k"])
