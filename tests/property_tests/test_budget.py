"""The main job's time budget (``--budget SECONDS`` a kernel): rounds of new examples after the default run.

The default run (the ``gmm-ci`` profile's examples, which reach every pair of
relations) always runs in full; the budget only adds rounds, each under a seed
of its own, to the cells that passed, until the kernel's time is spent. A bug
too rare for the default examples is caught by the rounds, the table says how
many examples each cell ran, and a kernel that crashes in a round is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np

from gmm_kernels import Status, resolve_kernel
from property_tests.checks.engine import spend_rounds
from property_tests.checks.tiers import ROUND_SEED_STEP
from property_tests.cli.cells import CELL_OUTCOMES, run_cell
from property_tests.cli.request import WorkRequest
from property_tests.cli.table import CellOutcome, GoldenTally, TableCell
from tests.corpus import broken_kernels

ROOT = Path(__file__).resolve().parents[2]


def rarely_wrong(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Right except on about one input in a hundred (by a hash of lhs): too rare for the default examples."""
    out = np.array(broken_kernels.ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type))
    if out.size and zlib.crc32(np.asarray(lhs).tobytes()) % 97 == 5:
        out.flat[0] += 1
    return out


def test_rounds_catch_a_bug_the_default_examples_miss():
    kernel = resolve_kernel(rarely_wrong, convention="ragged_dot", name="rarely_wrong", option="kernel")
    cell = TableCell("rarely_wrong", "ragged_m", "exact")
    first = run_cell(kernel, cell, WorkRequest())
    assert first.text.startswith("pass"), "precondition: the default examples miss it (else this test proves nothing)"
    rounds = list(spend_rounds({cell: first}, lambda c, seed: run_cell(kernel, c, WorkRequest(), seed=seed),
                               CELL_OUTCOMES, deadline=time.time() + 300, first=0))
    *passes, (_, failed) = rounds
    assert all(o.text.startswith("pass (") and "rounds)" in o.text for _, o in passes)
    assert failed.text.startswith("FAIL: group ") and f"round {len(rounds) + 1}, seed " in failed.text
    assert failed.details and "wrong" in failed.details[0]  # the full report, with its reproducer


def test_rounds_add_examples_to_passed_cells_only_and_stop_at_the_deadline():
    # a clock of our own: each run takes one tick of it, so a deadline 20 ticks away is reached after exactly
    # 20 runs however busy the machine is (no assertion here depends on real time)
    clock = [1000]
    def passed(examples, seconds, coverage=""):
        return CellOutcome(Status.PASSED, examples=examples, seconds=seconds, coverage=coverage, extendable=True)

    done = {("k", "ragged_m", "exact"): passed(10, 1.0, "cov"),
            ("k", "ragged_m", "wide"): CellOutcome(Status.FAILED, "group 0", 3, 1.0, ("report",)),
            ("k", "ragged_m", "sharded"): CellOutcome(Status.UNSUPPORTED, "no group_offset"),
            ("k", None, "goldens"): CellOutcome(Status.PASSED, seconds=1.0, goldens=GoldenTally(9, passed=9)),
            ("k", "ragged_m", "grad"): passed(4, 1.0)}
    assert done[("k", None, "goldens")].text == "pass (9/9)" and done[("k", "ragged_m", "exact")].text == "pass (10)"
    calls = []

    def run(cell, seed):
        calls.append((cell[2], seed))
        if cell[2] == "grad" and len([c for c in calls if c[0] == "grad"]) == 2:
            return CellOutcome(Status.FAILED, "group 1 (rows [3, 5)): 2 wrong", 4, 0.5, ("grad report",))
        clock[0] += 1
        return passed(4, 0.5) if cell[2] == "grad" else passed(10, 0.5, "cov")

    out = list(spend_rounds(done, run, CELL_OUTCOMES, deadline=1020, first=7, clock=lambda: clock[0]))
    assert {c for c, _ in calls} == {"exact", "grad"}  # failed, n/a and golden cells get no rounds
    assert calls[:2] == [("exact", 7 + ROUND_SEED_STEP), ("grad", 7 + ROUND_SEED_STEP)]  # round 2's seed
    grad = [o for c, o in out if c[2] == "grad"]
    assert grad[0].text == "pass (8; 2 rounds)"
    assert grad[-1].text == (f"FAIL: group 1 (rows [3, 5)): 2 wrong (round 3, seed {7 + 2 * ROUND_SEED_STEP}, "
                             "after 8 examples passed)") and grad[-1].details == ("grad report",)
    exact = [o for c, o in out if c[2] == "exact"]
    assert len(exact) > 2 and exact[-1].text == f"pass ({10 * (len(exact) + 1)}; {len(exact) + 1} rounds)"
    assert exact[-1].seconds == 1.0 + 0.5 * len(exact)
    assert len(calls) == 21 and len(exact) == 19  # the deadline stopped it: 20 runs of a tick (and the failing one)
    late = spend_rounds(done, run, CELL_OUTCOMES, deadline=clock[0] - 1, first=0, clock=lambda: clock[0])
    assert list(late) == []  # no time left: nothing more


KERNELS = textwrap.dedent('''
    import os
    import numpy as np
    from tests.corpus.broken_kernels import ragged_dot_correct

    calls = 0

    def good(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        return ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)

    def crashes_later(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        global calls
        calls += 1
        if calls > int(os.environ["CRASH_AFTER"]):
            os.kill(os.getpid(), 11)
        return ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)
''')


def _main_job(tmp_path, *argv, env=None):
    (tmp_path / "budgeted.py").write_text(KERNELS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), **(env or {})}
    return subprocess.run([sys.executable, "-m", "property_tests.cli.main", "check", "--convention", "ragged_dot",
                           "--no-goldens", "--modes", "exact", *argv], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=env)


def test_the_main_job_spends_the_budget_and_a_crash_in_a_round_is_a_failure(tmp_path):
    first = _main_job(tmp_path, "--kernel", "budgeted:good", "--max-examples", "20")
    calls = int(first.stdout.split("pass (")[1].split(";")[0].split(")")[0]) * 2  # exact: each is run twice
    proc = _main_job(tmp_path, "--kernel", "budgeted:good", "--kernel", "budgeted:crashes_later", "--budget", "12",
                     "--max-examples", "20", "--jobs", "2", env={"CRASH_AFTER": str(calls + 5)})
    out = proc.stdout
    good = next(line for line in out.splitlines() if line.startswith("budgeted:good"))
    assert " rounds)" in good and "FAIL" not in good, out + proc.stderr
    crashed = next(line for line in out.splitlines() if line.startswith("budgeted:crashes_later"))
    assert "FAIL" in crashed, out
    first_round = [line for line in proc.stderr.splitlines() if "budgeted:crashes_later" in line]
    assert first_round and "pass (20;" in first_round[0], proc.stderr  # it crashed in a later round
    assert ("FAIL: crashed: the kernel's process was killed by SIGSEGV during the call; the last problem it was "
            "given: ragged_m") in out
    assert proc.returncode == 1 and "then rounds of new examples for 12 s a kernel" in out
