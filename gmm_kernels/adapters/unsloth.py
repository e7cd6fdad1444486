"""unsloth's grouped GEMM forward (``unsloth.grouped_gemm``, a routed kernel: :class:`UnslothGroupedGemm`), its
Triton kernel read from unsloth's wheel by the wheel loader (``gmm_kernels.runtimes.wheels``).

Importing unsloth pulls in far more than this kernel (its package root patches transformers and needs a GPU), so
the adapter reads ``_grouped_gemm_forward_kernel`` from ``unsloth/kernels/moe/grouped_gemm/kernels/forward.py`` of
unsloth's wheel (:data:`WHEEL_VERSION`, ``pip download --no-deps``; :data:`WHEEL` looks in
``GMM_HARNESS_UNSLOTH_WHEEL``, then the wheel cache), untouched, and launches it as ``grouped_gemm_forward``'s
``_grouped_gemm_forward_impl`` does without autotuning (interface.py): the operands made contiguous, ``y``
allocated ``[T*topk, N]`` in X's dtype, one persistent program per SM (``grid = (NUM_SMS,)``), every launch
argument as it passes them, TMA off. That function itself asserts CUDA tensors and reads unsloth's device
helpers, so it is not loaded: its launch is restated here. Where torch sees no GPU the kernel runs in Triton's
interpreter with :data:`INTERPRETED_SMS` programs (so that programs take several tiles, as on a GPU).

The backward kernels (:data:`BACKWARD_FUNCTIONS` of ``kernels/backward.py``) are rows of their own, each launched
as ``interface.py`` launches it without autotuning: :class:`UnslothGroupedGemmDX` (``_grouped_gemm_dX_impl``),
:class:`UnslothGroupedGemmDW` (``_launch_grouped_gemm_dW``'s default per-expert kernel) and
:class:`UnslothGroupedGemmDWAccumulate` (the same kernel adding into a given ``dW``).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

from gmm_kernels.base import RoutedKernelAdapter, RoutedLimits
from gmm_kernels.runtimes import triton_interpreter
from gmm_kernels.runtimes.wheels import Wheel, load_functions
from gmm_kernels.sandbox import convert, device, guards
from gmm_kernels.sandbox.convert import to_framework
from gmm_ref.dtypes import as_dtype

__all__ = ["BACKWARD_FUNCTIONS", "BACKWARD_MEMBER", "DOWNLOAD", "FORWARD_FUNCTIONS", "FORWARD_MEMBER",
           "INTERPRETED_SMS", "WHEEL", "WHEEL_VERSION", "UnslothGroupedGemm", "UnslothGroupedGemmDW",
           "UnslothGroupedGemmDWAccumulate", "UnslothGroupedGemmDX", "load_backward", "load_forward"]

#: the unsloth release whose kernel is checked (scripts/setup.sh downloads its wheel)
WHEEL_VERSION = "2026.10.9"
FORWARD_MEMBER = "unsloth/kernels/moe/grouped_gemm/kernels/forward.py"
FORWARD_FUNCTIONS = ("_grouped_gemm_forward_kernel",)
BACKWARD_MEMBER = "unsloth/kernels/moe/grouped_gemm/kernels/backward.py"
BACKWARD_FUNCTIONS = ("_grouped_gemm_dX_kernel", "_grouped_gemm_dW_per_expert_kernel")
#: where the wheel is found (``GMM_HARNESS_UNSLOTH_WHEEL``, then the wheel cache)
WHEEL = Wheel("unsloth", "unsloth", WHEEL_VERSION, "GMM_HARNESS_UNSLOTH_WHEEL")
#: the command that puts the wheel where :data:`WHEEL` looks
DOWNLOAD = WHEEL.download
#: the persistent programs launched in Triton's interpreter (a GPU launches one per SM)
INTERPRETED_SMS = 3


def load_forward(wheel: str) -> types.ModuleType:
    """A module holding :data:`FORWARD_FUNCTIONS` from ``wheel``'s :data:`FORWARD_MEMBER` (``load_functions``)."""
    return load_functions(wheel, ((FORWARD_MEMBER, FORWARD_FUNCTIONS),), {}, "gmm_kernels.adapters._unsloth_forward")


def load_backward(wheel: str) -> types.ModuleType:
    """A module holding :data:`BACKWARD_FUNCTIONS` from ``wheel``'s :data:`BACKWARD_MEMBER`."""
    return load_functions(wheel, ((BACKWARD_MEMBER, BACKWARD_FUNCTIONS),), {},
                          "gmm_kernels.adapters._unsloth_backward")


@functools.cache
def _loaded(wheel: str, interpreted: bool, backward: bool = False) -> types.ModuleType:
    """:func:`load_forward` (:func:`load_backward`), once per wheel and interpreter state (``@triton.jit`` reads
    it when run)."""
    return load_backward(wheel) if backward else load_forward(wheel)


def _kernel(name: str = "_grouped_gemm_forward_kernel") -> Any:
    """The wheel's kernel ``name`` (of :data:`FORWARD_FUNCTIONS` or :data:`BACKWARD_FUNCTIONS`)."""
    wheel = WHEEL.find()
    if wheel is None:
        raise WHEEL.missing("grouped GEMM")
    interpreted = triton_interpreter.in_use()
    module = _loaded(wheel, interpreted, name in BACKWARD_FUNCTIONS)  # imports Triton, which fix() patches
    if interpreted:  # a direct run (no available() first) gets the interpreter's fixes too
        triton_interpreter.fix()
    return getattr(module, name)


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
        it (``RoutedNumerics(weight="output")``). float32: ``tl.dot``'s default TF32 inputs (the base class's)."""
        from gmm_ref import RoutedNumerics

        product = super().numerics_for(routing).product
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


# ------------------------------------------------------------------------------------------------- backward
class _UnslothBackward(RoutedKernelAdapter):
    """A backward kernel of unsloth's grouped GEMM (``backward.py`` of its wheel), launched as its ``interface.py``
    launches it without autotuning, TMA off, with ``GROUPED_GEMM_CONFIG`` (16 x 16 x 16 tiles)."""

    requires = ("torch", "triton")
    needs = "unsloth's grouped GEMM is a Triton kernel"
    flush_subnormals = True
    #: the wheel's kernel (of BACKWARD_FUNCTIONS)
    kernel_name = ""

    def _unavailable(self) -> str | None:
        return WHEEL.unavailable(lambda: _kernel(self.kernel_name))

    def numerics_for(self, routing: Any) -> Any:
        """Exact products into a float32 accumulator, one rounding to the gradient's dtype (subnormals possibly
        flushed); float32: ``tl.dot``'s default TF32 inputs (the base class's)."""
        from gmm_ref import RoutedNumerics

        return RoutedNumerics(product=super().numerics_for(routing).product)

    def _launch(self, kernel: Any, grid: tuple[int], *tensors: Any, num_stages: int = 2, **args: Any) -> None:
        if device.on_cuda():
            kernel[grid](*tensors, num_warps=4, num_stages=num_stages, **args)
            return
        with np.errstate(all="ignore"):  # the interpreter's NumPy: NaN and Inf propagate, unwarned
            kernel[grid](*tensors, **args)


def _torch(*arrays: Any) -> list[Any]:
    tensors, _ = to_framework("torch", arrays, {})
    return [t.contiguous() if t is not None else None for t in tensors]


def _no_tuning(autotune: bool, **tma: bool) -> None:
    if autotune or any(tma.values()):
        raise ValueError("autotune / use_tma_*: this adapter launches the fixed config without TMA")


class UnslothGroupedGemmDX(_UnslothBackward):
    """unsloth's ``_grouped_gemm_dX_kernel`` (``gmm_ref.conventions.unsloth.GROUPED_GEMM_DX``), launched as
    ``_grouped_gemm_dX_impl`` launches it: ``dX`` zeroed ``[T*topk, K]`` in dY's dtype, one persistent program per
    SM (:data:`INTERPRETED_SMS` interpreted)."""

    name = "unsloth.grouped_gemm_dX"
    convention = "unsloth.grouped_gemm_dX"
    kernel_name = "_grouped_gemm_dX_kernel"

    def routed_limits(self) -> RoutedLimits:
        """The convention's ``(K, N)`` extents, up to 257 experts (every program walks every expert, as the
        forward's), ``top_k`` up to 8, 40 tokens."""
        return RoutedLimits(num_experts=(8, 60, 257))

    def call(self, dY: Any, W: Any, gather_indices: Any, m_sizes: Any, topk: int, BLOCK_SIZE_M: int = 32,
             BLOCK_SIZE_N: int = 32, BLOCK_SIZE_K: int = 32, debug: bool = False, permute_x: bool = False,
             permute_y: bool = False, use_tma_load_w: bool = False, use_tma_load_dy: bool = False,
             use_tma_store: bool = False, num_warps: int = 4, num_stages: int = 2, flatten: bool = True,
             fuse_mul_pre: bool = False, fuse_mul_post: bool = False, autotune: bool = False) -> Any:
        _no_tuning(autotune, load_w=use_tma_load_w, load_dy=use_tma_load_dy, store=use_tma_store)
        kernel = _kernel(self.kernel_name)
        dy, w, gather, sizes = _torch(dY, W, gather_indices, m_sizes)
        n = w.shape[1] if w.dim() == 3 else w.shape[0] // sizes.shape[0]
        dy, w = dy.view(-1, dy.shape[-1]), w.view(-1, w.shape[-1])
        total, k = dy.shape[0], w.shape[1]
        if device.on_cuda():
            import torch

            dx = torch.zeros((total, k), dtype=dy.dtype, device=dy.device)
            sms = torch.cuda.get_device_properties(dx.device).multi_processor_count
        else:  # a guarded buffer of zeros, as torch.zeros: a write past dX is seen in its margins
            dx, sms = guards.torch_empty("dX", (total, k), dy.dtype), INTERPRETED_SMS
        self._launch(kernel, (sms,), dy, w, dx, gather, sizes, num_stages=num_stages,
                     NUM_EXPERTS=int(sizes.shape[0]), NUM_TOKENS=total // topk, TOPK=topk, N=n, K=k, NUM_SMS=sms,
                     BLOCK_SIZE_M=BLOCK_SIZE_M, BLOCK_SIZE_N=BLOCK_SIZE_N, BLOCK_SIZE_K=BLOCK_SIZE_K,
                     PERMUTE_X=permute_x, PERMUTE_Y=permute_y, USE_TMA_LOAD_W=False, USE_TMA_LOAD_dY=False,
                     USE_TMA_STORE=False, FLATTEN=flatten)
        return dx


class UnslothGroupedGemmDW(_UnslothBackward):
    """unsloth's default dW kernel, ``_grouped_gemm_dW_per_expert_kernel`` (``gmm_ref.conventions.unsloth.
    GROUPED_GEMM_DW``), launched as ``_launch_grouped_gemm_dW`` launches it: one program per (expert, n tile,
    k tile), ``dW`` from ``torch.empty`` (here NaN inside a guarded buffer: an element never written is seen),
    ``EXPERTS_POW2`` the next power of two of the expert count; one stage for float32 operands on a GPU."""

    name = "unsloth.grouped_gemm_dW"
    convention = "unsloth.grouped_gemm_dW"
    kernel_name = "_grouped_gemm_dW_per_expert_kernel"

    def routed_limits(self) -> RoutedLimits:
        """The convention's ``(K, N)`` extents, 8 and 20 experts (one interpreted program per expert and tile:
        20 experts are 20 to 120 programs, ``EXPERTS_POW2`` 32 with 12 masked; 1,025 experts are the ``scale``
        mode's), ``top_k`` up to 8, 40 tokens."""
        return RoutedLimits(num_experts=(8, 20))

    def call(self, X: Any, dY: Any, m_sizes: Any, gather_indices: Any, topk: int, BLOCK_SIZE_M: int = 32,
             BLOCK_SIZE_N: int = 32, BLOCK_SIZE_K: int = 32, permute_x: bool = False, permute_y: bool = False,
             use_tma_load_dy: bool = False, use_tma_load_x: bool = False, use_tma_store: bool = False,
             fuse_mul_pre: bool = False, fuse_mul_post: bool = False, num_warps: int = 4, num_stages: int = 2,
             flatten: bool = True, autotune: bool = False, debug: bool = False, dW_dtype: Any = None) -> Any:
        _no_tuning(autotune, load_dy=use_tma_load_dy, load_x=use_tma_load_x, store=use_tma_store)
        x, dy, sizes, gather = _torch(X, dY, m_sizes, gather_indices)
        dtype = x.dtype if dW_dtype is None else convert.torch_dtype(as_dtype(dW_dtype, name="dW_dtype"))
        shape = (int(sizes.shape[0]), dy.shape[1], x.shape[-1])
        if device.on_cuda():
            import torch

            dw = torch.empty(shape, dtype=dtype, device=x.device)
        else:  # torch.empty's contents are undefined: NaN here, so an element the kernel never writes is seen
            dw = guards.torch_empty("dW", shape, dtype).fill_(float("nan"))
        return self._dw(x, dy, sizes, gather, dw, topk, permute_x, permute_y, False,
                        dict(BLOCK_SIZE_M=BLOCK_SIZE_M, BLOCK_SIZE_N=BLOCK_SIZE_N, BLOCK_SIZE_K=BLOCK_SIZE_K),
                        num_stages)

    def _dw(self, x: Any, dy: Any, sizes: Any, gather: Any, dw: Any, topk: int, permute_x: bool, permute_y: bool,
            accumulate: bool, blocks: dict[str, int], num_stages: int) -> Any:
        import triton

        kernel = _kernel(self.kernel_name)
        x = x.view(-1, x.shape[-1]).contiguous()
        e, n, k = int(sizes.shape[0]), dy.shape[1], x.shape[1]
        grid = (e * triton.cdiv(n, blocks["BLOCK_SIZE_N"]) * triton.cdiv(k, blocks["BLOCK_SIZE_K"]),)
        args = dict(NUM_TOKENS=gather.shape[0] // topk, TOPK=topk, NUM_EXPERTS=e, N=n, K=k,
                    NUM_SMS=INTERPRETED_SMS, PERMUTE_X=permute_x, PERMUTE_Y=permute_y, USE_TMA_LOAD_dY=False,
                    USE_TMA_LOAD_X=False, USE_TMA_STORE=False, EXPERTS_POW2=triton.next_power_of_2(e), **blocks)
        if accumulate:
            args["ACCUMULATE"] = True
        stages = 1 if x.element_size() >= 4 else num_stages  # fp32 operands: one stage, as the launcher
        self._launch(kernel, grid, x, dy, dw, sizes, gather, num_stages=stages, **args)
        return dw


class UnslothGroupedGemmDWAccumulate(UnslothGroupedGemmDW):
    """unsloth's per-expert dW kernel with ``ACCUMULATE`` (``gmm_ref.conventions.unsloth.
    GROUPED_GEMM_DW_ACCUMULATE``): the gradient added into the ``dW`` it is given, in place, as
    ``_grouped_gemm_dW_accumulate_impl`` launches it."""

    name = "unsloth.grouped_gemm_dW_accumulate"
    convention = "unsloth.grouped_gemm_dW_accumulate"

    def call(self, X: Any, dY: Any, m_sizes: Any, gather_indices: Any, dW: Any, topk: int,  # type: ignore[override]
             BLOCK_SIZE_M: int = 32, BLOCK_SIZE_N: int = 32, BLOCK_SIZE_K: int = 32, permute_x: bool = False,
             permute_y: bool = False, use_tma_load_dy: bool = False, use_tma_load_x: bool = False,
             use_tma_store: bool = False, num_warps: int = 4, num_stages: int = 2) -> Any:
        _no_tuning(False, load_dy=use_tma_load_dy, load_x=use_tma_load_x, store=use_tma_store)
        x, dy, sizes, gather, dw = _torch(X, dY, m_sizes, gather_indices, dW)
        self._dw(x, dy, sizes, gather, dw, topk, permute_x, permute_y, True,
                 dict(BLOCK_SIZE_M=BLOCK_SIZE_M, BLOCK_SIZE_N=BLOCK_SIZE_N, BLOCK_SIZE_K=BLOCK_SIZE_K), num_stages)
        return None
