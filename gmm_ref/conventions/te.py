"""TransformerEngine-style grouped GEMM described by per-axis group sizes (``*_first_dims`` / ``*_last_dims``).

Each ``*_dims`` is a ``(G,)`` int array or None (that axis not ragged); at
most one axis of each operand is ragged, and a ragged last axis is stored
packed (group g is a contiguous ``(rows, size_g)`` block), as TE's
GroupedTensor does. TE's Hopper path needs ``sum(sizes)`` equal to the ragged
extent and zero-fills empty groups; ragged N is not expressible (one operand
would be ragged on both axes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gmm_ref.conventions import base
from gmm_ref.conventions.base import Convention
from gmm_ref.problem import Problem

__all__ = ["TE_GROUPED_GEMM", "te_grouped_gemm"]

_DIMS = ("lhs_first_dims", "lhs_last_dims", "rhs_first_dims", "rhs_last_dims")


def _ragged_axes(dims: dict[str, np.ndarray], lhs_t: bool, rhs_t: bool) -> tuple[str | None, str | None]:
    """The logical axis ("M", "K" or "N") each operand is ragged on, or None."""
    lr = "first" if "lhs_first_dims" in dims else "last" if "lhs_last_dims" in dims else None
    rr = "first" if "rhs_first_dims" in dims else "last" if "rhs_last_dims" in dims else None
    lhs_axes = ("K", "M") if lhs_t else ("M", "K")  # stored axes 0, 1 of lhs
    rhs_axes = ("N", "K") if rhs_t else ("K", "N")
    lm = None if lr is None else lhs_axes[0 if lr == "first" else 1]
    rm = None if rr is None else rhs_axes[0 if rr == "first" else 1]
    return lm, rm


def _family(lm: str | None, rm: str | None) -> str:
    fam = {("M", None): "ragged_m", (None, "N"): "ragged_n", ("K", "K"): "ragged_k"}.get((lm, rm))
    if fam is None:
        raise ValueError(
            f"lhs_*_dims/rhs_*_dims: unsupported combination (lhs ragged on {lm}, rhs ragged on {rm}); "
            "expected ragged M (lhs only), ragged N (rhs only) or ragged K (both, on K)"
        )
    return fam


def _sizes(given: dict[str, Any]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    dims = {nm: base.as_sizes(nm, v) for nm, v in given.items() if v is not None and base.as_array(nm, v).size}
    for op in ("lhs", "rhs"):
        if f"{op}_first_dims" in dims and f"{op}_last_dims" in dims:
            raise ValueError(f"{op}_first_dims/{op}_last_dims: an operand may be ragged on one axis only")
    if not dims:
        raise ValueError("lhs_first_dims/lhs_last_dims/rhs_first_dims/rhs_last_dims: at least one must be given")
    sizes = list(dims.values())
    for other in sizes[1:]:
        if other.shape != sizes[0].shape or np.any(other != sizes[0]):
            raise ValueError("*_dims: every ragged axis must carry the same group sizes")
    return dims, sizes[0]


class _TeGroupedGemm(Convention):
    def parse(self, lhs: Any, rhs: Any, *, lhs_first_dims: Any = None, lhs_last_dims: Any = None,
              rhs_first_dims: Any = None, rhs_last_dims: Any = None, contracting_dims: Any = ((1,), (0,)),
              preferred_element_type: Any = None) -> Problem:
        """TransformerEngine-style grouped GEMM described by per-axis group sizes.

        Each ``*_dims`` is a ``(G,)`` int array or None (that axis not ragged);
        at most one axis of each operand is ragged. A ragged last axis is stored
        packed (group g is a contiguous ``(rows, size_g)`` block), as TE's
        GroupedTensor does. A 3-D operand carries the group axis first.
        ``contracting_dims`` names the 2-D contracting axis of each operand.
        Output ragged dims are derived: ragged M -> ``[sum M, N]``, ragged N ->
        ``[M, sum N]``, ragged K -> ``[G, M, N]``.
        """
        lhs, rhs = base.as_array("lhs", lhs), base.as_array("rhs", rhs)
        base.expect_ndim("lhs", lhs, (2, 3))
        base.expect_ndim("rhs", rhs, (2, 3))
        dims, gs = _sizes(dict(zip(_DIMS, (lhs_first_dims, lhs_last_dims, rhs_first_dims, rhs_last_dims), strict=True)))
        try:
            (lcd,), (rcd,) = contracting_dims
        except (TypeError, ValueError):
            raise ValueError(f"contracting_dims: expected ((l,), (r,)), got {contracting_dims!r}") from None
        if lcd not in (0, 1) or rcd not in (0, 1):
            raise ValueError(f"contracting_dims: expected axes 0 or 1 of the 2-D matrices, got {contracting_dims!r}")
        lhs_t, rhs_t = lcd == 0, rcd == 1  # lhs stored [K, M]; rhs stored [N, K]
        fam = _family(*_ragged_axes(dims, lhs_t, rhs_t))
        packed = "lhs_last_dims" in dims or "rhs_last_dims" in dims
        return Problem(fam, lhs, rhs, gs, lhs_transposed=lhs_t, rhs_transposed=rhs_t, packed=packed,
                       out_dtype=base.optional_dtype("preferred_element_type", preferred_element_type),
                       convention=self.name, **self.policies(fam))

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        gs32 = base.sizes32(p)
        kw: dict[str, Any] = {}
        if p.family == "ragged_m":
            kw["lhs_last_dims" if p.lhs_transposed else "lhs_first_dims"] = gs32
        elif p.family == "ragged_n":
            kw["rhs_first_dims" if p.rhs_transposed else "rhs_last_dims"] = gs32
        else:
            kw["lhs_first_dims" if p.lhs_transposed else "lhs_last_dims"] = gs32
            kw["rhs_last_dims" if p.rhs_transposed else "rhs_first_dims"] = gs32
        kw["contracting_dims"] = ((0 if p.lhs_transposed else 1,), (1 if p.rhs_transposed else 0,))
        kw["preferred_element_type"] = p.out_dtype
        return (p.lhs, p.rhs), kw


TE_GROUPED_GEMM = _TeGroupedGemm(
    name="te.grouped_gemm", framework="jax", families=("ragged_m", "ragged_k"),
    layouts=tuple((f, base.packed_layouts(f)) for f in ("ragged_m", "ragged_k")),
    dtype_pairs=(("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32"),
                 ("bfloat16", "float32")),
    full_sums=True, summary="TransformerEngine grouped_gemm(lhs, rhs, *, lhs_first_dims=..., ...)",
)
te_grouped_gemm = base.front_end(TE_GROUPED_GEMM, "te_grouped_gemm")
