"""torchao's emulated NVFP4 grouped GEMM (``torchao.nvfp4_grouped_mm`` convention, packed e2m1 codes and e4m3
block scales). torchao's MXFP8 grouped GEMMs are in the conventions they take: ``torch_grouped`` and
``torch_scaled``.
"""

from __future__ import annotations

from typing import Any

from gmm_kernels.adapters._torchao import quiet_torchao_import
from gmm_kernels.base import KernelAdapter, import_failure
from gmm_kernels.sandbox.convert import to_framework
from gmm_ref import Numerics, Problem

__all__ = ["TorchaoNVFP4GroupedMM"]


class TorchaoNVFP4GroupedMM(KernelAdapter):
    """torchao 0.18's emulated NVFP4 grouped mm, 2d-3d (runs on CPU): it unpacks the e2m1 codes, multiplies them
    by their e4m3 block scales into ``out_dtype`` (exactly: a 2-bit by 4-bit significand product) and calls
    ``torch._grouped_mm`` (float32 accumulation; bfloat16 inputs with flushed subnormals on CPU)."""

    name = "torchao.nvfp4_grouped_mm[emulated]"
    convention = "torchao.nvfp4_grouped_mm"
    requires = ("torch", "torchao")

    def _unavailable(self) -> str | None:
        with quiet_torchao_import():
            return import_failure("torchao.prototype.moe_training.nvfp4_grouped_mm",
                                  "_emulated_nvfp4_scaled_grouped_mm_2d_3d", "torchao's emulated NVFP4 grouped mm")

    def numerics_for(self, problem: Problem) -> Numerics:
        """The dequantized operands in the output dtype, then a float32-accumulated matmul."""
        if self.scope is not None and self.scope.numerics is not None:
            return self.scope.numerics
        return Numerics(multiply=str(problem.out_dtype), accumulate="float32", flush_subnormals=True)

    def call(self, A_data: Any, A_scale: Any, B_data: Any, B_scale: Any, offs: Any = None, out_dtype: Any = None
             ) -> Any:
        import torch

        with quiet_torchao_import():
            from torchao.prototype.moe_training.nvfp4_grouped_mm import _emulated_nvfp4_scaled_grouped_mm_2d_3d

        args, kw = to_framework("torch", (A_data, A_scale, B_data, B_scale), {"offs": offs, "out_dtype": out_dtype})
        return _emulated_nvfp4_scaled_grouped_mm_2d_3d(*args, offs=kw["offs"],
                                                       out_dtype=kw["out_dtype"] or torch.bfloat16)
