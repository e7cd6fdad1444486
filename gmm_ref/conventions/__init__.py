"""The convention registry: every calling convention the harness knows, looked up by name.

Built in: ``ragged_dot``, ``ragged_dot_general`` (jax.lax), ``megablox.gmm``,
``megablox.tgmm``, ``torch.grouped_mm``, ``te.grouped_gemm``, the scaled
``torch.scaled_grouped_mm`` (and its v2 NVFP4 form), ``te.scaled_grouped_gemm``, ``qwix.ragged_dot`` and
``torchao.nvfp4_grouped_mm``, and the serving layouts'
``deep_gemm.m_grouped_contiguous`` (and ``_psum``), ``deep_gemm.m_grouped_masked`` and
``vllm.batched_moe``, one module each; the routed ``vllm.fused_moe`` (per-slot output) and
``torch.moe_experts`` (combined output).
Other packages add conventions through the ``gmm_harness.conventions``
entry-point group (each entry point names a :class:`Convention` instance).

>>> from gmm_ref import conventions
>>> conventions.get("megablox.gmm").families
('ragged_m',)
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

from gmm_ref.conventions.base import Convention, RoutedConvention
from gmm_ref.conventions.deep_gemm import CONTIGUOUS, CONTIGUOUS_PSUM, MASKED
from gmm_ref.conventions.megablox import GMM, TGMM
from gmm_ref.conventions.qwix import QWIX_RAGGED_DOT
from gmm_ref.conventions.ragged_dot import RAGGED_DOT, RAGGED_DOT_GENERAL
from gmm_ref.conventions.sglang import FUSED_MOE as SGLANG_FUSED_MOE
from gmm_ref.conventions.te import TE_GROUPED_GEMM, TE_SCALED_GROUPED_GEMM
from gmm_ref.conventions.torch_grouped import GROUPED_MM
from gmm_ref.conventions.torch_moe import MOE_EXPERTS, MOE_SLOTS
from gmm_ref.conventions.torch_scaled import SCALED_GROUPED_MM, SCALED_GROUPED_MM_V2
from gmm_ref.conventions.torchao import NVFP4_GROUPED_MM
from gmm_ref.conventions.unsloth import GROUPED_GEMM as UNSLOTH_GROUPED_GEMM
from gmm_ref.conventions.unsloth import GROUPED_GEMM_DW as UNSLOTH_GROUPED_GEMM_DW
from gmm_ref.conventions.unsloth import GROUPED_GEMM_DW_ACCUMULATE as UNSLOTH_GROUPED_GEMM_DW_ACCUMULATE
from gmm_ref.conventions.unsloth import GROUPED_GEMM_DX as UNSLOTH_GROUPED_GEMM_DX
from gmm_ref.conventions.vllm import BATCHED_MOE, FUSED_MOE
from gmm_ref.names import did_you_mean
from gmm_ref.problem import Problem

__all__ = ["ENTRY_POINT_GROUP", "Convention", "arguments", "get", "names", "problem_from_arguments", "registry",
           "routed_names"]

ENTRY_POINT_GROUP = "gmm_harness.conventions"
BUILTIN = (RAGGED_DOT, RAGGED_DOT_GENERAL, GMM, TGMM, GROUPED_MM, TE_GROUPED_GEMM, SCALED_GROUPED_MM,
           QWIX_RAGGED_DOT, CONTIGUOUS, CONTIGUOUS_PSUM, MASKED, BATCHED_MOE, NVFP4_GROUPED_MM,
           TE_SCALED_GROUPED_GEMM, SCALED_GROUPED_MM_V2)
#: the routed MoE conventions (a kernel taking a ``gmm_ref.Routing``, docs/routed.md): looked up by :func:`get`,
#: listed by :func:`routed_names`, not by :func:`names` (whose conventions express grouped ``Problem`` s)
ROUTED = (FUSED_MOE, SGLANG_FUSED_MOE, UNSLOTH_GROUPED_GEMM, UNSLOTH_GROUPED_GEMM_DX, UNSLOTH_GROUPED_GEMM_DW,
          UNSLOTH_GROUPED_GEMM_DW_ACCUMULATE, MOE_EXPERTS, MOE_SLOTS)


@functools.cache
def registry() -> dict[str, Convention]:
    """Every known convention by name: the built-ins, then those of installed entry points."""
    found = {c.name: c for c in BUILTIN}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        conv = ep.load()
        if not isinstance(conv, Convention):
            raise TypeError(f"entry point {ep.name!r} ({ep.value}) in {ENTRY_POINT_GROUP}: expected a "
                            f"gmm_ref.conventions.Convention, got {type(conv).__name__}")
        if conv.name in found and found[conv.name] is not conv:
            raise ValueError(f"entry point {ep.name!r}: convention {conv.name!r} is already registered")
        found[conv.name] = conv
    return found


def names() -> tuple[str, ...]:
    """The names of every known convention."""
    return tuple(registry())


def routed_names() -> tuple[str, ...]:
    """The names of the routed MoE conventions."""
    return tuple(c.name for c in ROUTED)


def get(name: Any) -> Any:
    """The convention called ``name`` (a Convention or RoutedConvention passes through; a routed one is a
    :class:`RoutedConvention`); ValueError naming the known ones."""
    if isinstance(name, (Convention, RoutedConvention)):
        return name
    conv = registry().get(name) if isinstance(name, str) else None
    if conv is None and isinstance(name, str):
        conv = next((c for c in ROUTED if c.name == name), None)
    if conv is None:
        known = (*names(), *routed_names())
        raise ValueError(f"convention: expected one of {known}, got {name!r}{did_you_mean(name, known)}")
    return conv


def arguments(p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of ``p.convention``'s kernel for ``p`` (NumPy arrays)."""
    if not isinstance(p, Problem):
        raise TypeError(f"problem: expected a gmm_ref.Problem, got {type(p).__name__}")
    if p.convention is None:
        raise ValueError("convention: this problem names no convention; set Problem(convention=...)")
    return get(p.convention).arguments(p)


def problem_from_arguments(convention: str, *args: Any, **kwargs: Any) -> Problem:
    """The problem a convention's kernel call describes (inverse of :func:`arguments`)."""
    return get(convention).parse(*args, **kwargs)

