"""``torch._grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None)`` on CPU (CUDA where a GPU is).

Four forms: 2d x 3d (ragged M), 3d x 2d (ragged N), 2d x 2d (ragged K,
output ``[G, M, N]``), 3d x 3d (uniform batch, no ``offs``). CPU rules seen in
torch 2.13: inputs float32, bfloat16 or float16, both the same dtype;
``out_dtype`` None or equal to the input dtype (the CUDA path also takes
float32 from bfloat16); no K = 0 or N = 0; ``offs`` int32; every non-unit
stride of each operand a multiple of 16 bytes (the convention's rules). The
CPU output is ``torch.empty``: rows (2d x 3d) or columns (3d x 2d) past
``offs[-1]`` are never written (undefined, often but not always zero).

Known upstream bug (:data:`gmm_kernels.known_issues.TORCH_CPU_RAGGED_K_LEAK`): in
bfloat16 on a CPU where oneDNN runs its AMX matmul, the ragged-K form reads the
lhs columns past a group's K range, so a NaN/Inf there leaks into the group's
output. It is declared for the poisoned mode where a probe sees it on this
machine (``torch_cpu_ragged_k_leak``), so the verdict is a known bug where the
leak shows and a pass where it does not.

Also here: torchao's emulated MXFP8 grouped mm (:class:`TorchaoMXFP8GroupedMM`), a kernel that quantizes
its bfloat16 inputs itself, in the same convention (ragged M).
"""

from __future__ import annotations

from typing import Any

from gmm_kernels.adapters._torchao import quiet_torchao_import
from gmm_kernels.base import KernelAdapter, dtype_name, import_failure
from gmm_kernels.convert import to_framework
from gmm_kernels.known_issues import TORCH_CPU_RAGGED_K_LEAK
from gmm_kernels.scope import Limits, Scope
from gmm_ref import MXQuantizer, Numerics, Problem

__all__ = ["TorchGroupedMM", "TorchaoMXFP8GroupedMM"]


class TorchGroupedMM(KernelAdapter):
    """``torch._grouped_mm``."""

    name = "torch.grouped_mm"
    convention = "torch.grouped_mm"
    requires = ("torch",)
    input_dtypes = ("float32", "bfloat16", "float16")
    equal_input_dtypes = True
    #: applies only where the probe sees the leak (AMX bfloat16): elsewhere the poisoned mode passes
    known_issues = (TORCH_CPU_RAGGED_K_LEAK,)

    def _unavailable(self) -> str | None:
        import torch

        if not hasattr(torch, "_grouped_mm"):
            return f"torch {torch.__version__} has no torch._grouped_mm"
        return None

    def _refusal(self, problem: Problem) -> str | None:
        import torch

        zero = [axis for axis, extent in (("K", problem.k), ("N", problem.n)) if extent == 0]
        if zero:
            return (f"torch {torch.__version__}'s _grouped_mm refuses {zero[0]} = 0 ('strides should be multiple of "
                    "16 bytes': a zero-length last axis gives a stride of one element; "
                    "github.com/pytorch/pytorch/pull/192497)")
        return None

    def dtype_refusal(self, lhs: Any, rhs: Any, out: Any) -> str | None:
        """As the base class says; on CPU also an output dtype other than the input's."""
        reason = super().dtype_refusal(lhs, rhs, out)
        if reason is None and dtype_name(out) != dtype_name(lhs):
            try:
                import torch
            except ImportError:  # not installed: the adapter is unavailable and says so
                return None
            if not torch.cuda.is_available():
                return (f"torch {torch.__version__}'s CPU _grouped_mm refuses out_dtype {dtype_name(out)} for "
                        f"{dtype_name(lhs)} inputs ('Grouped gemm output dtype must match mat_a dtype'); "
                        "its CUDA path takes float32 from bfloat16")
        return reason

    def _limits(self) -> Limits:
        """No K = 0 or N = 0 (:meth:`_refusal`): the design leaves those relations out and names them,
        instead of drawing problems the kernel would decline (about half of every mode's draws)."""
        return Limits(zero_extents=("m",))

    def numerics_for(self, problem: Problem) -> Any:
        """As the base class says, but on CPU with bfloat16/float16 inputs subnormal inputs may count as
        zero: torch's CPU matmul runs those through oneDNN's bf16 dot-product path, which treats
        denormal inputs as zero (seen in torch 2.13: a 4.1e-39 weight dropped from a 2.3e17 x 4.1e-39
        product; float32 inputs keep them)."""
        import dataclasses

        import torch

        numerics = super().numerics_for(problem)
        if (self.scope is None or self.scope.numerics is None) and not torch.cuda.is_available() \
                and str(problem.lhs.dtype) in ("bfloat16", "float16"):
            numerics = dataclasses.replace(numerics, flush_subnormals=True)
        return numerics

    def differentiable_fn(self) -> Any:
        import torch

        return torch._grouped_mm

    def call(self, mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any:
        import torch

        if bias is not None:
            raise ValueError("torch._grouped_mm: bias is not supported")
        (a, b), kw = to_framework("torch", (mat_a, mat_b), {"offs": offs, "out_dtype": out_dtype})
        return torch._grouped_mm(a, b, **kw)


# ---- torchao MXFP8 grouped mm, emulated
# ``torchao.prototype.moe_training.mxfp8_grouped_mm._to_mxfp8_then_scaled_grouped_mm`` with
# ``kernel_preference=EMULATED`` (torchao 0.18.0; the SM100 path needs a Blackwell GPU) quantizes the
# activations ``[M, K]`` and each expert's weights (along K) to float8_e4m3fn codes with one e8m0 scale per 32
# elements (scale mode RCEIL, torchao's default here), dequantizes them into bfloat16 and calls
# ``torch._grouped_mm``. It declares that format (its scope's ``quantizes``): the harness quantizes the same inputs with
# ``gmm_ref.to_mx`` (which agrees with torchao's ``to_mx`` bit for bit in the floor, rceil and even modes) and
# holds the kernel to the exact reference of those codes and scales. Its numerics: the dequantized values in
# bfloat16, a float32 accumulator, and the CPU bfloat16 matmul's flushed subnormals.

MXFP8_RCEIL = MXQuantizer("float8_e4m3fn", 32, "rceil")


class TorchaoMXFP8GroupedMM(KernelAdapter):
    """torchao's MXFP8 grouped mm, emulated (runs on CPU)."""

    name = "torchao.mxfp8_grouped_mm[emulated]"
    convention = "torch.grouped_mm"
    requires = ("torch", "torchao")
    scope = Scope(families=("ragged_m",), dtypes=("bfloat16",), out_dtypes=("bfloat16",), multiples={"k": 32},
                  zero_extents=("m",), quantizes=(MXFP8_RCEIL, MXFP8_RCEIL),
                  numerics=Numerics(multiply="bfloat16", accumulate="float32", flush_subnormals=True))

    def _unavailable(self) -> str | None:
        with quiet_torchao_import():
            return import_failure("torchao.prototype.moe_training.mxfp8_grouped_mm", None,
                                  "torchao's moe_training.mxfp8_grouped_mm")

    def call(self, mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any:
        with quiet_torchao_import():
            from torchao.prototype.moe_training.mxfp8_grouped_mm import _to_mxfp8_then_scaled_grouped_mm
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.quantization.quantize_.common import KernelPreference

        (a, b), kw = to_framework("torch", (mat_a, mat_b), {"offs": offs, "out_dtype": out_dtype})
        # its documented layouts, as its MoE layer passes them: A row-major, B_t per-group column-major
        a, b = a.contiguous(), b.transpose(-2, -1).contiguous().transpose(-2, -1)
        return _to_mxfp8_then_scaled_grouped_mm(
            a, b, offs=kw["offs"], bias=bias, out_dtype=kw["out_dtype"] or a.dtype,
            kernel_preference=KernelPreference.EMULATED, scale_calculation_mode=ScaleCalculationMode.RCEIL)
