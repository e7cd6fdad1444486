"""SGLang's fused MoE (``sglang.fused_moe``, a routed kernel: :class:`SglangFusedMoE`): ``fused_moe_kernel``
through its launcher ``invoke_fused_moe_kernel``, read from SGLang's wheel (:data:`WHEEL_VERSION`,
``scripts/setup.sh`` downloads it; ``gmm_kernels.runtimes.wheels`` finds and loads it as it does vLLM's).

SGLang, like vLLM, pins its own torch and imports far more than this kernel on import. So the adapter runs only
the three top-level functions of ``sglang/kernels/ops/moe/fused_moe_triton_kernels.py`` the unquantized path
needs (:data:`FUSED_MOE_FUNCTIONS`: ``write_zeros_to_output``, ``fused_moe_kernel``, ``invoke_fused_moe_kernel``),
as written, with Triton's ``triton`` / ``tl``. What the launcher reads besides them is given here: SGLang's
quantizers, its GPTQ/AWQ kernel and its TMA descriptors (read only on paths this convention refuses) raise
naming themselves; ``is_arch_support_pdl()`` is False (no programmatic dependent launch: the kernel's
``USE_GDC`` off, as SGLang runs it before Hopper); ``padding_size`` is 0 (read under FP8 only).

Where torch sees no GPU the kernel runs in Triton's interpreter on CPU tensors; on a CUDA GPU with SGLang
installed the installed package's launcher runs, else the wheel's, on CUDA tensors. The launch config is the
convention's ``FUSED_MOE_CONFIG`` (16 x 32 x 32 tiles).
"""

from __future__ import annotations

import functools
import types
from typing import Any, Optional

import numpy as np

from gmm_kernels.base import RoutedKernelAdapter, RoutedLimits
from gmm_kernels.runtimes.wheels import Wheel, load_functions, tl_dtype
from gmm_kernels.sandbox import device
from gmm_kernels.sandbox.convert import to_framework

__all__ = ["FUSED_MOE_FUNCTIONS", "FUSED_MOE_MEMBER", "WHEEL", "WHEEL_ENV", "WHEEL_VERSION", "SglangFusedMoE",
           "load_fused_moe"]

#: the SGLang release whose kernel is checked (scripts/setup.sh downloads its wheel)
WHEEL_VERSION = "0.5.23"
#: an SGLang wheel file (or a folder holding one) to read the kernel from, before the cache
WHEEL_ENV = "GMM_HARNESS_SGLANG_WHEEL"
WHEEL = Wheel("sglang", "SGLang", WHEEL_VERSION, WHEEL_ENV)
FUSED_MOE_MEMBER = "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
#: the fused MoE GEMM: the kernel, its helper for other ranks' experts, and its launcher
FUSED_MOE_FUNCTIONS = ("write_zeros_to_output", "fused_moe_kernel", "invoke_fused_moe_kernel")
#: the launcher's other globals, read only on the paths this convention refuses (quantized, GPTQ/AWQ, TMA)
NOT_LOADED = ("scaled_fp8_quant", "per_token_group_quant_fp8", "sglang_per_token_group_quant_fp8",
              "per_token_quant_int8", "per_token_group_quant_int8", "sglang_per_token_group_quant_int8",
              "fused_moe_kernel_gptq_awq", "TensorDescriptor", "_set_triton_tma_allocator", "_get_b_tma_desc_cached",
              "should_enable_swap_ab")


def _not_loaded(name: str) -> Any:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"SGLang's {name}: not loaded from the wheel (sglang.fused_moe runs the unquantized "
                           "path, without TMA)")
    return refuse


def load_fused_moe(wheel: str) -> types.ModuleType:
    """A module holding :data:`FUSED_MOE_FUNCTIONS` from ``wheel``'s :data:`FUSED_MOE_MEMBER`
    (``gmm_kernels.runtimes.wheels.load_functions``; module docstring)."""
    import torch

    provided: dict[str, Any] = {name: _not_loaded(name) for name in NOT_LOADED}
    # the typing names: the file's ``from __future__ import annotations`` lies outside the functions loaded
    provided.update(torch=torch, Any=Any, Dict=dict, List=list, Optional=Optional,
                    is_arch_support_pdl=lambda: False, padding_size=0, _is_cuda=torch.cuda.is_available())
    return load_functions(wheel, ((FUSED_MOE_MEMBER, FUSED_MOE_FUNCTIONS),), provided,
                          "gmm_kernels.adapters._sglang_fused_moe")


@functools.cache
def _loaded(wheel: str, interpreted: bool) -> types.ModuleType:
    """:func:`load_fused_moe`, once per wheel and interpreter state (``@triton.jit`` reads it when run)."""
    return load_fused_moe(wheel)


class SglangFusedMoE(RoutedKernelAdapter):
    """``invoke_fused_moe_kernel`` of SGLang's ``fused_moe_triton_kernels`` (``fused_moe_kernel``, unquantized;
    from its wheel, interpreted where no GPU is seen), on metadata SGLang's ``moe_align_block_size`` builds
    (``gmm_ref.conventions.sglang.FUSED_MOE``), launched with ``FUSED_MOE_CONFIG`` (16 x 32 x 32 tiles)."""

    name = "sglang.fused_moe"
    convention = "sglang.fused_moe"
    requires = ("torch", "triton")
    needs = "SGLang's fused MoE is a Triton kernel"
    flush_subnormals = True

    def _kernel(self) -> Any:
        """The launcher: the installed SGLang's on a GPU where it is installed (and imports), else the wheel's."""
        return WHEEL.launcher(("sglang.kernels.ops.moe.fused_moe_triton_kernels",), "invoke_fused_moe_kernel",
                              "fused MoE", _loaded)

    def _unavailable(self) -> str | None:
        return WHEEL.unavailable(self._kernel)

    def routed_limits(self) -> RoutedLimits:
        """The strategies' defaults (up to 40 tokens, 8 to 513 experts, top_k up to 8) with ``(K, N)`` extents
        around the launch config's tiles: ``(4, 4)`` (within one tile), ``(32, 8)`` (K one whole tile: the
        kernel's ``even_Ks`` path, its loads unmasked in K) and ``(40, 40)`` (K and N past one 32-wide tile, a
        masked tail each)."""
        return RoutedLimits(extents=((4, 4), (32, 8), (40, 40)))

    def call(self, A: Any, B: Any, bias: Any, C: Any, A_scale: Any, B_scale: Any, B_zp: Any, topk_weights: Any,
             topk_ids: Any, sorted_token_ids: Any, expert_ids: Any, num_tokens_post_padded: Any,
             mul_routed_weight: bool, top_k: int, config: Any, compute_type: Any, **flags: Any) -> Any:
        kernel = self._kernel()
        tensors, _ = to_framework("torch", (A, B, C, topk_weights, topk_ids, sorted_token_ids, expert_ids,
                                            num_tokens_post_padded), {})
        a, b, c, w, ids, sorted_ids, blocks, post = tensors
        args = (w, ids, sorted_ids, blocks, post, mul_routed_weight, top_k, dict(config))
        kw = dict(flags, compute_type=tl_dtype(compute_type, c.dtype))
        # the kernel writes the C it is given (its guarded copy: a write past it is seen in its margins); on CUDA
        # to_framework made the operands on the selected device
        if device.on_cuda():
            kernel(a, b, bias, c, A_scale, B_scale, B_zp, *(device.place(x) for x in args), **kw)
            return c
        with np.errstate(all="ignore"):  # the interpreter's NumPy: NaN and Inf propagate, unwarned
            kernel(a, b, bias, c, A_scale, B_scale, B_zp, *args, **kw)
        return c
