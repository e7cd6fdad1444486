"""vLLM's batched (masked) MoE experts: ``invoke_moe_batched_triton_kernel`` (``vllm.batched_moe``); and vLLM's
fused MoE, ``invoke_fused_moe_triton_kernel`` (``vllm.fused_moe``, a routed convention: :data:`FUSED_MOE`, whose
arguments come from a ``gmm_ref.Routing``; docs/routed.md).

``invoke_moe_batched_triton_kernel(A, B, C, expert_num_tokens, compute_type, A_scale, B_scale, B_zp,
use_fp8_w8a8, use_int8_w8a16, use_int4_w4a16, config, per_act_token_quant, block_shape=None)``, the GEMM of
``BatchedTritonExperts``:

- ``A`` ``[E, max_tokens, K]``, ``B`` ``[E, N, K]``, ``C`` ``[E, max_tokens, N]`` written in place;
  expert e's tokens are the first ``expert_num_tokens[e]`` rows of its matrix (the ``masked`` family);
- rows past ``expert_num_tokens[e]`` are never written: ``C`` keeps what it held there (here, an existing
  output that every row no expert computes keeps);
- unquantized (``compute_type`` the dtype of A, B and C), or FP8 (``use_fp8_w8a8=True``, float8_e4m3fn codes)
  with float32 scales in one of three forms: per tensor (``A_scale (E, 1, 1)``, one per expert's activations;
  ``B_scale [E]``), per token / per channel (``per_act_token_quant=True``: ``A_scale (E, max_tokens, 1)``,
  ``B_scale [E, N, 1]``), or blocks (``block_shape=[128, 128]``: ``A_scale (E, max_tokens, ceil(K/128))``,
  ``B_scale [E, ceil(N/128), ceil(K/128)]``). Per-tensor and per-token scales apply after the K loop, block
  scales at every K block into the float32 accumulator; the result is cast to ``compute_type``.

Scale slots of rows past an expert's count hold NaN in the arguments built here: no correct kernel uses
them for a row it writes. ``config`` (the Triton tile sizes) comes from the problem's tiling.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from gmm_ref.conventions import base
from gmm_ref.conventions.base import Convention
from gmm_ref.problem import Problem
from gmm_ref.routed.metadata import moe_align_block_size
from gmm_ref.routed.routing import Routing
from gmm_ref.scaled.model import Quantization

__all__ = ["BATCHED_MOE", "FUSED_MOE", "FUSED_MOE_CONFIG", "QUANTIZATIONS", "fused_operands", "fused_routing",
           "slot_experts", "vllm_batched_moe"]

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
BLOCK = 128
PER_TENSOR = (Quantization(E4M3, np.float32, "tensor"), Quantization(E4M3, np.float32, "tensor"))
PER_TOKEN = (Quantization(E4M3, np.float32, "row"), Quantization(E4M3, np.float32, "row"))
BLOCKWISE = (Quantization(E4M3, np.float32, (1, BLOCK)), Quantization(E4M3, np.float32, (BLOCK, BLOCK)))
#: the FP8 forms: per tensor, per token x per channel, 1x128 activation blocks x 128x128 weight blocks
QUANTIZATIONS = (PER_TENSOR, PER_TOKEN, BLOCKWISE)


class _BatchedMoE(Convention):
    def parse(self, A: Any, B: Any, C: Any, expert_num_tokens: Any, compute_type: Any = None, A_scale: Any = None,
              B_scale: Any = None, B_zp: Any = None, use_fp8_w8a8: bool = False, use_int8_w8a16: bool = False,
              use_int4_w4a16: bool = False, config: Any = None, per_act_token_quant: bool = False,
              block_shape: Any = None) -> Problem:
        """vLLM's batched experts GEMM: ``A [E, max_tokens, K] x B [E, N, K]`` into ``C [E, max_tokens, N]``, the
        first ``expert_num_tokens[e]`` rows of each expert computed, the others left as ``C`` held them;
        unquantized, or FP8 (``use_fp8_w8a8``) per tensor, per token (``per_act_token_quant``) or in 128x128
        blocks (``block_shape=[128, 128]``)."""
        a, b, c = base.as_array("A", A), base.as_array("B", B), base.as_array("C", C)
        e, m, k, n = base.expect_grouped_nt("A", a, "B", b)
        if c.shape != (e, m, n):
            raise ValueError(f"C: expected the output buffer of shape {(e, m, n)}, got {c.shape}")
        counts = base.as_array("expert_num_tokens", expert_num_tokens)
        if counts.shape != (e,) or not np.issubdtype(counts.dtype, np.integer):
            raise TypeError(f"expert_num_tokens: expected [{e}] integer token counts, got {counts.dtype} "
                            f"{counts.shape}")
        for flag in ("use_fp8_w8a8", "use_int8_w8a16", "use_int4_w4a16", "per_act_token_quant"):
            if not isinstance(locals()[flag], bool):
                raise TypeError(f"{flag}: expected a bool, got {locals()[flag]!r}")
        if use_int8_w8a16 or use_int4_w4a16 or B_zp is not None:
            raise ValueError("use_int8_w8a16/use_int4_w4a16/B_zp: the batched experts take unquantized or FP8 "
                             "operands only (vLLM asserts the others are not implemented)")
        out = base.optional_dtype("compute_type", compute_type) or np.dtype(c.dtype)
        if out != c.dtype:
            raise TypeError(f"compute_type: the result is cast to it and stored in C ({c.dtype}), got {out}")
        extra: dict[str, Any] = {}
        if use_fp8_w8a8:
            for name, arr in (("A", a), ("B", b)):
                if arr.dtype != E4M3:
                    raise TypeError(f"{name}: expected float8_e4m3fn codes with use_fp8_w8a8, got {arr.dtype}")
            extra = _scales(A_scale, B_scale, counts, e, m, n, k, per_act_token_quant, block_shape)
        elif A_scale is not None or B_scale is not None or block_shape is not None or per_act_token_quant:
            raise ValueError("A_scale/B_scale/block_shape/per_act_token_quant: only with use_fp8_w8a8=True")
        return Problem("masked", a, b, counts.astype(np.int64), rhs_transposed=True, out_dtype=out,
                       existing_out=c, existing_policy="overwrite", convention=self.name,
                       **{k_: v for k_, v in self.policies("masked").items() if k_ != "existing_policy"}, **extra)

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        tm, tk, tn = p.tiling or self.default_tiling
        kw: dict[str, Any] = {"compute_type": p.out_dtype,
                              "config": {"BLOCK_SIZE_M": tm, "BLOCK_SIZE_N": tn, "BLOCK_SIZE_K": tk}}
        c = np.array(p.existing_out)
        if p.lhs_quant is not None:
            g, counts = p.num_groups, p.group_sizes
            form = (p.lhs_quant, p.rhs_quant)
            if form == PER_TENSOR:
                sa = np.stack([p.scales_of("lhs", i).reshape(1, 1) for i in range(g)]).astype(np.float32)
                sb = np.array([p.scales_of("rhs", i)[0, 0] for i in range(g)], np.float32)
            else:
                width = p.lhs_quant.scale_shape(p.m, p.k)[1]
                sa = np.full((g, p.m, width), np.nan, np.float32)
                for i in range(g):
                    sa[i, :counts[i]] = p.scales_of("lhs", i)
                sb = np.stack([p.scales_of("rhs", i) for i in range(g)]).astype(np.float32) if g else \
                    np.zeros((0, *p.rhs_quant.scale_shape(p.n, p.k)), np.float32)
            kw.update(A_scale=sa, B_scale=sb, use_fp8_w8a8=True, per_act_token_quant=form == PER_TOKEN,
                      block_shape=[BLOCK, BLOCK] if form == BLOCKWISE else None)
        return (p.lhs, p.rhs, c, p.group_sizes.astype(np.int32)), kw


def _scales(A_scale: Any, B_scale: Any, counts: np.ndarray, e: int, m: int, n: int, k: int, per_token: bool,
            block_shape: Any) -> dict[str, Any]:
    """The scaled problem's quantizations and per-expert scale blocks from vLLM's FP8 scale arguments."""
    if A_scale is None or B_scale is None:
        raise ValueError("A_scale, B_scale: required with use_fp8_w8a8=True")
    sa, sb = base.as_array("A_scale", A_scale), base.as_array("B_scale", B_scale)
    for name, arr in (("A_scale", sa), ("B_scale", sb)):
        if arr.dtype != np.float32:
            raise TypeError(f"{name}: expected float32 scales, got {arr.dtype}")
    kb = -(-k // BLOCK)
    if block_shape is not None:
        if list(block_shape) != [BLOCK, BLOCK] or per_token:
            raise ValueError(f"block_shape: expected [128, 128] (and per_act_token_quant=False), got {block_shape!r}")
        quants, want_a, want_b = BLOCKWISE, (e, m, kb), (e, -(-n // BLOCK), kb)
    elif per_token:
        quants, want_a, want_b = PER_TOKEN, (e, m, 1), (e, n, 1)
    else:
        quants, want_a, want_b = PER_TENSOR, (e, 1, 1), (e,)
    if sa.shape != want_a:
        raise ValueError(f"A_scale: expected shape {want_a} for this form, got {sa.shape}")
    if sb.shape != want_b:
        raise ValueError(f"B_scale: expected shape {want_b} for this form, got {sb.shape}")
    if quants == PER_TENSOR:
        lhs = [sa[i].reshape(1, 1) for i in range(e)]
        rhs = [sb[i].reshape(1, 1) for i in range(e)]
    else:
        lhs = [sa[i, :max(int(counts[i]), 0)] for i in range(e)]
        rhs = [sb[i] for i in range(e)]
    return dict(lhs_quant=quants[0], lhs_scales=lhs, rhs_quant=quants[1], rhs_scales=rhs)


BATCHED_MOE = _BatchedMoE(
    name="vllm.batched_moe", framework="torch", families=("masked",), layouts=(("masked", ((False, True, False),)),),
    dtype_pairs=((BF16, BF16), ("float16", "float16"), ("float32", "float32"), (E4M3, BF16)),
    listed_pairs_only=True, tail="undefined", existing_policy="overwrite", existing_argument="C",
    existing_required=True, out_argument="C",
    # K in 128-wide blocks where the scales are (a kernel's BLOCK_SIZE_K divides it), N in 16-byte rows
    multiple_of=(("k", 16), ("n", 16)), default_tiling=(16, 128, 32),
    quantizations=((None, None), *QUANTIZATIONS),
    summary="vllm invoke_moe_batched_triton_kernel(A, B, C, expert_num_tokens, ...): [E, max_tokens, K] experts, "
            "unquantized or FP8 per tensor / token / 128x128 block",
)
vllm_batched_moe = base.front_end(BATCHED_MOE, "vllm_batched_moe")


# ------------------------------------------------------------------------------------------ fused MoE (routed)
#: the launch config ``vllm.fused_moe`` arguments carry (tiles small enough that drawn routings straddle them)
FUSED_MOE_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1}


class _FusedMoE(base.RoutedConvention):
    def parse(self, A: Any, B: Any, C: Any, topk_weights: Any, sorted_token_ids: Any, expert_ids: Any,
              num_tokens_post_padded: Any, mul_routed_weight: bool, top_k: int, config: Any = None,
              compute_type: Any = None) -> Routing:
        """vLLM's fused MoE GEMM (``invoke_fused_moe_triton_kernel``, unquantized): tokens ``A [T, K]``, experts
        ``B [E, N, K]``, output ``C [T, top_k, N]`` written in place; the slots ``t*top_k + j`` of each block
        of ``config["BLOCK_SIZE_M"]`` entries of ``sorted_token_ids`` (entries ``>= T*top_k`` are padding) are
        computed with the local expert ``expert_ids[block]`` (-1: another rank's, its slots written as zeros), up
        to ``num_tokens_post_padded[0]``; ``mul_routed_weight``: each slot times ``topk_weights[t, j]``.

        The routing returned has the local experts as its experts; where some block's expert is -1 one more
        global expert stands for the other ranks' (``expert_map`` maps it to -1). Every slot must lie in exactly
        one block below ``num_tokens_post_padded`` (as ``moe_align_block_size`` places them)."""
        a, b, c = fused_operands(A, B, C, top_k)
        t, (e, n) = a.shape[0], b.shape[:2]
        if c.shape != (t, top_k, n):
            raise ValueError(f"C: expected the output buffer of shape {(t, top_k, n)}, got {c.shape}")
        if not isinstance(mul_routed_weight, (bool, np.bool_)):
            raise TypeError(f"mul_routed_weight: expected a bool, got {mul_routed_weight!r}")
        out = base.optional_dtype("compute_type", compute_type) or np.dtype(c.dtype)
        if out != c.dtype:
            raise TypeError(f"compute_type: the result is cast to it and stored in C ({c.dtype}), got {out}")
        local = slot_experts(config or FUSED_MOE_CONFIG, sorted_token_ids, expert_ids, num_tokens_post_padded,
                             t * top_k, top_k, e)
        return fused_routing(a, b, local, top_k, topk_weights, bool(mul_routed_weight), out, self.foreign)

    def _arguments(self, r: Routing) -> tuple[tuple[Any, ...], dict[str, Any]]:
        config = dict(FUSED_MOE_CONFIG)
        sorted_ids, blocks, post = moe_align_block_size(r.topk_ids, config["BLOCK_SIZE_M"], r.num_experts,
                                                        r.expert_map)
        c = np.full((r.num_tokens, r.top_k, r.n), np.nan, r.out_dtype)  # torch.empty: nothing the kernel may read
        weights = r.topk_weights if r.topk_weights is not None else np.ones(r.topk_ids.shape, np.float32)
        return ((r.tokens, r.experts, c, weights, sorted_ids, blocks, post, bool(r.mul_routed_weight), r.top_k),
                {"config": config, "compute_type": r.out_dtype})


FUSED_MOE = _FusedMoE(
    name="vllm.fused_moe", framework="torch",
    dtype_pairs=((BF16, BF16), ("float16", "float16"), ("float32", "float32")),
    weight_dtypes=("float32",), expert_layouts=("enk",), foreign="zero", distinct_experts=True,
    block_size=FUSED_MOE_CONFIG["BLOCK_SIZE_M"], out_argument="C",
    summary="vllm invoke_fused_moe_triton_kernel(A, B, C, topk_weights, sorted_token_ids, expert_ids, "
            "num_tokens_post_padded, mul_routed_weight, top_k, config, compute_type): routed tokens [T, K], "
            "experts [E, N, K], per-slot output [T, top_k, N], unquantized",
)


def fused_operands(A: Any, B: Any, C: Any, top_k: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fused-MoE launcher's tokens ``A [T, K]``, experts ``B [E, N, K]`` and output ``C`` as arrays, their ranks,
    K and ``top_k`` checked, naming the argument (``C``'s shape is the convention's to check)."""
    a, b, c = base.as_array("A", A), base.as_array("B", B), base.as_array("C", C)
    base.expect_ndim("A", a, 2)
    base.expect_ndim("B", b, 3)
    if b.shape[2] != a.shape[1]:
        raise ValueError(f"B: expected [E, N, K={a.shape[1]}], got {b.shape}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise TypeError(f"top_k: expected a positive int, got {top_k!r}")
    return a, b, c


def slot_experts(config: Any, sorted_token_ids: Any, expert_ids: Any, num_tokens_post_padded: Any, numel: int,
                 top_k: int, e: int) -> np.ndarray:
    """``[numel]``: the local expert (-1: another rank's) of the block each flat slot lies in, as
    ``fused_moe_kernel`` reads the metadata (blocks of ``config["BLOCK_SIZE_M"]`` entries of ``sorted_token_ids``
    below ``num_tokens_post_padded[0]``, entries ``>= numel`` the padding); a ValueError names a slot in no block
    or in two, or a block's expert out of range."""
    bm = config.get("BLOCK_SIZE_M") if isinstance(config, dict) else None
    if not isinstance(bm, int) or bm < 1:
        raise ValueError(f"config: expected a dict with a positive BLOCK_SIZE_M, got {config!r}")
    sorted_ids = base.as_sizes("sorted_token_ids", sorted_token_ids).astype(np.int64)
    blocks = base.as_sizes("expert_ids", expert_ids).astype(np.int64)
    post = base.as_sizes("num_tokens_post_padded", num_tokens_post_padded).astype(np.int64)
    if post.shape != (1,) or post[0] % bm or post[0] > sorted_ids.size or post[0] // bm > blocks.size:
        raise ValueError(f"num_tokens_post_padded: expected [1] holding a multiple of BLOCK_SIZE_M={bm} within "
                         f"sorted_token_ids ({sorted_ids.size}) and expert_ids ({blocks.size} blocks), got {post}")
    local = np.full(numel, -2, np.int64)  # -2: in no block
    for blk in range(int(post[0]) // bm):
        ex = int(blocks[blk])
        if not -1 <= ex < e:
            raise ValueError(f"expert_ids[{blk}] = {ex}: expected a local expert in [0, {e}) or -1")
        for s in sorted_ids[blk * bm:(blk + 1) * bm]:
            if 0 <= s < numel:
                if local[s] != -2:
                    raise ValueError(f"sorted_token_ids: slot {int(s)} (token {s // top_k}, slot {s % top_k}) "
                                     "lies in two blocks")
                local[s] = ex
            elif s < 0:
                raise ValueError(f"sorted_token_ids: {int(s)} is no slot index (nor the padding, >= {numel})")
    missing = np.flatnonzero(local == -2)
    if missing.size:
        s = int(missing[0])
        raise ValueError(f"sorted_token_ids: slot {s} (token {s // top_k}, slot {s % top_k}) lies in no block "
                         f"below num_tokens_post_padded = {int(post[0])}: the kernel would never write it")
    return local


def fused_routing(a: np.ndarray, b: np.ndarray, local: np.ndarray, top_k: int, topk_weights: Any,
                  mul_routed_weight: bool, out: np.dtype, foreign: str) -> Routing:
    """The routing of a fused MoE call whose slots' local experts are ``local`` (:func:`slot_experts`): the
    local experts are its experts; where some slot's is -1 one more global expert stands for the other ranks'
    (``expert_map`` maps it to -1)."""
    e = b.shape[0]
    emap = None
    if (local == -1).any():
        emap = np.concatenate([np.arange(e), [-1]]).astype(np.int64)
        local = np.where(local == -1, e, local)
    weights = None if topk_weights is None else base.as_array("topk_weights", topk_weights)
    return Routing(a, b, local.reshape(a.shape[0], top_k), weights, expert_layout="enk", expert_map=emap,
                   mul_routed_weight=mul_routed_weight, out_dtype=out, foreign=foreign)
