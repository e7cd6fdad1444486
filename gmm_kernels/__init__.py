"""gmm_kernels: one adapter per real grouped-GEMM kernel.

Each adapter runs a kernel on its convention's arguments (as
``gmm_ref.Problem.arguments()`` gives them) and returns NumPy, says whether
it can run here (:meth:`~gmm_kernels.base.KernelAdapter.available`) and
whether it takes a problem (:meth:`~gmm_kernels.base.KernelAdapter.supports`).
``import gmm_kernels`` imports neither jax nor torch.

>>> import gmm_kernels
>>> [a.name for a in gmm_kernels.registry()]  # doctest: +SKIP
>>> gmm_kernels.get("megablox.gmm").run(problem)  # doctest: +SKIP
"""

from __future__ import annotations

from gmm_kernels.base import KernelAdapter
from gmm_kernels.user import CONVENTIONS, FunctionAdapter, wrap

__all__ = ["KernelAdapter", "FunctionAdapter", "CONVENTIONS", "registry", "get", "names", "wrap"]


def registry() -> list[KernelAdapter]:
    """Every built-in adapter, available here or not (check ``available()``)."""
    from gmm_kernels.ejkernel_ops import EjkernelGroupedMatmul
    from gmm_kernels.jax_lax import JaxRaggedDot, JaxRaggedDotGeneral
    from gmm_kernels.megablox import MegabloxGmm, MegabloxTgmm
    from gmm_kernels.mosaic_gpu import MosaicGpuRaggedDot
    from gmm_kernels.tokamax_ops import TokamaxRaggedDot
    from gmm_kernels.torch_grouped import TorchGroupedMM
    from gmm_kernels.transformer_engine import TransformerEngineGroupedGemm

    return [
        JaxRaggedDot(),
        JaxRaggedDotGeneral(),
        MegabloxGmm(),
        MegabloxTgmm(),
        TorchGroupedMM(),
        TokamaxRaggedDot("xla"),
        TokamaxRaggedDot("mosaic"),
        TokamaxRaggedDot("triton"),
        EjkernelGroupedMatmul("xla"),
        EjkernelGroupedMatmul("pallas"),
        EjkernelGroupedMatmul("pallas_v2"),
        EjkernelGroupedMatmul("pallas_v3"),
        MosaicGpuRaggedDot(),
        TransformerEngineGroupedGemm(),
    ]


def names() -> list[str]:
    """The names of the built-in adapters."""
    return [a.name for a in registry()]


def get(name: str) -> KernelAdapter:
    """The built-in adapter called ``name`` (KeyError listing the names otherwise)."""
    for a in registry():
        if a.name == name:
            return a
    raise KeyError(f"no kernel adapter {name!r}; built-in: {names()}")
