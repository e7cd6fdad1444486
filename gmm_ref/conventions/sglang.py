"""SGLang's fused MoE GEMM (``sglang.fused_moe``, a routed convention: docs/routed.md, docs/conventions.md).

``invoke_fused_moe_kernel(A, B, bias, C, A_scale, B_scale, B_zp, topk_weights, topk_ids, sorted_token_ids,
expert_ids, num_tokens_post_padded, mul_routed_weight, top_k, config, compute_type, use_fp8_w8a8, use_int8_w8a8,
use_int8_w8a16, use_int4_w4a16, per_channel_quant, block_shape=None, ...)`` of
``sglang/kernels/ops/moe/fused_moe_triton_kernels.py``, its unquantized path: tokens ``A [T, K]``, the local
experts ``B [E, N, K]``, the per-slot output ``C`` (``[T, top_k, N]`` or ``[T*top_k, N]``: the kernel addresses
row ``t*top_k + j`` through ``C.stride(-2)``) written in place. The metadata is SGLang's ``moe_align_block_size``
(``gmm_ref.routed.metadata.sglang_moe_align_block_size``): the ids are *local* already (-1: another rank's
expert, whose run comes first and whose blocks the kernel writes as zeros); ``topk_ids`` is read by the launcher
for its ``numel()`` only (the padding sentinel ``T*top_k``), so it must be the ``[T, top_k]`` ids the metadata
was built from.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from gmm_ref.conventions import base
from gmm_ref.conventions.vllm import fused_operands, fused_routing, slot_experts
from gmm_ref.routed.metadata import sglang_moe_align_block_size
from gmm_ref.routed.routing import Routing

__all__ = ["FUSED_MOE", "FUSED_MOE_CONFIG"]

BF16 = np.dtype(ml_dtypes.bfloat16)
#: the launch config ``sglang.fused_moe`` arguments carry (tiles small enough that drawn routings straddle them)
FUSED_MOE_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1}
#: the launcher's options past the unquantized path, at the only values this convention takes
DEFAULT_OPTIONS = {"block_shape": None, "no_combine": False, "a_use_tma": False, "b_use_tma": False,
                   "c_sorted": False, "filter_expert": True, "fuse_sum_all_reduce": False, "router_topk": 1,
                   "fuse_add_to_output": False, "add_output_mask": None, "mask_output": False,
                   "lora_preserve_base": False, "fuse_swiglu": False, "a_output_slices": 1}
QUANT_FLAGS = ("use_fp8_w8a8", "use_int8_w8a8", "use_int8_w8a16", "use_int4_w4a16", "per_channel_quant")


def _unquantized(bias: Any, A_scale: Any, B_scale: Any, B_zp: Any, flags: dict[str, Any],
                 options: dict[str, Any]) -> None:
    """The unquantized path without a bias or any fused epilogue, each other argument named where given."""
    for name, value in (("bias", bias), ("A_scale", A_scale), ("B_scale", B_scale), ("B_zp", B_zp)):
        if value is not None:
            raise ValueError(f"{name}: expected None (sglang.fused_moe is the unquantized path without a bias; the "
                             "routed model has neither), got a value")
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name}: expected a bool, got {value!r}")
        if value:
            raise ValueError(f"{name}: expected False (sglang.fused_moe is the unquantized path)")
    for name, value in options.items():
        want = DEFAULT_OPTIONS[name]
        if value is not want and value != want:
            raise ValueError(f"{name}: expected {want!r} (this convention covers the plain per-slot store), "
                             f"got {value!r}")


def _topk_ids(topk_ids: Any, local: np.ndarray, t: int, top_k: int, e: int) -> None:
    """``topk_ids`` as the launcher reads it, and the metadata built from it: each slot's expert the one of the
    block it lies in."""
    ids = base.as_array("topk_ids", topk_ids)
    if ids.shape != (t, top_k) or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"topk_ids: expected [{t}, {top_k}] integer local expert ids (its numel() is the "
                         f"padding sentinel), got {ids.dtype} {ids.shape}")
    wrong = np.flatnonzero(ids.reshape(-1).astype(np.int64) != local)
    if wrong.size:
        s = int(wrong[0])
        raise ValueError(f"topk_ids[{s // top_k}, {s % top_k}] = {int(ids.reshape(-1)[s])}: sorted_token_ids "
                         f"places that slot in a block of expert {int(local[s])} (expert_ids; -1: another rank's, "
                         f"of {e} local experts)")


class _FusedMoE(base.RoutedConvention):
    def parse(self, A: Any, B: Any, bias: Any, C: Any, A_scale: Any, B_scale: Any, B_zp: Any, topk_weights: Any,
              topk_ids: Any, sorted_token_ids: Any, expert_ids: Any, num_tokens_post_padded: Any,
              mul_routed_weight: bool, top_k: int, config: Any, compute_type: Any, use_fp8_w8a8: bool,
              use_int8_w8a8: bool, use_int8_w8a16: bool, use_int4_w4a16: bool, per_channel_quant: bool,
              block_shape: Any = None, no_combine: bool = False, a_use_tma: bool = False, b_use_tma: bool = False,
              c_sorted: bool = False, filter_expert: bool = True, fuse_sum_all_reduce: bool = False,
              router_topk: int = 1, fuse_add_to_output: bool = False, add_output_mask: Any = None,
              mask_output: bool = False, lora_preserve_base: bool = False, fuse_swiglu: bool = False,
              a_output_slices: int = 1) -> Routing:
        """SGLang's fused MoE GEMM (``invoke_fused_moe_kernel``, unquantized, module docstring): each block of
        ``config["BLOCK_SIZE_M"]`` entries of ``sorted_token_ids`` below ``num_tokens_post_padded[0]`` computed
        with its local expert ``expert_ids[block]`` (-1: another rank's, its slots written as zeros), entries
        ``>= T*top_k`` the padding; ``mul_routed_weight``: each slot times ``topk_weights[t, j]``."""
        _unquantized(bias, A_scale, B_scale, B_zp,
                     {"use_fp8_w8a8": use_fp8_w8a8, "use_int8_w8a8": use_int8_w8a8, "use_int8_w8a16": use_int8_w8a16,
                      "use_int4_w4a16": use_int4_w4a16, "per_channel_quant": per_channel_quant},
                     {name: value for name, value in locals().items() if name in DEFAULT_OPTIONS})
        a, b, c = fused_operands(A, B, C, top_k)
        t, (e, n) = a.shape[0], b.shape[:2]
        if c.shape not in ((t, top_k, n), (t * top_k, n)):
            raise ValueError(f"C: expected the output buffer of shape {(t, top_k, n)} or {(t * top_k, n)}, got "
                             f"{c.shape}")
        if not isinstance(mul_routed_weight, (bool, np.bool_)):
            raise TypeError(f"mul_routed_weight: expected a bool, got {mul_routed_weight!r}")
        if topk_weights is None:
            raise ValueError("topk_weights: expected [T, top_k] weights (the launcher reads their strides), got None")
        out = base.optional_dtype("compute_type", compute_type) or np.dtype(c.dtype)
        if out != c.dtype:
            raise TypeError(f"compute_type: the result is cast to it and stored in C ({c.dtype}), got {out}")
        local = slot_experts(config, sorted_token_ids, expert_ids, num_tokens_post_padded, t * top_k, top_k, e)
        _topk_ids(topk_ids, local, t, top_k, e)
        return fused_routing(a, b, local, int(top_k), topk_weights, bool(mul_routed_weight), out, self.foreign)

    def _arguments(self, r: Routing) -> tuple[tuple[Any, ...], dict[str, Any]]:
        config = dict(FUSED_MOE_CONFIG)
        ids = r.local_ids.astype(np.int32)
        sorted_ids, blocks, post = sglang_moe_align_block_size(ids, config["BLOCK_SIZE_M"], r.num_local_experts)
        c = np.full((r.num_tokens, r.top_k, r.n), np.nan, r.out_dtype)  # torch.empty: nothing the kernel may read
        weights = r.topk_weights if r.topk_weights is not None else np.ones(r.topk_ids.shape, np.float32)
        return ((r.tokens, r.experts, None, c, None, None, None, weights, ids, sorted_ids, blocks, post,
                 bool(r.mul_routed_weight), r.top_k, config, r.out_dtype),
                {"use_fp8_w8a8": False, "use_int8_w8a8": False, "use_int8_w8a16": False, "use_int4_w4a16": False,
                 "per_channel_quant": False})


FUSED_MOE = _FusedMoE(
    name="sglang.fused_moe", framework="torch",
    dtype_pairs=((BF16, BF16), ("float16", "float16"), ("float32", "float32")),
    # the launcher's grid spans all of sorted_token_ids (no small-batch trim assuming distinct experts, as
    # vLLM's has): a token listing one expert twice is taken, and drawn
    weight_dtypes=("float32",), expert_layouts=("enk",), foreign="zero", distinct_experts=False,
    block_size=FUSED_MOE_CONFIG["BLOCK_SIZE_M"], out_argument="C",
    summary="sglang invoke_fused_moe_kernel(A, B, bias, C, A_scale, B_scale, B_zp, topk_weights, topk_ids, "
            "sorted_token_ids, expert_ids, num_tokens_post_padded, mul_routed_weight, top_k, config, compute_type, "
            "use_fp8_w8a8, ...): routed tokens [T, K], local experts [E, N, K] (ids -1: another rank's), "
            "per-slot output, unquantized",
)
