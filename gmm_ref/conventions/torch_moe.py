"""Torch MoE experts with the combined output (``torch.moe_experts``, a routed convention: :data:`MOE_EXPERTS`).

``moe_experts(hidden_states, weight, topk_ids, topk_weights, expert_map=None) -> [T, N]``, one expert GEMM of a
MoE layer as transformers' experts (``grouped_mm_experts_forward``) and torch-native MoE layers compute it:

- ``hidden_states [T, K]`` the tokens in their own order; ``weight [E_local, N, K]`` the experts of this rank
  (``nn.Linear``'s ``[out, in]``, transformers' ``gate_up_proj`` / ``down_proj``); bfloat16, float16 or float32,
  the output in the tokens' dtype;
- ``topk_ids [T, top_k]`` (int32 or int64) global experts, ``topk_weights [T, top_k]`` float32 (the router's
  softmax), always multiplied in;
- ``expert_map [num_experts]`` (expert parallelism): global -> local, -1 for another rank's expert, whose slot adds
  nothing; None: every expert local;
- the result is ``out[t] = sum_j topk_weights[t, j] * (hidden_states[t] @ weight[local(topk_ids[t, j])].T)``,
  a new ``[T, N]`` tensor: the combined output of docs/routed.md. A token may list one expert twice (the
  layer's sum handles it; nothing in the convention excludes it).

Where it rounds between the product, the weight and the sum is the kernel's own declaration
(:class:`gmm_ref.RoutedNumerics`, docs/routed.md): transformers rounds the product to the tokens' dtype
(``torch._grouped_mm``'s output), multiplies it by the float32 weight in float32, casts each slot to the tokens'
dtype and sums in it (``index_add_`` into ``zeros_like(hidden_states)``).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from gmm_ref.conventions import base
from gmm_ref.routed.routing import Routing

__all__ = ["MOE_EXPERTS", "MOE_SLOTS"]

BF16 = np.dtype(ml_dtypes.bfloat16)


class _MoEExperts(base.RoutedConvention):
    def parse(self, hidden_states: Any, weight: Any, topk_ids: Any, topk_weights: Any,
              expert_map: Any = None) -> Routing:
        """A MoE layer's experts GEMM with the combined output: tokens ``hidden_states [T, K]``, experts ``weight
        [E_local, N, K]``, each token's ``top_k`` global experts ``topk_ids`` and weights ``topk_weights``
        ``[T, top_k]``, ``expert_map`` global -> local (-1: another rank's); returns ``[T, N]``, the weighted sum
        of each token's slots in the tokens' dtype."""
        a, b = base.as_array("hidden_states", hidden_states), base.as_array("weight", weight)
        base.expect_ndim("hidden_states", a, 2)
        base.expect_ndim("weight", b, 3)
        if b.shape[2] != a.shape[1]:
            raise ValueError(f"weight: expected [E, N, K={a.shape[1]}] (K: hidden_states' last axis), got {b.shape}")
        ids = base.as_array("topk_ids", topk_ids)
        w = base.as_array("topk_weights", topk_weights)
        emap = None if expert_map is None else base.as_array("expert_map", expert_map)
        return Routing(a, b, ids, w, expert_layout="enk", expert_map=emap, mul_routed_weight=True,
                       out_dtype=a.dtype, foreign=self.foreign)

    def _arguments(self, r: Routing) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (r.tokens, r.experts, r.topk_ids, r.topk_weights), {"expert_map": r.expert_map}


class _MoESlots(base.RoutedConvention):
    def parse(self, A: Any, B: Any, topk_ids: Any, topk_weights: Any, mul_routed_weight: bool,
              expert_map: Any = None) -> Routing:
        """A fused-MoE GEMM per slot with the router's own (global) expert ids: tokens ``A [T, K]``, this rank's
        experts ``B [E_local, N, K]``, each token's ``top_k`` global experts ``topk_ids [T, top_k]`` and weights
        ``topk_weights [T, top_k]``, ``mul_routed_weight`` whether each slot is multiplied by its weight,
        ``expert_map [E_global]`` global -> local (-1: another rank's expert, whose slot is 0; None: every expert
        local); returns ``[T, top_k, N]``, one row per slot, in A's dtype."""
        a, b = base.as_array("A", A), base.as_array("B", B)
        base.expect_ndim("A", a, 2)
        base.expect_ndim("B", b, 3)
        if b.shape[2] != a.shape[1]:
            raise ValueError(f"B: expected [E, N, K={a.shape[1]}] (K: A's last axis), got {b.shape}")
        if not isinstance(mul_routed_weight, (bool, np.bool_)):
            raise TypeError(f"mul_routed_weight: expected a bool, got {mul_routed_weight!r}")
        ids = base.as_array("topk_ids", topk_ids)
        w = base.as_array("topk_weights", topk_weights)
        emap = None if expert_map is None else base.as_array("expert_map", expert_map)
        return Routing(a, b, ids, w, expert_layout="enk", expert_map=emap, mul_routed_weight=bool(mul_routed_weight),
                       out_dtype=a.dtype, foreign=self.foreign)

    def _arguments(self, r: Routing) -> tuple[tuple[Any, ...], dict[str, Any]]:
        weights = r.topk_weights if r.topk_weights is not None else np.ones(r.topk_ids.shape, np.float32)
        return (r.tokens, r.experts, r.topk_ids, weights, bool(r.mul_routed_weight), r.expert_map), {}


#: the per-slot signature many fused-MoE kernels take, and the loops they are tested against: global expert ids
#: and an expert map, no sorted metadata
MOE_SLOTS = _MoESlots(
    name="torch.moe_slots", framework="torch",
    dtype_pairs=((BF16, BF16), ("float16", "float16"), ("float32", "float32")),
    weight_dtypes=("float32",), expert_layouts=("enk",), foreign="zero", distinct_experts=False,
    output="slots",
    summary="moe_slots(A, B, topk_ids, topk_weights, mul_routed_weight, expert_map): routed tokens [T, K], this "
            "rank's experts [E_local, N, K], the router's global expert ids and an expert map (global -> local, -1 "
            "elsewhere), the per-slot output [T, top_k, N] returned (another rank's slot 0)",
)


MOE_EXPERTS = _MoEExperts(
    name="torch.moe_experts", framework="torch",
    dtype_pairs=((BF16, BF16), ("float16", "float16"), ("float32", "float32")),
    weight_dtypes=("float32",), expert_layouts=("enk",), foreign="zero", distinct_experts=False,
    output="combined", mul_routed_weight=True,
    summary="moe_experts(hidden_states, weight, topk_ids, topk_weights, expert_map=None): routed tokens [T, K], "
            "experts [E, N, K], the combined output [T, N] (the weighted sum over each token's slots), as "
            "transformers' experts and torch-native MoE layers compute it",
)
