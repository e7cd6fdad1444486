"""What a kernel declares it takes, in the words of the strategies that draw its problems.

``gmm_kernels`` states facts (``KernelAdapter.limits()``: a ``gmm_kernels.scope.Limits`` of the dtype pairs,
families, multiples, group counts and refused features of a kernel, its scope applied); how those become
``property_tests.strategies.problems`` keywords is known here, next to the strategies, and nowhere below; so is
how the modes that build their problems for a kernel (``checks.scale``, ``checks.real_k``) make one within them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter
from gmm_kernels.scope import Limits
from gmm_ref import families
from gmm_ref.layouts import aligned_multiples, named
from property_tests.strategies.values import scaled_problem

__all__ = ["Unsupported", "axis_multiple", "both_quantized", "built_problem", "declared_pairs", "exact_pair",
           "first_layout", "limits_options", "problem_options", "round_up", "routing_options", "scaled_out"]


class Unsupported(Exception):
    """What a kernel declares leaves no problem of a mode/family it can take; ``str()`` is the reason."""


def limits_options(limits: Limits) -> dict[str, Any]:
    """The ``problems()`` keywords that draw only problems within ``limits`` (only those that narrow)."""
    opts: dict[str, Any] = {}
    if limits.dtypes is not None:
        opts["dtypes"] = limits.dtypes
    if limits.families is not None:
        opts["families"] = limits.families
    if limits.multiples:
        opts["multiple_of"] = dict(limits.multiples)
    if limits.max_extent is not None:
        opts["max_extent"] = limits.max_extent
    if limits.min_groups > 1:
        opts["min_groups"] = limits.min_groups
    if limits.max_groups is not None:
        opts["max_groups"] = limits.max_groups
    if not limits.tail:
        opts["allow_tail"] = False
    if limits.zero_extents is not None:
        opts["zero_extents"] = limits.zero_extents
    if limits.quantizations is not None:
        opts["quantizations"] = limits.quantizations
    if limits.storages:
        opts["storages"] = dict(limits.storages)
    if limits.layouts is not None:
        opts["layouts"] = limits.layouts
    if limits.alignment:
        opts["operand_alignment"] = dict(limits.alignment)
    opts.update((f, False) for f in limits.refuses)  # a feature's name is the problems() keyword that draws it
    return opts


def problem_options(adapter: KernelAdapter) -> dict[str, Any]:
    """Options for ``property_tests.strategies.problems`` (with ``convention=adapter.convention``) that draw
    only problems ``adapter`` takes: its :meth:`~gmm_kernels.KernelAdapter.limits` as keywords."""
    return limits_options(adapter.limits())


def routing_options(adapter: KernelAdapter) -> dict[str, Any]:
    """The ``routings()`` keywords of a routed kernel (``gmm_kernels.base.RoutedKernelAdapter``): its routed
    convention's facts (layouts, dtypes, weight dtypes, distinct experts, the alignment's block) narrowed by its
    dtype declarations and its ``routed_limits()`` (cheap extents)."""
    conv = adapter.convention_facts
    pairs = tuple(pr for pr in conv.dtype_pairs if adapter.dtype_refusal(pr[0], pr[0], pr[1]) is None)
    opts: dict[str, Any] = dict(expert_layouts=conv.expert_layouts, dtypes=pairs, weight_dtypes=conv.weight_dtypes,
                                distinct_experts=conv.distinct_experts, block_size=conv.block_size,
                                foreign=(conv.foreign, "undefined") if conv.foreign != "undefined" else ("undefined",))
    if conv.expert_parallel is not None:
        opts["expert_parallel"] = conv.expert_parallel
    if conv.extents is not None:
        opts["shapes"] = conv.extents
    if conv.mul_routed_weight is not None:
        opts["mul_routed_weight"] = conv.mul_routed_weight
    lim = adapter.routed_limits()
    if lim.max_tokens is not None:
        opts["max_tokens"] = lim.max_tokens
    if lim.num_experts is not None:
        opts["num_experts"] = lim.num_experts
    if lim.extents is not None:
        opts["shapes"] = lim.extents
    if lim.max_top_k is not None:
        opts["top_k"] = tuple(k for k in (1, 2, 3, 4, 8) if k <= lim.max_top_k)
    return opts


def declared_pairs(adapter: KernelAdapter) -> list[tuple[np.dtype, np.dtype]]:
    """The (input, output) dtype pairs the kernel takes: its declared ones (an input alone: that dtype out), else
    its convention's."""
    declared = adapter.limits().dtypes or adapter.convention_facts.dtype_pairs
    return [(np.dtype(i), np.dtype(o)) for i, o in ((p, p) if isinstance(p, str) else p for p in declared)]


def exact_pair(adapter: KernelAdapter) -> tuple[np.dtype, np.dtype]:
    """The (input, output) pair of the smallest floating input the kernel takes (not a quantized operand's codes),
    an output equal to it first: small integers are exact in it (sums of K products of |x| <= 2 stay below 2**8).
    The problems built for a kernel (``property_tests.checks.scale``, ``property_tests.checks.large_strided``) are
    in it."""
    pairs = declared_pairs(adapter)
    floats = [p for p in pairs if p[0].kind in "fV" and p[0] not in adapter.convention_facts.code_dtypes] or pairs
    return min(floats, key=lambda p: (p[0].itemsize, p[0] != p[1], str(p[0])))


def axis_multiple(adapter: KernelAdapter, axis: str, family: str, in_dt: np.dtype) -> int:
    """The multiple ``axis`` of a ``family`` problem in ``in_dt`` must be for ``adapter``: its convention's (at its
    tiling), its own declared one, and what keeps the rows of its operands in :func:`first_layout` aligned as it
    declares."""
    rules, limits = adapter.convention_facts, adapter.limits()
    tiling = adapter.tiling or rules.default_tiling
    rows = aligned_multiples(first_layout(adapter, family), np.dtype(in_dt).itemsize, limits.alignment)
    return math.lcm(rules.axis_multiple(axis, family, tiling, in_dt), limits.multiples.get(axis, 1), rows.get(axis, 1))


def first_layout(adapter: KernelAdapter, family: str) -> tuple[bool, bool, bool]:
    """The first of ``family``'s layouts in ``adapter``'s convention that it takes: the one the problems built for
    it (``built_problem``, ``checks.large_strided``) are stored in."""
    layouts = adapter.convention_facts.layouts_of(family)
    return (named(layouts, adapter.limits().layouts) or layouts)[0]


def both_quantized(adapter: KernelAdapter, family: str) -> list[tuple[Any, Any]] | None:
    """The (lhs, rhs) quantizations a scale cell's operands may take for a convention that takes quantized
    operands only: its pairs in ``family`` that quantize both operands (codes of a dtype the kernel declares), in
    the convention's order (the first the kernel takes is used); None for a convention that takes unscaled
    operands (the cells built for it, ``checks.scale`` and ``checks.real_k``, are unscaled then)."""
    rules = adapter.convention_facts
    if not rules.quantizations or (None, None) in rules.quantizations:
        return None
    declared = {i for i, _ in declared_pairs(adapter)}
    return [q for q in rules.quantizations_for(family) if None not in q and q[0].elem in declared]


def scaled_out(adapter: KernelAdapter, elem: np.dtype) -> np.dtype:
    """The output dtype of ``elem`` codes: the first the kernel declares for them (bfloat16 where it may)."""
    outs = [o for i, o in declared_pairs(adapter) if i == elem]
    return next((o for o in outs if o == np.dtype(ml_dtypes.bfloat16)), outs[0] if outs else np.dtype(np.float32))


def round_up(x: int, mult: int) -> int:
    """``x`` raised to a multiple of ``mult`` (an extent to the kernel's multiple)."""
    return -(-x // mult) * mult


def built_problem(adapter: KernelAdapter, family: str, mkn: dict[str, int], sizes: np.ndarray | None, *,
                  values: Callable[[tuple[int, ...], np.dtype], np.ndarray], out_dtype: np.dtype,
                  quants: tuple[Any, Any] | None, scales: str, rng: np.random.Generator, local: int,
                  offset: int, built_by: tuple[list[str], str]) -> gmm_ref.Problem | str:
    """A problem built for ``adapter`` (the cells of ``checks.scale`` and ``checks.real_k``): operands of ``mkn``'s
    extents in the family's :func:`first_layout`, ``local`` groups from ``offset`` where its convention shards them,
    filled by ``values(shape, dtype)`` (the output's too, where the convention requires ``existing_out``), scaled by
    ``quants`` with scales of kind ``scales`` where given; ``built_by`` (the imports, the expression) rebuilds it.
    Or why the kernel cannot take it (a sentence)."""
    rules, fam = adapter.convention_facts, families.get(family)
    m, k, n = mkn["m"], mkn["k"], mkn["n"]
    lt, rt, packed = first_layout(adapter, family)
    in_dt, rhs_dt = (exact_pair(adapter)[0],) * 2 if quants is None else (quants[0].elem, quants[1].elem)
    lhs = values((*((local,) if fam.is_grouped("lhs") else ()), *((k, m) if lt else (m, k))), in_dt)
    rhs = values((*((local,) if fam.is_grouped("rhs") else ()), *((n, k) if rt else (k, n))), rhs_dt)
    kwargs: dict[str, Any] = dict(lhs_transposed=lt, rhs_transposed=rt, packed=packed, out_dtype=out_dtype,
                                  convention=adapter.convention, **rules.policies(family))
    if adapter.tiling is not None:
        kwargs["tiling"] = adapter.tiling
    if fam.shardable and rules.sharding:
        kwargs.update(group_offset=offset, num_local_groups=local)
    if rules.existing_required:
        kwargs["existing_out"] = values(fam.shape("out", m, 0, n, local), out_dtype)
    gs = None if sizes is None else np.asarray(sizes, np.int32)
    try:
        if quants is None:
            problem = gmm_ref.Problem(family, lhs, rhs, gs, **kwargs)
        else:
            problem = scaled_problem(rng, family, lhs, rhs, gs, quants, scales, k, kwargs)
    except (ValueError, TypeError) as exc:
        return f"{adapter.convention} cannot express this cell: {exc}"
    object.__setattr__(problem, "_built_by", built_by)
    why = adapter.supports(problem)
    return f"{adapter.name} declines it: {why}" if why else problem
