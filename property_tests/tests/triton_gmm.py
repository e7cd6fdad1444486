"""A small bfloat16 Triton grouped matmul in ``torch._grouped_mm``'s 2d x 3d form, and two broken copies.

``mat_a [sum M, K] x mat_b [G, K, N] -> [sum M, N]``, ``offs`` the int32 cumulative group ends. One fixed
block config (32 x 32 x 32); each program computes one tile of rows and columns, group by group, for the
groups its rows meet. Written for property_tests/tests/test_triton.py (which copies this file into a user's
package too): import it only once ``TRITON_INTERPRET`` is decided (the harness sets it where no GPU is seen).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import gmm_kernels

__all__ = ["grouped_mm", "grouped_mm_boundary_off_by_one", "grouped_mm_no_k_tail"]

_BLOCK = 32
LAUNCHES = [0]  # kernel launches so far: a check whose every problem was empty launched nothing


@triton.jit
def _grouped_mm_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, G, N, K,
                       stride_am, stride_ak, stride_bg, stride_bk, stride_bn, stride_cm, stride_cn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       START_SHIFT: tl.constexpr, K_TAIL: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_end = tl.cdiv(K, BLOCK_K) * BLOCK_K if K_TAIL else (K // BLOCK_K) * BLOCK_K
    for g in tl.range(0, G):
        gi = g.to(tl.int64)
        start = tl.load(offs_ptr + tl.maximum(gi - 1, 0), mask=gi > 0, other=0)
        start = tl.where(gi > 0, start + START_SHIFT, 0)
        end = tl.load(offs_ptr + gi)
        if (start < pid_m * BLOCK_M + BLOCK_M) & (end > pid_m * BLOCK_M):  # this tile meets group g
            live = (rows >= start) & (rows < end)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in tl.range(0, k_end, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                            mask=live[:, None] & (ks < K)[None, :], other=0.0)
                b = tl.load(b_ptr + gi * stride_bg + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                            mask=(ks < K)[:, None] & (cols < N)[None, :], other=0.0)
                acc = tl.dot(a, b, acc)
            tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
                     acc.to(c_ptr.dtype.element_ty), mask=live[:, None] & (cols < N)[None, :])


def _launch(mat_a, mat_b, offs, out_dtype, *, start_shift=0, k_tail=True):
    m, k = mat_a.shape
    groups, _, n = mat_b.shape
    out = torch.empty((m, n), dtype=out_dtype or mat_a.dtype)
    if out.numel() == 0 or groups == 0:
        return out
    grid = (triton.cdiv(m, _BLOCK), triton.cdiv(n, _BLOCK))
    LAUNCHES[0] += 1
    _grouped_mm_kernel[grid](mat_a, mat_b, out, offs, groups, n, k, *mat_a.stride(), *mat_b.stride(), *out.stride(),
                             BLOCK_M=_BLOCK, BLOCK_N=_BLOCK, BLOCK_K=_BLOCK, START_SHIFT=start_shift, K_TAIL=k_tail)
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
