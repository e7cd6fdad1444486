"""vLLM's batched experts GEMM (``vllm.batched_moe``): ``invoke_moe_batched_triton_kernel``, a Triton kernel; and
vLLM's fused MoE (``vllm.fused_moe``, a routed kernel: :class:`VllmFusedMoE`), read from the same wheel by the same
loader (:func:`gmm_kernels.runtimes.wheels.load_functions`).

vLLM cannot be installed beside the tested torch (its wheel pins another torch), and its package root imports
far more than this kernel needs. So the adapter reads the kernel's source from vLLM's wheel, untouched
(:data:`WHEEL_VERSION`, ``pip download --no-deps``; :func:`find_wheel` says where it looks,
``gmm_kernels.runtimes.wheels`` the loader every wheel's kernels share), and runs only what the GEMM needs
(:func:`load_kernel`): from ``vllm/model_executor/layers/fused_moe/experts/fused_batched_moe.py`` the three
``@triton.jit`` functions ``moe_mmk``, ``expert_triton_kernel``, ``batched_triton_kernel`` and the launcher
``invoke_moe_batched_triton_kernel``; from ``vllm/model_executor/layers/fused_moe/utils.py`` the launcher's helper
``normalize_batched_scales_shape``. They run with Triton's own ``triton`` and ``triton.language`` in place of
``vllm.triton_utils``'s, and ``use_tensor_descriptor()`` False (vLLM's TMA path, for Hopper and later, is off: the
interpreter and any GPU run the pointer path). Each function keeps its file name and line numbers, so a traceback
points into the wheel's file.

Where torch sees no GPU the kernels run in Triton's interpreter (``gmm_kernels.runtimes.triton_interpreter``) on CPU
tensors; on a CUDA GPU with vLLM installed the installed package's function runs, else the wheel's, on CUDA
tensors. Either way the launch config is the problem's tiling, the convention's ``config`` argument (by default
``BLOCK_SIZE_M=16, BLOCK_SIZE_K=128, BLOCK_SIZE_N=32``, ``gmm_ref.conventions.vllm``), so that drawn extents
straddle tile edges. Every form the convention has runs interpreted, FP8 included (the interpreter's ``tl.dot``
of float8_e4m3fn codes reads NaN codes as finite: the harness fixes it, ``fp8_nan_dot`` in docs/triton.md).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any

import numpy as np

from gmm_kernels.base import KernelAdapter, RoutedKernelAdapter, RoutedLimits
from gmm_kernels.runtimes.wheels import Wheel, WheelLayoutError, load_functions, tl_dtype, wheel_cache_dir
from gmm_kernels.sandbox import device
from gmm_kernels.sandbox.convert import to_framework
from gmm_kernels.scope import Limits
from gmm_ref import Numerics, Problem

__all__ = ["KERNEL_FUNCTIONS", "KERNEL_MEMBER", "UTILS_FUNCTIONS", "UTILS_MEMBER", "WHEEL", "WHEEL_ENV",
           "WHEEL_VERSION", "VllmBatchedMoE", "VllmFusedMoE", "WheelLayoutError", "find_wheel", "load_functions",
           "load_fused_moe", "load_kernel", "wheel_cache_dir"]

#: the vLLM release whose kernel is checked (scripts/setup.sh downloads its wheel)
WHEEL_VERSION = "0.33.0"
#: a vLLM wheel file (or a folder holding one) to read the kernel from, before the cache
WHEEL_ENV = "GMM_HARNESS_VLLM_WHEEL"
KERNEL_MEMBER = "vllm/model_executor/layers/fused_moe/experts/fused_batched_moe.py"
UTILS_MEMBER = "vllm/model_executor/layers/fused_moe/utils.py"
KERNEL_FUNCTIONS = ("moe_mmk", "expert_triton_kernel", "batched_triton_kernel", "invoke_moe_batched_triton_kernel")
UTILS_FUNCTIONS = ("normalize_batched_scales_shape",)
FUSED_MOE_MEMBER = "vllm/model_executor/layers/fused_moe/fused_moe.py"
#: the fused MoE GEMM of ``TritonExperts``: the kernel, its helper for other ranks' experts, and its launcher
FUSED_MOE_FUNCTIONS = ("write_zeros_to_output", "fused_moe_kernel", "invoke_fused_moe_triton_kernel")
#: where the wheel is found (:meth:`gmm_kernels.runtimes.wheels.Wheel.find`)
WHEEL = Wheel("vllm", "vLLM", WHEEL_VERSION, WHEEL_ENV)
#: the command that puts the wheel where :func:`find_wheel` looks
DOWNLOAD = WHEEL.download


def find_wheel() -> str | None:
    """The vLLM wheel to read: :data:`WHEEL_ENV` (a wheel, or a folder holding vLLM :data:`WHEEL_VERSION`'s),
    else :data:`WHEEL_VERSION`'s in :func:`wheel_cache_dir`; None where there is none."""
    return WHEEL.find()


def _no_allocator(*_args: Any, **_kwargs: Any) -> None:
    raise RuntimeError("vllm.triton_utils.allocation.set_triton_allocator: not loaded (the TMA path is off)")


def load_kernel(wheel: str) -> types.ModuleType:
    """A module holding :data:`KERNEL_FUNCTIONS` and :data:`UTILS_FUNCTIONS` from ``wheel``'s source, run with
    Triton's ``triton`` and ``tl`` (:func:`load_functions`)."""
    import torch

    return load_functions(wheel, ((UTILS_MEMBER, UTILS_FUNCTIONS), (KERNEL_MEMBER, KERNEL_FUNCTIONS)),
                          dict(torch=torch, use_tensor_descriptor=lambda: False, set_triton_allocator=_no_allocator),
                          "gmm_kernels.adapters._vllm_fused_batched_moe")


class _Logger:
    """vLLM's logger where the loaded launcher warns (the TD path it would warn about is off)."""

    def warning_once(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    warning = info = debug = warning_once


def load_fused_moe(wheel: str) -> types.ModuleType:
    """A module holding :data:`FUSED_MOE_FUNCTIONS` from ``wheel``'s ``fused_moe.py`` (:func:`load_functions`):
    the launcher ``invoke_fused_moe_triton_kernel`` with vLLM's tensor-descriptor path off
    (``resolve_moe_use_td()`` False, as vLLM resolves it on CUDA unless ``VLLM_TRITON_USE_TD`` is set) and
    ``SWAP_AB`` off (``enable_swap_ab`` is False for unquantized operands in vLLM too: it is read under FP8 only)."""
    import torch

    return load_functions(wheel, ((FUSED_MOE_MEMBER, FUSED_MOE_FUNCTIONS),),
                          dict(torch=torch, Any=Any, set_triton_allocator=_no_allocator,
                               resolve_moe_use_td=lambda: False, enable_swap_ab=lambda *_a: False,
                               warn_if_moe_use_td_ineffective=lambda *_a, **_k: None, logger=_Logger()),
                          "gmm_kernels.adapters._vllm_fused_moe")


@functools.cache
def _loaded(wheel: str, interpreted: bool) -> types.ModuleType:
    """:func:`load_kernel`, once per wheel and interpreter state (``@triton.jit`` reads it when run)."""
    return load_kernel(wheel)


@functools.cache
def _loaded_fused(wheel: str, interpreted: bool) -> types.ModuleType:
    """:func:`load_fused_moe`, once per wheel and interpreter state."""
    return load_fused_moe(wheel)


class VllmBatchedMoE(KernelAdapter):
    """``invoke_moe_batched_triton_kernel`` of vLLM's ``fused_batched_moe`` (from its wheel; interpreted where
    no GPU is seen)."""

    name = "vllm.batched_moe"
    convention = "vllm.batched_moe"
    requires = ("torch", "triton")
    needs = "vLLM's batched experts are Triton kernels"
    flush_subnormals = True

    def _kernel(self) -> Any:
        """The launcher: the installed vLLM's on a GPU where it is installed (and imports), else the wheel's."""
        return _launcher(("vllm.model_executor.layers.fused_moe.experts.fused_batched_moe",  # 0.33
                          "vllm.model_executor.layers.fused_moe.fused_batched_moe"),  # earlier releases
                         "invoke_moe_batched_triton_kernel", "batched experts", _loaded)

    def _unavailable(self) -> str | None:
        return _unavailable_here(self._kernel)

    def large_refusal(self) -> str | None:
        return None if device.on_cuda() else self._runs_interpreted("Triton's interpreter", takes="days")

    def _limits(self) -> Limits:
        """On a GPU: the convention's. In Triton's interpreter: extents up to 64 (up to 4 row tiles of 16 and 2
        column tiles of 32 at the default tiling, K within one tile of 128; the grid is experts x row tiles x
        column tiles, one interpreted program each, the cost grows with it)."""
        if device.on_cuda():
            return Limits()
        return Limits(max_extent=160, max_k=8192)  # K: the loop inside each program, a real layer's at most

    def numerics_for(self, problem: Problem) -> Numerics:
        """FP8: each K tile's ``tl.dot`` of codes in the tensor cores (about 14 bits kept on Hopper), promoted into
        the float32 accumulator with its scales (the block path; the per-tensor and per-token paths are declared
        the same, which a first run on a GPU confirms or refutes). float32: ``tl.dot``'s default input precision
        is TF32, on a GPU as in the harness's interpreter (declared as bfloat16 products, a sound, slightly looser
        bound)."""
        base = super().numerics_for(problem)
        if self.scope is not None and self.scope.numerics is not None:
            return base
        if problem.scaled:
            tk = (problem.tiling or self.convention_facts.default_tiling)[1]
            return dataclasses.replace(base, promote_every=tk, partial_accumulate=2.0 ** -13)
        if str(problem.lhs.dtype) == "float32":
            return dataclasses.replace(base, multiply="bfloat16")
        return base

    def call(self, A: Any, B: Any, C: Any, expert_num_tokens: Any, **kwargs: Any) -> Any:
        kernel = self._kernel()
        (a, b, c, counts), kw = to_framework("torch", (A, B, C, expert_num_tokens), kwargs)
        args = {"B_zp": None, "use_int8_w8a16": False, "use_int4_w4a16": False, "A_scale": None, "B_scale": None,
                "use_fp8_w8a8": False, "per_act_token_quant": False, "block_shape": None, **kw}
        args["compute_type"] = tl_dtype(args.get("compute_type"), c.dtype)
        # the kernel writes the C it is given (a view into its guarded buffer: a write past it is seen there); on
        # CUDA to_framework made the operands on the selected device
        if device.on_cuda():
            kernel(a, b, c, counts, **{k: device.place(v) for k, v in args.items()})
            return c
        with np.errstate(all="ignore"):  # the interpreter's NumPy: NaN and Inf propagate, as on a GPU, unwarned
            kernel(a, b, c, counts, **args)
        return c


def _launcher(modules: tuple[str, ...], name: str, what: str, loaded: Any) -> Any:
    """vLLM's launcher ``name`` (:meth:`gmm_kernels.runtimes.wheels.Wheel.launcher`)."""
    return WHEEL.launcher(modules, name, what, loaded)


def _unavailable_here(kernel: Any) -> str | None:
    """Why a kernel of vLLM's wheel cannot run here (``kernel()`` loads it), or None."""
    return WHEEL.unavailable(kernel)


class VllmFusedMoE(RoutedKernelAdapter):
    """``invoke_fused_moe_triton_kernel`` of vLLM's ``fused_moe`` (``fused_moe_kernel``, unquantized; from its
    wheel, interpreted where no GPU is seen), on metadata ``moe_align_block_size`` builds
    (``gmm_ref.conventions.vllm.FUSED_MOE``), launched with ``FUSED_MOE_CONFIG`` (16 x 32 x 32 tiles)."""

    name = "vllm.fused_moe"
    convention = "vllm.fused_moe"
    requires = ("torch", "triton")
    needs = "vLLM's fused MoE is a Triton kernel"
    flush_subnormals = True

    def _kernel(self) -> Any:
        """The launcher: the installed vLLM's on a GPU where it is installed (and imports), else the wheel's."""
        return _launcher(("vllm.model_executor.layers.fused_moe.fused_moe",), "invoke_fused_moe_triton_kernel",
                         "fused MoE", _loaded_fused)

    def _unavailable(self) -> str | None:
        return _unavailable_here(self._kernel)

    def routed_limits(self) -> RoutedLimits:
        """The strategies' defaults (up to 40 tokens, 8 to 513 experts, top_k up to 8) with ``(K, N)`` extents
        around the launch config's tiles: ``(4, 4)``, ``(16, 8)`` (within one tile) and ``(40, 40)`` (K and N past
        one 32-wide tile, a masked tail each). Interpreted, a call costs about 10 ms per live program (live row
        blocks x column tiles)."""
        return RoutedLimits(extents=((4, 4), (16, 8), (40, 40)))

    def call(self, A: Any, B: Any, C: Any, topk_weights: Any, sorted_token_ids: Any, expert_ids: Any,
             num_tokens_post_padded: Any, mul_routed_weight: bool, top_k: int, config: Any = None,
             compute_type: Any = None) -> Any:
        kernel = self._kernel()
        tensors, _ = to_framework("torch", (A, B, C, topk_weights, sorted_token_ids, expert_ids,
                                            num_tokens_post_padded), {})
        a, b, c, w, ids, blocks, post = tensors
        args = (None, None, w, ids, blocks, post, mul_routed_weight, top_k, dict(config),
                tl_dtype(compute_type, c.dtype), False, False, False, False, False)
        # the kernel writes the C it is given (its guarded copy: a write past it is seen in its margins); on CUDA
        # to_framework made the operands on the selected device
        if device.on_cuda():
            kernel(a, b, c, *(device.place(x) for x in args))
            return c
        with np.errstate(all="ignore"):  # the interpreter's NumPy: NaN and Inf propagate, unwarned
            kernel(a, b, c, *args)
        return c
