"""Deliberately broken scaled (quantized) grouped GEMM kernels, each re-creating a real class of bug, and
their correct twins (``torch.scaled_grouped_mm`` and ``qwix.ragged_dot`` conventions)."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np


# ------------------------------------------------- torch.scaled_grouped_mm (rowwise FP8)
def _scaled_groups(mat_a, mat_b, scale_a, scale_b, offs):
    """(out, [(out index, a, b, sa, sb)]) of the four forms: each group's codes and rowwise scales."""
    import torch

    a, b = mat_a.float(), mat_b.float()
    if offs is None:
        out = torch.zeros(a.shape[0], a.shape[1], b.shape[2])
        return out, [((g,), a[g], b[g], scale_a[g], scale_b[g]) for g in range(a.shape[0])]
    ends = [int(e) for e in offs.tolist()]
    spans = list(zip([0, *ends[:-1]], ends, strict=True))
    if a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2])
        return out, [((slice(s, e),), a[s:e], b[g], scale_a[s:e], scale_b[g]) for g, (s, e) in enumerate(spans)]
    if a.dim() == 3:
        out = torch.zeros(a.shape[1], b.shape[1])
        return out, [((slice(None), slice(s, e)), a[g], b[:, s:e], scale_a[g], scale_b[s:e])
                     for g, (s, e) in enumerate(spans)]
    m, n = a.shape[0], b.shape[1]
    out = torch.zeros(len(spans), m, n)
    return out, [((g,), a[:, s:e], b[s:e], scale_a[g * m:(g + 1) * m], scale_b[g * n:(g + 1) * n])
                 for g, (s, e) in enumerate(spans)]


def _mx_grouped(mat_a, mat_b, scale_a, scale_b, offs, out_dtype, *, padded_offsets=True):
    """torch's MXFP8 form (2d-3d or 2d-2d): each group's e8m0 scales read back from its swizzled block (blocks one
    after the other, each padded to 128 rows; ``padded_offsets=False``: the next block sought right after the
    group's own rows, as if unpadded), code times scale summed exactly in float64."""
    import torch

    from gmm_kernels.sandbox.convert import to_torch
    from gmm_ref import as_numpy, round_to
    from gmm_ref.scaled.layouts import blocked_shape, from_blocked

    a, b = as_numpy(mat_a).astype(np.float64), as_numpy(mat_b).astype(np.float64)
    fa, fb = as_numpy(scale_a).reshape(-1).astype(np.float64), as_numpy(scale_b).reshape(-1).astype(np.float64)
    ends = [0, *np.asarray(as_numpy(offs)).astype(np.int64).tolist()]

    def blocks(flat, shapes):
        out, at = [], 0
        for r, c in shapes:
            out.append(from_blocked(flat[at:at + int(np.prod(blocked_shape(r, c)))], r, c))
            at += int(np.prod(blocked_shape(r, c))) if padded_offsets else r * blocked_shape(r, c)[1]
        return out

    def deq(x, s):  # [rows, K] values with [rows, ceil(K/32)] scales
        return x * np.repeat(s, 32, axis=1)[:, :x.shape[1]] if x.size else x

    spans = list(itertools.pairwise(ends))
    if b.ndim == 3:  # 2d-3d: ragged M
        kb = -(-a.shape[1] // 32)
        sa = blocks(fa, [(hi - lo, kb) for lo, hi in spans])
        sb = blocks(fb, [(b.shape[2], kb)] * len(spans))
        out = np.zeros((a.shape[0], b.shape[2]))
        for g, (lo, hi) in enumerate(spans):
            out[lo:hi] = deq(a[lo:hi], sa[g]) @ deq(b[g].T, sb[g]).T
    else:  # 2d-2d: ragged K
        sa = blocks(fa, [(a.shape[0], -(-(hi - lo) // 32)) for lo, hi in spans])
        sb = blocks(fb, [(b.shape[1], -(-(hi - lo) // 32)) for lo, hi in spans])
        out = np.zeros((len(spans), a.shape[0], b.shape[1]))
        for g, (lo, hi) in enumerate(spans):
            out[g] = deq(a[:, lo:hi], sa[g]) @ deq(b[lo:hi].T, sb[g]).T
    return to_torch(round_to(out, "bfloat16")).to(out_dtype or torch.bfloat16)


def _is_mx(scale_a):
    import torch

    return scale_a.dtype == torch.float8_e8m0fnu


def scaled_mm_correct(mat_a, mat_b, scale_a, scale_b, offs=None, out_dtype=None):
    """A correct rowwise FP8 grouped GEMM: exact code products summed in float32, both scales after the K loop (and
    the MXFP8 form: each group's scales from its own padded, swizzled block)."""
    import torch

    if _is_mx(scale_a):
        return _mx_grouped(mat_a, mat_b, scale_a, scale_b, offs, out_dtype)
    out, groups = _scaled_groups(mat_a, mat_b, scale_a, scale_b, offs)
    for where, a, b, sa, sb in groups:
        out[where] = (a @ b) * sa[:, None] * sb[None, :]
    return out.to(out_dtype or torch.bfloat16)


def scaled_mm_weight_scales_of_previous_group(mat_a, mat_b, scale_a, scale_b, offs=None, out_dtype=None):
    """Group g > 0 reads the weight (column) scales of group g - 1: a scale pointer advanced one group too few."""
    import torch

    out, groups = _scaled_groups(mat_a, mat_b, scale_a, scale_b, offs)
    sbs = [sb for *_, sb in groups]
    for g, (where, a, b, sa, _) in enumerate(groups):
        sb = sbs[max(g - 1, 0)]
        if sb.shape != sbs[g].shape:
            sb = sbs[g]
        out[where] = (a @ b) * sa[:, None] * sb[None, :]
    return out.to(out_dtype or torch.bfloat16)


def scaled_mm_row_scales_not_offset(mat_a, mat_b, scale_a, scale_b, offs=None, out_dtype=None):
    """2d x 3d: every group reads the token (row) scales from row 0 instead of from its own first row: the
    scale pointer is not advanced by the group's offset, as the codes' pointer is."""
    import torch

    out, groups = _scaled_groups(mat_a, mat_b, scale_a, scale_b, offs)
    ragged_m = offs is not None and mat_a.dim() == 2 and mat_b.dim() == 3
    for where, a, b, sa, sb in groups:
        if ragged_m:
            sa = scale_a[:a.shape[0]]
        out[where] = (a @ b) * sa[:, None] * sb[None, :]
    return out.to(out_dtype or torch.bfloat16)


def scaled_mm_bfloat16_partial_sums(mat_a, mat_b, scale_a, scale_b, offs=None, out_dtype=None):
    """The K loop's partial sums kept in bfloat16 (a promotion to float32 skipped): fine for a few K, wrong for
    the K of a real layer."""
    import torch

    out, groups = _scaled_groups(mat_a, mat_b, scale_a, scale_b, offs)
    for where, a, b, sa, sb in groups:
        acc = torch.zeros(a.shape[0], b.shape[1])
        for kk in range(a.shape[1]):
            acc = (acc + a[:, kk:kk + 1] * b[kk:kk + 1, :]).to(torch.bfloat16).float()
        out[where] = acc * sa[:, None] * sb[None, :]
    return out.to(out_dtype or torch.bfloat16)


def scaled_mm_dequantized_to_bfloat16(mat_a, mat_b, scale_a, scale_b, offs=None, out_dtype=None):
    """Each operand dequantized (code * scale) into bfloat16 before the matmul, while the kernel claims a float32
    path: every element loses its low bits before the sum."""
    import torch

    out, groups = _scaled_groups(mat_a, mat_b, scale_a, scale_b, offs)
    for where, a, b, sa, sb in groups:
        da = (a * sa[:, None]).to(torch.bfloat16).float()
        db = (b * sb[None, :]).to(torch.bfloat16).float()
        out[where] = da @ db
    return out.to(out_dtype or torch.bfloat16)


def scaled_mm_mx_scale_blocks_unpadded(mat_a, mat_b, scale_a, scale_b, offs=None, out_dtype=None):
    """MXFP8: each group's scale block sought right after the previous group's rows, as if the blocks were not
    padded to 128 rows (a scale offset computed from the group's size instead of its size rounded up)."""
    if _is_mx(scale_a):
        return _mx_grouped(mat_a, mat_b, scale_a, scale_b, offs, out_dtype, padded_offsets=False)
    return scaled_mm_correct(mat_a, mat_b, scale_a, scale_b, offs, out_dtype)


def scaled_mm_empty_k_groups_stale(mat_a, mat_b, scale_a, scale_b, offs=None, out_dtype=None):
    """2d x 2d: the output block of a group with no K is never written, so it holds stale memory."""
    return stale_empty_k_blocks(scaled_mm_correct(mat_a, mat_b, scale_a, scale_b, offs, out_dtype), mat_a, mat_b, offs)


def stale_empty_k_blocks(out, mat_a, mat_b, offs):
    """``out`` with the [M, N] block of every empty group of a 2d x 2d call holding stale values (3.0)."""
    if offs is not None and mat_a.dim() == 2 and mat_b.dim() == 2:
        ends = [int(e) for e in offs.tolist()]
        for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
            if e == s:
                out[g] = 3.0
    return out


# ----------------------------------------------------------- qwix.ragged_dot (QArray operands)
def _qwix_parts(lhs, rhs, group_sizes):
    """(codes and scales of lhs [T, K] / rhs [G, K, N] as float64 NumPy, group ends, K tile width)."""
    a, sa = (np.asarray(x, np.float64) for x in lhs)
    b, sb = (np.asarray(x, np.float64) for x in rhs)
    k = a.shape[1]
    tiles = max(sa.shape[1], sb.shape[1])
    ends = np.concatenate([[0], np.cumsum(np.asarray(group_sizes))])
    return a, sa, b, sb, ends, k // tiles, tiles


def qwix_correct(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None):
    """QArray x QArray as qwix's fast path does it: code products summed in float32 per K tile, each tile's
    sums times its scales, the tiles summed."""
    a, sa, b, sb, ends, width, tiles = _qwix_parts(lhs, rhs, group_sizes)
    out = np.zeros((a.shape[0], b.shape[2]), np.float32)
    for g in range(b.shape[0]):
        lo, hi = ends[g], ends[g + 1]
        for t in range(tiles):
            ks = slice(t * width, (t + 1) * width)
            part = a[lo:hi, ks].astype(np.float32) @ b[g, ks].astype(np.float32)
            ls = sa[lo:hi, min(t, sa.shape[1] - 1)][:, None].astype(np.float32)
            rs = sb[min(g, sb.shape[0] - 1), min(t, sb.shape[1] - 1)][None, :].astype(np.float32)
            out[lo:hi] += part * ls * rs
    return out.astype(preferred_element_type or np.float32)


def qwix_weight_scales_of_group_zero(lhs, rhs, group_sizes, precision=None, preferred_element_type=None,
                                     group_offset=None):
    """Every group multiplies by the first group's weight scales (a per-group scale table indexed without the
    group): right for G = 1 or equal scales only."""
    qv, scale = rhs
    return qwix_correct(lhs, type(rhs)(qv, np.broadcast_to(np.asarray(scale)[:1], np.shape(scale))), group_sizes,
                        precision, preferred_element_type, group_offset)


def qwix_k_tile_scales_reversed(lhs, rhs, group_sizes, precision=None, preferred_element_type=None,
                                group_offset=None):
    """The K tiles' activation scales applied in reverse order (a tile index counted from the wrong end)."""
    qv, scale = lhs
    return qwix_correct(type(lhs)(qv, np.asarray(scale)[:, ::-1]), rhs, group_sizes, precision,
                        preferred_element_type, group_offset)


def qwix_int4_read_unsigned(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None):
    """int4 weight codes unpacked without sign extension: -8..-1 read as 8..15 (int8 and float8 codes right)."""
    qv, scale = rhs
    codes = np.asarray(qv)
    if codes.dtype == np.dtype(ml_dtypes.int4):
        codes = codes.astype(np.int64) % 16
    return qwix_correct(lhs, type(rhs)(codes, scale), group_sizes, precision, preferred_element_type, group_offset)


# ----------------------------------- kernels that quantize inside: MXFP8 (torch.grouped_mm convention, ragged M)
def _mxfp8(mat_a, mat_b, offs, out_dtype, *, mode="rceil", weights_along_n=False):
    """Quantize bfloat16 activations and weights to MXFP8 (1x32 along K, e8m0), dequantize exactly, multiply."""
    import torch

    import gmm_ref
    from gmm_kernels.sandbox.convert import to_torch

    a = gmm_ref.as_numpy(mat_a).astype(np.float64)
    b = gmm_ref.as_numpy(mat_b).astype(np.float64)
    e4m3 = "float8_e4m3fn"

    def dequant(x):  # [rows, K] -> its MX value, blocks along K
        codes, scales = gmm_ref.to_mx(x, 32, e4m3, mode)
        return codes.astype(np.float64) * np.repeat(scales.astype(np.float64), 32, axis=-1)[..., :x.shape[-1]]

    da = dequant(a)
    ends = [0, *np.asarray(gmm_ref.as_numpy(offs)).astype(np.int64).tolist()]
    out = np.zeros((a.shape[0], b.shape[2]))
    for g in range(b.shape[0]):
        db = dequant(b[g]) if weights_along_n else dequant(b[g].T).T  # the bug: blocks along N
        with np.errstate(invalid="ignore", over="ignore"):
            out[ends[g]:ends[g + 1]] = da[ends[g]:ends[g + 1]] @ db
    return to_torch(gmm_ref.round_to(out, "bfloat16")).to(out_dtype or torch.bfloat16)


def _declared(fn):
    from gmm_kernels import declare
    from gmm_ref import MXQuantizer

    mx = MXQuantizer("float8_e4m3fn", 32, "rceil")
    return declare("torch.grouped_mm", families=("ragged_m",), dtypes=("bfloat16",), out_dtypes=("bfloat16",),
                   multiples={"k": 32}, zero_extents=("m",), quantizes=(mx, mx))(fn)


def mxfp8_correct_undeclared(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """A correct MXFP8 grouped mm (RCEIL scales), exact after quantization; its format not declared."""
    return _mxfp8(mat_a, mat_b, offs, out_dtype)


@_declared
def mxfp8_correct(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """A correct MXFP8 grouped mm, its format (1x32 e8m0 RCEIL on both operands) declared."""
    return _mxfp8(mat_a, mat_b, offs, out_dtype)


@_declared
def mxfp8_floor_scales(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Declares RCEIL scales but computes them with FLOOR (the OCP rule): a block whose largest value's
    mantissa passes 1.75 saturates."""
    return _mxfp8(mat_a, mat_b, offs, out_dtype, mode="floor")


@_declared
def mxfp8_weight_blocks_along_n(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The weights' 1x32 blocks taken along N instead of K (a scale applied per wrong block)."""
    return _mxfp8(mat_a, mat_b, offs, out_dtype, weights_along_n=True)


# --------------------------------------------------- torchao.nvfp4_grouped_mm (packed e2m1, e4m3 x 16)
def _nvfp4(A_data, A_scale, B_data, B_scale, offs, out_dtype, *, swap_nibbles=False, block=16):
    """torchao's NVFP4 2d-3d: unpack the codes (even index in the low nibble; the activations' high one first when
    ``swap_nibbles``), apply each ``block``-wide scale, sum each group exactly in float64."""
    import torch

    from gmm_kernels.sandbox.convert import to_torch
    from gmm_ref import as_numpy, round_to

    def unpack(packed, swap=False):
        b = as_numpy(packed).view(np.uint8)
        lo, hi = (b >> 4, b & 0xF) if swap else (b & 0xF, b >> 4)
        codes = np.stack([lo, hi], axis=-1).reshape(*b.shape[:-1], 2 * b.shape[-1])
        return codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64)

    def deq(codes, scales):
        return codes * np.repeat(as_numpy(scales).astype(np.float64), block, axis=-1)[..., :codes.shape[-1]]

    step = block // 16
    a, b = deq(unpack(A_data, swap_nibbles), A_scale[:, ::step]), deq(unpack(B_data), B_scale[..., ::step])
    ends = [0, *np.asarray(as_numpy(offs)).astype(np.int64).tolist()]
    out = np.zeros((a.shape[0], b.shape[1]))
    for g, (s, e) in enumerate(itertools.pairwise(ends)):
        out[s:e] = a[s:e] @ b[g].T
    dtype = out_dtype or torch.bfloat16
    return to_torch(round_to(out, ml_dtypes.bfloat16 if dtype == torch.bfloat16 else np.float32))


def nvfp4_correct(A_data, A_scale, B_data, B_scale, offs=None, out_dtype=None, block_size=16):
    """torchao's NVFP4 grouped mm, exactly: codes times their e4m3 scale per 16 of K, one rounding."""
    return _nvfp4(A_data, A_scale, B_data, B_scale, offs, out_dtype)


def nvfp4_activation_nibbles_swapped(A_data, A_scale, B_data, B_scale, offs=None, out_dtype=None, block_size=16):
    """The activations' packed codes read high nibble first (the weights' right): each pair of neighbouring
    activation elements along K trades places. (Swapped in both operands, the sums would not change.)"""
    return _nvfp4(A_data, A_scale, B_data, B_scale, offs, out_dtype, swap_nibbles=True)


def nvfp4_scale_per_32(A_data, A_scale, B_data, B_scale, offs=None, out_dtype=None, block_size=16):
    """An MXFP4 path reused: each scale taken to cover 32 elements of K (every other NVFP4 scale read)."""
    return _nvfp4(A_data, A_scale, B_data, B_scale, offs, out_dtype, block=32)


# ------------------------------------------- te.scaled_grouped_gemm (per-group tensor scales, MXFP8)
def _te_scaled(lhs, rhs, lhs_first_dims, preferred_element_type, *, packed_scale_index=False):
    """TE's FP8 grouped GEMM (ragged M, NT), exactly. ``packed_scale_index``: per-tensor scales read at a pointer
    that is not advanced past an empty group (TE's V1 grouped GEMM with tensor scaling), so every group after an
    empty one takes an earlier group's scale_inv."""
    from gmm_ref import round_to
    from gmm_ref.scaled.layouts import blocked_shape, from_blocked

    a, b = np.asarray(lhs.data).astype(np.float64), np.asarray(rhs.data).astype(np.float64)
    sizes = np.asarray(lhs_first_dims).astype(np.int64)
    ends = np.concatenate([[0], np.cumsum(sizes)])
    k, kb = a.shape[1], -(-a.shape[1] // 32)
    out = np.zeros((a.shape[0], b.shape[1]))
    at_a = at_b = 0
    slot = 0  # the scale pointer of the buggy kernel
    for g in range(len(sizes)):
        lo, hi = int(ends[g]), int(ends[g + 1])
        if lhs.scaling_mode == "tensor":
            i = slot if packed_scale_index else g
            da = a[lo:hi] * float(np.asarray(lhs.scale_inv)[i])
            db = b[g] * float(np.asarray(rhs.scale_inv)[i])
            slot += int(hi > lo)
        else:
            def deq(x, flat, at, rows):
                size = int(np.prod(blocked_shape(rows, kb))) if rows else 0
                s = from_blocked(np.asarray(flat)[at:at + size], rows, kb).astype(np.float64) if rows else None
                return (x if s is None else x * np.repeat(s, 32, axis=1)[:, :k]), at + size

            da, at_a = deq(a[lo:hi], lhs.scale_inv, at_a, hi - lo)
            db, at_b = deq(b[g], rhs.scale_inv, at_b, b.shape[1])
        out[lo:hi] = da @ db.T
    return round_to(out, preferred_element_type or ml_dtypes.bfloat16)


def te_scaled_correct(lhs, rhs, *, lhs_first_dims=None, lhs_last_dims=None, rhs_first_dims=None, rhs_last_dims=None,
                      contracting_dims=((1,), (1,)), preferred_element_type=None):
    """TE's FP8 grouped GEMM, exactly: group g's codes times its own scale_inv (or its MXFP8 blocks)."""
    return _te_scaled(lhs, rhs, lhs_first_dims, preferred_element_type)


def te_scaled_scale_pointer_stuck_on_empty_groups(lhs, rhs, *, lhs_first_dims=None, lhs_last_dims=None,
                                                  rhs_first_dims=None, rhs_last_dims=None,
                                                  contracting_dims=((1,), (1,)), preferred_element_type=None):
    """Per-tensor scaling: the scale_inv pointers advance only past non-empty groups (as TE's V1 grouped GEMM
    reads them), so after an empty group every group multiplies by an earlier group's scales."""
    return _te_scaled(lhs, rhs, lhs_first_dims, preferred_element_type, packed_scale_index=True)


# -------------------------------------------- torch.scaled_grouped_mm_v2 (NVFP4: blocks x per-group global)
def _nvfp4_v2(mat_a, mat_b, scale_a, scale_b, offs, *, first_global=False):
    """torch's NVFP4 2d-3d, exactly: codes x swizzled e4m3 block scales x each group's global scales
    (``first_global``: group 0's globals for every group, a per-tensor global broadcast over the groups)."""
    from gmm_kernels.sandbox.convert import to_torch
    from gmm_ref import as_numpy, round_to
    from gmm_ref.scaled.layouts import group_blocks, unpack_fp4

    a = unpack_fp4(as_numpy(mat_a)).astype(np.float64)
    b = unpack_fp4(np.swapaxes(as_numpy(mat_b), 1, 2)).astype(np.float64)  # [G, N, K]
    k, kb = a.shape[1], a.shape[1] // 16
    ends = [0, *np.asarray(as_numpy(offs)).astype(np.int64).tolist()]
    spans = list(itertools.pairwise(ends))
    sa = group_blocks("scale_a", as_numpy(scale_a[0]), [(e - s, kb) for s, e in spans], True)
    sb = group_blocks("scale_b", as_numpy(scale_b[0]), [(b.shape[1], kb)] * len(spans), True)
    ga, gb = as_numpy(scale_a[1]).astype(np.float64), as_numpy(scale_b[1]).astype(np.float64)
    out = np.zeros((a.shape[0], b.shape[1]))
    for g, (s, e) in enumerate(spans):
        i = 0 if first_global else g
        da = a[s:e] * np.repeat(sa[g].astype(np.float64), 16, axis=1)[:, :k] * ga[i]
        db = b[g] * np.repeat(sb[g].astype(np.float64), 16, axis=1)[:, :k] * gb[i]
        out[s:e] = da @ db.T
    return to_torch(round_to(out, ml_dtypes.bfloat16))


def nvfp4_v2_correct(mat_a, mat_b, scale_a, scale_recipe_a, scale_b, scale_recipe_b, swizzle_a=None, swizzle_b=None,
                     bias=None, offs=None, output_dtype=None, contraction_dim=(), use_fast_accum=False):
    """torch's NVFP4 grouped mm, exactly: each group's codes times its block scales and its global scales."""
    return _nvfp4_v2(mat_a, mat_b, scale_a, scale_b, offs)


def nvfp4_v2_first_group_global(mat_a, mat_b, scale_a, scale_recipe_a, scale_b, scale_recipe_b, swizzle_a=None,
                                swizzle_b=None, bias=None, offs=None, output_dtype=None, contraction_dim=(),
                                use_fast_accum=False):
    """The global scales read as one per tensor: group 0's pair multiplies every group (right only when every
    group's global scales are equal)."""
    return _nvfp4_v2(mat_a, mat_b, scale_a, scale_b, offs, first_global=True)
