"""Deliberately broken kernels whose bug shows only at scale: rows past a grid axis of 65,535 blocks (in the
call, in one group), groups past an expert scan of 512, groups past a weight table of 128. The ``scale`` mode
(``property_tests.checks.scale``) rejects each, naming the group and the row; the default modes without it pass them
(``test_scale``). NumPy functions in the ``ragged_dot`` signature, as ``broken_kernels``'s."""

from __future__ import annotations

import numpy as np

from tests.corpus.broken_kernels import _ends, _mm32, _np, _out_dtype, ragged_dot_correct

#: a CUDA grid axis holds at most 65,535 blocks (gridDim.y and gridDim.z)
GRID_AXIS_LIMIT = 65_535


def ragged_dot_grid_rows_capped(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Rows go on a grid axis of one-row blocks, capped at 65,535 blocks: rows past the 65,535th of the call are
    never written (the class of github.com/FlashML-org/FreeToken/issues/186: tokens * top_k on gridDim.z, whose
    limit is 65,535; that launch fails outright, a kernel that clamps its grid drops the rows instead)."""
    lhs = _np(lhs)
    out = np.asarray(ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)).copy()
    out[GRID_AXIS_LIMIT:] = 0
    return out


def ragged_dot_group_grid_rows_capped(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """One grid per group, its rows on an axis of one-row blocks capped at 65,535: the rows of a group past its
    65,535th are never written (a hot expert holding more tokens than a grid axis has blocks)."""
    lhs = _np(lhs)
    out = np.asarray(ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)).copy()
    gs, starts, ends = _ends(group_sizes)
    for g in range(gs.size):
        if gs[g] > GRID_AXIS_LIMIT:
            out[starts[g] + GRID_AXIS_LIMIT:ends[g]] = 0
    return out


def ragged_dot_expert_scan_of_512(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """The group offsets are a prefix sum over the group sizes in one block of 512 threads, one group each:
    groups past the 512th are never scanned, so their rows are never written (the class of
    github.com/sgl-project/sglang/pull/21610: moe_align_block_size's CUB block scan of 1,024 threads capped the
    experts at 1,024)."""
    lhs, rhs = _np(lhs), _np(rhs)
    gs, starts, ends = _ends(group_sizes)
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
    for g in range(min(gs.size, 512)):
        out[starts[g]:ends[g]] = _mm32(lhs[starts[g]:ends[g]], rhs[g])
    return out.astype(_out_dtype(preferred_element_type, lhs))


def ragged_dot_weight_table_of_128(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Per-group weight pointers live in a table of 128 slots: group g uses slot g % 128 (a pointer array sized
    for 128 experts, as Qwen3's)."""
    lhs, rhs = _np(lhs), _np(rhs)
    gs, starts, ends = _ends(group_sizes)
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
    for g in range(gs.size):
        out[starts[g]:ends[g]] = _mm32(lhs[starts[g]:ends[g]], rhs[g % 128])
    return out.astype(_out_dtype(preferred_element_type, lhs))


#: convention -> kernels whose bug only the scale mode's sizes show (the default modes without it pass them)
BROKEN_AT_SCALE = {
    "ragged_dot": [ragged_dot_grid_rows_capped, ragged_dot_group_grid_rows_capped, ragged_dot_expert_scan_of_512,
                   ragged_dot_weight_table_of_128],
}



def grouped_mm_weight_table_of_128(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm whose per-group pointers live in a table of 128 slots: group g multiplies by the
    weights of group g % 128 (2d x 3d, 3d x 3d; 3d x 2d: its lhs), or reads the K range of group g % 128
    (2d x 2d)."""
    import torch

    from tests.corpus.broken_kernels import grouped_mm_correct

    if mat_b.dim() == 3:
        return grouped_mm_correct(mat_a, mat_b[torch.arange(mat_b.shape[0]) % 128], offs, bias, out_dtype)
    if mat_a.dim() == 3:
        return grouped_mm_correct(mat_a[torch.arange(mat_a.shape[0]) % 128], mat_b, offs, bias, out_dtype)
    out = grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
    ends = [int(e) for e in offs.tolist()]
    starts = [0, *ends[:-1]]
    for g in range(128, len(ends)):
        s, e = starts[g % 128], ends[g % 128]
        out[g] = (mat_a[:, s:e].float() @ mat_b[s:e].float()).to(out.dtype)
    return out


#: the same class in a convention of four forms (ragged M, N, K and batch): every family's scale cells catch it
BROKEN_AT_SCALE_TORCH = {"torch.grouped_mm": [grouped_mm_weight_table_of_128]}


def scaled_mm_scale_table_of_128(mat_a, mat_b, scale_a, scale_b, offs=None, out_dtype=None):
    """A rowwise FP8 grouped GEMM whose per-group weight-scale pointers live in a table of 128 slots: group g
    multiplies by the weight (column) scales of group g % 128 (the codes are right; only the scales go wrong)."""
    import torch

    from tests.corpus.broken_scaled import _is_mx, _scaled_groups, scaled_mm_correct

    if _is_mx(scale_a):
        return scaled_mm_correct(mat_a, mat_b, scale_a, scale_b, offs, out_dtype)
    out, groups = _scaled_groups(mat_a, mat_b, scale_a, scale_b, offs)
    table = [sb for *_, sb in groups]
    for g, (where, a, b, sa, sb) in enumerate(groups):
        read = table[g % 128] if table[g % 128].shape == sb.shape else sb
        out[where] = (a @ b) * sa[:, None] * read[None, :]
    return out.to(out_dtype or torch.bfloat16)


#: the class in a convention of quantized operands only: the scale cells are scaled (codes, scales of 1 or 2)
BROKEN_AT_SCALE_SCALED = {"torch.scaled_grouped_mm": [scaled_mm_scale_table_of_128]}
