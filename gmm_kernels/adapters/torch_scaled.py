"""torch's rowwise FP8 grouped GEMM (``torch.scaled_grouped_mm`` convention): two kernels.

- ``torch.scaled_grouped_mm``: ``torch._scaled_grouped_mm`` itself. torch 2.13
  has no CPU kernel for it (CUDA only, compute capability 9.0 or newer), so
  here it is unavailable and says so; on a GPU machine it runs.
- ``torch.scaled_mm[loop]``: the same contract as a loop over the groups of
  ``torch._scaled_mm``, which does run on CPU: each group's codes are
  dequantized to float32 (code * scale, rounded once to float32), multiplied
  in float32 and rounded to bfloat16. It is what a framework without the
  grouped kernel calls, and it checks the convention end to end here (rowwise).
- ``torch.scaled_grouped_mm_v2``: ``torch.nn.functional.scaled_grouped_mm`` in its NVFP4 form (packed e2m1,
  e4m3 block scales and per-group float32 global scales; CUDA only, a Blackwell GPU): unavailable here, saying
  why. Its call follows torch's documented signature and has not run yet.
- ``torchao.mxfp8_scaled_grouped_mm[emulated]``: the MXFP8 form (2d-3d), torchao's emulated MXFP8 scaled grouped
  mm on CPU: it reads the swizzled scales back into each group's ``[rows, K / 32]`` block (the layout torch's
  kernel reads), dequantizes into bfloat16 and calls ``torch._grouped_mm``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from gmm_kernels.base import KernelAdapter, import_failure
from gmm_kernels.sandbox import device
from gmm_kernels.sandbox.convert import to_framework
from gmm_kernels.scope import Limits, Scope
from gmm_ref import Numerics, Problem
from gmm_ref.conventions.torch_scaled import MX_BLOCK, MXFP8, ROWWISE
from gmm_ref.scaled.layouts import group_blocks

__all__ = ["TorchScaledGroupedMM", "TorchScaledGroupedMMv2", "TorchScaledMMLoop", "TorchaoMXFP8ScaledGroupedMM",
           "unswizzled_2d_3d"]


class TorchScaledGroupedMM(KernelAdapter):
    """``torch._scaled_grouped_mm`` (rowwise FP8; CUDA only)."""

    name = "torch.scaled_grouped_mm"
    convention = "torch.scaled_grouped_mm"
    requires = ("torch",)
    # the CUDA kernel accumulates in float32 and applies both scales after the K loop
    flush_subnormals = True

    def _unavailable(self) -> str | None:
        import torch

        if not hasattr(torch, "_scaled_grouped_mm"):
            return f"torch {torch.__version__} has no torch._scaled_grouped_mm"
        if not torch.cuda.is_available():
            return (f"torch {torch.__version__}'s _scaled_grouped_mm has no CPU kernel (CUDA only, compute "
                    "capability 9.0+); torch.scaled_mm[loop] checks the same contract here")
        return device.cuda_only("torch._scaled_grouped_mm")

    def _refusal(self, problem: Problem) -> str | None:
        import torch

        if problem.lhs_quant == MXFP8 and torch.cuda.get_device_capability(device.torch_device())[0] < 10:
            return "torch's MXFP8 grouped mm needs compute capability 10.0 (Blackwell) or newer"
        return None

    def call(self, mat_a: Any, mat_b: Any, scale_a: Any, scale_b: Any, offs: Any = None, out_dtype: Any = None
             ) -> Any:
        import torch

        (a, b, sa, sb), kw = to_framework("torch", (mat_a, mat_b, scale_a, scale_b),
                                          {"offs": offs, "out_dtype": out_dtype})
        dev = device.torch_device()
        b = b.to(dev).transpose(-2, -1).contiguous().transpose(-2, -1)  # column-major, as the kernel wants
        kw = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        return torch._scaled_grouped_mm(a.to(dev), b, sa.to(dev), sb.to(dev), **kw)


class TorchScaledMMLoop(KernelAdapter):
    """The rowwise FP8 grouped contract as a per-group loop over ``torch._scaled_mm`` (runs on CPU)."""

    name = "torch.scaled_mm[loop]"
    convention = "torch.scaled_grouped_mm"
    requires = ("torch",)

    def _unavailable(self) -> str | None:
        import torch

        if not hasattr(torch, "_scaled_mm"):
            return f"torch {torch.__version__} has no torch._scaled_mm"
        return None

    def _refusal(self, problem: Problem) -> str | None:
        if problem.lhs_quant == MXFP8:
            return "torch._scaled_mm on CPU takes tensorwise and rowwise scales, not MXFP8 blocks"
        return None

    def _limits(self) -> Limits:
        return Limits(quantizations=((ROWWISE, ROWWISE),))

    def numerics_for(self, problem: Problem) -> Numerics:
        """Codes times scales rounded to float32 first (torch's CPU path dequantizes), then a float32 matmul."""
        if self.scope is not None and self.scope.numerics is not None:
            return self.scope.numerics
        return Numerics(multiply="float32", accumulate="float32", flush_subnormals=True)

    def call(self, mat_a: Any, mat_b: Any, scale_a: Any, scale_b: Any, offs: Any = None, out_dtype: Any = None
             ) -> Any:
        import torch

        (a, b, sa, sb), kw = to_framework("torch", (mat_a, mat_b, scale_a, scale_b), {"out_dtype": out_dtype})
        out_dtype = kw["out_dtype"] or torch.bfloat16

        def mm(x: Any, y: Any, sx: Any, sy: Any) -> Any:
            # _scaled_mm wants its second operand column-major, rowwise scales [M, 1] and [1, N]
            y = y.t().contiguous().t()
            return torch._scaled_mm(x, y, scale_a=sx.reshape(-1, 1), scale_b=sy.reshape(1, -1), out_dtype=out_dtype)

        if offs is None:  # 3d-3d
            return torch.stack([mm(a[g], b[g], sa[g], sb[g]) for g in range(a.shape[0])]) if a.shape[0] else \
                torch.zeros((0, a.shape[1], b.shape[2]), dtype=out_dtype, device=a.device)
        ends = [0, *np.asarray(offs).astype(np.int64).tolist()]
        groups = range(len(ends) - 1)
        if a.ndim == 2 and b.ndim == 3:  # ragged M; rows past the groups stay unwritten (zeros here)
            out = torch.zeros((a.shape[0], b.shape[2]), dtype=out_dtype, device=a.device)
            for g in groups:
                lo, hi = ends[g], ends[g + 1]
                if hi > lo:
                    out[lo:hi] = mm(a[lo:hi], b[g], sa[lo:hi], sb[g])
            return out
        if a.ndim == 3:  # ragged N
            out = torch.zeros((a.shape[1], b.shape[1]), dtype=out_dtype, device=a.device)
            for g in groups:
                lo, hi = ends[g], ends[g + 1]
                if hi > lo:
                    out[:, lo:hi] = mm(a[g], b[:, lo:hi], sa[g], sb[lo:hi])
            return out
        m, n = a.shape[0], b.shape[1]  # ragged K: one [M, N] block per group
        out = torch.zeros((len(groups), m, n), dtype=out_dtype, device=a.device)
        for g in groups:
            lo, hi = ends[g], ends[g + 1]
            if hi > lo:
                out[g] = mm(a[:, lo:hi], b[lo:hi], sa[g * m:(g + 1) * m], sb[g * n:(g + 1) * n])
        return out


def unswizzled_2d_3d(scale_a: Any, scale_b: Any, offs: Any, m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """torch's MXFP8 2d-3d scales unswizzled: ``scale_a`` ``[M, ceil(K/32)]`` row by row of ``mat_a`` (rows past
    the groups get scale 1) and ``scale_b`` ``[G, ceil(K/32), N]``, from each group's padded swizzled block."""
    from gmm_ref import as_numpy

    kb = -(-k // MX_BLOCK)
    ends = [0, *np.asarray(as_numpy(offs)).astype(np.int64).tolist()]
    sa, sb = as_numpy(scale_a), as_numpy(scale_b)
    spans = list(itertools.pairwise(ends))
    a = np.ones((m, kb), sa.dtype)
    for (lo, hi), block in zip(spans, group_blocks("scale_a", sa, [(hi - lo, kb) for lo, hi in spans], True),
                               strict=True):
        a[lo:hi] = block
    b = [block.T for block in group_blocks("scale_b", sb, [(n, kb)] * len(spans), True)]
    return a, np.stack(b) if b else np.zeros((0, kb, n), sb.dtype)


class TorchaoMXFP8ScaledGroupedMM(KernelAdapter):
    """torchao's emulated MXFP8 scaled grouped mm (2d-3d) behind torch's swizzled MXFP8 scale layout (CPU)."""

    name = "torchao.mxfp8_scaled_grouped_mm[emulated]"
    convention = "torch.scaled_grouped_mm"
    requires = ("torch", "torchao")
    # the codes times their e8m0 scales in bfloat16, then torch._grouped_mm (bfloat16 in, float32 accumulation)
    scope = Scope(families=("ragged_m",), multiples={"k": MX_BLOCK}, zero_extents=("m",),
                  numerics=Numerics(multiply="bfloat16", accumulate="float32", flush_subnormals=True))

    def _unavailable(self) -> str | None:
        from gmm_kernels.adapters._torchao import quiet_torchao_import

        with quiet_torchao_import():  # torchao's import-time log lines concern no kernel
            return import_failure("torchao.prototype.moe_training.mxfp8_grouped_mm",
                                  "_emulated_mxfp8_scaled_grouped_mm_2d_3d",
                                  "torchao's emulated MXFP8 scaled grouped mm")

    def _refusal(self, problem: Problem) -> str | None:
        if problem.lhs_quant != MXFP8:
            return f"{self.name} takes MXFP8 operands (e8m0 scales per 32 along K), not rowwise ones"
        return None

    def _limits(self) -> Limits:
        return Limits(quantizations=((MXFP8, MXFP8),))

    def call(self, mat_a: Any, mat_b: Any, scale_a: Any, scale_b: Any, offs: Any = None, out_dtype: Any = None
             ) -> Any:
        import torch

        from gmm_kernels.adapters._torchao import quiet_torchao_import
        from gmm_kernels.sandbox.convert import to_torch

        with quiet_torchao_import():
            from torchao.prototype.moe_training.mxfp8_grouped_mm import _emulated_mxfp8_scaled_grouped_mm_2d_3d
        m, k = mat_a.shape
        sa, sb = unswizzled_2d_3d(scale_a, scale_b, offs, m, k, mat_b.shape[2])
        (a, b), kw = to_framework("torch", (mat_a, mat_b), {"offs": offs, "out_dtype": out_dtype})
        return _emulated_mxfp8_scaled_grouped_mm_2d_3d(a, to_torch(sa), b, to_torch(sb), offs=kw["offs"],
                                                       out_dtype=kw["out_dtype"] or torch.bfloat16)


class TorchScaledGroupedMMv2(KernelAdapter):
    """``torch.nn.functional.scaled_grouped_mm``, NVFP4 2d-3d (CUDA only, compute capability 10.0)."""

    name = "torch.scaled_grouped_mm_v2"
    convention = "torch.scaled_grouped_mm_v2"
    requires = ("torch",)
    flush_subnormals = True

    def _unavailable(self) -> str | None:
        import torch
        import torch.nn.functional as F

        if not hasattr(F, "scaled_grouped_mm"):
            return f"torch {torch.__version__} has no torch.nn.functional.scaled_grouped_mm"
        if not torch.cuda.is_available():
            return (f"torch {torch.__version__}'s scaled_grouped_mm has no CPU kernel; its NVFP4 form needs a CUDA "
                    "GPU of compute capability 10.0 (Blackwell)")
        reason = device.cuda_only("torch.nn.functional.scaled_grouped_mm")
        if reason is None and torch.cuda.get_device_capability(device.torch_device())[0] < 10:
            return "torch's NVFP4 grouped mm needs compute capability 10.0 (Blackwell) or newer"
        return reason

    def call(self, mat_a: Any, mat_b: Any, scale_a: Any, scale_recipe_a: Any, scale_b: Any, scale_recipe_b: Any,
             swizzle_a: Any = None, swizzle_b: Any = None, bias: Any = None, offs: Any = None,
             output_dtype: Any = None, contraction_dim: Any = (), use_fast_accum: bool = False) -> Any:
        import torch
        import torch.nn.functional as F
        from torch.nn.functional import ScalingType, SwizzleType

        from gmm_kernels.sandbox.convert import to_torch

        def fp4(x: Any, transposed: bool) -> Any:
            t = to_torch(np.ascontiguousarray(np.swapaxes(x, -1, -2)) if transposed else x)  # the selected device
            t = t.view(torch.float4_e2m1fn_x2)
            return t.transpose(-2, -1) if transposed else t  # mat_b: a transposed view of [G, N, K/2]

        def scales(pair: Any) -> list[Any]:
            return [to_torch(np.asarray(v)) for v in pair]

        def enums(kind: Any, names: Any) -> list[Any]:
            return [getattr(kind, n) for n in names]

        return F.scaled_grouped_mm(
            fp4(mat_a, False), fp4(mat_b, True), scales(scale_a), enums(ScalingType, scale_recipe_a),
            scales(scale_b), enums(ScalingType, scale_recipe_b), swizzle_a=enums(SwizzleType, swizzle_a),
            swizzle_b=enums(SwizzleType, swizzle_b), offs=to_torch(np.asarray(offs)),
            output_dtype=torch.bfloat16)
