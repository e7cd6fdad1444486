"""Guard regions (``gmm_kernels.sandbox.guards``): a read past an operand or a write past a buffer the harness allocated
is caught, in Triton's interpreter and on CPU alike, and named by buffer; a correct kernel stays silent.

The kernels below are broken on purpose: a Triton kernel (run in Triton's interpreter, as test_triton.py runs its
kernels) that loads mat_a's K tail unmasked and so reads past mat_a's end, one whose store drops the group's end and
writes past the output it allocates through the harness, and plain torch kernels that write (or read) past a
buffer through a raw pointer. On a GPU (or unguarded) the stray read finds whatever is there, times a zero: nothing
shows; the stray write lands in someone else's memory.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import gmm_ref
from gmm_kernels import Scope, Status, wrap
from gmm_kernels.sandbox import guards
from property_tests.checks.check import check_kernel
from property_tests.cli.cells import run_cell
from property_tests.cli.request import WorkRequest
from property_tests.cli.table import TableCell
from tests.corpus.broken_serving import batched_correct

torch = pytest.importorskip("torch")


# ------------------------------------------------------------------------------------------ the guarded buffers
def test_a_guarded_copy_is_a_view_into_a_larger_base_with_poisoned_margins():
    x = np.arange(24, dtype=np.float32).reshape(4, 6).astype(ml_dtypes.bfloat16)
    offs = np.array([3, 4], np.int32)
    codes = np.ones((4, 8), ml_dtypes.float8_e4m3fn)
    with guards.call("k") as call:
        gx, go, gc = call.copy("mat_a", x), call.copy("offs", offs), call.copy("lhs.qvalue", codes)
    for g, original in zip((gx, go, gc), (x, offs, codes), strict=True):
        assert np.array_equal(g.view(np.uint8), original.view(np.uint8)) and g.strides == original.strides
        assert isinstance(g.base, np.ndarray) and g.base.size > original.size  # plain NumPy views: a device copy
    bx, bo, bc = (c.base for c in call.guards)                                 # of the base keeps the margins
    margin = call.guards[0].lo
    assert margin * 2 >= guards.MARGIN_MIN_BYTES and np.isnan(bx[:margin].astype(np.float32)).all()
    assert np.isnan(bx[margin + x.size:].astype(np.float32)).all()
    assert np.isnan(bc[:call.guards[2].lo].astype(np.float32)).all()  # float8: its NaN code
    assert (bo[:call.guards[1].lo].view(np.uint8) == guards.SENTINEL).all() and int(bo[0]) == -1515870811
    call.check()  # nothing written: silent


def test_a_view_into_a_wider_buffer_keeps_its_layout_inside_the_guard():
    owner = np.arange(40, dtype=np.float32).reshape(4, 10)
    view = owner[:, 2:7]
    with guards.call("k") as call:
        g = call.copy("mat_b", view)
    assert np.array_equal(g, view) and g.strides == view.strides
    assert g.base.size == owner.size + 2 * call.guards[0].lo  # the whole owner copied, margins around it


def test_the_margins_hold_a_tile_of_rows_and_a_whole_group_of_a_stack():
    # a matrix: 128 rows each side; a stack: a whole matrix (mat_b[G] past the last group, mat_b[-1] before the
    # first) and 128 rows of the next, wherever a stray index lands in them (its last row included)
    assert guards.margin_elements(np.zeros((300, 64), np.float32)) >= 128 * 64
    stack = np.zeros((3, 300, 16), np.float32)  # K = 300 rows: past the 128 rows of the rule for a matrix
    assert guards.margin_elements(stack) >= 300 * 16 + 128 * 16
    assert guards.margin_elements(np.zeros((3, 300, 16), np.float32).transpose(0, 2, 1)) >= 300 * 16 + 128 * 16
    with guards.call("k") as call:
        g = call.copy("mat_b", stack)
    past = np.lib.stride_tricks.as_strided(g, (5, 300, 16), g.strides)  # mat_b[3] and mat_b[4]: groups G, G + 1
    assert np.isnan(past[3]).all() and np.isnan(past[4, :128]).all()
    lo = call.guards[0].lo
    assert np.isnan(g.base[lo - 300 * 16:lo]).all()  # mat_b[-1], before the first group
    # and no more: a stack of small matrices is not given 128 whole matrices (up to 8 MiB) a side
    small = np.zeros((8, 64, 64), np.float16)  # 64 KiB a matrix: the old rule gave 8 MiB of margins a side
    assert guards.margin_elements(small) * 2 <= 64 * 64 * 2 + 128 * 64 * 2 + 512


def test_a_write_before_the_start_or_past_the_end_is_named_with_how_far():
    with guards.call("k") as call:
        c = call.empty("C", (2, 3), np.float32)
    g = call.guards[0]
    g.base[g.hi:g.hi + 16] = 1.0
    g.base[g.lo - 2] = 0.0
    with pytest.raises(gmm_ref.Mismatch) as info:
        call.check()
    assert info.value.kind == "wrote_out_of_bounds"
    assert "wrote 16 elements past the end of C" in str(info.value)
    assert "wrote 2 elements before the start of C (1 of them changed)" in str(info.value)
    assert c.shape == (2, 3)


# --------------------------------------------------------------------------- kernels that write or read past
def _past(t, n, *, before=False):
    """A NumPy view of the ``n`` elements of ``t``'s dtype just past the end of ``t`` (or just before its start):
    what an unmasked pointer reaches."""
    width = t.element_size()
    span = (1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride(), strict=True))) * width
    start = t.data_ptr() - n * width if before else t.data_ptr() + span
    return np.ctypeslib.as_array((ctypes.c_uint8 * (n * width)).from_address(start)).view(
        {1: np.uint8, 2: np.uint16, 4: np.uint32}[width])


def batched_writes_past_c(A, B, C, expert_num_tokens, compute_type=None, A_scale=None, B_scale=None, B_zp=None,
                          use_fp8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False, config=None,
                          per_act_token_quant=False, block_shape=None):
    """Broken: right, and then 16 elements written past the end of C (a tile's store left unmasked)."""
    batched_correct(A, B, C, expert_num_tokens, compute_type, A_scale, B_scale, B_zp, use_fp8_w8a8,
                    use_int8_w8a16, use_int4_w4a16, config, per_act_token_quant, block_shape)
    _past(C, 16)[:] = 1


def grouped_mm_writes_before_mat_a(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Broken: right, but scribbles on the 4 elements before mat_a's start."""
    _past(mat_a, 4, before=True)[:] = 7
    return torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)


def grouped_mm_reads_past_offs(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Broken: reads one group end past offs (offs[G], which is not there) and uses it."""
    out = torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)
    if offs is not None and out.numel():
        out.view(-1)[0] += float(np.int32(_past(offs, 1)[0].view(np.int32)) != 0)
    return out


def grouped_mm_nan_of_its_own(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Broken, but reads nothing out of bounds: it makes its last output row NaN itself."""
    out = torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)
    if out.numel():
        out[-1] = float("nan")
    return out


def correct(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    return torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)


#: torch._grouped_mm on CPU takes no K = 0 or N = 0 and no float32 output from bfloat16 inputs
TORCH = Scope(
    zero_extents=("m",), dtypes=["float32->float32", "bfloat16->bfloat16", "float16->float16"])


def test_a_torch_kernel_that_writes_past_its_output_buffer_is_named():
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(batched_writes_past_c, convention="vllm.batched_moe", modes=["exact"], max_examples=5)
    assert info.value.kind == "wrote_out_of_bounds"
    assert "wrote 16 elements past the end of C" in str(info.value)


def test_a_torch_kernel_that_writes_before_its_operand_is_named():
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(grouped_mm_writes_before_mat_a, convention="torch.grouped_mm", modes=["exact"], max_examples=5,
                     scope=TORCH)
    assert "wrote 4 elements before the start of mat_a" in str(info.value)


def test_a_read_past_an_integer_operand_is_named_by_its_sentinel():
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(grouped_mm_reads_past_offs, convention="torch.grouped_mm", modes=["exact"], max_examples=5,
                     scope=TORCH)
    assert info.value.kind == "read_out_of_bounds"
    assert "read outside offs (the wrong elements change when only the sentinel 0xA5 bytes" in str(info.value)


def test_a_kernel_whose_nan_is_its_own_is_not_blamed_for_a_read():
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(grouped_mm_nan_of_its_own, convention="torch.grouped_mm", modes=["exact"], max_examples=5,
                     scope=TORCH)
    assert info.value.kind != "read_out_of_bounds" and "read out of bounds" not in str(info.value)


@pytest.mark.parametrize(("fn", "convention"), [(correct, "torch.grouped_mm"), (batched_correct, "vllm.batched_moe")])
def test_correct_kernels_stay_silent_poisoned_inputs_included(fn, convention):
    scope = TORCH if convention == "torch.grouped_mm" else None
    report = check_kernel(fn, convention=convention, modes=["exact", "poisoned"], max_examples=5, scope=scope)
    assert report.ok, report.summary()


def test_the_main_jobs_cell_names_the_buffer():
    kernel = wrap(batched_writes_past_c, "vllm.batched_moe")
    outcome = run_cell(kernel, TableCell(kernel.name, "masked", "exact"), WorkRequest(max_examples=3))
    assert outcome.status is Status.FAILED and "wrote 16 elements past the end of C" in outcome.details[0]


# ------------------------------------------------------------------------- Triton kernels in the interpreter
class TestTriton:
    """The Triton kernels of triton_gmm.py, in Triton's interpreter (as test_triton.py runs them)."""

    SPEC = "tests.corpus.triton_gmm:"

    @pytest.fixture(autouse=True)
    def _interpreter(self):
        pytest.importorskip("triton", reason="Triton is not installed (gmm-harness[triton])")
        from gmm_kernels.runtimes import triton_interpreter

        if not triton_interpreter.use_if_no_gpu():
            pytest.skip("torch sees a GPU here: these tests run Triton kernels in Triton's interpreter")

    def test_an_unmasked_load_past_mat_a_is_named(self):
        with pytest.raises(gmm_ref.Mismatch) as info:
            check_kernel(self.SPEC + "grouped_mm_reads_past_a", modes=["exact"], max_examples=20)
        # the interpreter checks every masked-in lane against the launch's tensors (gmm_kernels.runtimes.triton_bounds)
        assert info.value.kind == "read_out_of_bounds"
        assert "read out of bounds: a Triton load reached memory outside every tensor of the launch" in str(info.value)
        assert "past the end of a_ptr (a [" in str(info.value), str(info.value)

    def test_a_load_past_mat_a_that_no_output_shows_is_named(self):
        with pytest.raises(gmm_ref.Mismatch) as info:
            check_kernel(self.SPEC + "grouped_mm_reads_a_row_past", modes=["exact"], max_examples=10)
        assert info.value.kind == "read_out_of_bounds"
        assert "1 element(s) past the end of a_ptr" in str(info.value), str(info.value)
        twin = check_kernel(self.SPEC + "grouped_mm_reads_its_rows", modes=["exact", "poisoned"], max_examples=10)
        assert twin.ok, twin.summary()

    def test_an_unmasked_store_past_its_output_is_named(self):
        with pytest.raises(gmm_ref.Mismatch) as info:
            check_kernel(self.SPEC + "grouped_mm_writes_past_out", modes=["exact"], max_examples=10)
        assert info.value.kind == "wrote_out_of_bounds"
        assert "a Triton store reached memory outside every tensor of the launch" in str(info.value)
        assert "past the end of c_ptr (a [" in str(info.value), str(info.value)

    def test_the_right_kernel_stays_silent(self):
        report = check_kernel(self.SPEC + "grouped_mm", modes=["exact", "poisoned"], max_examples=10)
        assert report.ok, report.summary()


def test_the_plugin_names_the_buffer(tmp_path):
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--pyargs", "property_tests",
         "--gmm-kernel=tests.gmm_kernels.test_guards:batched_writes_past_c", "--gmm-convention=vllm.batched_moe",
         "--hypothesis-profile=gmm-dev", "-k", "test_kernel_matches_reference and exact"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=dict(os.environ), check=False)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "wrote 16 elements past the end of C" in proc.stdout, proc.stdout[-3000:]
