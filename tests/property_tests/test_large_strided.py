"""The large mode's strided cells (``property_tests.checks.large_strided``): element offsets past 2**31 on small
problems, one operand (or the output a kernel writes in place) a view whose rows or groups lie 2**26 or 2**30 elements
apart in a lazily committed allocation.

Each broken kernel here computes offsets in int32 and passes the default modes: the cells reject it naming the group
and the rows (a torch kernel of all four ``torch._grouped_mm`` forms; a Triton kernel in the interpreter; vLLM's
batched experts from its wheel with one stride's ``tl.int64`` removed; a torch batched kernel storing at int32
offsets). The built-in kernels that read strides pass, but grouped-mm-bf16 0.1.7, whose offsets are int32 (a known
upstream bug, found here). The full-size cell (16 GiB) is left out in these tests (``GMM_LARGE_MEMORY``).
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import gmm_ref
from gmm_kernels import Status, get, resolve_kernel
from gmm_kernels.sandbox import device
from property_tests.checks import large
from property_tests.checks import large_strided as ls
from property_tests.checks.check import check_kernel, check_mode
from tests.corpus.broken_large import batched_int32_out_offsets, grouped_mm_int32_offsets

pytest.importorskip("torch", reason="the strided cells hand torch kernels strided tensors")

from tests.corpus.broken_serving import batched_correct


@pytest.fixture(autouse=True)
def no_full_size_cell(monkeypatch):
    """The full-size cell needs about 16 GiB: left out here (these tests check the strided cells)."""
    monkeypatch.setenv(large.MEMORY_ENV, "0.5")


def _torch(fn, convention="torch.grouped_mm"):
    return resolve_kernel(fn, convention=convention)


def test_which_cells_each_convention_gets():
    assert [c.describe() for c in ls.cells(get("torch.grouped_mm"))] == [
        "ragged_m lhs rows (M) 67,108,864 elements apart", "ragged_m rhs groups 1,073,741,824 elements apart",
        "ragged_n lhs groups 1,073,741,824 elements apart", "ragged_n rhs columns (N) 67,108,864 elements apart",
        "ragged_k lhs columns (K) 67,108,864 elements apart", "ragged_k rhs rows (K) 67,108,864 elements apart",
        "batch lhs groups 1,073,741,824 elements apart", "batch rhs groups 1,073,741,824 elements apart"]
    assert [c.describe() for c in ls.cells(get("vllm.batched_moe"))] == [  # its C, written in place
        "masked out groups 1,073,741,824 elements apart", "masked out rows (M) 67,108,864 elements apart"]
    assert ls.cells(get("jax.ragged_dot")) == () and "dense" in ls.none_why(get("jax.ragged_dot"))
    assert ls.cells(get("torch.scaled_mm[loop]")) == ()  # no strides in its convention, its output its own


@pytest.mark.parametrize("name", ["torch.grouped_mm", "vllm.batched_moe"])
def test_every_view_passes_2_31_and_a_wrapped_offset_lands_inside_its_allocation(name):
    adapter = get(name)
    for cell in ls.cells(adapter):
        problem = ls.cell_problem(adapter, cell.family)
        assert isinstance(problem, gmm_ref.Problem), problem
        x, axis = ls._operand(problem, cell), ls._axis(problem, cell)
        count, block = x.shape[axis], x.size // x.shape[axis]
        assert cell.stride < 2**31, "an int32-typed stride (Triton types an int argument by its value)"
        assert cell.stride * x.itemsize % 16 == 0 and block + 2 * ls.MARGIN < cell.stride  # a slice's layout
        offsets = np.arange(count) * cell.stride
        assert (offsets >= 2**31).sum() >= 2 and (offsets < 2**31).sum() >= 2, cell.describe()
        assert offsets[-1] + block < 2**32, "wrapped in int32, every offset lands in [-2**31, 0): in the front part"
        assert ls._elements(x, axis, cell.stride) * x.itemsize <= ls.MAX_BYTES
        if axis != 0 or cell.axis != "groups":
            assert problem.group_sizes is not None  # groups on either side of index 32
            ends = np.cumsum(problem.group_sizes)
            assert ((ends - problem.group_sizes < 32) & (ends > 32)).any() or cell.family == "masked"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the allocation's resident size from "
                                                                "/proc/self/smaps (Linux)")
@pytest.mark.parametrize("huge_pages", [False, True], ids=["as-configured", "huge-pages-always"])
def test_a_cell_commits_a_few_mib_of_its_12_gib(monkeypatch, huge_pages):
    """Where transparent huge pages are ``always`` (CI machines), each element the cell writes would commit 2 MiB
    (260 MiB for this cell): ``huge-pages-always`` advises the allocation ``MADV_HUGEPAGE`` as it is made, which
    Linux's ``madvise`` and ``always`` settings both honour, and the harness's own advice must win."""
    import torch

    kept = []

    def strided(*args):
        kept.append(ls._strided.__wrapped__(*args))
        return kept[-1]

    strided.__wrapped__ = ls._strided
    monkeypatch.setattr(ls, "_strided", strided)
    if huge_pages:
        if not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
            pytest.skip("this Linux kernel has no transparent huge pages to force")
        empty = torch.empty

        def empty_with_huge_pages(*args, **kwargs):
            x = empty(*args, **kwargs)
            if x.device.type == "cpu" and x.nbytes > 2**30:
                assert device._advise(x.data_ptr(), x.nbytes, 14)  # MADV_HUGEPAGE
            return x

        monkeypatch.setattr(torch, "empty", empty_with_huge_pages)
    adapter = get("torch.grouped_mm")
    cell = ls.cells(adapter)[0]
    problem = ls.cell_problem(adapter, cell.family)
    ls.check(adapter, problem, cell)
    size, resident = _inside(kept[0][0].data_ptr(), kept[0][0].nbytes)
    assert ls._elements(ls._operand(problem, cell), 0, cell.stride) * 2 == kept[0][0].nbytes  # bfloat16
    assert kept[0][0].nbytes > 11.8 * 2**30  # the address space reserved ...
    assert size > kept[0][0].nbytes - 2 * 4096, (f"{size} bytes of mappings lie inside the allocation's "
                                                 f"{kept[0][0].nbytes}: its pages were not advised apart")
    assert resident < 16 * 2**20, f"{resident / 2**20:.1f} MiB of the allocation committed"  # ... a few MiB touched


def _inside(address: int, nbytes: int) -> tuple[int, int]:
    """(size, resident bytes) of this process's mappings lying wholly inside ``[address, address + nbytes)``
    (/proc/self/smaps): the allocation's pages, without the neighbours a mapping it shares would count."""
    inside = False
    size = resident = 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                inside = address <= lo and hi <= address + nbytes
                size += (hi - lo) if inside else 0
            elif inside and head[0] == "Rss:":
                resident += int(head[1]) * 1024
    return size, resident


def test_torch_grouped_mm_passes_every_strided_cell_and_says_the_full_cell_is_left_out():
    adapter = get("torch.grouped_mm")
    for family in adapter.families:
        result = check_mode(adapter, "large", family=family)
        assert result.status is Status.PASSED and result.cells == (2, 3), result
        why = ("needs about 15.8 GiB; 0.5 GiB is allowed here (GMM_LARGE_MEMORY)" if family == large.FAMILY
               else "built in the ragged_m family only (the token axis)")
        assert result.detail.startswith(f"left out: {large.FULL} (") and why in result.detail, result.detail


@pytest.mark.parametrize(("family", "first"), [
    ("ragged_m", r"group 1 \(rows \[20, 36\), size 16\)"), ("ragged_n", r"group 2 \(columns \[36, 50\), size 14\)"),
    ("ragged_k", r"group 1 \(K range \[20, 36\), size 16\)"), ("batch", r"group 2: ")])
def test_a_torch_kernel_with_int32_offsets_fails_every_family_naming_the_group(family, first):
    """ragged M: rows 32 on of group 1 are read at wrapped offsets (zeros); ragged N and batch: groups 2 and 3 of
    lhs; ragged K: K indices 32 on."""
    result = check_mode(_torch(grouped_mm_int32_offsets), "large", family=family)
    assert result.status is Status.FAILED, result
    assert re.match(first, result.detail), result.detail
    notes = "\n".join(result.error.__notes__)
    assert "The large mode's strided cell" in notes and "an offset computed in int32 wraps there" in notes, notes
    assert "large_strided.check(k, large_strided.cell_problem(k, " in notes  # how to rerun it
    assert not any(n.startswith(gmm_ref.compare.REPRODUCE) for n in result.error.__notes__), \
        "no script that calls the kernel on the contiguous problem (which it passes)"


def test_the_int32_kernel_passes_the_default_modes():
    report = check_kernel(_torch(grouped_mm_int32_offsets), modes=["exact", "poisoned"], max_examples=12,
                          raise_on_failure=False)
    assert report.ok and not report.failures, report.summary()


def test_a_store_into_the_wrong_place_of_a_strided_output_is_named_by_its_group():
    """The output cells (vLLM's batched experts' C): stores at int32 offsets are lost (C keeps its NaN)."""
    right = check_mode(_torch(batched_correct, "vllm.batched_moe"), "large")
    assert right.status is Status.PASSED and right.cells == (2, 3), right
    result = check_mode(_torch(batched_int32_out_offsets, "vllm.batched_moe"), "large")
    assert result.status is Status.FAILED, result
    assert re.match(r"group 2 \(rows \[0, 50\) of its own matrix, size 50\): 1600 wrong", result.detail), result


def _past_each_block(kernel):
    """``kernel`` that also stores a zero one element past the end of each expert's ``[M, N]`` block of C."""

    def past(A, B, C, *args, **kwargs):
        import torch

        kernel(A, B, C, *args, **kwargs)
        e, m, n = C.shape
        torch.as_strided(C, (e,), (C.stride(0),), C.storage_offset() + m * n).zero_()

    return past


def test_a_store_past_a_block_of_the_strided_output_is_named_by_its_group():
    adapter = _torch(_past_each_block(batched_correct), "vllm.batched_moe")
    cell = ls.cells(adapter)[0]
    problem = ls.cell_problem(adapter, cell.family)
    with pytest.raises(gmm_ref.Mismatch) as info:
        ls.check(adapter, problem, cell)
    assert info.value.kind == "wrote_out_of_bounds"
    assert str(info.value).startswith("out, group 0: kernel ") and str(info.value).endswith(
        "wrote within 4096 elements of its block of out, outside it (4 blocks' margins changed)"), info.value


def test_kernels_without_strides_or_that_copy_them_say_why():
    jax_result = check_mode(get("jax.ragged_dot"), "large")
    assert jax_result.status is Status.UNSUPPORTED and "jax arrays are dense (no strides)" in jax_result.detail
    copies = check_mode(get("torchao.mxfp8_grouped_mm[emulated]"), "large")
    assert copies.status is Status.UNSUPPORTED, copies
    assert "copies its strided operands contiguous first (its documented layouts" in copies.detail, copies.detail


def test_a_memory_cap_that_is_no_number_is_named(monkeypatch):
    monkeypatch.setenv(large.MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match="GMM_LARGE_MEMORY: expected the GiB the large mode's full-size cell may "
                                         "use, got 'lots'"):
        large.allowed_memory()


def test_a_memory_cap_that_is_no_number_is_a_usage_error_of_the_main_job(monkeypatch, capsys):
    from property_tests.cli.main import main

    monkeypatch.setenv(large.MEMORY_ENV, "lots")
    with pytest.raises(SystemExit) as info:
        main(["check", "--kernel", "torch.grouped_mm", "--modes", "large"])
    assert info.value.code == 2 and "GMM_LARGE_MEMORY: expected the GiB" in capsys.readouterr().err


# ------------------------------------------------------------------------------- Triton kernels, interpreted
pytest.importorskip("triton", reason="Triton is not installed (gmm-harness[triton]; the newest-JAX leg has none)")

from gmm_kernels.adapters import vllm  # noqa: E402
from gmm_kernels.runtimes import triton_interpreter  # noqa: E402
from tests.corpus.wheel_twins import edited_wheel  # noqa: E402

interpreted = pytest.mark.skipif(not triton_interpreter.use_if_no_gpu(),
                                 reason="torch sees a GPU here (or TRITON_INTERPRET is off): these tests run Triton "
                                        "kernels in the interpreter")
needs_wheel = pytest.mark.skipif(vllm.find_wheel() is None, reason=f"no vLLM {vllm.WHEEL_VERSION} wheel here; get "
                                                                   f"it with: {vllm.DOWNLOAD}")


@interpreted
def test_a_triton_kernel_with_int32_row_offsets_fails_and_its_int64_twin_passes():
    right = check_mode(resolve_kernel("tests.corpus.triton_gmm:grouped_mm"), "large")
    assert right.status is Status.PASSED and right.cells == (2, 3), right
    broken = check_mode(resolve_kernel("tests.corpus.triton_gmm:grouped_mm_int32_offsets"), "large")
    assert broken.status is Status.FAILED, broken
    # the interpreter's checked loads see the wrapped offset itself: 2**31 elements before mat_a
    assert re.match(r"kernel \S+ read out of bounds: a Triton load .* 2147483648 element\(s\) before the start of "
                    r"a_ptr .*wrapped in int32", broken.detail), broken.detail


@interpreted
@pytest.mark.parametrize("name", ["grouped_mm_bf16", "grouped_mm_bf16[3d2d]"])
def test_grouped_mm_bf16s_int32_offsets_are_a_known_upstream_bug(name):
    adapter = get(name)
    assert adapter.available() is None
    result = check_mode(adapter, "large")
    assert result.status is Status.KNOWN_BUG, result
    assert "grouped_mm_bf16/kernels.py: every element offset is an int32 product" in result.detail
    caught = r"\(caught: kernel \S+ (read|wrote) out of bounds: .* before the start of [A-C]_ptr"
    assert re.search(caught, result.detail), result.detail


#: vLLM's batched experts with one stride left int32 (its tl.int64 annotation removed in batched_triton_kernel)
INT32_STRIDES = {"C rows": ("stride_cm: tl.int64,", "stride_cm,"), "C experts": ("stride_ce: tl.int64,", "stride_ce,")}


@interpreted
@needs_wheel
def test_vllms_batched_experts_pass_the_output_cells():
    adapter = get("vllm.batched_moe")
    assert adapter.available() is None
    result = check_mode(adapter, "large")
    assert result.status is Status.PASSED and result.cells == (2, 3), result


@interpreted
@needs_wheel
@pytest.mark.parametrize(("stride", "first"), [("C rows", r"kernel vllm.batched_moe wrote out of bounds: .* before the "
                                                          r"start of c_ptr .*wrapped in int32"),
                                               ("C experts", r"kernel vllm.batched_moe wrote out of bounds: .* before "
                                                             r"the start of c_ptr .*wrapped in int32")])
def test_vllms_batched_experts_with_an_int32_stride_fail_naming_the_group(stride, first, tmp_path, monkeypatch):
    monkeypatch.setenv(vllm.WHEEL_ENV, edited_wheel(vllm.find_wheel(), vllm.KERNEL_MEMBER, "batched_triton_kernel",
                                                    *INT32_STRIDES[stride], tmp_path / "vllm-int32.whl",
                                                    also=(vllm.UTILS_MEMBER,)))
    twin = vllm.VllmBatchedMoE()
    assert twin.available() is None
    result = check_mode(twin, "large")
    assert result.status is Status.FAILED, result
    assert re.match(first, result.detail), result.detail



def test_the_strided_cells_are_a_default_mode():
    """Offsets past 2**31 in every run: the default ``strided`` mode rejects the int32-offset kernel that passes
    every other default mode; the correct kernel passes it; a jax kernel, whose arrays have no strides, is n/a."""
    from property_tests.checks.modes import MODES

    assert "strided" in MODES and MODES["strided"].cells
    (result,) = check_kernel(grouped_mm_int32_offsets, convention="torch.grouped_mm", modes=["strided"],
                             raise_on_failure=False)
    assert result.status is Status.FAILED and re.match(r"group \d+ \(rows \[", result.detail), result.detail
    result = check_mode(get("torch.grouped_mm"), "strided")
    assert result.status is Status.PASSED and result.examples == 8, result
    result = check_mode(get("jax.ragged_dot"), "strided")
    assert result.status is Status.UNSUPPORTED and "dense" in result.detail, result
