"""TransformerEngine JAX ``grouped_gemm``: unscaled (``te.grouped_gemm`` convention) and on FP8 grouped scaled
tensors (``te.scaled_grouped_gemm``: per-group tensor ``scale_inv``, or MXFP8).

TransformerEngine is CUDA only and not installed here, so these adapters only report why they cannot run.
Their calls wait for a GPU machine with TransformerEngine to be written and checked against: the convention
modules and the golden cases (``te-*``) already hold the contract they will be held to.
"""

from __future__ import annotations

from typing import Any

from gmm_kernels.base import KernelAdapter

__all__ = ["TransformerEngineGroupedGemm", "TransformerEngineScaledGroupedGemm"]


class TransformerEngineGroupedGemm(KernelAdapter):
    """``transformer_engine.jax.cpp_extensions.grouped_gemm`` (CUDA only)."""

    name = "te.grouped_gemm"
    convention = "te.grouped_gemm"
    requires = ("transformer_engine",)

    def _unavailable(self) -> str | None:
        import jax

        if jax.default_backend() != "gpu":
            return "transformer_engine grouped_gemm needs a CUDA GPU"
        return f"the {self.name} adapter is not implemented yet (it waits for a GPU machine with TransformerEngine)"

    def _refusal(self, problem: Any) -> str | None:
        return self.available()

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.name} cannot run here: {self.available()}")


class TransformerEngineScaledGroupedGemm(TransformerEngineGroupedGemm):
    """``grouped_gemm`` on ``GroupedScaledTensor1x`` operands (CUDA only): tensor scaling or MXFP8."""

    name = "te.scaled_grouped_gemm"
    convention = "te.scaled_grouped_gemm"
