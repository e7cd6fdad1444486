"""A small bfloat16 Triton grouped matmul in ``torch._grouped_mm``'s 2d x 3d form, and broken copies.

``mat_a [sum M, K] x mat_b [G, K, N] -> [sum M, N]``, ``offs`` the int32 cumulative group ends. One fixed
block config (32 x 32 x 32); each program computes one tile of rows and columns, group by group, for the
groups its rows meet. Written for tests/gmm_kernels/test_triton.py (which copies this file into a user's
package too): import it only once ``TRITON_INTERPRET`` is decided (the harness sets it where no GPU is seen).
"""

from __future__ import annotations

import triton
import triton.language as tl

import gmm_kernels
from gmm_kernels.sandbox.guards import torch_empty

__all__ = ["grouped_mm", "grouped_mm_boundary_off_by_one", "grouped_mm_int32_offsets", "grouped_mm_no_k_tail",
           "grouped_mm_reads_a_row_past", "grouped_mm_reads_its_rows", "grouped_mm_reads_past_a",
           "grouped_mm_writes_past_out"]

_BLOCK = 32
LAUNCHES = [0]  # kernel launches so far: a check whose every problem was empty launched nothing


@triton.jit
def _grouped_mm_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, G, N, K,
                       stride_am, stride_ak, stride_bg, stride_bk, stride_bn, stride_cm, stride_cn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       START_SHIFT: tl.constexpr, K_TAIL: tl.constexpr, MASK_A_K: tl.constexpr,
                       MASK_STORE_END: tl.constexpr, WIDE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if WIDE:  # row and group offsets (index * stride) in int64; else int32, wrapping past 2**31 - 1
        rows_at = rows.to(tl.int64)
    else:
        rows_at = rows
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_end = tl.cdiv(K, BLOCK_K) * BLOCK_K if K_TAIL else (K // BLOCK_K) * BLOCK_K
    for g in tl.range(0, G):
        gi = g.to(tl.int64)
        if WIDE:
            g_at = gi
        else:
            g_at = g
        start = tl.load(offs_ptr + tl.maximum(gi - 1, 0), mask=gi > 0, other=0)
        start = tl.where(gi > 0, start + START_SHIFT, 0)
        end = tl.load(offs_ptr + gi)
        if (start < pid_m * BLOCK_M + BLOCK_M) & (end > pid_m * BLOCK_M):  # this tile meets group g
            live = (rows >= start) & (rows < end)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in tl.range(0, k_end, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                a_mask = live[:, None] & (ks < K)[None, :] if MASK_A_K else live[:, None] & (ks >= 0)[None, :]
                a = tl.load(a_ptr + rows_at[:, None] * stride_am + ks[None, :] * stride_ak, mask=a_mask, other=0.0)
                b = tl.load(b_ptr + g_at * stride_bg + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                            mask=(ks < K)[:, None] & (cols < N)[None, :], other=0.0)
                acc = tl.dot(a, b, acc)
            stored = live if MASK_STORE_END else rows >= start
            tl.store(c_ptr + rows_at[:, None] * stride_cm + cols[None, :] * stride_cn,
                     acc.to(c_ptr.dtype.element_ty), mask=stored[:, None] & (cols < N)[None, :])


def _launch(mat_a, mat_b, offs, out_dtype, *, start_shift=0, k_tail=True, mask_a_k=True, mask_store_end=True,
            wide=True):
    m, k = mat_a.shape
    groups, _, n = mat_b.shape
    # the output through the harness (a guarded buffer when the harness calls it; torch.empty else)
    out = torch_empty("out", (m, n), out_dtype or mat_a.dtype)
    if out.numel() == 0 or groups == 0:
        return out
    grid = (triton.cdiv(m, _BLOCK), triton.cdiv(n, _BLOCK))
    LAUNCHES[0] += 1
    _grouped_mm_kernel[grid](mat_a, mat_b, out, offs, groups, n, k, *mat_a.stride(), *mat_b.stride(), *out.stride(),
                             BLOCK_M=_BLOCK, BLOCK_N=_BLOCK, BLOCK_K=_BLOCK, START_SHIFT=start_shift, K_TAIL=k_tail,
                             MASK_A_K=mask_a_k, MASK_STORE_END=mask_store_end, WIDE=wide)
    return out


@gmm_kernels.declare("torch.grouped_mm", families=["ragged_m"], dtypes=["bfloat16"])
def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Right: group g's rows ``offs[g-1] <= r < offs[g]`` times ``mat_b[g]``, accumulated in float32."""
    return _launch(mat_a, mat_b, offs, out_dtype)


@gmm_kernels.declare("torch.grouped_mm", families=["ragged_m"], dtypes=["bfloat16"])
def grouped_mm_boundary_off_by_one(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Wrong: each group after the first starts a row early, overwriting the previous group's last row."""
    return _launch(mat_a, mat_b, offs, out_dtype, start_shift=-1)


@gmm_kernels.declare("torch.grouped_mm", families=["ragged_m"], dtypes=["bfloat16"])
def grouped_mm_no_k_tail(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Wrong: the K loop stops at the last whole block, dropping the tail of K (K not a multiple of 32)."""
    return _launch(mat_a, mat_b, offs, out_dtype, k_tail=False)


@gmm_kernels.declare("torch.grouped_mm", families=["ragged_m"], dtypes=["bfloat16"])
def grouped_mm_reads_past_a(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Wrong: the K tail of mat_a is loaded unmasked. A row reads its K-tail block past its last element (the next
    row's first ones, times mat_b's masked zeros: harmless while finite); the last row reads past mat_a's end. On a
    GPU that read finds whatever lies there (times zero: nothing shows); in the harness it finds mat_a's NaN guard."""
    return _launch(mat_a, mat_b, offs, out_dtype, mask_a_k=False)


@gmm_kernels.declare("torch.grouped_mm", families=["ragged_m"], dtypes=["bfloat16"])
def grouped_mm_writes_past_out(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Wrong: the store drops the group's end from its mask. The rows past a group's end in its last tile are
    written (and rewritten by the next group, or undefined past the last); those past the output's last row land
    past the end of the buffer it allocated (through ``gmm_kernels.sandbox.guards.torch_empty``)."""
    return _launch(mat_a, mat_b, offs, out_dtype, mask_store_end=False)


@triton.jit
def _touch_rows(a_ptr, m, K: tl.constexpr, BLOCK_M: tl.constexpr, PAST: tl.constexpr):
    """Loads rows of mat_a and keeps nothing: ``PAST`` rows past its last one too."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, K)
    tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=(rows < m + PAST)[:, None])


@gmm_kernels.declare("torch.grouped_mm", families=["ragged_m"], dtypes=["bfloat16"], multiples={"k": 16})
def grouped_mm_reads_a_row_past(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Wrong: a prologue loads one row past mat_a's last (a row count off by one) and uses it for nothing the
    output shows: no output comparison can see it; on a GPU it reads a neighbour's memory, or faults."""
    m, k = mat_a.shape
    if m and k <= 64 and mat_a.is_contiguous():
        _touch_rows[(triton.cdiv(m + 1, _BLOCK),)](mat_a, m, K=k, BLOCK_M=_BLOCK, PAST=1)
    return _launch(mat_a, mat_b, offs, out_dtype)


@gmm_kernels.declare("torch.grouped_mm", families=["ragged_m"], dtypes=["bfloat16"], multiples={"k": 16})
def grouped_mm_reads_its_rows(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The honest twin: the same prologue, its rows only."""
    m, k = mat_a.shape
    if m and k <= 64 and mat_a.is_contiguous():
        _touch_rows[(triton.cdiv(m + 1, _BLOCK),)](mat_a, m, K=k, BLOCK_M=_BLOCK, PAST=0)
    return _launch(mat_a, mat_b, offs, out_dtype)


@gmm_kernels.declare("torch.grouped_mm", families=["ragged_m"], dtypes=["bfloat16"])
def grouped_mm_int32_offsets(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Wrong: a row's offset ``row * stride_am`` and a group's ``g * stride_bg`` are int32 products (as
    grouped-mm-bf16 0.1.7 computes them): past 2**31 - 1 they wrap and the kernel reads before mat_a or mat_b.
    Right wherever every operand holds fewer than 2**31 elements; the large mode's strided cells catch it."""
    return _launch(mat_a, mat_b, offs, out_dtype, wide=False)
