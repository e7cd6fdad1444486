"""Deliberately broken grouped-GEMM kernels, each carrying one bug seen in real kernels.

The suite asserts that the ``gmm-ci`` profile rejects every one of them with a
message naming the wrong group, and that the correct twins here pass. They are
NumPy functions in a convention's signature (jax arrays arrive and are read
with ``np.asarray``), float32 accumulation, so they run without compiling.
"""

from __future__ import annotations

import functools
import hashlib

import ml_dtypes
import numpy as np

from tests.corpus.broken_scaled import (
    nvfp4_activation_nibbles_swapped,
    nvfp4_correct,
    nvfp4_scale_per_32,
    nvfp4_v2_correct,
    nvfp4_v2_first_group_global,
    qwix_correct,
    qwix_int4_read_unsigned,
    qwix_k_tile_scales_reversed,
    qwix_weight_scales_of_group_zero,
    scaled_mm_bfloat16_partial_sums,
    scaled_mm_correct,
    scaled_mm_dequantized_to_bfloat16,
    scaled_mm_empty_k_groups_stale,
    scaled_mm_mx_scale_blocks_unpadded,
    scaled_mm_row_scales_not_offset,
    scaled_mm_weight_scales_of_previous_group,
    stale_empty_k_blocks,
    te_scaled_correct,
    te_scaled_scale_pointer_stuck_on_empty_groups,
)
from tests.corpus.broken_serving import (
    batched_block_scales_per_tile,
    batched_correct,
    batched_writes_every_row,
    contiguous_bf16_block_sums,
    contiguous_correct,
    contiguous_group_of_last_row,
    masked_blocks_spill_into_next_group,
    masked_correct,
    masked_count_from_expected_m,
)


def _np(x):
    return None if x is None else np.asarray(x)


def _ends(group_sizes):
    gs = _np(group_sizes).astype(np.int64)
    ends = np.cumsum(gs)
    return gs, ends - gs, ends


def _mm32(a, b, rows=1 << 13):
    """``a @ b`` in float32, a chunk of rows at a time (large problems: no full-size float32 copy)."""
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    bf = b.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf inputs propagate
        for r in range(0, a.shape[0], rows):
            out[r:r + rows] = a[r:r + rows].astype(np.float32) @ bf
    return out


def _out_dtype(ped, lhs):
    return np.dtype(ped) if ped is not None else np.dtype(lhs.dtype)


# ---------------------------------------------------------------- ragged_dot
def ragged_dot_correct(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """A correct ragged_dot: float32 accumulation, zero tail."""
    lhs, rhs = _np(lhs), _np(rhs)
    gs, starts, ends = _ends(group_sizes)
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
    for g in range(gs.size):
        out[starts[g]:ends[g]] = _mm32(lhs[starts[g]:ends[g]], rhs[g])
    return out.astype(_out_dtype(preferred_element_type, lhs))


def ragged_dot_boundary_off_by_one(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Each group's first row is multiplied by the previous group's weights."""
    lhs, rhs = _np(lhs), _np(rhs)
    out = np.asarray(ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type))
    out = out.astype(np.float32)
    gs, starts, _ = _ends(group_sizes)
    for g in range(1, gs.size):
        if gs[g] > 0:
            out[starts[g]] = _mm32(lhs[starts[g]:starts[g] + 1], rhs[g - 1])[0]
    return out.astype(_out_dtype(preferred_element_type, lhs))


#: the group sizes the broken "plan caches" below kept from a first call
_PLANS: dict = {}


def ragged_dot_plan_cached_by_shape(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """The group boundaries are planned on the first call of each shape and kept (a launch plan cached by
    operand shapes and dtypes): a later call of that shape uses the first call's group sizes."""
    lhs, rhs = _np(lhs), _np(rhs)
    key = ("shape", lhs.shape, rhs.shape, str(lhs.dtype), str(rhs.dtype), preferred_element_type)
    return ragged_dot_correct(lhs, rhs, _PLANS.setdefault(key, _np(group_sizes).copy()), precision,
                              preferred_element_type)


def ragged_dot_replays_last_plan(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """One plan, for the last operands seen (shapes, dtypes and bytes: the buffers a layer keeps across steps),
    re-planned when they change and replayed otherwise, new group sizes or not (a CUDA graph re-captured on a
    new input and replayed with the routing of its capture). One call per problem never sees it: consecutive
    problems bring new operands."""
    lhs, rhs = _np(lhs), _np(rhs)
    key = (lhs.shape, rhs.shape, str(lhs.dtype), str(rhs.dtype), preferred_element_type,
           hashlib.sha1(lhs.tobytes() + rhs.tobytes()).hexdigest())
    if _PLANS.get("last") != key:
        _PLANS.update(last=key, sizes=_np(group_sizes).copy())
    return ragged_dot_correct(lhs, rhs, _PLANS["sizes"], precision, preferred_element_type)


def ragged_dot_empty_groups_reindexed(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Empty groups are compacted away, so later groups use the wrong weights."""
    lhs, rhs = _np(lhs), _np(rhs)
    gs, starts, ends = _ends(group_sizes)
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
    slot = 0
    for g in range(gs.size):
        if gs[g] == 0:
            continue
        out[starts[g]:ends[g]] = _mm32(lhs[starts[g]:ends[g]], rhs[slot])
        slot += 1
    return out.astype(_out_dtype(preferred_element_type, lhs))


def ragged_dot_tail_not_zeroed(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Rows past sum(group_sizes) are computed with the last group's weights."""
    lhs, rhs = _np(lhs), _np(rhs)
    out = np.asarray(ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type))
    out = out.astype(np.float32)
    _, _, ends = _ends(group_sizes)
    total = int(ends[-1]) if ends.size else 0
    if rhs.shape[0]:
        out[total:] = _mm32(lhs[total:], rhs[-1])
    return out.astype(_out_dtype(preferred_element_type, lhs))


def ragged_dot_k_remainder_skipped(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """The contraction stops at the last full K tile of 8 (the remainder is dropped)."""
    lhs, rhs = _np(lhs), _np(rhs)
    k = lhs.shape[1]
    k_full = k - k % 8 if k >= 8 else k
    return ragged_dot_correct(lhs[:, :k_full], rhs[:, :k_full], group_sizes, precision, preferred_element_type)


def ragged_dot_bf16_partial_sums(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """The accumulator is bfloat16: every partial sum is rounded to bfloat16."""
    lhs, rhs = _np(lhs), _np(rhs)
    gs, starts, ends = _ends(group_sizes)
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
    bf16 = ml_dtypes.bfloat16
    for g in range(gs.size):
        a = lhs[starts[g]:ends[g]].astype(np.float32)
        acc = np.zeros((a.shape[0], rhs.shape[2]), bf16)
        for kk in range(a.shape[1]):
            term = np.outer(a[:, kk], rhs[g, kk].astype(np.float32))
            acc = (acc.astype(np.float32) + term).astype(bf16)
        out[starts[g]:ends[g]] = acc.astype(np.float32)
    return out.astype(_out_dtype(preferred_element_type, lhs))


def ragged_dot_nan_leak_masking(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Groups selected by multiplying with a 0/1 mask: NaN or Inf in rows of no group leak out."""
    lhs, rhs = _np(lhs), _np(rhs)
    gs, starts, ends = _ends(group_sizes)
    rows = np.arange(lhs.shape[0])
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
    a = lhs.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for g in range(gs.size):
            m = ((rows >= starts[g]) & (rows < ends[g])).astype(np.float32)[:, None]
            out += m * (a @ rhs[g].astype(np.float32))
    return out.astype(_out_dtype(preferred_element_type, lhs))


def ragged_dot_output_dtype_ignored(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Returns the input dtype whatever preferred_element_type asks for."""
    lhs = _np(lhs)
    out = ragged_dot_correct(lhs, rhs, group_sizes, precision, np.float32)
    return np.asarray(out).astype(lhs.dtype)


def ragged_dot_group_table_of_eight(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Per-group weight pointers live in a table of 8 slots: group g uses slot g % 8."""
    lhs, rhs = _np(lhs), _np(rhs)
    gs, starts, ends = _ends(group_sizes)
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
    for g in range(gs.size):
        out[starts[g]:ends[g]] = _mm32(lhs[starts[g]:ends[g]], rhs[g % 8])
    return out.astype(_out_dtype(preferred_element_type, lhs))


def ragged_dot_int8_accumulator(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """int8 inputs accumulate in int8 (wrapping) before widening to the int32 output."""
    lhs = _np(lhs)
    out = np.asarray(ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type))
    if np.issubdtype(lhs.dtype, np.integer):
        out = out.astype(np.int8).astype(out.dtype)
    return out


def ragged_dot_boundary_inside_tile(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Tiles of 8 rows: a tile holding a group boundary uses the weights of the group of its first row
    for every row (a scheduler that assumes groups start on tile edges;
    github.com/deepseek-ai/DeepGEMM/pull/450)."""
    lhs, rhs = _np(lhs), _np(rhs)
    out = np.asarray(ragged_dot_correct(lhs, rhs, group_sizes, precision, np.float32)).copy()
    gs, _starts, ends = _ends(group_sizes)
    owner = np.searchsorted(ends, np.arange(lhs.shape[0]), side="right")
    for t0 in range(0, int(ends[-1]) if gs.size else 0, 8):
        g = owner[t0]
        rows = slice(t0, min(t0 + 8, int(ends[-1])))
        if g < gs.size:
            out[rows] = _mm32(lhs[rows], rhs[g])
    return out.astype(_out_dtype(preferred_element_type, lhs))


def ragged_dot_half_the_m_tiles(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """The grid launches ceil(tiles / 2) M tiles of 8 rows: the later rows are never written (zero)
    (a grid size halved twice; github.com/ROCm/vllm/pull/980)."""
    lhs = _np(lhs)
    out = np.asarray(ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)).copy()
    tiles = -(-lhs.shape[0] // 8)
    out[-(-tiles // 2) * 8:] = 0
    return out


def ragged_dot_n_overhang_unmasked(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """The last, partial N tile of 8 columns is not masked: it reads past the expert's weights into the
    next expert's (github.com/huggingface/kernels-community/issues/1153)."""
    lhs, rhs = _np(lhs), _np(rhs)
    out = np.asarray(ragged_dot_correct(lhs, rhs, group_sizes, precision, np.float32)).copy()
    n = rhs.shape[2]
    if n % 8 == 0 or n < 8 or rhs.shape[0] < 2:
        return out.astype(_out_dtype(preferred_element_type, lhs))
    gs, starts, ends = _ends(group_sizes)
    cols = slice(n - n % 8, n)
    for g in range(gs.size):
        out[starts[g]:ends[g], cols] = _mm32(lhs[starts[g]:ends[g]], rhs[(g + 1) % gs.size][:, cols])
    return out.astype(_out_dtype(preferred_element_type, lhs))


def ragged_dot_last_row_next_expert(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Expert ids from the cumulative ends with the wrong side of the search: each group's last row is
    given the next expert (github.com/sgl-project/sglang/pull/15250, an off-by-one expert id)."""
    lhs, rhs = _np(lhs), _np(rhs)
    out = np.asarray(ragged_dot_correct(lhs, rhs, group_sizes, precision, np.float32)).copy()
    gs, _starts, ends = _ends(group_sizes)
    for g in range(gs.size - 1):
        if gs[g] > 0:
            out[ends[g] - 1] = _mm32(lhs[ends[g] - 1:ends[g]], rhs[g + 1])[0]
    return out.astype(_out_dtype(preferred_element_type, lhs))


def ragged_dot_int32_row_offsets(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Each group's first element is found at ``start * K`` computed in int32: past 2**31 elements
    the offset wraps negative and the group reads memory before the buffer (here: zeros)
    (github.com/vllm-project/vllm/issues/5938, github.com/sgl-project/sglang/pull/4727)."""
    lhs, rhs = _np(lhs), _np(rhs)
    m, k = lhs.shape
    gs, starts, ends = _ends(group_sizes)
    out = np.zeros((m, rhs.shape[2]), np.float32)
    flat = lhs.reshape(-1)
    for g in range(gs.size):
        if gs[g] == 0:
            continue
        offset = int((np.array([starts[g]], np.int32) * np.int32(k))[0])  # wraps like an int32 pointer offset
        if offset >= 0:
            block = flat[offset:offset + gs[g] * k].reshape(gs[g], k)
        else:
            block = np.zeros((gs[g], k), lhs.dtype)
        out[starts[g]:ends[g]] = _mm32(block, rhs[g])
    return out.astype(_out_dtype(preferred_element_type, lhs))




# ------------------------------------------------------------- megablox.gmm
def gmm_correct(lhs, rhs, group_sizes, preferred_element_type=np.float32, tiling=None, group_offset=None,
                existing_out=None, transpose_rhs=False):
    """A correct megablox-style gmm with group_offset and existing_out."""
    lhs, rhs = _np(lhs), _np(rhs)
    if transpose_rhs:
        rhs = rhs.swapaxes(1, 2)
    go = 0 if group_offset is None else int(np.asarray(group_offset).reshape(-1)[0])
    _gs, starts, ends = _ends(group_sizes)
    ex = _np(existing_out)
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32) if ex is None else ex.astype(np.float32)
    for local in range(rhs.shape[0]):
        g = go + local
        out[starts[g]:ends[g]] = _mm32(lhs[starts[g]:ends[g]], rhs[local])
    return out.astype(preferred_element_type)


def gmm_group_offset_ignored(lhs, rhs, group_sizes, preferred_element_type=np.float32, tiling=None,
                             group_offset=None, existing_out=None, transpose_rhs=False):
    """Local weights are applied to the first groups, as if group_offset were 0."""
    return gmm_correct(lhs, rhs, group_sizes, preferred_element_type, tiling, None, existing_out, transpose_rhs)


def gmm_square_transpose_ignored(lhs, rhs, group_sizes, preferred_element_type=np.float32, tiling=None,
                                 group_offset=None, existing_out=None, transpose_rhs=False):
    """transpose_rhs is inferred from the weights' shape, so square weights (K == N) are never
    transposed (the relation this harness once never drew with sharding; a shape-sniffing layout bug)."""
    square = _np(rhs).shape[1] == _np(rhs).shape[2]
    return gmm_correct(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset, existing_out,
                       transpose_rhs and not square)


def gmm_k_remainder_dropped(lhs, rhs, group_sizes, preferred_element_type=np.float32, tiling=None,
                            group_offset=None, existing_out=None, transpose_rhs=False):
    """The K loop runs K // tk full tiles: a partial last K tile is dropped (a wrong mask on K % tk;
    github.com/AI-Hypercomputer/maxtext/issues/1183)."""
    lhs, rhs = _np(lhs), _np(rhs)
    tk = (tiling or (128, 128, 128))[1]
    k = lhs.shape[1]
    keep = k - k % tk if k >= tk else k
    rhs = rhs[:, :, :keep] if transpose_rhs else rhs[:, :keep]
    return gmm_correct(lhs[:, :keep], rhs, group_sizes, preferred_element_type, tiling, group_offset, existing_out,
                       transpose_rhs)


# ------------------------------------------------------------- megablox.tgmm
def tgmm_correct(lhs, rhs, group_sizes, preferred_element_type=np.float32, tiling=None, group_offset=None,
                 num_actual_groups=None, existing_out=None):
    """A correct megablox-style tgmm: lhs [M, sum K], rhs [sum K, N] -> [groups, M, N]."""
    lhs, rhs = _np(lhs), _np(rhs)
    go = 0 if group_offset is None else int(np.asarray(group_offset).reshape(-1)[0])
    gs, starts, ends = _ends(group_sizes)
    n_out = num_actual_groups if num_actual_groups is not None else gs.size
    out = np.zeros((n_out, lhs.shape[0], rhs.shape[1]), np.float32)
    for i in range(n_out):
        g = go + i
        if g < gs.size:
            out[i] = _mm32(lhs[:, starts[g]:ends[g]], rhs[starts[g]:ends[g]])
    ex = _np(existing_out)
    if ex is not None:
        out += ex.astype(np.float32)
    return out.astype(preferred_element_type)


def tgmm_all_empty_uninitialized(lhs, rhs, group_sizes, preferred_element_type=np.float32, tiling=None,
                                 group_offset=None, num_actual_groups=None, existing_out=None):
    """Output blocks of empty groups are never written (left holding stale memory)."""
    out = np.asarray(tgmm_correct(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset,
                                  num_actual_groups, existing_out)).copy()
    gs = _np(group_sizes)
    go = 0 if group_offset is None else int(np.asarray(group_offset).reshape(-1)[0])
    for i in range(out.shape[0]):
        if go + i < gs.size and gs[go + i] == 0:
            out[i] = np.asarray(3.0, out.dtype)  # whatever was in memory
    return out


def tgmm_nan_leak_masking(lhs, rhs, group_sizes, preferred_element_type=np.float32, tiling=None,
                          group_offset=None, num_actual_groups=None, existing_out=None):
    """K columns are selected by multiplying with a 0/1 mask: NaN in padding reaches every group."""
    lhs, rhs = _np(lhs).astype(np.float32), _np(rhs).astype(np.float32)
    go = 0 if group_offset is None else int(np.asarray(group_offset).reshape(-1)[0])
    gs, starts, ends = _ends(group_sizes)
    n_out = num_actual_groups if num_actual_groups is not None else gs.size
    ks = np.arange(lhs.shape[1])
    out = np.zeros((n_out, lhs.shape[0], rhs.shape[1]), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(n_out):
            g = go + i
            m = ((ks >= starts[g]) & (ks < ends[g])).astype(np.float32)
            out[i] = (lhs * m[None, :]) @ rhs
    ex = _np(existing_out)
    if ex is not None:
        out += ex.astype(np.float32)
    return out.astype(preferred_element_type)


# --------------------------------------------------------- torch.grouped_mm
def _contiguous_strides(shape):
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def grouped_mm_correct(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """A correct torch._grouped_mm in its four forms, float32 accumulation, strides honoured."""
    import torch

    od = out_dtype or mat_a.dtype
    a, b = mat_a.float(), mat_b.float()
    if offs is None:
        return torch.bmm(a, b).to(od)
    ends = [int(e) for e in offs.tolist()]
    starts = [0, *ends[:-1]]
    if a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2])
        for g, (s, e) in enumerate(zip(starts, ends, strict=True)):
            out[s:e] = a[s:e] @ b[g]
    elif a.dim() == 3 and b.dim() == 2:
        out = torch.zeros(a.shape[1], b.shape[1])
        for g, (s, e) in enumerate(zip(starts, ends, strict=True)):
            out[:, s:e] = a[g] @ b[:, s:e]
    else:
        out = torch.zeros(len(ends), a.shape[0], b.shape[1])
        for g, (s, e) in enumerate(zip(starts, ends, strict=True)):
            out[g] = a[:, s:e] @ b[s:e]
    return out.to(od)


def grouped_mm_bf16_sums_past_256(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Float32 sums of K chunks of 256, added up in bfloat16: exact at every K the drawn modes reach, off by whole
    units at a real layer's K (a split-K reduction or a pipeline stage kept in the input dtype)."""
    import torch

    od = out_dtype or mat_a.dtype
    k = mat_a.shape[-1]
    if k <= 256 or offs is None or mat_a.dim() != 2 or mat_b.dim() != 3:
        return grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
    a, b = mat_a.float(), mat_b.float()
    out = torch.zeros(a.shape[0], b.shape[2])
    ends = [int(e) for e in offs.tolist()]
    for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
        acc = torch.zeros(e - s, b.shape[2], dtype=torch.bfloat16)
        for c in range(0, k, 256):
            acc = acc + (a[s:e, c:c + 256] @ b[g, c:c + 256]).to(torch.bfloat16)
        out[s:e] = acc.float()
    return out.to(od)


def grouped_mm_strides_ignored(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Operands are read as if contiguous: a transposed view, a slice or a chunk reads the wrong memory
    (the class of github.com/pytorch/FBGEMM/pull/4796: one tensor's strides assumed for a
    non-contiguous one)."""
    import torch

    def raw(x):
        if x.is_contiguous():
            return x
        return torch.as_strided(x, x.shape, _contiguous_strides(x.shape), x.storage_offset())

    return grouped_mm_correct(raw(mat_a), raw(mat_b), offs, bias, out_dtype)


def grouped_mm_empty_k_groups_stale(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """2d x 2d (the weight gradient): the output block of a group with no K (no routed tokens) is never
    written, so it holds stale memory (github.com/pytorch/pytorch/issues/172439,
    github.com/tgale96/grouped_gemm/issues/36, github.com/NVIDIA/TransformerEngine/issues/2499)."""
    return stale_empty_k_blocks(grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype), mat_a, mat_b, offs)


def grouped_mm_spanning_tiles_dropped(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """2d x 3d: the scheduler computes at most two 32-row tiles of a group, so rows of a group that
    spans three or more tiles are never written (github.com/flashinfer-ai/flashinfer/pull/3533)."""
    out = grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
    if offs is not None and mat_a.dim() == 2 and mat_b.dim() == 3:
        ends = [int(e) for e in offs.tolist()]
        for s, e in zip([0, *ends[:-1]], ends, strict=True):
            if e > s:
                third = (s // 32 + 2) * 32
                if third < e:
                    out[third:e] = 0
    return out


def grouped_mm_rejects_float32_out(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Rejects the documented float32 output from bfloat16 inputs (torch 2.13's CPU path does:
    'Grouped gemm output dtype must match mat_a dtype'; its CUDA path and docs take it)."""
    if out_dtype is not None and out_dtype != mat_a.dtype:
        raise RuntimeError("Grouped gemm output dtype must match mat_a dtype")
    return grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)


# convention -> [(name, fn, what the message must name)]
BROKEN = {
    "ragged_dot": [
        ragged_dot_boundary_off_by_one,
        ragged_dot_empty_groups_reindexed,
        ragged_dot_tail_not_zeroed,
        ragged_dot_k_remainder_skipped,
        ragged_dot_bf16_partial_sums,
        ragged_dot_nan_leak_masking,
        ragged_dot_output_dtype_ignored,
        ragged_dot_int8_accumulator,
        ragged_dot_group_table_of_eight,
        ragged_dot_boundary_inside_tile,
        ragged_dot_half_the_m_tiles,
        ragged_dot_n_overhang_unmasked,
        ragged_dot_last_row_next_expert,
    ],
    "megablox.gmm": [gmm_group_offset_ignored, gmm_square_transpose_ignored, gmm_k_remainder_dropped],
    "torch.grouped_mm": [grouped_mm_strides_ignored, grouped_mm_empty_k_groups_stale,
                         grouped_mm_spanning_tiles_dropped, grouped_mm_rejects_float32_out],
    "megablox.tgmm": [tgmm_all_empty_uninitialized, tgmm_nan_leak_masking],
    "torch.scaled_grouped_mm": [scaled_mm_weight_scales_of_previous_group, scaled_mm_row_scales_not_offset,
                                scaled_mm_bfloat16_partial_sums, scaled_mm_dequantized_to_bfloat16,
                                scaled_mm_empty_k_groups_stale, scaled_mm_mx_scale_blocks_unpadded],
    "qwix.ragged_dot": [qwix_weight_scales_of_group_zero, qwix_k_tile_scales_reversed, qwix_int4_read_unsigned],
    "deep_gemm.m_grouped_contiguous": [contiguous_group_of_last_row, contiguous_bf16_block_sums],
    "deep_gemm.m_grouped_contiguous_psum": [contiguous_group_of_last_row],
    "deep_gemm.m_grouped_masked": [masked_blocks_spill_into_next_group, masked_count_from_expected_m],
    "vllm.batched_moe": [batched_writes_every_row, batched_block_scales_per_tile],
    "torchao.nvfp4_grouped_mm": [nvfp4_activation_nibbles_swapped, nvfp4_scale_per_32],
    "te.scaled_grouped_gemm": [te_scaled_scale_pointer_stuck_on_empty_groups],
    "torch.scaled_grouped_mm_v2": [nvfp4_v2_first_group_global],
}
CORRECT = {
    "ragged_dot": ragged_dot_correct,
    "megablox.gmm": gmm_correct,
    "megablox.tgmm": tgmm_correct,
    "torch.grouped_mm": grouped_mm_correct,
    "torch.scaled_grouped_mm": scaled_mm_correct,
    "qwix.ragged_dot": qwix_correct,
    "deep_gemm.m_grouped_contiguous": contiguous_correct,
    "deep_gemm.m_grouped_contiguous_psum": contiguous_correct,
    "deep_gemm.m_grouped_masked": masked_correct,
    "vllm.batched_moe": batched_correct,
    "torchao.nvfp4_grouped_mm": nvfp4_correct,
    "te.scaled_grouped_gemm": te_scaled_correct,
    "torch.scaled_grouped_mm_v2": nvfp4_v2_correct,
}


# ---------------------------------------------------------- gradients (jax)
@functools.cache
def _rolled_rhs_grad(ped):
    import jax
    import jax.numpy as jnp
    from jax import lax

    def fwd_fn(lhs, rhs, gs):
        return lax.ragged_dot(lhs, rhs, gs, preferred_element_type=ped)

    @jax.custom_vjp
    def f(lhs, rhs, gs):
        return fwd_fn(lhs, rhs, gs)

    def fwd(lhs, rhs, gs):
        return fwd_fn(lhs, rhs, gs), (lhs, rhs, gs)

    def bwd(res, g):
        lhs, rhs, gs = res
        _, pull = jax.vjp(lambda a, b: fwd_fn(a, b, gs), lhs, rhs)
        dl, dr = pull(g)
        return dl, jnp.roll(dr, 1, axis=0), None  # each expert's weight gradient lands on the next

    f.defvjp(fwd, bwd)
    return f


def ragged_dot_weight_grad_misrouted(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Forward is lax.ragged_dot; the backward hands each group's weight gradient to the next group."""
    return _rolled_rhs_grad(preferred_element_type)(lhs, rhs, group_sizes)


BROKEN_GRADIENTS = {"ragged_dot": [ragged_dot_weight_grad_misrouted]}


# ------------------------------------------------- for the reports' own tests
def ragged_dot_always_raises(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Raises the same exception on every input (an unsupported-argument check gone wrong)."""
    raise TypeError("always_raises: unsupported argument combination")


def ragged_dot_one_row_short(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Returns one output row too few (a jax kernel, so that its gradient can be asked for too)."""
    from jax import lax

    return lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=preferred_element_type)[:-1]


def ragged_dot_via_lax(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """A user kernel that calls lax.ragged_dot (and so inherits its upstream bugs on this backend)."""
    from jax import lax

    return lax.ragged_dot(lhs, rhs, group_sizes, precision=precision, preferred_element_type=preferred_element_type)

