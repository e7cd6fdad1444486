"""vLLM's batched experts GEMM (``vllm.batched_moe``): ``invoke_moe_batched_triton_kernel``, a Triton kernel.

vLLM and its Triton kernels need a CUDA (or ROCm) GPU: here the adapter says why it cannot run; on a GPU machine
with vLLM installed it calls the kernel on CUDA tensors, writing into the ``C`` the harness gives it (its rows
past each expert's token count must keep what ``C`` held).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gmm_kernels import device
from gmm_kernels.base import KernelAdapter
from gmm_kernels.convert import to_framework
from gmm_ref import Numerics, Problem

__all__ = ["VllmBatchedMoE"]


class VllmBatchedMoE(KernelAdapter):
    """``vllm.model_executor.layers.fused_moe.fused_batched_moe.invoke_moe_batched_triton_kernel``."""

    name = "vllm.batched_moe"
    convention = "vllm.batched_moe"
    requires = ("torch", "vllm")
    needs = "its batched experts are a Triton kernel for CUDA / ROCm GPUs"
    flush_subnormals = True

    def _unavailable(self) -> str | None:
        import torch

        if not torch.cuda.is_available():
            return "vLLM's batched experts are a Triton kernel for CUDA / ROCm GPUs; no GPU here"
        return device.cuda_only("vLLM's batched experts")

    def numerics_for(self, problem: Problem) -> Numerics:
        """FP8: each K tile's ``tl.dot`` of codes in the tensor cores (about 14 bits kept on Hopper), promoted into
        the float32 accumulator with its scales (the block path; the per-tensor and per-token paths are declared
        the same, which a first run on a GPU confirms or refutes)."""
        base = super().numerics_for(problem)
        if problem.scaled and (self.scope is None or self.scope.numerics is None):
            tk = (problem.tiling or self.convention_facts.default_tiling)[1]
            return dataclasses.replace(base, promote_every=tk, partial_accumulate=2.0 ** -13)
        return base

    def call(self, A: Any, B: Any, C: Any, expert_num_tokens: Any, **kwargs: Any) -> Any:
        from vllm.model_executor.layers.fused_moe.fused_batched_moe import invoke_moe_batched_triton_kernel

        (a, b, c, counts), kw = to_framework("torch", (A, B, C, expert_num_tokens), kwargs)
        kw = {k: device.place(v) for k, v in kw.items()}  # to_framework made them on the selected device
        out = device.place(c)
        invoke_moe_batched_triton_kernel(device.place(a), device.place(b), out, device.place(counts),
                                         B_zp=None, use_int8_w8a16=False, use_int4_w4a16=False,
                                         **{"A_scale": None, "B_scale": None, "use_fp8_w8a8": False,
                                            "per_act_token_quant": False, "block_shape": None, **kw})
        return out
