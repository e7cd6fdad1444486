"""unsloth's grouped GEMM forward (``unsloth.grouped_gemm``, a routed kernel: :class:`UnslothGroupedGemm`), its
Triton kernel read from unsloth's wheel by the wheel loader (``gmm_kernels.wheels``).

Importing unsloth pulls in far more than this kernel (its package root patches transformers and needs a GPU), so
the adapter reads ``_grouped_gemm_forward_kernel`` from ``unsloth/kernels/moe/grouped_gemm/kernels/forward.py`` of
unsloth's wheel (:data:`WHEEL_VERSION`, ``pip download --no-deps``; :data:`WHEEL` looks in
``GMM_HARNESS_UNSLOTH_WHEEL``, then the wheel cache), untouched, and launches it as ``grouped_gemm_forward``'s
``_grouped_gemm_forward_impl`` does without autotuning (interface.py): the operands made contiguous, ``y``
allocated ``[T*topk, N]`` in X's dtype, one persistent program per SM (``grid = (NUM_SMS,)``), every launch
argument as it passes them, TMA off. That function itself asserts CUDA tensors and reads unsloth's device
helpers, so it is not loaded: its launch is restated here. Where torch sees no GPU the kernel runs in Triton's
interpreter with :data:`INTERPRETED_SMS` programs (so that programs take several tiles, as on a GPU).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

from gmm_kernels import device, guards, triton_interpreter
from gmm_kernels.base import RoutedKernelAdapter, RoutedLimits
from gmm_kernels.convert import to_framework
from gmm_kernels.wheels import Wheel, load_functions

__all__ = ["DOWNLOAD", "FORWARD_FUNCTIONS", "FORWARD_MEMBER", "INTERPRETED_SMS", "WHEEL", "WHEEL_VERSION",
           "UnslothGroupedGemm", "load_forward"]

#: the unsloth release whose kernel is checked (scripts/setup.sh downloads its wheel)
WHEEL_VERSION = "2026.10.9"
FORWARD_MEMBER = "unsloth/kernels/moe/grouped_gemm/kernels/forward.py"
FORWARD_FUNCTIONS = ("_grouped_gemm_forward_kernel",)
#: where the wheel is found (``GMM_HARNESS_UNSLOTH_WHEEL``, then the wheel cache)
WHEEL = Wheel("unsloth", "unsloth", WHEEL_VERSION, "GMM_HARNESS_UNSLOTH_WHEEL")
#: the command that puts the wheel where :data:`WHEEL` looks
DOWNLOAD = WHEEL.download
#: the persistent programs launched in Triton's interpreter (a GPU launches one per SM)
INTERPRETED_SMS = 3


def load_forward(wheel: str) -> types.ModuleType:
    """A module holding :data:`FORWARD_FUNCTIONS` from ``wheel``'s :data:`FORWARD_MEMBER` (``load_functions``)."""
    return load_functions(wheel, ((FORWARD_MEMBER, FORWARD_FUNCTIONS),), {}, "gmm_kernels.adapters._unsloth_forward")


@functools.cache
def _loaded(wheel: str, interpreted: bool) -> types.ModuleType:
    """:func:`load_forward`, once per wheel and interpreter state (``@triton.jit`` reads it when run)."""
    return load_forward(wheel)


def _kernel() -> Any:
    wheel = WHEEL.find()
    if wheel is None:
        raise WHEEL.missing("grouped GEMM")
    interpreted = triton_interpreter.in_use()
    module = _loaded(wheel, interpreted)  # imports Triton, which fix() patches
    if interpreted:  # a direct run (no available() first) gets the interpreter's fixes too
        triton_interpreter.fix()
    return module._grouped_gemm_forward_kernel


class UnslothGroupedGemm(RoutedKernelAdapter):
    """unsloth's ``_grouped_gemm_forward_kernel`` (from its wheel; interpreted where no GPU is seen) in its three
    fused forms (``gmm_ref.conventions.unsloth``), launched with ``GROUPED_GEMM_CONFIG`` (16 x 16 x 16 tiles)."""

    name = "unsloth.grouped_gemm"
    convention = "unsloth.grouped_gemm"
    requires = ("torch", "triton")
    needs = "unsloth's grouped GEMM is a Triton kernel"
    flush_subnormals = True

    def _unavailable(self) -> str | None:
        return WHEEL.unavailable(_kernel)

    def routed_limits(self) -> RoutedLimits:
        """The convention's ``(K, N)`` extents, up to 257 experts (past 256: unsloth has no expert-count variants,
        and every program walks every expert, so 513 only costs time), ``top_k`` up to 8, 40 tokens."""
        return RoutedLimits(num_experts=(8, 60, 257))

    def numerics_for(self, routing: Any) -> Any:
        """The product rounded once to X's dtype; with ``fuse_mul_post`` the weight cast to it and multiplied in
        it (``RoutedNumerics(weight="output")``). float32 on a GPU: ``tl.dot``'s default TF32 inputs (declared as
        bfloat16 products, a sound, slightly looser bound)."""
        import dataclasses

        from gmm_ref import RoutedNumerics

        rn = super().numerics_for(routing)
        product = rn.product
        if device.on_cuda() and str(routing.tokens.dtype) == "float32":
            product = dataclasses.replace(product, multiply="bfloat16")
        if routing.mul_routed_weight:
            return RoutedNumerics(product=product, weight="output", combine=routing.out_dtype)
        return RoutedNumerics(product=product)

    def call(self, X: Any, W: Any, topk: int, m_sizes: Any, gather_indices: Any = None, topk_weights: Any = None,
             permute_x: bool = False, permute_y: bool = False, fuse_mul_post: bool = False, autotune: bool = False,
             BLOCK_SIZE_M: int = 32, BLOCK_SIZE_N: int = 32, BLOCK_SIZE_K: int = 32, **options: Any) -> Any:
        if autotune or any(options.get(f"use_tma_{x}") for x in ("load_w", "load_x", "store")):
            raise ValueError("autotune / use_tma_*: this adapter launches the fixed config without TMA")
        kernel = _kernel()
        tensors, _ = to_framework("torch", (X, W, m_sizes, gather_indices, topk_weights), {})
        x, w, sizes, gather, weights = (t.contiguous() if t is not None else None for t in tensors)
        n = w.shape[1] if w.dim() == 3 else w.shape[0] // sizes.shape[0]
        x, w = x.view(-1, x.shape[-1]), w.view(-1, w.shape[-1])
        total = gather.shape[0]
        if weights is not None:
            weights = weights.view(-1)
        if device.on_cuda():  # to_framework made the operands on the selected device
            import torch

            y = torch.empty((total, n), dtype=x.dtype, device=x.device)
            sms = torch.cuda.get_device_properties(y.device).multi_processor_count
        else:  # a guarded buffer: a write past y is seen in its margins
            y = guards.torch_empty("y", (total, n), x.dtype)
            sms = INTERPRETED_SMS
        args = dict(NUM_EXPERTS=int(sizes.shape[0]), NUM_TOKENS=total // topk, TOPK=topk, N=n, K=x.shape[1],
                    NUM_SMS=sms, PERMUTE_X=permute_x, PERMUTE_Y=permute_y, FUSE_MUL_POST=fuse_mul_post, FLATTEN=True,
                    USE_TMA_LOAD_W=False, USE_TMA_LOAD_X=False, USE_TMA_STORE=False, BLOCK_SIZE_M=BLOCK_SIZE_M,
                    BLOCK_SIZE_N=BLOCK_SIZE_N, BLOCK_SIZE_K=BLOCK_SIZE_K)
        if device.on_cuda():
            kernel[(sms,)](x, w, y, sizes, gather, weights, num_warps=4, num_stages=2, **args)
            return y
        with np.errstate(all="ignore"):  # the interpreter's NumPy: NaN and Inf propagate, unwarned
            kernel[(sms,)](x, w, y, sizes, gather, weights, **args)
        return y
