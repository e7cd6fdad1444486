"""Tiers (``property_tests.checks.tiers``): gmm-quick runs every cell of every mode once, the cells most likely to fail
first, and rejects the corpus's broken kernels as gmm-ci does; gmm-ci is unchanged; gmm-nightly adds a time budget,
the large mode and an example database; the tier is taken by name (check_kernel, the CLI, the plugin) and shown.
Counts, not times: the tiers' costs are benchmarks/bench_tiers.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import zlib
from pathlib import Path

import numpy as np
import pytest

import gmm_ref
from gmm_kernels import Status, resolve_kernel
from property_tests.checks import cell_order, large
from property_tests.checks import check as checking
from property_tests.checks.check import check_kernel, check_mode
from property_tests.checks.engine import RUN_ORDER
from property_tests.checks.modes import MODES, mode_covering
from property_tests.checks.tiers import TIERS, budgets, tier_of
from tests.corpus.broken_kernels import (
    gmm_group_offset_ignored,
    grouped_mm_strides_ignored,
    ragged_dot_boundary_off_by_one,
    ragged_dot_correct,
    ragged_dot_group_table_of_eight,
    ragged_dot_nan_leak_masking,
    ragged_dot_tail_not_zeroed,
    tgmm_all_empty_uninitialized,
)

ROOT = Path(__file__).resolve().parents[2]
BROKEN = "tests.corpus.broken_kernels:ragged_dot_tail_not_zeroed"


def _recording(calls: list[tuple[int, int]]):
    """A correct ragged_dot that records (rows in groups, rows) of every problem it is given."""

    def kernel(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        calls.append((int(np.sum(np.asarray(group_sizes))), int(np.asarray(lhs).shape[0])))
        return ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)

    return kernel


def test_quick_runs_every_cell_of_every_mode_once_and_reaches_every_pair():
    report = check_kernel(ragged_dot_correct, convention="ragged_dot", tier="gmm-quick", raise_on_failure=False)
    adapter = resolve_kernel(ragged_dot_correct, convention="ragged_dot")
    assert report.tier == "gmm-quick" and report.ok and [r.check for r in report] == list(MODES)  # table order
    drawn = [r for r in report if r.status is Status.PASSED and MODES[r.check].draws_examples]
    assert len(drawn) >= 7, report  # exact, normal, wide, poisoned, all_empty, many_groups, out_dtype, graph
    for r in drawn:
        cells = len(mode_covering(adapter, r.check).cells)
        assert r.cells == (cells, cells) and r.examples == cells, r  # one example a cell, every cell
        assert r.pairs[0] == r.pairs[1] > 0 and not r.missing, r  # every pair of relations still reached
        assert r.setting == "gmm-quick profile (derandomized, 1 example a cell)"
    scale = report.by_check()["scale"]
    assert scale.status is Status.PASSED and scale.cells[0] == scale.cells[1] == scale.examples  # scale's cells, once
    (run, total), (reached, pairs) = report.reached()
    assert run == total and reached == pairs > 0


def test_quick_runs_the_highest_weighted_cells_first(monkeypatch):
    adapter = resolve_kernel(ragged_dot_correct, convention="ragged_dot")
    cells = [c.cell for c in mode_covering(adapter, "normal").cells]
    tails = sum(dict(c.levels).get("span") == "tail" for c in cells)  # cells whose examples end before M
    runs = {}
    for weight in (None, 100.0, -100.0):  # the design's order; the tail cells first; last
        calls: list[tuple[int, int]] = []
        monkeypatch.setattr(cell_order, "RELATION_WEIGHTS", {} if weight is None else {"span=tail": weight})
        result = check_mode(resolve_kernel(_recording(calls), convention="ragged_dot"), "normal", tier="gmm-quick")
        assert result.status is Status.PASSED and len(calls) == len(cells)  # one call a cell (normal: no repeat)
        runs[weight] = [rows < m for rows, m in calls]  # (other cells may draw a tail too)
    assert 0 < tails < len(cells) and not all(runs[None][:tails])  # else this proves nothing
    assert all(runs[100.0][:tails]) and all(runs[-100.0][-tails:])


def test_the_cell_order_scores_a_cell_by_its_relations(monkeypatch):
    adapter = resolve_kernel(ragged_dot_correct, convention="ragged_dot")
    cells = [c.cell for c in mode_covering(adapter, "exact").cells]
    monkeypatch.setattr(cell_order, "RELATION_WEIGHTS", {})
    assert cell_order.order(cells) == list(range(len(cells)))  # no weights: the design's order
    monkeypatch.setattr(cell_order, "RELATION_WEIGHTS", {"groups=more_than_tiles": 2.0, "span=full": -1.0})
    scores = [cell_order.score(cells[i]) for i in cell_order.order(cells)]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1]


CORPUS = [("ragged_dot", ragged_dot_boundary_off_by_one), ("ragged_dot", ragged_dot_tail_not_zeroed),
          ("ragged_dot", ragged_dot_nan_leak_masking), ("ragged_dot", ragged_dot_group_table_of_eight),
          ("megablox.gmm", gmm_group_offset_ignored), ("megablox.tgmm", tgmm_all_empty_uninitialized),
          ("torch.grouped_mm", grouped_mm_strides_ignored)]


def _named(exc: gmm_ref.Mismatch) -> str:
    """What a rejection names: the problem that raised, a shape, or where the output is wrong (a group or the
    tail), "?" for none of these."""
    message = str(exc)
    if exc.kind == "raised":
        return "raised" if "[on " in message and "group_sizes=[" in message.split("[on ")[1] else "?"
    if exc.kind == "shape":
        return "shape"
    wrong = message.split("Wrong groups:")[1] if "Wrong groups:" in message else ""
    return "where" if "group " in wrong or wrong.lstrip().startswith("tail") else "?"


@pytest.mark.parametrize(("convention", "fn"), [pytest.param(c, f, id=f.__name__) for c, f in CORPUS])
def test_a_broken_kernel_fails_under_quick_naming_what_it_names_under_ci(convention, fn):
    pytest.importorskip(gmm_ref.conventions.get(convention).framework)
    adapter = resolve_kernel(fn, convention=convention)
    # (a kernel that returns uninitialized memory fails on some calls only: INTERMITTENT, a failure too)
    ci = next(r for m in RUN_ORDER if (r := check_mode(adapter, m, tier="gmm-ci")).status.failure)
    quick = check_mode(adapter, ci.check, tier="gmm-quick")  # the mode gmm-ci fails first, under gmm-quick
    assert quick.status.failure, quick
    # the same form of report (the example differs: a poisoned tail may read NaN under one, wrong values under the
    # other, a NaN leaking from padding may reach a group or the tail)
    assert _named(quick.error) == _named(ci.error) != "?", (quick.error, ci.error)
    notes = "\n".join(quick.error.__notes__)
    assert "Problem(" in notes and "Checked under the gmm-quick profile (derandomized, 1 example a cell)" in notes
    with pytest.raises(gmm_ref.Mismatch):  # and a whole quick run rejects it
        check_kernel(fn, convention=convention, tier="gmm-quick")


def test_gmm_ci_is_the_profile_run_as_before_tiers():
    runs = []
    for how in ({"tier": "gmm-ci"}, {"profile": "gmm-ci"}, {}):  # the tier, the profile, check_kernel's default
        calls: list[tuple[int, int]] = []
        report = check_kernel(_recording(calls), convention="ragged_dot", modes=["exact", "normal"], **how)
        runs.append((calls, [(r.examples, r.cells, r.setting) for r in report]))
    (a, ra), (b, rb), (c, rc) = runs
    assert ra == rb == rc and a == b == c
    adapter = resolve_kernel(ragged_dot_correct, convention="ragged_dot")
    cells = len(mode_covering(adapter, "exact").cells)
    assert cells >= 25 and ra[0][:2] == (2 * cells, (cells, cells))  # 50 examples spread, at least 2 a cell
    assert ra[0][2] == "gmm-ci profile (derandomized, 50 examples)"
    assert budgets(None, "gmm-ci", None, cells) == [2] * cells and budgets(None, "gmm-ci", None, 10) == [5] * 10


def test_nightly_runs_the_large_mode_and_keeps_an_example_db(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("GMM_HARNESS_EXAMPLE_DB", raising=False)
    monkeypatch.setattr(large, "available_memory", lambda: 2**30)  # 1 GiB: the large problem does not fit
    report = check_kernel(ragged_dot_correct, convention="ragged_dot", tier="gmm-nightly", budget=1e-9,
                          raise_on_failure=False)  # (a budget spent before the first round ends: no rounds)
    by = report.by_check()
    assert report.tier == "gmm-nightly" and report.ok and list(by) == [*MODES, "large"]
    assert by["large"].status is Status.UNSUPPORTED and "GiB is available here" in by["large"].detail
    assert by["exact"].setting == "gmm-nightly tier, gmm-ci profile (derandomized, 50 examples)"
    assert (tmp_path / "cache" / "gmm-harness" / "examples").is_dir()  # the tier's database, where none was given


def test_a_budget_adds_rounds_of_new_examples_to_the_passed_modes(monkeypatch):
    # a clock of our own, one tick a reading: the rounds end after the same readings however busy the machine is
    clock = iter(range(10**9))
    monkeypatch.setattr(checking, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    seen: list[int] = []

    def kernel(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        seen.append(zlib.crc32(np.asarray(lhs).tobytes() + np.asarray(group_sizes).tobytes()))
        return ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)

    report = check_kernel(kernel, convention="ragged_dot", tier="gmm-nightly", modes=["normal", "grad"], budget=60,
                          raise_on_failure=False)
    normal, grad = report  # grad: n/a (a NumPy kernel), no rounds
    first = 2 * normal.cells[1]  # the first round: gmm-ci's, two examples a cell
    rounds = int(normal.detail.split()[0])
    assert normal.status is Status.PASSED and normal.detail == f"{rounds} rounds" and rounds >= 3, normal
    assert normal.examples == len(seen) == rounds * first  # every round's examples
    assert len(set(seen)) > 2 * first  # new ones: each round under a seed of its own
    assert grad.status is Status.UNSUPPORTED


def test_an_unknown_tier_is_an_error_naming_the_option_with_a_suggestion():
    with pytest.raises(ValueError, match=r"^tier: expected one of gmm-quick, .*got 'gmm-quik'; did you mean gmm-quick"):
        check_kernel(ragged_dot_correct, convention="ragged_dot", tier="gmm-quik")
    with pytest.raises(ValueError, match=r"^tier: gmm-quick runs under the gmm-quick profile; profile='gmm-dev'"):
        check_kernel(ragged_dot_correct, convention="ragged_dot", tier="gmm-quick", profile="gmm-dev")
    with pytest.raises(ValueError, match=r"^budget: expected a positive number"):
        check_kernel(ragged_dot_correct, convention="ragged_dot", budget=0)
    assert tier_of("gmm-nightly").opt_in and set(TIERS) >= {"gmm-quick", "gmm-ci", "gmm-nightly", "gmm-dev",
                                                            "gmm-thorough"}


def _cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "property_tests.cli.main", "check", *args], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, env=env, check=False)


def test_the_cli_takes_the_tier_and_says_what_it_reached(tmp_path):
    kernel = "tests.corpus.broken_kernels:ragged_dot_correct"
    proc = _cli("--kernel", kernel, "--convention", "ragged_dot", "--modes", "exact,poisoned", "--no-goldens",
                "--tier", "gmm-quick", "--json", "out.json", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    header = proc.stdout.split("\nkernel ")[0]
    assert "tier gmm-quick: 1 example a cell of every mode's covering design" in header
    doc = json.loads((tmp_path / "out.json").read_text())
    cells = sum(c["cells"][1] for c in doc["cells"])
    pairs = sum(c["pairs"][1] for c in doc["cells"])
    assert doc["tier"] == "gmm-quick" and doc["reached"] == {"cells": [cells, cells], "pairs": [pairs, pairs]}
    assert all(c["examples"] == c["cells"][1] for c in doc["cells"])  # one example a cell
    assert "2 passed, 0 failed" in proc.stdout and "tier gmm-quick, 1 example a cell, derandomized" in proc.stdout
    assert f"tier gmm-quick reached {cells} of {cells} cells of the covering designs and {pairs} of {pairs} pairs" \
        in proc.stdout
    ci = _cli("--kernel", kernel, "--convention", "ragged_dot", "--modes", "exact", "--no-goldens", "--json",
              "ci.json", tmp_path=tmp_path)
    assert ci.returncode == 0 and "tier gmm-ci: the gmm-ci profile's 50 examples a mode" in ci.stdout
    assert json.loads((tmp_path / "ci.json").read_text())["tier"] == "gmm-ci"


def test_an_unknown_tier_is_a_usage_error_of_the_cli_and_the_plugin(tmp_path):
    proc = _cli("--kernel", "jax.ragged_dot", "--tier", "gmm-quik", tmp_path=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: gmm-harness check"), proc.stderr
    assert "--tier: expected one of gmm-quick, gmm-ci, gmm-nightly, gmm-dev, gmm-thorough, got 'gmm-quik'; did you " \
           "mean gmm-quick?" in proc.stderr
    plugin = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
                             "property_tests", f"--gmm-kernel={BROKEN}", "--gmm-convention=ragged_dot",
                             "--gmm-tier=nightly"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            check=False)
    assert plugin.returncode == 4, plugin.stdout[-2000:] + plugin.stderr[-2000:]  # pytest's usage error
    assert "--gmm-tier: expected one of" in plugin.stderr and "did you mean gmm-nightly?" in plugin.stderr


def test_the_plugin_runs_the_tier_and_names_it(tmp_path):
    run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "--pyargs",  # (a header)
           "property_tests", f"--gmm-kernel={BROKEN}", "--gmm-convention=ragged_dot", "-k", "reference", "-x"]
    proc = subprocess.run([*run, "--gmm-tier=gmm-quick"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          check=False)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gmm tier gmm-quick: 1 example a cell" in proc.stdout  # the report header
    assert f"gmm-harness: FAIL {BROKEN} / {RUN_ORDER[0]}: tail (past sum(group_sizes))" in proc.stderr
    assert "gmm-quick profile (derandomized, 1 example a cell)" in proc.stdout
    listed = subprocess.run([*run, "--gmm-tier=gmm-nightly", "--collect-only"], capture_output=True, text=True,
                            timeout=600, cwd=tmp_path, check=False)
    modes = [line.split("-")[-1].rstrip("]>") for line in listed.stdout.splitlines() if "reference[" in line]
    assert modes == [*RUN_ORDER, "large"], listed.stdout[-3000:]  # the tier's opt-in mode, last
