"""TransformerEngine-style grouped GEMM described by per-axis group sizes (``*_first_dims`` / ``*_last_dims``):
``te.grouped_gemm`` (unscaled operands) and ``te.scaled_grouped_gemm`` (FP8 operands with per-group tensor
scales, or MXFP8).

Each ``*_dims`` is a ``(G,)`` int array or None (that axis not ragged); at
most one axis of each operand is ragged, and a ragged last axis is stored
packed (group g is a contiguous ``(rows, size_g)`` block), as TE's
GroupedTensor does. TE's Hopper path needs ``sum(sizes)`` equal to the ragged
extent and zero-fills empty groups; ragged N is not expressible (one operand
would be ragged on both axes).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from gmm_ref.conventions import base
from gmm_ref.conventions.base import Convention
from gmm_ref.problem import Problem
from gmm_ref.scaled.layouts import group_blocks, join_blocked
from gmm_ref.scaled.model import Quantization

__all__ = ["TE_GROUPED_GEMM", "TE_SCALED_GROUPED_GEMM", "TEScaledTensor", "te_grouped_gemm", "te_scaled_grouped_gemm"]

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
        ragged = p.family_facts.ragged
        if ragged == "m":
            kw["lhs_last_dims" if p.lhs_transposed else "lhs_first_dims"] = gs32
        elif ragged == "n":
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


# ----------------------------------------------------------------------------- scaled (FP8) grouped GEMM
E4M3, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
E8M0, BF16 = np.dtype(ml_dtypes.float8_e8m0fnu), np.dtype(ml_dtypes.bfloat16)
MX_BLOCK = 32
#: per-tensor scaling (delayed or current): one float32 scale_inv per group of each operand
TENSOR_SCALINGS = ((Quantization(E4M3, np.float32, "tensor"), Quantization(E4M3, np.float32, "tensor")),
                   (Quantization(E4M3, np.float32, "tensor"), Quantization(E5M2, np.float32, "tensor")),
                   (Quantization(E5M2, np.float32, "tensor"), Quantization(E4M3, np.float32, "tensor")))
#: MXFP8: one e8m0 scale_inv per 32 elements along K
MXFP8 = (Quantization(E4M3, E8M0, (1, MX_BLOCK)), Quantization(E4M3, E8M0, (1, MX_BLOCK)))


class TEScaledTensor(NamedTuple):
    """A TransformerEngine grouped scaled tensor as NumPy: its codes (``data``), ``scale_inv`` and
    ``scaling_mode`` (``"tensor"``: per-tensor scaling, ``(G,)`` float32; ``"mxfp8"``: the groups' e8m0 scales,
    each group's ``[rows, K / 32]`` block padded to 128 rows and 4 columns and swizzled, one after the other)."""

    data: np.ndarray
    scale_inv: np.ndarray
    scaling_mode: str


def _scaled_operand(name: str, x: Any) -> tuple[np.ndarray, np.ndarray, str]:
    if not all(hasattr(x, f) for f in ("data", "scale_inv", "scaling_mode")):
        raise TypeError(f"{name}: expected a TEScaledTensor (data, scale_inv, scaling_mode), got {type(x).__name__}")
    data, sinv = base.as_array(f"{name}.data", x.data), base.as_array(f"{name}.scale_inv", x.scale_inv)
    if data.dtype not in (E4M3, E5M2):
        raise TypeError(f"{name}.data: expected float8_e4m3fn or float8_e5m2 codes, got {data.dtype}")
    if x.scaling_mode not in ("tensor", "mxfp8"):
        raise ValueError(f"{name}.scaling_mode: expected 'tensor' or 'mxfp8', got {x.scaling_mode!r}")
    want = np.float32 if x.scaling_mode == "tensor" else E8M0
    if sinv.dtype != want or sinv.ndim != 1:
        raise TypeError(f"{name}.scale_inv: expected a 1-D {np.dtype(want)} array for {x.scaling_mode} scaling, "
                        f"got {sinv.dtype} {sinv.shape}")
    return data, sinv, x.scaling_mode


class _TeScaledGroupedGemm(Convention):
    def parse(self, lhs: Any, rhs: Any, *, lhs_first_dims: Any = None, lhs_last_dims: Any = None,
              rhs_first_dims: Any = None, rhs_last_dims: Any = None, contracting_dims: Any = ((1,), (1,)),
              preferred_element_type: Any = None) -> Problem:
        """TransformerEngine's FP8 grouped GEMM, forward / dgrad (ragged M, NT): ``lhs`` ``[sum M, K]`` and ``rhs``
        ``[G, N, K]``, each a :class:`TEScaledTensor`; ``lhs_first_dims`` the group sizes. Per-tensor scaling:
        ``scale_inv[g]`` is group g's (the value is ``code * scale_inv[g]``), e4m3 x e4m3, e4m3 x e5m2 or
        e5m2 x e4m3; MXFP8: e4m3 codes with swizzled e8m0 blocks per 32 of K. bfloat16 output by default."""
        a, sa, mode_a = _scaled_operand("lhs", lhs)
        b, sb, mode_b = _scaled_operand("rhs", rhs)
        if mode_a != mode_b:
            raise ValueError(f"lhs.scaling_mode, rhs.scaling_mode: expected the same, got {mode_a!r} and {mode_b!r}")
        base.expect_ndim("lhs.data", a, 2)
        base.expect_ndim("rhs.data", b, 3)
        if any(d is not None for d in (lhs_last_dims, rhs_first_dims, rhs_last_dims)) or lhs_first_dims is None:
            raise ValueError("lhs_first_dims/lhs_last_dims/rhs_first_dims/rhs_last_dims: the scaled form modelled is "
                             "ragged M (lhs_first_dims only; the weights carry their group axis)")
        if tuple(map(tuple, contracting_dims)) != ((1,), (1,)):
            raise ValueError(f"contracting_dims: the FP8 grouped GEMM is NT (lhs [M, K], rhs [N, K] per group): "
                             f"expected ((1,), (1,)), got {contracting_dims!r}")
        gs = base.as_sizes("lhs_first_dims", lhs_first_dims)
        g, n, k = b.shape
        if gs.size != g or a.shape[1] != k:
            raise ValueError(f"lhs.data, rhs.data, lhs_first_dims: expected [sum M, {k}] and [{gs.size}, N, K], got "
                             f"{a.shape} and {b.shape}")
        if int(gs.sum()) != a.shape[0] or np.any(gs < 0):
            raise ValueError(f"lhs_first_dims: expected non-negative sizes summing to {a.shape[0]}, got {gs.tolist()}")
        out = base.optional_dtype("preferred_element_type", preferred_element_type) or BF16
        if mode_a == "tensor":
            if (a.dtype, b.dtype) == (E5M2, E5M2):
                raise TypeError("lhs.data, rhs.data: e5m2 x e5m2 is not an FP8 GEMM TE runs (one side e4m3)")
            for name, s in (("lhs", sa), ("rhs", sb)):
                if s.shape != (g,):
                    raise ValueError(f"{name}.scale_inv: expected ({g},) float32 (one per group), got {s.shape}")
            qa, qb = Quantization(a.dtype, np.float32, "tensor"), Quantization(b.dtype, np.float32, "tensor")
            ls, rs = [sa[i].reshape(1, 1) for i in range(g)], [sb[i].reshape(1, 1) for i in range(g)]
        else:
            if (a.dtype, b.dtype) != (E4M3, E4M3):
                raise TypeError(f"lhs.data, rhs.data: MXFP8 takes float8_e4m3fn codes, got {a.dtype} and {b.dtype}")
            qa, qb = MXFP8
            kb = -(-k // MX_BLOCK)
            ls = group_blocks("lhs.scale_inv", sa, [(int(m), kb) for m in gs], True)
            rs = group_blocks("rhs.scale_inv", sb, [(n, kb)] * g, True)
        return Problem("ragged_m", a, b, gs.astype(np.int64), rhs_transposed=True, out_dtype=out,
                       convention=self.name, **self.policies("ragged_m"), lhs_quant=qa, lhs_scales=ls,
                       rhs_quant=qb, rhs_scales=rs)

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        g = p.num_groups
        lhs = [p.scales_of("lhs", i) for i in range(g)]
        rhs = [p.scales_of("rhs", i) for i in range(g)]
        if p.lhs_quant.block == (None, None):
            sa = np.array([s[0, 0] for s in lhs], np.float32)
            sb = np.array([s[0, 0] for s in rhs], np.float32)
            mode = "tensor"
        else:
            sa, sb, mode = join_blocked(lhs, E8M0), join_blocked(rhs, E8M0), "mxfp8"
        return ((TEScaledTensor(p.lhs, sa, mode), TEScaledTensor(p.rhs, sb, mode)),
                {"lhs_first_dims": base.sizes32(p), "contracting_dims": ((1,), (1,)),
                 "preferred_element_type": p.out_dtype})


TE_SCALED_GROUPED_GEMM = _TeScaledGroupedGemm(
    name="te.scaled_grouped_gemm", framework="jax", families=("ragged_m",),
    layouts=(("ragged_m", ((False, True, False),)),),
    dtype_pairs=((E4M3, BF16), (E4M3, np.float32), (E5M2, BF16), (E5M2, np.float32)), listed_pairs_only=True,
    full_sums=True, tail="zero", empty="zero",
    # K in whole MX blocks (and 16-byte rows of FP8 codes); N in 16-byte rows
    multiple_of=(("k", MX_BLOCK), ("n", 16)), zero_extents=("m",), default_tiling=(128, 128, 128),
    quantizations=(*TENSOR_SCALINGS, MXFP8),
    summary="TransformerEngine grouped_gemm on FP8 GroupedScaledTensors: per-group tensor scale_inv, or MXFP8",
)
te_scaled_grouped_gemm = base.front_end(TE_SCALED_GROUPED_GEMM, "te_scaled_grouped_gemm")
