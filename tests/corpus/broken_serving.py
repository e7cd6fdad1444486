"""Deliberately broken kernels of the serving layouts, each re-creating a real class of bug, and correct twins.

They take the conventions' own signatures with torch tensors (``deep_gemm.m_grouped_contiguous`` and
``_psum``, ``deep_gemm.m_grouped_masked``, ``vllm.batched_moe``) and write their output buffer in place, as
the real kernels do. The correct twins compute the way the real kernels do, padding included: DeepGEMM
computes whole ``BLOCK_M`` row blocks (a padding row inside a group's last block is that row of ``a`` times
the group's weights, written to ``d``), so the harness must not cry wolf on rows no group owns.
"""

from __future__ import annotations

BLOCK_M = 64  # DeepGEMM's math warpgroup: a 64-row half whose first row is padding is written as zeros
BLOCK_K = 128


# ------------------------------------------------------------------------------------------- arithmetic
def _product(a, b, *, block_dtype=None, k_step=BLOCK_K, k_scale_block=BLOCK_K):
    """One group's ``a [rows, K] @ b[N, K]^T`` as DeepGEMM computes it: FP8 code products summed per K tile of
    ``k_step`` in float32, promoted with both scales (the scale block ``j // k_scale_block``) into a float32
    accumulator; bf16 operands in float32. ``block_dtype``: keep each tile's partial sums in that dtype (a
    promotion skipped)."""
    import torch

    if not isinstance(a, tuple):
        return a.float() @ b.float().T
    (ca, sa), (cb, sb) = a, b
    k = ca.shape[1]
    rows_b = 1 if sb.shape[0] == cb.shape[0] else 128  # per channel, or 128x128 blocks
    acc = torch.zeros(ca.shape[0], cb.shape[0])
    for j in range(0, k, k_step):
        part = ca[:, j:j + k_step].float() @ cb[:, j:j + k_step].float().T
        if block_dtype is not None:
            part = part.to(block_dtype).float()
        col = min(j // k_scale_block, sa.shape[1] - 1)  # past the last block: what the memory there holds
        s_a = sa[:, col].float()[:, None]
        s_b = torch.repeat_interleave(sb[:, col].float(), rows_b)[:cb.shape[0]][None, :]
        acc += (s_a * s_b) * part
    return acc


def _rows(x, lo, hi):
    return (x[0][lo:hi], x[1][lo:hi]) if isinstance(x, tuple) else x[lo:hi]


def _group(x, g):
    return (x[0][g], x[1][g]) if isinstance(x, tuple) else x[g]


def _contiguous_groups(grouped_layout, use_psum_layout, m):
    """(per-row group ids) of either form of DeepGEMM's contiguous layout (alignment 128)."""
    import torch

    if not use_psum_layout:
        return grouped_layout
    ids = torch.full((m,), -1, dtype=torch.int32)
    start = 0
    for g, end in enumerate(grouped_layout.tolist()):
        start = 0 if g == 0 else -(-start // 128) * 128
        ids[start:min(end, m)] = g
        start = end
    return ids


def _contiguous(a, b, d, grouped_layout, use_psum_layout=False, *, group_row="first", block_dtype=None):
    """DeepGEMM's contiguous kernel: each BLOCK_M block of rows takes the group of its ``group_row`` row; a
    block whose first row is padding is written as zeros, any other block computed whole."""
    import torch

    codes = a[0] if isinstance(a, tuple) else a
    m = codes.shape[0]
    ids = _contiguous_groups(grouped_layout, use_psum_layout, m)
    for lo in range(0, m, BLOCK_M):
        hi = min(lo + BLOCK_M, m)
        g = int(ids[lo if group_row == "first" else hi - 1])
        if int(ids[lo]) < 0:
            d[lo:hi] = 0
            continue
        d[lo:hi] = _product(_rows(a, lo, hi), _group(b, max(g, 0)), block_dtype=block_dtype).to(torch.bfloat16)


# --------------------------------------------------------------------- deep_gemm.m_grouped_contiguous
def contiguous_correct(a, b, d, grouped_layout, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False,
                       use_psum_layout=False, ensure_zero_padding=True, expected_m_for_psum_layout=None):
    """DeepGEMM's contiguous layout done right: whole 64-row blocks, padding rows computed or zeroed."""
    _contiguous(a, b, d, grouped_layout, use_psum_layout)


def contiguous_group_of_last_row(a, b, d, grouped_layout, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False,
                                 use_psum_layout=False, ensure_zero_padding=True, expected_m_for_psum_layout=None):
    """Each row block takes its group from its last row: in a group's last block that row is padding, -1,
    clamped to group 0, so the group's real rows are multiplied by expert 0's weights (a -1 padding row read)."""
    _contiguous(a, b, d, grouped_layout, use_psum_layout, group_row="last")


def contiguous_bf16_block_sums(a, b, d, grouped_layout, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False,
                               use_psum_layout=False, ensure_zero_padding=True, expected_m_for_psum_layout=None):
    """Each 128-wide K block's partial sums rounded to bfloat16 before the promotion (the float32 promotion
    skipped)."""
    import torch

    _contiguous(a, b, d, grouped_layout, use_psum_layout, block_dtype=torch.bfloat16)


# ------------------------------------------------------------------------- deep_gemm.m_grouped_masked
def _masked(a, b, d, masked_m, *, count=None, spill=False):
    import torch

    codes = a[0] if isinstance(a, tuple) else a
    g_count, m = codes.shape[0], codes.shape[1]
    # the kernel's 2-D view of d: [G * M, N] (the spilling kernel's only: d may be strided, as the strided cells give)
    flat = d.view(g_count * m, d.shape[2]) if spill else None
    for g in reversed(range(g_count)):  # the scheduler's order: any
        valid = int(masked_m[g]) if count is None else min(count, m)
        if valid == 0:
            continue
        rows = -(-valid // BLOCK_M) * BLOCK_M if spill else valid
        part = _product(_rows(_group(a, g), 0, valid), _group(b, g)).to(torch.bfloat16)
        if spill:  # whole BLOCK_M blocks stored through the 2-D view: past M they land in the next group
            pad = _product(_rows(_group(a, g), 0, m), _group(b, g)).to(torch.bfloat16)
            end = min(g * m + rows, g_count * m)
            block = torch.cat([part, pad[valid:]])[:end - g * m]
            if end - g * m > block.shape[0]:  # the rows past this group's matrix: the next group's a rows
                nxt = _product(_rows(_group(a, g + 1), 0, end - g * m - block.shape[0]),
                               _group(b, g)).to(torch.bfloat16)
                block = torch.cat([block, nxt])
            flat[g * m:end] = block  # type: ignore[index]
        else:
            d[g, :valid] = part


def masked_correct(a, b, d, masked_m, expected_m, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False):
    """DeepGEMM's masked layout done right: each group's first masked_m[g] rows."""
    _masked(a, b, d, masked_m)


def masked_blocks_spill_into_next_group(a, b, d, masked_m, expected_m, recipe=None, compiled_dims="nk",
                                        disable_ue8m0_cast=False):
    """Stores whole 64-row blocks through a [G * M, N] view of d: when a group's count rounded up to the block
    passes M, the store runs into the next group's first rows (masked rows written into another group)."""
    _masked(a, b, d, masked_m, spill=True)


def masked_count_from_expected_m(a, b, d, masked_m, expected_m, recipe=None, compiled_dims="nk",
                                 disable_ue8m0_cast=False):
    """Takes the hint expected_m for every group's row count: rows past it are never computed."""
    _masked(a, b, d, masked_m, count=int(expected_m))


# ------------------------------------------------------------------------------------- vllm.batched_moe
def _batched(A, B, C, expert_num_tokens, compute_type, A_scale, B_scale, per_act_token_quant, block_shape,
             *, write_all=False, k_tile=BLOCK_K):
    e_count, m = A.shape[0], A.shape[1]
    for e in range(e_count):
        count = m if write_all else int(expert_num_tokens[e])
        if count == 0:
            continue
        a, b = A[e, :count], B[e]
        if A_scale is None:
            out = a.float() @ b.float().T
        elif block_shape is not None:
            out = _product((a, A_scale[e, :count]), (b, B_scale[e]), k_step=k_tile, k_scale_block=k_tile)
        else:
            sa = A_scale[e, :count, 0] if per_act_token_quant else A_scale[e].reshape(1).expand(count)
            sb = B_scale[e, :, 0] if per_act_token_quant else B_scale[e].reshape(1).expand(b.shape[0])
            out = (a.float() @ b.float().T) * sa.float()[:, None] * sb.float()[None, :]
        C[e, :count] = out


def batched_correct(A, B, C, expert_num_tokens, compute_type=None, A_scale=None, B_scale=None, B_zp=None,
                    use_fp8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False, config=None,
                    per_act_token_quant=False, block_shape=None):
    """vLLM's batched experts done right: each expert's first expert_num_tokens[e] rows, the rest of C kept."""
    _batched(A, B, C, expert_num_tokens, compute_type, A_scale, B_scale, per_act_token_quant, block_shape)


def batched_writes_every_row(A, B, C, expert_num_tokens, compute_type=None, A_scale=None, B_scale=None, B_zp=None,
                             use_fp8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False, config=None,
                             per_act_token_quant=False, block_shape=None):
    """Computes and stores every row of every expert, past its token count too (masked rows written): what C
    held there is lost."""
    _batched(A, B, C, expert_num_tokens, compute_type, A_scale, B_scale, per_act_token_quant, block_shape,
             write_all=True)


def batched_block_scales_per_tile(A, B, C, expert_num_tokens, compute_type=None, A_scale=None, B_scale=None,
                                  B_zp=None, use_fp8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False,
                                  config=None, per_act_token_quant=False, block_shape=None):
    """Block scales indexed by the kernel's K tile (BLOCK_SIZE_K = 64) instead of the 128-wide scale block: the
    second half of every scale block takes the next block's scales (a scale applied per wrong block)."""
    _batched(A, B, C, expert_num_tokens, compute_type, A_scale, B_scale, per_act_token_quant, block_shape,
             k_tile=64)
