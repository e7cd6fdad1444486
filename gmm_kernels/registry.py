"""The built-in kernel adapters, plus those other packages register.

Other packages add adapters through the ``gmm_harness.kernels`` entry-point
group: each entry point names a :class:`~gmm_kernels.base.KernelAdapter`
subclass or instance. Every call returns fresh instances, so callers may set
``tiling`` on theirs.
"""

from __future__ import annotations

from importlib import metadata

from gmm_kernels.adapters.deep_gemm import DeepGemmContiguous, DeepGemmContiguousPsum, DeepGemmMasked
from gmm_kernels.adapters.megablox import EjkernelGroupedMatmul, MegabloxGmm, MegabloxTgmm
from gmm_kernels.adapters.qwix import QwixRaggedDot, TokamaxQArrayRaggedDot
from gmm_kernels.adapters.ragged_dot import (
    JaxRaggedDot,
    JaxRaggedDotGeneral,
    MosaicGpuRaggedDot,
    QwixRaggedDotQt,
    TokamaxRaggedDot,
)
from gmm_kernels.adapters.sglang import SglangFusedMoE
from gmm_kernels.adapters.te import TransformerEngineGroupedGemm, TransformerEngineScaledGroupedGemm
from gmm_kernels.adapters.torch_grouped import (
    GroupedMMBf16,
    GroupedMMBf16RaggedN,
    TorchaoMXFP8GroupedMM,
    TorchGroupedMM,
)
from gmm_kernels.adapters.torch_moe import TorchMoEExperts
from gmm_kernels.adapters.torch_scaled import (
    TorchaoMXFP8ScaledGroupedMM,
    TorchScaledGroupedMM,
    TorchScaledGroupedMMv2,
    TorchScaledMMLoop,
)
from gmm_kernels.adapters.torchao import TorchaoNVFP4GroupedMM
from gmm_kernels.adapters.unsloth import (
    UnslothGroupedGemm,
    UnslothGroupedGemmDW,
    UnslothGroupedGemmDWAccumulate,
    UnslothGroupedGemmDX,
)
from gmm_kernels.adapters.vllm import VllmBatchedMoE, VllmFusedMoE
from gmm_kernels.base import KernelAdapter

__all__ = ["ENTRY_POINT_GROUP", "get", "names", "registry", "routed"]

ENTRY_POINT_GROUP = "gmm_harness.kernels"


def _builtin() -> list[KernelAdapter]:
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
        TransformerEngineScaledGroupedGemm(),
        TorchScaledMMLoop(),
        TorchScaledGroupedMM(),
        TorchScaledGroupedMMv2(),
        QwixRaggedDot("fast"),
        QwixRaggedDot("slow"),
        QwixRaggedDotQt(),
        TorchaoMXFP8GroupedMM(),
        TorchaoNVFP4GroupedMM(),
        TorchaoMXFP8ScaledGroupedMM(),
        TokamaxQArrayRaggedDot(),
        DeepGemmContiguous(),
        DeepGemmContiguousPsum(),
        DeepGemmMasked(),
        VllmBatchedMoE(),
        GroupedMMBf16(),
        GroupedMMBf16RaggedN(),
    ]


def _entry_points() -> list[KernelAdapter]:
    found = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        adapter = obj() if isinstance(obj, type) and issubclass(obj, KernelAdapter) else obj
        if not isinstance(adapter, KernelAdapter):
            raise TypeError(f"entry point {ep.name!r} ({ep.value}) in {ENTRY_POINT_GROUP}: expected a "
                            f"KernelAdapter subclass or instance, got {type(obj).__name__}")
        found.append(adapter)
    return found


def registry() -> list[KernelAdapter]:
    """Every known adapter, available here or not (check ``available()``): the grouped GEMMs, then the routed MoE
    kernels (:func:`routed`), then those other packages register. The default run (the main job, the plugin)
    checks every one: a routed kernel added to :func:`routed` is a row of its table with nothing else to do."""
    return _builtin() + routed() + _entry_points()


def routed() -> list[KernelAdapter]:
    """The built-in routed MoE kernels (``gmm_kernels.base.RoutedKernelAdapter``, docs/routed.md), a part of
    :func:`registry`."""
    return [VllmFusedMoE(), SglangFusedMoE(), UnslothGroupedGemm(), UnslothGroupedGemmDX(), UnslothGroupedGemmDW(),
            UnslothGroupedGemmDWAccumulate(), TorchMoEExperts()]


def names() -> list[str]:
    """The names of the known adapters (:func:`registry`'s order)."""
    return [a.name for a in registry()]


def get(name: str) -> KernelAdapter:
    """The adapter called ``name`` (KeyError listing the names otherwise)."""
    for a in registry():
        if a.name == name:
            return a
    raise KeyError(f"no kernel adapter {name!r}; known: {names()}")
