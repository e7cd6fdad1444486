"""The ``scale`` mode (``property_tests.checks.scale``): group counts and rows past the limits kernels hard-code.

Each kernel of ``BROKEN_AT_SCALE`` carries a bug that shows only there (rows past a grid axis of 65,535 blocks,
in the call or in one group; an expert scan of 512; a weight table of 128): the scale mode rejects it naming
the group and the row, and the default modes without it pass it, which is why the mode is in the default run.
"""

from __future__ import annotations

import numpy as np
import pytest

import gmm_ref
from gmm_kernels import Status, resolve_kernel
from property_tests.checks import scale
from property_tests.checks.check import check_kernel, check_mode, coverage
from property_tests.checks.modes import MODES
from tests.corpus import broken_kernels as bk
from tests.corpus import broken_scale as bs

pytest.importorskip("jax")

#: kernel -> (the group its report names first, the first wrong row)
EXPECTED = {
    bs.ragged_dot_grid_rows_capped: ("group 1", bs.GRID_AXIS_LIMIT),  # the rows cell: sizes [40, 65,600, 24]
    bs.ragged_dot_group_grid_rows_capped: ("group 1", 40 + bs.GRID_AXIS_LIMIT),
    bs.ragged_dot_expert_scan_of_512: ("group 512", None),
    bs.ragged_dot_weight_table_of_128: ("group 128", None),
}
CASES = [pytest.param(fn, id=fn.__name__) for fn in bs.BROKEN_AT_SCALE["ragged_dot"]]


def _kernel(fn):
    return resolve_kernel(fn, convention="ragged_dot", option="kernel")


def test_every_scale_kernel_has_its_expectation():
    assert set(EXPECTED) == set(bs.BROKEN_AT_SCALE["ragged_dot"])


def test_the_correct_kernel_passes_every_cell():
    result = check_mode(_kernel(bk.ragged_dot_correct), "scale")
    assert result.status is Status.PASSED, result.detail
    n = len(scale.GROUP_COUNTS) + 1  # ragged_dot: ragged M only, no sharding
    assert result.examples == n and result.cells == (n, n) and result.detail == ""


@pytest.mark.parametrize("fn", CASES)
def test_the_scale_mode_rejects_it_naming_the_group_and_row(fn):
    result = check_mode(_kernel(fn), "scale")
    assert result.status is Status.FAILED, result
    group, row = EXPECTED[fn]
    assert result.detail.startswith(group + " "), result.detail
    err = result.error
    assert isinstance(err, gmm_ref.Mismatch)
    report = str(err)
    assert f"Wrong groups:\n  {group} " in report
    if row is not None:  # the first mismatch is the first row past the grid's 65,535 blocks
        first = report.split("First mismatches")[1].splitlines()[1].strip()
        assert first.startswith(f"[{row}, "), first
    notes = "\n".join(getattr(err, "__notes__", []))
    assert "Problem(" in notes or "load_problem" in notes, "the failure carries a reproducer"


@pytest.mark.parametrize("fn", CASES)
def test_the_drawn_modes_miss_it(fn):
    """Only cells built past the limits show these bugs: the scale mode's (and the real_k mode's 129 groups)."""
    report = check_kernel(fn, convention="ragged_dot", modes=[m for m in MODES if MODES[m].draws_examples],
                          profile="gmm-ci", raise_on_failure=False)
    assert report.ok and not report.failures, report


def test_a_kernel_with_declared_extent_limits_is_na_naming_them():
    adapter = resolve_kernel("jax.ragged_dot_mgpu", option="kernel")
    if adapter.available():
        pytest.skip(f"jax.ragged_dot_mgpu cannot run here: {adapter.available()}")
    result = check_mode(adapter, "scale")
    if adapter.interpreted() is None:  # a GPU: the convention's limits, every cell
        assert result.status is Status.PASSED
        return
    assert result.status is Status.UNSUPPORTED
    assert "takes none of the scale cells" in result.detail
    assert "takes extents up to 64 (declared)" in result.detail


def test_an_interpreted_kernel_gets_the_largest_group_count_and_says_what_it_left_out():
    class Interpreted(type(_kernel(bk.ragged_dot_correct))):
        def large_refusal(self):
            return self._runs_interpreted("a test's interpreter")

    adapter = _kernel(bk.ragged_dot_correct)
    adapter.__class__ = Interpreted
    assert adapter.interpreted() == "a test's interpreter"
    result = check_mode(adapter, "scale")
    assert result.status is Status.PASSED and result.cells == (1, len(scale.GROUP_COUNTS) + 1)
    assert result.detail.startswith("left out: ragged_m G=129, ")
    assert "ragged_m 65,600 rows in one group (" in result.detail and "a test's interpreter" in result.detail
    # the one it keeps still catches the scan of 512 and the table of 128
    for fn in (bs.ragged_dot_expert_scan_of_512, bs.ragged_dot_weight_table_of_128):
        broken = _kernel(fn)
        broken.__class__ = type("Interpreted", (type(broken),), {"large_refusal": Interpreted.large_refusal})
        assert check_mode(broken, "scale").status is Status.FAILED


def test_scaled_only_conventions_get_scaled_cells_of_exact_codes():
    """A convention of quantized operands only gets its cells scaled: codes of small integers, block scales of 1
    or 2 (exact products), K a multiple of the blocks; every scaled convention here takes the ragged_m cells."""
    for fn, convention in ((bk.qwix_correct, "qwix.ragged_dot"), (bk.scaled_mm_correct, "torch.scaled_grouped_mm"),
                           (bk.nvfp4_correct, "torchao.nvfp4_grouped_mm")):
        adapter = resolve_kernel(fn, convention=convention, option="kernel")
        for cell in scale.cells(adapter):
            p = scale.scale_problem(adapter, cell)
            if cell.family != "ragged_m" and isinstance(p, str):
                continue
            assert isinstance(p, gmm_ref.Problem) and p.scaled, (convention, cell, p)
            assert abs(p.lhs.astype(float)).max() <= 2 and abs(p.rhs.astype(float)).max() <= 2
            for scales in (p.lhs_scales, p.rhs_scales):
                assert set(np.unique(np.concatenate([np.ravel(s).astype(float) for s in scales]))) <= {1.0, 2.0}
            for q in (p.lhs_quant, p.rhs_quant):
                assert q.block[1] is None or p.k % q.block[1] == 0, (convention, q, p.k)


def test_a_scaled_kernel_with_a_scale_table_of_128_fails_the_scaled_cells_naming_the_group():
    pytest.importorskip("torch")
    (fn,) = bs.BROKEN_AT_SCALE_SCALED["torch.scaled_grouped_mm"]
    adapter = resolve_kernel(fn, convention="torch.scaled_grouped_mm", option="kernel")
    result = check_mode(adapter, "scale", family="ragged_m")
    assert result.status is Status.FAILED and result.detail.startswith(("group 128 ", "group 128:")), result.detail
    assert check_mode(adapter, "many_groups", family="ragged_m", profile="gmm-ci").status is Status.PASSED
    correct = resolve_kernel(bk.scaled_mm_correct, convention="torch.scaled_grouped_mm", option="kernel")
    assert check_mode(correct, "scale", family="ragged_m").status is Status.PASSED


def test_the_scale_mode_draws_nothing_to_cover():
    result = coverage(_kernel(bk.ragged_dot_correct), "scale")
    assert result.status is Status.UNSUPPORTED and "draws no examples" in result.detail


def test_cells_cross_the_limits_exactly():
    """Every group of a group-count cell past 128 (and 512) holds rows where it matters, and the rows cell puts
    more than 65,535 rows in one group and in the call."""
    adapter = _kernel(bk.ragged_dot_correct)
    for cell in scale.cells(adapter):
        p = scale.scale_problem(adapter, cell)
        assert isinstance(p, gmm_ref.Problem), p
        sizes = p.group_sizes
        if cell.kind == "groups":
            assert sizes.size == cell.groups and sizes[-1] > 0 and sizes[128] > 0
            assert p.k <= 32 and p.n <= 32
        elif cell.kind == "rows":
            assert sizes.max() > 65_535 and p.m > 65_535 and list(sizes[[0, 2]]) == [40, 24]
        assert p.lhs.dtype.kind in "fV" and abs(p.lhs.astype(float)).max() <= 2  # exact values


def test_the_table_says_which_cells_were_left_out():
    from property_tests.cli.table import CellOutcome, render

    note = "left out: ragged_m G=129 (k runs interpreted here (x))"
    passed = CellOutcome(Status.PASSED, note, examples=1, cells=(1, 2))
    text = render([{"kernel": "k", "family": "ragged_m", "scale": passed}], ["scale"])
    assert "pass (1; 1/2 cells) [1]" in text
    assert f"[1] pass (1; 1/2 cells): {note}" in text
    whole = CellOutcome(Status.PASSED, "", examples=7, cells=(7, 7))
    assert render([{"kernel": "k", "family": "ragged_m", "scale": whole}], ["scale"]).splitlines()[2].endswith(
        "pass (7)")


@pytest.mark.parametrize("family", ["ragged_m", "ragged_n", "ragged_k", "batch"])
def test_every_family_of_a_convention_catches_a_table_of_128(family):
    pytest.importorskip("torch")
    (fn,) = bs.BROKEN_AT_SCALE_TORCH["torch.grouped_mm"]
    adapter = resolve_kernel(fn, convention="torch.grouped_mm", option="kernel")
    result = check_mode(adapter, "scale", family=family)
    assert result.status is Status.FAILED, result
    assert result.detail.startswith(("group 128 ", "group 128:")), result.detail
    # the many groups mode (9 to 64 groups) does not reach the table's end
    assert check_mode(adapter, "many_groups", family=family, profile="gmm-ci").status is Status.PASSED
    correct = resolve_kernel(bk.grouped_mm_correct, convention="torch.grouped_mm", option="kernel")
    assert check_mode(correct, "scale", family=family).status is Status.PASSED


def test_a_scale_problem_rebuilds_from_the_lines_its_reproducer_prints():
    """A scale problem is too large to save beside a report: the reproducer rebuilds it from the lines the mode
    leaves on it (``gmm_ref.repro.problem_source``), which must run as printed, from a fresh namespace."""
    pytest.importorskip("jax")
    adapter = resolve_kernel("jax.ragged_dot")
    cell = next(c for c in scale.cells(adapter) if c.kind == "rows")
    problem = scale.scale_problem(adapter, cell, seed=3)
    imports, built = problem._built_by
    namespace: dict = {}
    exec("\n".join([*imports, f"problem = {built}"]), namespace)
    rebuilt = namespace["problem"]
    assert rebuilt.describe() == problem.describe()
    assert np.array_equal(rebuilt.group_sizes, problem.group_sizes) and np.array_equal(rebuilt.lhs, problem.lhs)
