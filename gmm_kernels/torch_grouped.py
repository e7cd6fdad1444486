"""``torch._grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None)`` on CPU (CUDA where a GPU is).

Four forms: 2d x 3d (ragged M), 3d x 2d (ragged N), 2d x 2d (ragged K,
output ``[G, M, N]``), 3d x 3d (uniform batch, no ``offs``). CPU rules seen in
torch 2.13: inputs float32, bfloat16 or float16, both the same dtype;
``out_dtype`` None or equal to the input dtype; ``offs`` int32; every non-unit
stride of each operand a multiple of 16 bytes (the convention's rules). The
CPU output is ``torch.empty``: rows (2d x 3d) or columns (3d x 2d) past
``offs[-1]`` are never written (undefined, often but not always zero).
"""

from __future__ import annotations

from typing import Any

from gmm_kernels.base import KernelAdapter
from gmm_kernels.convert import to_framework

__all__ = ["TorchGroupedMM"]


class TorchGroupedMM(KernelAdapter):
    """``torch._grouped_mm``."""

    name = "torch.grouped_mm"
    convention = "torch.grouped_mm"
    requires = ("torch",)
    input_dtypes = ("float32", "bfloat16", "float16")
    equal_input_dtypes = True

    def _unavailable(self) -> str | None:
        import torch

        if not hasattr(torch, "_grouped_mm"):
            return f"torch {torch.__version__} has no torch._grouped_mm"
        return None

    def differentiable_fn(self) -> Any:
        import torch

        return torch._grouped_mm

    def call(self, mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any:
        import torch

        if bias is not None:
            raise ValueError("torch._grouped_mm: bias is not supported")
        (a, b), kw = to_framework("torch", (mat_a, mat_b), {"offs": offs, "out_dtype": out_dtype})
        return torch._grouped_mm(a, b, **kw)
