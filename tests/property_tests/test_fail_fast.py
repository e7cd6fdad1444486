"""Failing fast: the modes most likely to fail run first, a failure is printed as soon as it is found, and
``-x`` / ``--fail-fast`` stops a kernel's run at its first failing mode (the CLI and the plugin alike)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gmm_kernels import Status
from property_tests.checks.engine import RUN_ORDER, run_checks
from property_tests.checks.modes import MODES
from property_tests.cli.cells import CELL_OUTCOMES
from property_tests.cli.shards import TableCell
from property_tests.cli.table import CellOutcome, Table, not_run, render, run_order

BROKEN = "tests.corpus.broken_kernels:ragged_dot_tail_not_zeroed"  # wrong in exact, normal and poisoned
ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "property_tests.cli.main", "check", "--no-goldens", *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=dict(os.environ), check=False)


def _cells(out: str, kernel: str) -> dict[str, str]:
    """The table's cells of ``kernel``'s row, by column."""
    head = next(line for line in out.splitlines() if line.startswith("kernel "))
    row = next(line for line in out.splitlines() if line.startswith(kernel + " "))
    return dict(zip([c.strip() for c in head.split("|")], [c.strip() for c in row.split("|")], strict=True))


def test_the_run_order_names_every_mode_once_and_leaves_the_table_order_alone():
    assert sorted(RUN_ORDER) == sorted(MODES)
    cells = [TableCell("k", f, m) for f in ("ragged_m", "ragged_k") for m in MODES] + [TableCell("k", None, "goldens")]
    ordered = run_order(cells)
    assert [c.column for c in ordered[::2][:-1]] == list(RUN_ORDER) and ordered[-1].column == "goldens"
    assert [c.family for c in ordered[:2]] == ["ragged_m", "ragged_k"]  # within a mode, the families as given
    table = Table()
    table.plan(cells)
    for cell in ordered:
        table.add(cell, CellOutcome(Status.PASSED, examples=1))
    head = render(table.as_rows(), list(MODES)).splitlines()[0]
    assert [c.strip() for c in head.split("|")][2:] == list(MODES)  # the columns keep the order of MODES


def test_the_run_policy_stops_at_the_first_failure_under_fail_fast():
    cells = [TableCell("k", "ragged_m", m) for m in ("exact", "normal", "wide")]
    ran = []

    def run(cell, seed):
        ran.append(cell.column)
        return CellOutcome(Status.FAILED if cell.column == "normal" else Status.PASSED, "group 1: 3 wrong")

    every = [(c.column, o.status) for c, o, _ in run_checks(cells, run, CELL_OUTCOMES)]
    assert ran == ["exact", "normal", "wide"] and every[2] == ("wide", Status.PASSED)
    ran.clear()
    fast = list(run_checks(cells, run, CELL_OUTCOMES, left_out=lambda c, failure: not_run(failure), deadline=1e18))
    assert ran == ["exact", "normal"]  # and no round of the budget after the failure (the deadline is far)
    assert fast[2][1].status is Status.UNSUPPORTED
    assert fast[2][1].note == "not run: --fail-fast stopped at the kernel's first failure (k / ragged_m / normal)"


def test_a_crashed_cell_is_the_first_failure_under_fail_fast(tmp_path, monkeypatch, capsys):
    from property_tests.cli.request import WorkRequest
    from property_tests.cli.supervisor import Supervisor

    (tmp_path / "exits.py").write_text("import sys\nsys.exit(0)\n")  # a worker that dies before its first cell
    monkeypatch.setattr(Supervisor, "COMMAND", (sys.executable, str(tmp_path / "exits.py")))
    cells = [TableCell("k", "ragged_m", m) for m in ("exact", "normal", "wide")]
    texts = {}
    for fail_fast in (False, True):
        table = Table()
        table.plan(cells)
        Supervisor(WorkRequest(kernels=("k",), fail_fast=fail_fast), table, timeout=600, verbose=False).run(cells)
        texts[fail_fast] = [table.get(c).text for c in cells]
    crashed = "FAIL: crashed: the process exited with status 0"
    assert texts[False] == [crashed, crashed, "n/a: not run: k crashed or hung in 2 cells already (see their notes)"]
    assert texts[True] == [crashed] + ["n/a: not run: --fail-fast stopped at the kernel's first failure "
                                       "(k / ragged_m / exact)"] * 2
    printed = capsys.readouterr().err.splitlines()
    assert printed.count(f"gmm-harness: FAIL k / ragged_m / exact: {crashed[6:]}") == 2, printed  # once a run


def test_a_broken_kernel_fails_at_once_and_fail_fast_runs_no_other_mode():
    modes = "exact,normal,poisoned"
    order = [m for m in RUN_ORDER if m in modes.split(",")]
    proc = _cli("--kernel", BROKEN, "--convention", "ragged_dot", "--modes", modes, "-x")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = f"gmm-harness: FAIL {BROKEN} / ragged_m / {order[0]}: tail (past sum(group_sizes)): "
    assert proc.stderr.count("gmm-harness: FAIL") == 1 and first in proc.stderr, proc.stderr
    # the failing example was said when it was found, before it was shrunk (and the FAIL line, shrunk, after)
    found = f"gmm-harness: FOUND {BROKEN} / ragged_m / {order[0]} (shrinking it; the report follows): tail "
    assert proc.stderr.count("gmm-harness: FOUND") == 1 and proc.stderr.index(found) < proc.stderr.index(first), \
        proc.stderr
    cells = _cells(proc.stdout, BROKEN)
    assert cells[order[0]].startswith("FAIL") and cells[order[1]].startswith("n/a") and cells[order[2]] == cells[
        order[1]]
    assert "not run: --fail-fast stopped at the kernel's first failure" in proc.stdout
    assert "0 passed, 1 failed" in proc.stdout
    # without -x every mode runs, and each failure is printed as it is found (before the table, which the
    # main job prints once every cell is in)
    every = _cli("--kernel", BROKEN, "--convention", "ragged_dot", "--modes", modes)
    assert every.returncode == 1 and "0 passed, 3 failed" in every.stdout, every.stdout[-3000:]
    found = [line.split(" / ")[2].split(":")[0] for line in every.stderr.splitlines()
             if line.startswith("gmm-harness: FAIL")]
    assert found == order  # in the run order, not the table's


def test_a_correct_kernels_run_is_the_same_with_fail_fast():
    args = ("--kernel", "jax.ragged_dot", "--modes", "exact,normal,poisoned", "--max-examples", "8")
    plain, fast = _cli(*args), _cli(*args, "--fail-fast")
    assert plain.returncode == fast.returncode == 0, plain.stdout[-3000:] + fast.stdout[-3000:]
    assert _cells(plain.stdout, "jax.ragged_dot") == _cells(fast.stdout, "jax.ragged_dot")
    assert "gmm-harness: FAIL" not in plain.stderr + fast.stderr
    assert "gmm-harness: FOUND" not in plain.stderr + fast.stderr


def test_check_kernel_says_a_failing_example_when_it_is_found_once_a_check_before_shrinking(caplog):
    """The shrunk report comes when a check ends (seconds of shrinking later); the first failing example is a
    WARNING of the ``gmm_harness`` logger at once (stderr, unless the application configures logging), once per
    check (the shrinking's failing examples are not said again); a correct kernel's run says nothing."""
    import logging

    import pytest

    import gmm_ref
    from property_tests.checks.check import check_kernel
    from property_tests.checks.failures import CheckRun
    from tests.corpus.broken_kernels import ragged_dot_correct, ragged_dot_tail_not_zeroed

    with caplog.at_level(logging.WARNING, logger="gmm_harness"), pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(ragged_dot_tail_not_zeroed, convention="ragged_dot", modes=["normal"], max_examples=10)
    said = [r.getMessage() for r in caplog.records if r.name == "gmm_harness"]
    assert len(said) == 1 and said[0].startswith("gmm-harness: FOUND tests.corpus.broken_kernels:"
                                                 "ragged_dot_tail_not_zeroed / ragged_m / normal (shrinking it; "
                                                 "the report follows): tail (past sum(group_sizes))"), said
    assert "tail (past sum(group_sizes))" in str(info.value)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gmm_harness"):
        check_kernel(ragged_dot_correct, convention="ragged_dot", modes=["normal"], max_examples=10)
    assert not [r for r in caplog.records if r.name == "gmm_harness"]
    # a mode the kernel declares a known upstream bug in: its verdict is the known bug, nothing is announced
    from gmm_kernels import Status, get

    with caplog.at_level(logging.WARNING, logger="gmm_harness"):
        known = check_kernel("jax.ragged_dot", modes=["poisoned"], max_examples=10, raise_on_failure=False)
    (result,) = list(known)
    assert result.status is Status.KNOWN_BUG and get("jax.ragged_dot").known_issue("poisoned"), result.detail
    assert not [r for r in caplog.records if r.name == "gmm_harness"]
    # an announcement that raises changes no verdict
    run = CheckRun(announce=lambda *a: 1 / 0)
    from gmm_kernels import wrap

    run.found(wrap(ragged_dot_correct, "ragged_dot"), "normal", "normal", ValueError("x"))


def test_the_plugin_prints_the_failure_at_once_and_honours_x(tmp_path):
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--pyargs",
           "property_tests", f"--gmm-kernel={BROKEN}", "--gmm-convention=ragged_dot", "-k", "reference"]
    fast = subprocess.run([*run, "-x"], capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert fast.returncode == 1, fast.stdout[-3000:] + fast.stderr[-3000:]
    assert f"gmm-harness: FAIL {BROKEN} / {RUN_ORDER[0]}: tail (past sum(group_sizes)): " in fast.stderr, fast.stderr
    # said when found, before shrinking (not captured: on the terminal while the test runs)
    assert f"gmm-harness: FOUND {BROKEN} / ragged_m / {RUN_ORDER[0]} (shrinking it" in fast.stderr, fast.stderr
    assert "1 failed" in fast.stdout and "stopping after 1 failures" in fast.stdout  # the first mode run
    listed = subprocess.run([*run, "--collect-only"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            check=False)
    modes = [line.split("-")[-1].rstrip("]") for line in listed.stdout.splitlines() if "reference[" in line]
    assert modes == list(RUN_ORDER), listed.stdout[-3000:]
    assert "tests/test_" not in listed.stdout  # the kernel checks, and none of the harness's own test modules
