"""torchao's emulated grouped GEMMs: NVFP4 (``torchao.nvfp4_grouped_mm`` convention, packed e2m1 codes and e4m3
block scales), and MXFP8 (``torch.grouped_mm`` convention, ragged M): a kernel that quantizes
its bfloat16 inputs itself.

``torchao.prototype.moe_training.mxfp8_grouped_mm._to_mxfp8_then_scaled_grouped_mm`` with
``kernel_preference=EMULATED`` (torchao 0.18.0; the SM100 path needs a Blackwell GPU) quantizes the
activations ``[M, K]`` and each expert's weights (along K) to float8_e4m3fn codes with one e8m0 scale per 32
elements (scale mode RCEIL, torchao's default here), dequantizes them into bfloat16 and calls
``torch._grouped_mm``. It declares that format (its scope's ``quantizes``): the harness quantizes the same inputs with
``gmm_ref.to_mx`` (which agrees with torchao's ``to_mx`` bit for bit in the floor, rceil and even modes) and
holds the kernel to the exact reference of those codes and scales. Its numerics: the dequantized values in
bfloat16, a float32 accumulator, and the CPU bfloat16 matmul's flushed subnormals.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

from gmm_kernels.base import KernelAdapter, import_failure
from gmm_kernels.convert import to_framework
from gmm_kernels.scope import Scope
from gmm_ref import MXQuantizer, Numerics, Problem

__all__ = ["TorchaoMXFP8GroupedMM", "TorchaoNVFP4GroupedMM", "quiet_torchao_import"]

MXFP8_RCEIL = MXQuantizer("float8_e4m3fn", 32, "rceil")

#: what importing torchao (0.18) logs on a machine where its prebuilt CUDA extensions cannot load (any CPU-only
#: machine): a warning per extension from torchao's logger, and torch's deprecation of register_constant() on
#: the Enums torchao registers. Both are about torchao's own build, never about a kernel under test, and each
#: process that imports torchao prints them (the main job's workers, the xdist workers): only these messages,
#: only while the harness imports torchao, are dropped (quiet_torchao_import)
_IMPORT_NOISE = (
    ("torchao", re.compile(r"^Failed to load \S*torchao[/\\]_C[^/\\]*\.so: ")),
    ("torch.utils._pytree", re.compile(r"register_constant\(\) on Enum subclasses is deprecated")),
)


class _DropImportNoise(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


@contextlib.contextmanager
def quiet_torchao_import() -> Iterator[None]:
    """Import torchao inside this block without its known import-time log noise (``_IMPORT_NOISE``).

    The filters are on the two loggers for the block only: torchao's other messages, and anything your
    own kernel makes torchao or torch log later, still show (torchao logs these once per process, when it
    is first imported)."""
    filters = [(logging.getLogger(name), _DropImportNoise(pattern)) for name, pattern in _IMPORT_NOISE]
    for logger, f in filters:
        logger.addFilter(f)
    try:
        yield
    finally:
        for logger, f in filters:
            logger.removeFilter(f)


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
