"""``torch.moe_experts``: a MoE layer's experts GEMM with the combined output, built from torch ops as
transformers' experts (``grouped_mm_experts_forward``) and torch-native MoE layers build it (docs/routed.md).

:class:`TorchMoEExperts` (``torch.moe_experts``): the slots on this rank sorted by local expert (stable: flat
order within one), their tokens gathered, one ``torch._grouped_mm`` over the experts with int32 cumulative
``offs``, each row times its slot's float32 weight, ``index_add_`` into a float32 ``[T, N]`` by token, one cast to
the tokens' dtype. Its numerics (:meth:`TorchMoEExperts.numerics_for`): the product rounded to the tokens' dtype
(``_grouped_mm``'s output), the weight multiplied in float32, the slots summed in float32, one rounding.
transformers' own forward differs in the sum only: it casts each weighted slot to the hidden states' dtype and
``index_add_`` s into ``zeros_like(hidden_states)``, summing in that dtype (``RoutedNumerics(weight=float32,
combine=<the tokens' dtype>)``; ``tests/gmm_kernels/test_torch_moe.py`` checks it so declared).

``torch._grouped_mm``'s CPU path (torch >= 2.13) takes K with rows of a multiple of 16 bytes (8 bfloat16 / float16,
4 float32 elements), no K = 0 or N = 0: other extents are refused, and the checked extents avoid them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gmm_kernels.adapters.torch_grouped import TorchGroupedMM
from gmm_kernels.base import RoutedKernelAdapter, RoutedLimits
from gmm_kernels.sandbox import device
from gmm_kernels.sandbox.convert import to_framework

__all__ = ["TorchMoEExperts", "moe_experts"]


def moe_experts(hidden_states: Any, weight: Any, topk_ids: Any, topk_weights: Any, expert_map: Any = None,
                *, sum_dtype: Any = None) -> Any:
    """The combined ``[T, N]`` of torch tensors (``torch.moe_experts``); ``sum_dtype`` the dtype the weighted
    slots are added in with ``index_add_`` (None: float32; the tokens' dtype: transformers' sum)."""
    import torch

    t, top_k = topk_ids.shape
    n, e_local = weight.shape[1], weight.shape[0]
    sum_dtype = torch.float32 if sum_dtype is None else sum_dtype
    out = torch.zeros((t, n), dtype=sum_dtype, device=hidden_states.device)
    flat = topk_ids.reshape(-1).long()
    local = flat if expert_map is None else expert_map.long()[flat]
    slots = torch.nonzero(local >= 0).reshape(-1)  # the flat slots on this rank
    if slots.numel():
        slots = slots[torch.argsort(local[slots], stable=True)]
        counts = torch.bincount(local[slots], minlength=e_local)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        token = torch.div(slots, top_k, rounding_mode="floor")
        y = torch._grouped_mm(hidden_states[token], weight.transpose(-2, -1), offs=offs)  # the tokens' dtype
        weighted = y * topk_weights.reshape(-1)[slots].unsqueeze(-1)  # float32 (type promotion)
        out.index_add_(0, token, weighted.to(sum_dtype))
    return out.to(hidden_states.dtype)


class TorchMoEExperts(RoutedKernelAdapter):
    """``torch.moe_experts`` built from torch ops (module docstring): ``torch._grouped_mm`` on the gathered
    tokens, float32 weights, ``index_add_`` in float32."""

    name = "torch.moe_experts"
    convention = "torch.moe_experts"
    requires = ("torch",)

    @property
    def deterministic(self) -> bool:  # type: ignore[override]
        """On CUDA ``index_add_`` adds with atomics, in no fixed order."""
        return not device.on_cuda()

    def _unavailable(self) -> str | None:
        return TorchGroupedMM()._unavailable()

    def _refusal(self, routing: Any) -> str | None:
        import torch

        width = routing.k * np.dtype(routing.tokens.dtype).itemsize
        if routing.k == 0 or routing.n == 0 or width % 16:
            return (f"torch {torch.__version__}'s _grouped_mm takes K rows of a multiple of 16 bytes and no K = 0 or "
                    f"N = 0 ('strides should be multiple of 16 bytes'), got K={routing.k}, N={routing.n} in "
                    f"{routing.tokens.dtype}")
        return None

    def routed_limits(self) -> RoutedLimits:
        """The strategies' defaults with ``(K, N)`` extents ``_grouped_mm`` takes: ``(8, 4)``, ``(16, 8)``,
        ``(40, 24)`` (K a multiple of 8)."""
        return RoutedLimits(extents=((8, 4), (16, 8), (40, 24)))

    def numerics_for(self, routing: Any) -> Any:
        """The product rounded to the tokens' dtype, the weight multiplied in float32, the slots summed in float32
        (the accumulator); on CPU bfloat16 / float16 subnormal inputs may count as zero (as ``torch.grouped_mm``)."""
        from gmm_ref import RoutedNumerics

        product = super().numerics_for(routing).product
        if device.cpu_only() and str(routing.tokens.dtype) in ("bfloat16", "float16"):
            product = dataclasses.replace(product, flush_subnormals=True)
        return RoutedNumerics(product=product, weight=np.float32, combine="accumulator")

    def call(self, hidden_states: Any, weight: Any, topk_ids: Any, topk_weights: Any, expert_map: Any = None) -> Any:
        (x, w, ids, tw), kw = to_framework("torch", (hidden_states, weight, topk_ids, topk_weights),
                                           {"expert_map": expert_map})
        return moe_experts(x, w, ids, tw, kw["expert_map"])
