"""TransformerEngine JAX ``grouped_gemm`` (``te.grouped_gemm`` convention).

Not installed here, so this adapter only reports why it cannot run.
"""

from __future__ import annotations

from typing import Any

from gmm_kernels.base import KernelAdapter

__all__ = ["TransformerEngineGroupedGemm"]


class TransformerEngineGroupedGemm(KernelAdapter):
    """``transformer_engine.jax.cpp_extensions.grouped_gemm`` (CUDA only)."""

    name = "te.grouped_gemm"
    convention = "te.grouped_gemm"
    requires = ("transformer_engine",)

    def _unavailable(self) -> str | None:
        import jax

        if jax.default_backend() != "gpu":
            return "transformer_engine grouped_gemm needs a CUDA GPU"
        return "the te.grouped_gemm adapter is not implemented yet"

    def _refusal(self, problem: Any) -> str | None:
        return self.available()

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.name} cannot run here: {self.available()}")
