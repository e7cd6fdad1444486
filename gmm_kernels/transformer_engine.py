"""TransformerEngine JAX ``grouped_gemm`` (``te.grouped_gemm`` convention).

Not installed here, so this adapter only reports why it cannot run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gmm_ref import Numerics

from gmm_kernels.base import KernelAdapter, missing_module

__all__ = ["TransformerEngineGroupedGemm"]


class TransformerEngineGroupedGemm(KernelAdapter):
    """``transformer_engine.jax.cpp_extensions.grouped_gemm`` (CUDA only)."""

    name = "te.grouped_gemm"
    convention = "te.grouped_gemm"
    numerics = Numerics(multiply=None, accumulate=np.float32)

    def available(self) -> str | None:
        reason = missing_module("transformer_engine")
        if reason:
            return reason
        import jax

        if jax.default_backend() != "gpu":
            return "transformer_engine grouped_gemm needs a CUDA GPU"
        return "the te.grouped_gemm adapter is not implemented yet"

    def supports(self, problem: Any) -> str | None:
        reason = super().supports(problem)
        return reason or (self.available() if self.available() else None)

    def call(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise RuntimeError(f"{self.name} cannot run here: {self.available()}")
