"""The main job survives kernels that crash or hang, and gives the same verdict every run.

A kernel that kills its process (SIGSEGV) or hangs past ``--timeout`` is a
failure naming the last problem it was given; the other kernels of the run are
still checked. ``check_kernel`` outside pytest is derandomized (the same
examples every run) and names the profile or seed it ran under.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import gmm_ref
from gmm_kernels import Status
from property_tests.checking import check_kernel

ROOT = Path(__file__).resolve().parents[2]
KERNELS = textwrap.dedent('''
    import os, time
    import numpy as np
    import gmm_ref

    def _right(lhs, rhs, group_sizes, preferred_element_type):
        return gmm_ref.ragged_dot(np.asarray(lhs), np.asarray(rhs), np.asarray(group_sizes),
                                  preferred_element_type=preferred_element_type)

    def good(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        return _right(lhs, rhs, group_sizes, preferred_element_type)

    def segv(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        if group_sizes.shape[0] > 2:
            os.kill(os.getpid(), 11)
        return _right(lhs, rhs, group_sizes, preferred_element_type)

    def hang(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        if group_sizes.shape[0] > 2:
            time.sleep(3600)
        return _right(lhs, rhs, group_sizes, preferred_element_type)
''')


def _main_job(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    (tmp_path / "crashy.py").write_text(KERNELS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "property_tests.main", "check", "--convention", "ragged_dot",
                           "--no-goldens", "--max-examples", "4", *argv], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env=env)


@pytest.mark.parametrize(("kernel", "what", "jobs"), [
    ("crashy:segv", "crashed: the process was killed by SIGSEGV", "1"),
    ("crashy:hang", "timed out after 10 s", "2"),  # the good kernel checked beside it, in a lane of its own
])
def test_a_crashing_or_hanging_kernel_is_a_failure_and_the_run_goes_on(tmp_path, kernel, what, jobs):
    # 10 s: room for a loaded CI machine, where the good kernel's first cell may take several seconds
    proc = _main_job(tmp_path, "--kernel", kernel, "--kernel", "crashy:good", "--timeout", "10", "--jobs", jobs)
    out = proc.stdout
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("crashy:")]
    assert rows == [kernel, "crashy:good"], out  # the table keeps the kernels' order, whichever lane ended first
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"FAIL: {what}; the last problem it was given: ragged_m convention=ragged_dot" in out
    assert "group_sizes=[" in out.split(what)[1].splitlines()[0]
    assert f"n/a: not run: {kernel} crashed or hung in 2 cells already" in out
    good = next(line for line in out.splitlines() if line.startswith("crashy:good"))
    assert "pass (4; 2/" in good and "FAIL" not in good  # the next kernel was still checked (4 examples: 2 cells)


def _np_ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    return gmm_ref.ragged_dot(np.asarray(lhs), np.asarray(rhs), np.asarray(group_sizes),
                              preferred_element_type=preferred_element_type)


def test_check_kernel_gives_the_same_verdict_every_run_and_names_it():
    runs = [check_kernel(_np_ragged_dot, convention="ragged_dot", modes=["exact", "normal"], max_examples=10)
            for _ in range(2)]
    assert [(r.status, r.examples) for r in runs[0]] == [(r.status, r.examples) for r in runs[1]]
    assert all(r.setting == "gmm-ci profile (derandomized, 10 examples)" for r in runs[0])
    seeded = check_kernel(_np_ragged_dot, convention="ragged_dot", modes=["exact"], max_examples=10, seed=1234)
    assert seeded.results[0].status is Status.PASSED and seeded.results[0].setting == "seed=1234 (10 examples)"
