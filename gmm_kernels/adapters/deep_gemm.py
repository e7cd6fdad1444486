"""DeepGEMM's m-grouped GEMMs (``deep_gemm.m_grouped_contiguous``, ``..._psum``, ``deep_gemm.m_grouped_masked``).

DeepGEMM is CUDA only (SM90 or SM100, JIT-compiled): here each adapter says why it cannot run; on a GPU machine
with ``deep_gemm`` installed it calls ``m_grouped_fp8_gemm_nt_*`` for FP8 operands and
``m_grouped_bf16_gemm_nt_*`` for bfloat16 ones, writing into the ``d`` the harness gives it.

Numerics: FP8 code products accumulate in the tensor cores, which keep about 14 significant bits on Hopper, and
every 128-wide K block is promoted into a float32 accumulator with both scales (SM90; SM100's block-scaled MMA
accumulates in float32, which the same declaration covers). bfloat16 operands: exact products, float32
accumulation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from gmm_kernels.base import KernelAdapter
from gmm_kernels.sandbox import device
from gmm_kernels.sandbox.convert import to_framework
from gmm_ref import Numerics, Problem

#: Hopper's FP8 tensor cores: partial sums of a 128-wide K block kept to about 14 bits (truncating)
HOPPER_FP8 = dict(promote_every=128, partial_accumulate=2.0 ** -13)

__all__ = ["DeepGemmContiguous", "DeepGemmContiguousPsum", "DeepGemmMasked"]


def _cuda_reason(major: int = 9) -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "DeepGEMM runs on CUDA GPUs only (SM90 / SM100); no CUDA device here"
    reason = device.cuda_only("DeepGEMM")
    if reason is not None:
        return reason
    capability = torch.cuda.get_device_capability(device.torch_device())
    if capability[0] < major:
        return f"DeepGEMM needs compute capability {major}.0 or newer, got {capability}"
    return None


class _DeepGemm(KernelAdapter):
    requires = ("torch", "deep_gemm")
    needs = "DeepGEMM is CUDA only, SM90 / SM100; it builds on a GPU machine"
    flush_subnormals = True
    #: (fp8 function, bf16 function) in ``deep_gemm``
    functions: ClassVar[tuple[str, str]] = ("", "")

    def _unavailable(self) -> str | None:
        return _cuda_reason()

    def numerics_for(self, problem: Problem) -> Numerics:
        """FP8: partial sums per 128-wide K block in the tensor cores, promoted into float32 (SM90)."""
        base = super().numerics_for(problem)
        if problem.scaled and (self.scope is None or self.scope.numerics is None):
            return dataclasses.replace(base, **HOPPER_FP8)
        return base

    def call(self, *args: Any, **kwargs: Any) -> Any:
        import deep_gemm

        (a, b, d, *rest), kw = to_framework("torch", args, kwargs)  # on the selected (CUDA) device
        place = device.place
        fp8 = isinstance(a, tuple)
        fn = getattr(deep_gemm, self.functions[0 if fp8 else 1])
        out = place(d)
        fn(place(a), place(b), out, *(place(r) for r in rest), **kw)
        return out


class DeepGemmContiguous(_DeepGemm):
    """``deep_gemm.m_grouped_{fp8,bf16}_gemm_nt_contiguous`` with a group id per row (-1: padding)."""

    name = "deep_gemm.m_grouped_contiguous"
    convention = "deep_gemm.m_grouped_contiguous"
    functions = ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_contiguous")


class DeepGemmContiguousPsum(_DeepGemm):
    """The same kernels with ``use_psum_layout=True`` (the groups' cumulative ends)."""

    name = "deep_gemm.m_grouped_contiguous_psum"
    convention = "deep_gemm.m_grouped_contiguous_psum"
    functions = ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_contiguous")


class DeepGemmMasked(_DeepGemm):
    """``deep_gemm.m_grouped_{fp8,bf16}_gemm_nt_masked``: ``[G, M, K]`` with valid rows per group."""

    name = "deep_gemm.m_grouped_masked"
    convention = "deep_gemm.m_grouped_masked"
    functions = ("m_grouped_fp8_gemm_nt_masked", "m_grouped_bf16_gemm_nt_masked")
