"""``jax.lax.ragged_dot`` and ``jax.lax.ragged_dot_general`` (also tokamax ``ragged_dot``).

Nothing is undefined: XLA zeroes rows past ``sum(group_sizes)``; mode 3 ignores
the sizes. No ``group_offset`` (jax 0.10.2 raises NotImplementedError) and no
existing output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from gmm_ref.conventions import base
from gmm_ref.conventions.base import Convention
from gmm_ref.problem import Problem

__all__ = ["RAGGED_DOT", "RAGGED_DOT_GENERAL", "RaggedDotDimensionNumbers", "ragged_dot", "ragged_dot_general"]

_PAIRS = (("float32", "float32"), ("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float16"),
          ("float16", "float32"), ("int8", "int32"))
_DN = "ragged_dot_dimension_numbers"


class RaggedDotDimensionNumbers(NamedTuple):
    """jax-free twin of ``jax.lax.RaggedDotDimensionNumbers`` (same fields)."""

    dot_dimension_numbers: tuple[tuple[Sequence[int], Sequence[int]], tuple[Sequence[int], Sequence[int]]]
    lhs_ragged_dimensions: Sequence[int]
    rhs_group_dimensions: Sequence[int]


_PRECISIONS = ("default", "high", "highest", "bfloat16", "tensorfloat32", "float32")


def _check_precision(value: Any) -> None:
    """jax's ``precision``: None, a Precision / DotAlgorithm(Preset), one of its names, or a pair.

    The reference is exact whatever it says; a kernel adapter decides what it may run.
    """
    if value is None or type(value).__module__.startswith(("jax", "jaxlib")):
        return
    if isinstance(value, str) and value.lower() in _PRECISIONS:
        return
    if isinstance(value, (tuple, list)) and len(value) == 2 and not any(isinstance(v, (tuple, list)) for v in value):
        for v in value:
            _check_precision(v)
        return
    raise ValueError(f"precision: expected None, a jax.lax.Precision, one of {_PRECISIONS} or a pair of them, "
                     f"got {value!r}")


class _RaggedDot(Convention):
    def parse(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None,
              preferred_element_type: Any = None) -> Problem:
        """``jax.lax.ragged_dot``: ``lhs [M, K]``, ``rhs [G, K, N]``, sizes ``[G]`` -> ``[M, N]``."""
        _check_precision(precision)
        lhs, rhs = base.as_array("lhs", lhs), base.as_array("rhs", rhs)
        base.expect_ndim("lhs", lhs, 2)
        base.expect_ndim("rhs", rhs, 3)
        gs = base.as_sizes("group_sizes", group_sizes)
        if rhs.shape[0] != gs.shape[0]:
            raise ValueError(f"rhs: expected {gs.shape[0]} groups on axis 0 (len(group_sizes)), got {rhs.shape[0]}")
        return Problem("ragged_m", lhs, rhs, gs, out_dtype=base.optional_dtype("preferred_element_type",
                                                                          preferred_element_type),
                       convention=self.name)

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (p.lhs, p.rhs, base.sizes32(p)), {"preferred_element_type": p.out_dtype}


def _dn_fields(dn: Any) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    try:
        ((lc, rc), (lb, rb)) = dn.dot_dimension_numbers
        lr = list(dn.lhs_ragged_dimensions)
        rg = list(dn.rhs_group_dimensions)
    except (AttributeError, TypeError, ValueError):
        raise TypeError(f"{_DN}: expected a RaggedDotDimensionNumbers (jax's or gmm_ref's), got {dn!r}") from None
    return list(lc), list(rc), list(lb), list(rb), lr, rg


def _check_dims(lhs: np.ndarray, rhs: np.ndarray, lc: list[int], rc: list[int], lb: list[int], rb: list[int],
                lr: list[int], rg: list[int]) -> tuple[list[int], list[int]]:
    """The free (non-contracting, non-batch, non-group) dims of lhs and rhs; ValueError if unsupported."""
    if len(lr) != 1:
        raise ValueError(f"{_DN}: expected exactly one lhs ragged dimension, got {lr}")
    if len(lc) != 1 or len(rc) != 1:
        raise ValueError(f"{_DN}: gmm_ref supports exactly one contracting dim per operand, got {lc} and {rc}")
    if len(lb) != len(rb):
        raise ValueError(f"{_DN}: lhs and rhs batch dims differ in number: {lb} vs {rb}")
    for nm, dims, arr in (("lhs", lc + lb, lhs), ("rhs", rc + rb + rg, rhs)):
        if len(set(dims)) != len(dims) or any(not 0 <= d < arr.ndim for d in dims):
            raise ValueError(f"{_DN}: {nm} dims {dims} must be distinct axes of {nm} (ndim {arr.ndim})")
    l_free = [d for d in range(lhs.ndim) if d not in lc + lb]
    r_free = [d for d in range(rhs.ndim) if d not in rc + rb + rg]
    if len(l_free) != 1 or len(r_free) != 1:
        raise ValueError(
            f"{_DN}: gmm_ref supports exactly one non-contracting dim per operand, got lhs {l_free} "
            f"and rhs {r_free} (besides batch and group dims)"
        )
    ragged = lr[0]
    if not isinstance(ragged, (int, np.integer)) or not 0 <= ragged < lhs.ndim:
        raise ValueError(f"{_DN}: lhs ragged dim {ragged} is not an axis of lhs (ndim {lhs.ndim})")
    return l_free, r_free


def _batched_sizes(gs: np.ndarray, batch: tuple[int, ...]) -> None:
    if gs.ndim != 1 and gs.shape[:-1] != batch:
        raise ValueError(f"group_sizes: expected shape [G] or {[*batch, 'G']}, got {gs.shape}")


class _RaggedDotGeneral(Convention):
    def parse(self, lhs: Any, rhs: Any, group_sizes: Any, ragged_dot_dimension_numbers: Any, precision: Any = None,
              preferred_element_type: Any = None) -> Problem:
        """``jax.lax.ragged_dot_general``, all three modes, with batch dims.

        gmm_ref supports one contracting dim and one non-contracting dim per
        operand (besides batch dims and the rhs group dim), at any positions.
        Mode 1 (ragged non-contracting): ``[b, m, k] x [g, b, k, n] -> [b, m, n]``;
        mode 2 (ragged contracting): ``[b, m, k] x [b, k, n] -> [g, b, m, n]``;
        mode 3 (ragged batch): a plain batched product, ``group_sizes`` ignored.
        """
        _check_precision(precision)
        lhs, rhs = base.as_array("lhs", lhs), base.as_array("rhs", rhs)
        lc, rc, lb, rb, lr, rg = _dn_fields(ragged_dot_dimension_numbers)
        gs = base.as_sizes("group_sizes", group_sizes, ndim1=False)
        l_free, r_free = _check_dims(lhs, rhs, lc, rc, lb, rb, lr, rg)
        ragged, nb = lr[0], len(lb)
        out = base.optional_dtype("preferred_element_type", preferred_element_type)
        lhs_t = lhs.transpose(lb + l_free + lc)
        if ragged in l_free:  # mode 1
            if len(rg) != 1:
                raise ValueError(f"{_DN}: mode 1 (ragged non-contracting) needs exactly one rhs group dim, got {rg}")
            rhs_t = rhs.transpose(rg + rb + rc + r_free)
            _batched_sizes(gs, lhs_t.shape[:nb])
            if rhs_t.shape[0] != gs.shape[-1]:
                raise ValueError(f"rhs: expected {gs.shape[-1]} groups on the group dim {rg[0]}, got {rhs_t.shape[0]}")
            return Problem("ragged_m", lhs_t, rhs_t, gs, batch_ndim=nb, out_dtype=out, convention=self.name)
        if rg:
            raise ValueError(f"{_DN}: rhs group dims must be empty when the lhs ragged dim is contracting or batch, "
                             f"got {rg}")
        rhs_t = rhs.transpose(rb + rc + r_free)
        if ragged in lc:  # mode 2
            _batched_sizes(gs, lhs_t.shape[:nb])
            return Problem("ragged_k", lhs_t, rhs_t, gs, batch_ndim=nb, out_dtype=out, convention=self.name)
        # mode 3: the ragged dim is a batch dim (the group axis is lhs_batch[0]); sizes are ignored
        return Problem("batch", lhs_t, rhs_t, None, batch_ndim=nb - 1, out_dtype=out, convention=self.name)

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        gs = base.sizes32(p)
        return ((p.lhs, p.rhs, gs if gs is not None else np.ones(p.num_groups, np.int32), dimension_numbers(p)),
                {"preferred_element_type": p.out_dtype})


def dimension_numbers(p: Problem) -> RaggedDotDimensionNumbers:
    """The ragged_dot_general dimension numbers that read ``p``'s operands as stored."""
    nb = p.batch_ndim
    lt, rt = p.lhs_transposed, p.rhs_transposed
    ragged = p.family_facts.ragged
    if ragged == "m":
        lb = list(range(nb))
        m_ax, k_ax = (nb + 1, nb) if lt else (nb, nb + 1)
        rb = list(range(1, nb + 1))
        rk = nb + 2 if rt else nb + 1
        return RaggedDotDimensionNumbers((([k_ax], [rk]), (lb, rb)), [m_ax], [0])
    if ragged == "k":
        lb = list(range(nb))
        k_ax = nb if lt else nb + 1
        rk = nb + 1 if rt else nb
        return RaggedDotDimensionNumbers((([k_ax], [rk]), (lb, lb)), [k_ax], [])
    # batch: the group axis 0 is the ragged batch dim
    b = list(range(nb + 1))
    k_ax = nb + 1 if lt else nb + 2
    rk = nb + 2 if rt else nb + 1
    return RaggedDotDimensionNumbers((([k_ax], [rk]), (b, b)), [0], [])


RAGGED_DOT = _RaggedDot(
    name="ragged_dot", framework="jax", families=("ragged_m",), layouts=(("ragged_m", base.PLAIN),),
    dtype_pairs=_PAIRS, summary="lax.ragged_dot(lhs [M, K], rhs [G, K, N], group_sizes [G]) -> [M, N]",
)
RAGGED_DOT_GENERAL = _RaggedDotGeneral(
    name="ragged_dot_general", framework="jax", families=("ragged_m", "ragged_k", "batch"),
    layouts=tuple((f, base.TRANSPOSES) for f in ("ragged_m", "ragged_k", "batch")), dtype_pairs=_PAIRS,
    max_batch_dims=1, summary="lax.ragged_dot_general: modes 1 (ragged M), 2 (ragged K), 3 (ragged batch)",
)
ragged_dot = base.front_end(RAGGED_DOT, "ragged_dot")
ragged_dot_general = base.front_end(RAGGED_DOT_GENERAL, "ragged_dot_general")
