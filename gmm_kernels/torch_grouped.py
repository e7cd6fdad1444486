"""``torch._grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None)`` on CPU.

Four forms: 2d x 3d (ragged M), 3d x 2d (ragged N), 2d x 2d (ragged K,
output ``[G, M, N]``), 3d x 3d (uniform batch, no ``offs``). CPU rules seen in
torch 2.13: inputs float32, bfloat16 or float16, both the same dtype;
``out_dtype`` None or equal to the input dtype; ``offs`` int32; every non-unit
stride of each operand a multiple of 16 bytes. The CPU output is
``torch.empty``: rows (2d x 3d) or columns (3d x 2d) past ``offs[-1]`` are
never written (undefined, often but not always zero).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gmm_ref import Numerics

from gmm_kernels.base import KernelAdapter, dtype_name, missing_module
from gmm_kernels.convert import to_numpy, to_torch, torch_dtype

__all__ = ["TorchGroupedMM", "stride_reason"]

_DTYPES = ("float32", "bfloat16", "float16")


def stride_reason(name: str, a: np.ndarray) -> str | None:
    """Why ``a``'s strides break torch's 16-byte rule, else None."""
    for ax, st in enumerate(a.strides):
        if a.shape[ax] > 1 and st != a.itemsize and st % 16:
            return f"{name} stride {st} bytes on axis {ax} is not a multiple of 16 (RuntimeError)"
    return None


class TorchGroupedMM(KernelAdapter):
    """``torch._grouped_mm`` (CPU fallback here, CUDA where a GPU is)."""

    name = "torch.grouped_mm"
    convention = "torch.grouped_mm"
    numerics = Numerics(multiply=None, accumulate=np.float32)

    def strategy_options(self) -> dict[str, Any]:
        """Inputs of one dtype among float32 / bfloat16 / float16, output dtype = input dtype."""
        return {"dtypes": _DTYPES}

    def available(self) -> str | None:
        reason = missing_module("torch")
        if reason:
            return reason
        import torch

        if not hasattr(torch, "_grouped_mm"):
            return f"torch {torch.__version__} has no torch._grouped_mm"
        return None

    def supports(self, problem: Any) -> str | None:
        reason = super().supports(problem)
        if reason:
            return reason
        lt, rt = dtype_name(problem.lhs.dtype), dtype_name(problem.rhs.dtype)
        if lt not in _DTYPES or rt not in _DTYPES:
            return f"torch._grouped_mm takes float32, bfloat16 or float16, not {lt} x {rt}"
        if lt != rt:
            return f"torch._grouped_mm needs equal input dtypes, got {lt} x {rt}"
        if dtype_name(problem.out_dtype) != lt:
            return f"torch._grouped_mm: out_dtype must equal the input dtype ({lt}), got {problem.out_dtype}"
        if problem.batch_ndim or problem.lhs_transposed or problem.rhs_transposed or problem.packed:
            return "torch._grouped_mm takes row-major strided operands, no batch dims"
        if problem.group_offset != 0 or problem.num_local_groups != problem.num_groups:
            return "torch._grouped_mm has no group_offset"
        if problem.existing_out is not None:
            return "torch._grouped_mm takes no existing output"
        for name in ("lhs", "rhs"):
            r = stride_reason(name, getattr(problem, name))
            if r:
                return r
        # the output [.., N] row stride
        if (problem.n * problem.out_dtype.itemsize) % 16 and problem.m > 1:
            return f"output row of {problem.n} x {problem.out_dtype} is not a multiple of 16 bytes"
        return None

    def differentiable_fn(self) -> Any:
        import torch

        return torch._grouped_mm

    def call(self, mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None,
             out_dtype: Any = None) -> np.ndarray:
        import torch

        if bias is not None:
            raise ValueError("torch._grouped_mm: bias is not supported")
        t_offs = None if offs is None else torch.from_numpy(np.ascontiguousarray(offs, np.int32))
        out = torch._grouped_mm(to_torch(mat_a), to_torch(mat_b), offs=t_offs,
                                out_dtype=torch_dtype(out_dtype))
        return to_numpy(out)
