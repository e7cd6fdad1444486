"""A kernel cannot fool the check by writing to its inputs: caught in every path, named by argument.

The kernels below are right about their output but write to an input (before
or after computing), or donate it. Each path that runs kernels (check_kernel
and the plugin's modes, gradients, the main job's cells, the golden check and
regeneration) must fail them, naming the argument.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

import gmm_ref
from gmm_kernels import Scope, Status, wrap
from golden import check_goldens, regenerate
from golden.case import Case
from property_tests.checks.check import check_kernel
from property_tests.cli.cells import run_cell
from property_tests.cli.request import WorkRequest
from property_tests.cli.table import TableCell

torch = pytest.importorskip("torch")
DATA = Path(__file__).resolve().parents[2] / "golden" / "data"
#: kernels built on torch._grouped_mm on CPU take no K = 0 or N = 0 (an upstream limitation, pytorch PR
#: 192497) and no float32 output from bfloat16 inputs
TORCH = Scope(zero_extents=("m",), dtypes=["float32->float32", "bfloat16->bfloat16", "float16->float16"])


def doubles_mat_a_first(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Broken: doubles mat_a in place, then computes correctly from it (the result is halved)."""
    mat_a.mul_(2)
    return torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype) / 2


def scratches_mat_b_after(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Broken: computes correctly, then uses mat_b as scratch space."""
    out = torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)
    mat_b.zero_()
    return out


def zeroes_offs_after(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Broken: differentiable and right, but clears offs once done."""
    out = torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)
    if offs is not None:
        offs.zero_()
    return out


def correct(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    return torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)


@pytest.mark.parametrize(("fn", "argument"), [(doubles_mat_a_first, "mat_a"), (scratches_mat_b_after, "mat_b")])
def test_check_kernel_fails_a_kernel_that_writes_to_its_input(fn, argument):
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(fn, convention="torch.grouped_mm", modes=["exact"], scope=TORCH)
    assert info.value.kind == "modified_input"
    assert "modified its input in place" in str(info.value) and f"  {argument}: " in str(info.value)


def test_the_gradient_path_fails_it_too():
    # torch's autograd sees the write first when offs is saved for backward; the harness otherwise
    with pytest.raises((gmm_ref.Mismatch, RuntimeError), match=r"modified (its input in place|by an inplace)"):
        check_kernel(zeroes_offs_after, convention="torch.grouped_mm", modes=["grad"], scope=TORCH)
    assert check_kernel(correct, convention="torch.grouped_mm", modes=["grad", "exact"], scope=TORCH).ok


def test_the_main_jobs_cell_fails_it():
    kernel = wrap(scratches_mat_b_after, "torch.grouped_mm", scope=TORCH)
    outcome = run_cell(kernel, TableCell(kernel.name, "ragged_m", "exact"), WorkRequest(max_examples=5))
    details = outcome.details
    assert outcome.status is Status.FAILED and "modified its input in place" in details[0] and "mat_b" in details[0]


def test_the_golden_check_and_regeneration_fail_it(tmp_path):
    results = check_goldens(wrap(doubles_mat_a_first, "torch.grouped_mm"), DATA)
    assert results and all(r.status is Status.FAILED and "modified its input in place" in r.detail for r in results)
    corpus = [Case("t", convention="torch.grouped_mm", family="ragged_m", m=8, k=4, n=4, group_sizes=[3, 5])]
    assert regenerate(corpus, tmp_path, stream=io.StringIO())[0] == 0
    rc, text = regenerate(corpus, tmp_path, kernel=wrap(scratches_mat_b_after, "torch.grouped_mm", name="scratch"),
                          stream=io.StringIO())
    assert rc == 1 and "modified its input in place" in text and "nothing written" in text


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")  # jax's, when shapes differ
def test_a_jax_kernel_that_donates_its_input_is_reported():
    jax = pytest.importorskip("jax")
    donating = jax.jit(lambda lhs, rhs, g: jax.lax.ragged_dot(lhs, rhs, g), donate_argnums=(0,))

    def fn(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        return donating(lhs, rhs, group_sizes)

    with pytest.raises(gmm_ref.Mismatch, match="donated its input lhs"):
        check_kernel(fn, convention="ragged_dot", modes=["exact"])


def test_a_problem_keeps_its_own_copy():
    lhs = np.ones((4, 2), np.float32)
    p = gmm_ref.Problem("ragged_m", lhs, np.ones((1, 2, 2), np.float32), np.array([4]))
    before = gmm_ref.reference(p).exact.copy()
    lhs[:] = 7  # the caller's array changes; the problem's does not
    np.testing.assert_array_equal(gmm_ref.reference(p).exact, before)
    assert not p.lhs.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        p.lhs[0, 0] = 1


def _exits(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    sys.exit(3)


def test_a_kernel_calling_sys_exit_fails_its_call_on_every_path():
    # the forward call, the gradient (jax.vjp traces the kernel outside KernelAdapter.invoke) and the operator probe
    # all go through one guard: a SystemExit is the call's KernelExit, never the end of the process checking it
    pytest.importorskip("jax")
    from gmm_kernels import KernelExit, resolve_kernel

    adapter = resolve_kernel(_exits, convention="ragged_dot")
    problem = gmm_ref.problem_from_arguments("ragged_dot", np.ones((4, 3), np.float32), np.ones((2, 3, 5), np.float32),
                                             np.array([1, 3], np.int32))
    with pytest.raises(KernelExit, match=r"SystemExit\(3\)"):
        adapter.run(problem)
    with pytest.raises(KernelExit, match=r"SystemExit\(3\)"):
        adapter.vjp(problem, np.ones((4, 5), np.float32))
