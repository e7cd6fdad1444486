"""Coverage you can see: the covering design's pairs of relations, reached by the CI profile.

``gmm-harness coverage`` draws what the checks draw (no kernel is called) and
lists every pair a convention can express that the ``gmm-ci`` profile never
reaches; there must be none. A truncated budget must say what it missed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gmm_kernels import FunctionAdapter, Status
from gmm_ref import conventions
from property_tests.checks.check import check_mode, coverage
from property_tests.checks.modes import MODES
from property_tests.strategies.design import design
from tests.corpus.broken_kernels import gmm_correct


def _never(*args, **kwargs):
    raise AssertionError("coverage must not call the kernel")


@pytest.mark.parametrize("convention", conventions.names())
def test_the_ci_profile_reaches_every_pair_a_convention_can_express(convention):
    target = FunctionAdapter(_never, convention)
    reached = 0
    for mode in MODES:
        r = coverage(target, mode, profile="gmm-ci")
        if r.status is Status.UNSUPPORTED:
            continue
        assert not r.missing, f"{convention} / {mode}: never reached {r.missing[:10]}"
        assert r.cells[0] == r.cells[1] and r.pairs[0] == r.pairs[1] > 0, r
        reached += r.pairs[0]
    assert reached > 0, f"{convention}: no mode drew anything"


def test_a_budget_below_two_examples_a_cell_says_which_pairs_it_missed():
    target = FunctionAdapter(_never, "megablox.gmm")
    r = coverage(target, "normal", max_examples=4)
    assert r.status is Status.FAILED and r.cells[0] == 2 < r.cells[1]
    assert r.missing and r.pairs[0] < r.pairs[1]
    assert "never reached" in r.coverage_report()


def test_the_relations_a_real_bug_hid_behind_are_drawn_in_every_sharded_run():
    # a kernel that ignores transpose_rhs when the weights are square passed a whole run once: the
    # sharded modes never drew K == N with a transposed rhs
    for mode in ("sharded", "sharded_existing"):
        r = coverage(FunctionAdapter(_never, "megablox.gmm"), mode, profile="gmm-ci")
        seen = dict(r.coverage)
        assert seen.get("layout=rhsT") and seen.get("k_eq_n=yes"), r.coverage
        assert not r.missing


def test_what_a_convention_cannot_express_is_listed_with_the_reason():
    from property_tests.checks.modes import mode_covering

    cov = mode_covering(FunctionAdapter(_never, "megablox.gmm"), "normal")
    reasons = dict(cov.designs["ragged_m"].inexpressible)
    assert "multiple of" in reasons["m=unaligned"] and "M = 0" in reasons["m=zero"]
    torch_cov = mode_covering(FunctionAdapter(_never, "torch.grouped_mm"), "normal")
    levels = {f.name: f.levels for f in torch_cov.designs["ragged_m"].factors}
    assert "bfloat16->float32" in levels["dtype"], "a user kernel is drawn every out_dtype the signature takes"
    assert set(levels["lhs_storage"]) == {"contiguous", "transposed", "slice", "chunk"}


def test_a_design_is_deterministic_and_its_cells_show_their_levels():
    cov = FunctionAdapter(_never, "ragged_dot")
    from property_tests.checks.modes import mode_covering

    a, b = mode_covering(cov, "normal"), mode_covering(cov, "normal")
    assert [c.cell for c in a.cells] == [c.cell for c in b.cells]
    design.cache_clear()
    c = mode_covering(cov, "normal")
    assert [x.cell for x in a.cells] == [x.cell for x in c.cells]


def test_check_mode_records_relations_and_pairs():
    r = check_mode(FunctionAdapter(gmm_correct, "megablox.gmm"), "sharded", profile="gmm-ci")
    assert r.status is Status.PASSED and r.pairs[0] == r.pairs[1] > 0 and not r.missing
    assert dict(r.coverage)["shard=last"] > 0
    assert r.examples >= 2 * r.cells[1]


def test_the_coverage_command_lists_pairs_and_exits_0_when_all_are_reached():
    done = subprocess.run([sys.executable, "-m", "property_tests.cli.main", "coverage", "--convention", "megablox.tgmm",
                           "--modes", "normal,sharded", "-v"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 never reached" in done.stdout and "cannot express" in done.stdout
    short = subprocess.run([sys.executable, "-m", "property_tests.cli.main", "coverage",
                            "--convention", "megablox.tgmm",
                            "--modes", "normal", "--max-examples", "3"], capture_output=True, text=True, timeout=600)
    assert short.returncode == 1 and "MISSING" in short.stdout, short.stdout + short.stderr
    bad = subprocess.run([sys.executable, "-m", "property_tests.cli.main", "coverage", "--convention", "bogus"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--convention" in bad.stderr
