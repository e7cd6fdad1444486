"""``torch._scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
out_dtype=None, use_fast_accum=False)``, rowwise FP8, in its four forms.

float8_e4m3fn operands, one float32 scale per row of ``mat_a`` and per column
of ``mat_b`` (``mat_b`` is logical ``[..., K, N]``), applied after the K loop;
bfloat16 output. ``offs`` are int32 cumulative group ends:

======  =============  ==============  ===========  =============  ===============
form    mat_a          mat_b           scale_a      scale_b        output
======  =============  ==============  ===========  =============  ===============
2d-3d   ``[sum M, K]`` ``[G, K, N]``   ``[sum M]``  ``[G, N]``     ``[sum M, N]``
3d-3d   ``[G, M, K]``  ``[G, K, N]``   ``[G, M]``   ``[G, N]``     ``[G, M, N]``
3d-2d   ``[G, M, K]``  ``[K, sum N]``  ``[G, M]``   ``[sum N]``    ``[M, sum N]``
2d-2d   ``[M, sum K]`` ``[sum K, N]``  ``[G * M]``  ``[G * N]``    ``[G, M, N]``
======  =============  ==============  ===========  =============  ===============

Rows (columns) past ``offs[-1]`` are never written: undefined. Their scales
are read by no correct kernel: the arguments built here hold NaN there. The
kernel is CUDA only in torch 2.13 (``gmm_kernels`` loops over
``torch._scaled_mm``, which runs on CPU, to check the contract here).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from gmm_ref import families
from gmm_ref.conventions import base
from gmm_ref.conventions.base import Convention
from gmm_ref.problem import RAGGED_FAMILIES as FAMILIES
from gmm_ref.problem import Problem
from gmm_ref.scaled.layouts import blocked_shape, group_blocks, join_blocked, pack_fp4, round_up, unpack_fp4
from gmm_ref.scaled.model import Quantization

__all__ = ["MXFP8", "NVFP4_GLOBAL", "ROWWISE", "SCALED_GROUPED_MM", "SCALED_GROUPED_MM_V2", "blocked_2d_3d",
           "group_blocks", "scaled_grouped_mm", "scaled_grouped_mm_v2"]

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
#: one float32 scale per row of mat_a and per column of mat_b, over the whole K of a group
ROWWISE = Quantization(E4M3, np.float32, "row")
MX_BLOCK = 32
#: MXFP8: one e8m0 scale per 32 elements along K (both operands), blocks restarting at every group
MXFP8 = Quantization(E4M3, E8M0, (1, MX_BLOCK))


def _offsets(offs: Any, form: str) -> np.ndarray:
    if (form == "3d-3d") != (offs is None):
        raise ValueError(f"offs: {'not taken' if form == '3d-3d' else 'required'} by the {form} form, got {offs!r}")
    if offs is None:
        return np.zeros(0, np.int64)
    o = base.as_array("offs", offs)
    if o.ndim != 1 or o.dtype != np.int32:
        raise TypeError(f"offs: expected a 1-D int32 array of cumulative group ends, got {o.dtype} {o.shape}")
    sizes = np.diff(np.concatenate([[0], o.astype(np.int64)]))
    if np.any(sizes < 0):
        raise ValueError(f"offs: expected non-decreasing non-negative group ends, got {o.tolist()}")
    return sizes


def blocked_2d_3d(p: Problem, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """A ragged-M (2d-3d) problem's block scales as torch's grouped kernels take them: ``scale_a`` the groups'
    padded swizzled blocks stacked by rows (``[sum of padded rows, padded k-blocks]``), ``scale_b`` one flat
    padded swizzled block per group (``[G, padded N * padded k-blocks]``)."""
    g = p.num_groups
    lhs = [p.scales_of("lhs", i) for i in range(g)]
    width = round_up(p.lhs_quant.scale_shape(p.m, p.k)[1], 4)
    rows = sum(blocked_shape(s.shape[0], 1)[0] for s in lhs)
    sb = np.stack([join_blocked([p.scales_of("rhs", i)], dtype) for i in range(g)]) if g else \
        np.zeros((0, width * round_up(p.n, 128)), dtype)
    return join_blocked(lhs, dtype).reshape(rows, width), sb


def _expect(arr: np.ndarray, shape: tuple[int, ...], name: str) -> None:
    if arr.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {arr.shape}")


class _ScaledGroupedMM(Convention):
    def parse(self, mat_a: Any, mat_b: Any, scale_a: Any, scale_b: Any, offs: Any = None, bias: Any = None,
              scale_result: Any = None, out_dtype: Any = None, use_fast_accum: bool = False) -> Problem:
        """``torch._scaled_grouped_mm``'s rowwise FP8 contract: float8_e4m3fn operands, float32 scales (one per
        row of ``mat_a``, one per column of ``mat_b``) applied after the K loop, bfloat16 output."""
        a, b = base.as_array("mat_a", mat_a), base.as_array("mat_b", mat_b)
        for name, arr in (("mat_a", a), ("mat_b", b)):
            if arr.dtype != E4M3:
                raise TypeError(f"{name}: expected float8_e4m3fn (rowwise FP8), got {arr.dtype}")
        sa, sb = base.as_array("scale_a", scale_a), base.as_array("scale_b", scale_b)
        mx = sa.dtype == E8M0
        for name, arr in (("scale_a", sa), ("scale_b", sb)):
            if arr.dtype != (E8M0 if mx else np.float32):
                raise TypeError(f"{name}: expected float32 rowwise scales, or float8_e8m0fnu MXFP8 scales on both "
                                f"operands, got {sa.dtype} and {sb.dtype}")
        if bias is not None or scale_result is not None:
            raise ValueError("bias, scale_result: the rowwise grouped form takes neither; expected None")
        out = BF16 if out_dtype is None else base.optional_dtype("out_dtype", out_dtype)
        if out != BF16:
            raise ValueError(f"out_dtype: rowwise scaled grouped mm outputs bfloat16, got {out}")
        if not isinstance(use_fast_accum, bool):
            raise TypeError(f"use_fast_accum: expected a bool, got {use_fast_accum!r}")
        form = f"{a.ndim}d-{b.ndim}d"
        if form not in ("2d-3d", "3d-3d", "3d-2d", "2d-2d"):
            raise ValueError(f"mat_a, mat_b: expected 2-D or 3-D operands, got {a.ndim}-D and {b.ndim}-D")
        sizes = _offsets(offs, form)
        if mx:
            return self._parse_mx(a, b, sa, sb, sizes, form, out)
        ends = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        g = len(sizes)
        if form == "2d-3d":
            _expect(sa, (a.shape[0],), "scale_a")
            _expect(sb, (b.shape[0], b.shape[2]), "scale_b")
            if g != b.shape[0]:
                raise ValueError(f"offs: expected {b.shape[0]} group ends (one per mat_b group), got {g}")
            family, ls, rs = "ragged_m", [sa[ends[i]:ends[i + 1]] for i in range(g)], list(sb)
        elif form == "3d-3d":
            g = a.shape[0]
            _expect(sa, (g, a.shape[1]), "scale_a")
            _expect(sb, (b.shape[0], b.shape[2]), "scale_b")
            family, ls, rs, sizes = "batch", list(sa), list(sb), None
        elif form == "3d-2d":
            _expect(sa, (a.shape[0], a.shape[1]), "scale_a")
            _expect(sb, (b.shape[1],), "scale_b")
            if g != a.shape[0]:
                raise ValueError(f"offs: expected {a.shape[0]} group ends (one per mat_a group), got {g}")
            family, ls, rs = "ragged_n", list(sa), [sb[ends[i]:ends[i + 1]] for i in range(g)]
        else:
            m, n = a.shape[0], b.shape[1]
            _expect(sa, (g * m,), "scale_a")
            _expect(sb, (g * n,), "scale_b")
            family, ls, rs = "ragged_k", [sa[i * m:(i + 1) * m] for i in range(g)], \
                [sb[i * n:(i + 1) * n] for i in range(g)]
        # one scale per row of the group's [rows, K] view
        return Problem(family, a, b, sizes, out_dtype=out, convention=self.name, **self.policies(family),
                       lhs_quant=ROWWISE, lhs_scales=[s.reshape(-1, 1) for s in ls],
                       rhs_quant=ROWWISE, rhs_scales=[s.reshape(-1, 1) for s in rs])

    def _parse_mx(self, a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray, sizes: np.ndarray, form: str,
                  out: np.dtype) -> Problem:
        """The MXFP8 form: 2d-3d or 2d-2d, each group's e8m0 scales in its own swizzled, padded block."""
        g = len(sizes)
        if form == "2d-3d":
            if g != b.shape[0]:
                raise ValueError(f"offs: expected {b.shape[0]} group ends (one per mat_b group), got {g}")
            k, n = a.shape[1], b.shape[2]
            kb = -(-k // MX_BLOCK)
            ls = group_blocks("scale_a", sa, [(int(m), kb) for m in sizes], rows_first=True)
            rs = group_blocks("scale_b", sb, [(n, kb)] * g, rows_first=True)
            family = "ragged_m"
        elif form == "2d-2d":
            m, n = a.shape[0], b.shape[1]
            ls = group_blocks("scale_a", sa, [(m, -(-int(s) // MX_BLOCK)) for s in sizes], rows_first=False)
            rs = group_blocks("scale_b", sb, [(n, -(-int(s) // MX_BLOCK)) for s in sizes], rows_first=False)
            family = "ragged_k"
        else:
            raise ValueError(f"mat_a, mat_b: the MXFP8 grouped form takes 2d-3d or 2d-2d operands, got {form}")
        return Problem(family, a, b, sizes, out_dtype=out, convention=self.name, **self.policies(family),
                       lhs_quant=MXFP8, lhs_scales=ls, rhs_quant=MXFP8, rhs_scales=rs)

    def quantizations_for(self, family: str) -> tuple[tuple[Any, Any], ...]:
        """Rowwise in every form; MXFP8 in the 2d-3d and 2d-2d forms only (torch's MXFP8 grouped kernel)."""
        two_d = not families.get(family).is_grouped("lhs")  # ragged_m, ragged_k: a 2-D lhs
        return tuple(q for q in self.quantizations if q[0] != MXFP8 or two_d)

    def _refusal(self, p: Problem) -> str | None:
        if p.lhs_quant == MXFP8 and p.family_facts.is_grouped("lhs"):
            return f"{self.name}: MXFP8 takes the 2d-3d and 2d-2d forms only, not {p.family}"
        return None

    def _mx_arguments(self, p: Problem) -> tuple[np.ndarray, np.ndarray]:
        if p.family_facts.ragged == "m":
            return blocked_2d_3d(p, E8M0)
        # 2d-2d: each group's [M, k_g / 32] (and [N, k_g / 32]) block, padded and swizzled, one after the other,
        # viewed as [round_up(M, 128), the groups' padded columns]
        lhs = [p.scales_of("lhs", i) for i in range(p.num_groups)]
        rhs = [p.scales_of("rhs", i) for i in range(p.num_groups)]
        cols = sum(blocked_shape(1, s.shape[1])[1] for s in lhs)
        return (join_blocked(lhs, E8M0).reshape(round_up(p.m, 128), cols),
                join_blocked(rhs, E8M0).reshape(round_up(p.n, 128), cols))

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        gs = base.sizes32(p)
        if p.lhs_quant == MXFP8:
            sa, sb = self._mx_arguments(p)
            return (p.lhs, p.rhs, sa, sb), {"offs": np.cumsum(gs).astype(np.int32), "out_dtype": p.out_dtype}
        g = p.num_groups
        lhs = [p.scales_of("lhs", i)[:, 0] for i in range(g)]
        rhs = [p.scales_of("rhs", i)[:, 0] for i in range(g)]
        ragged = p.family_facts.ragged
        if ragged == "m":  # rows past the groups: NaN, which no correct kernel reads
            sa = np.concatenate([*lhs, np.full(p.m - int(gs.sum()), np.nan, np.float32)])
            sb = np.stack(rhs) if g else np.zeros((0, p.n), np.float32)
        elif ragged == "n":
            sa = np.stack(lhs) if g else np.zeros((0, p.m), np.float32)
            sb = np.concatenate([*rhs, np.full(p.n - int(gs.sum()), np.nan, np.float32)])
        elif ragged == "k":
            sa = np.concatenate(lhs) if g else np.zeros(0, np.float32)
            sb = np.concatenate(rhs) if g else np.zeros(0, np.float32)
        else:
            sa, sb = np.stack(lhs), np.stack(rhs)
        offs = None if gs is None else np.cumsum(gs).astype(np.int32)
        return (p.lhs, p.rhs, sa.astype(np.float32), sb.astype(np.float32)), {"offs": offs,
                                                                                "out_dtype": p.out_dtype}


SCALED_GROUPED_MM = _ScaledGroupedMM(
    name="torch.scaled_grouped_mm", framework="torch", families=FAMILIES,
    layouts=tuple((f, base.PLAIN) for f in FAMILIES),
    dtype_pairs=((E4M3, BF16),), listed_pairs_only=True, tail="undefined", empty="zero",
    # every operand's leading stride is a multiple of 16 bytes (16 float8 elements)
    multiple_of=(("k", "16B"), ("n", "16B")),
    default_tiling=(32, 32, 32),
    quantizations=((ROWWISE, ROWWISE), (MXFP8, MXFP8)),
    summary="torch._scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs=None, ...): rowwise FP8, 4 forms",
)
scaled_grouped_mm = base.front_end(SCALED_GROUPED_MM, "scaled_grouped_mm")


# ------------------------------------------------------------------ v2: F.scaled_grouped_mm, NVFP4
E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
NV_BLOCK = 16
#: NVFP4: e2m1 codes, one e4m3 scale per 16 of K, times one float32 global scale per group
NVFP4_GLOBAL = Quantization(E2M1, E4M3, (1, NV_BLOCK), global_scale=True)
_NVFP4_RECIPE = ["BlockWise1x16", "TensorWise"]


def _names(value: Any, name: str, n: int) -> list[str]:
    """A recipe / swizzle argument (an enum or its name, or a list of them) as a list of ``n`` names."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    names = [str(getattr(v, "name", v)).rsplit(".", 1)[-1] for v in items]
    if len(names) != n:
        raise ValueError(f"{name}: expected {n} entries (one per scale), got {value!r}")
    return names


class _ScaledGroupedMMv2(Convention):
    def parse(self, mat_a: Any, mat_b: Any, scale_a: Any, scale_recipe_a: Any, scale_b: Any, scale_recipe_b: Any,
              swizzle_a: Any = None, swizzle_b: Any = None, bias: Any = None, offs: Any = None,
              output_dtype: Any = BF16, contraction_dim: Any = (), use_fast_accum: bool = False) -> Problem:
        """``torch.nn.functional.scaled_grouped_mm``'s NVFP4 form, 2d-3d: ``mat_a [sum M, K/2]`` and ``mat_b
        [G, K/2, N]`` packed e2m1 codes (uint8 bytes of ``float4_e2m1fn_x2``, two consecutive elements of K a
        byte, the lower index in the low nibble), each with two scales: float8_e4m3fn blocks per 16 of K
        (``BlockWise1x16``, each group's block padded to 128 x 4 and swizzled: ``SWIZZLE_32_4_4``) and one
        float32 global scale per group (``TensorWise``, ``(G,)``); int32 ``offs``; bfloat16 output."""
        for name, rec in (("scale_recipe_a", scale_recipe_a), ("scale_recipe_b", scale_recipe_b)):
            if _names(rec, name, 2) != _NVFP4_RECIPE:
                raise ValueError(f"{name}: the form modelled is NVFP4, [BlockWise1x16, TensorWise], got {rec!r}")
        for name, sw in (("swizzle_a", swizzle_a), ("swizzle_b", swizzle_b)):
            if sw is None or _names(sw, name, len(sw) if isinstance(sw, (list, tuple)) else 1)[0] != "SWIZZLE_32_4_4":
                raise ValueError(f"{name}: NVFP4 block scales are swizzled (SWIZZLE_32_4_4), got {sw!r}")
        if bias is not None or tuple(contraction_dim) != () or not isinstance(use_fast_accum, bool):
            raise ValueError("bias, contraction_dim, use_fast_accum: NVFP4 grouped mm takes no bias, the default "
                             "contraction and a bool use_fast_accum")
        a8, b8 = base.as_array("mat_a", mat_a), base.as_array("mat_b", mat_b)
        for name, arr, nd in (("mat_a", a8, 2), ("mat_b", b8, 3)):
            if arr.dtype != np.uint8:
                raise TypeError(f"{name}: expected uint8 bytes of packed float4_e2m1fn codes, got {arr.dtype}")
            base.expect_ndim(name, arr, nd)
        a = unpack_fp4(a8, "mat_a")
        b = unpack_fp4(np.swapaxes(b8, 1, 2), "mat_b")  # [G, N, K]: each byte two consecutive elements of K
        t, k = a.shape
        g, n, kb_ = b.shape
        if kb_ != k or k % NV_BLOCK:
            raise ValueError(f"mat_a, mat_b: expected the same K, a multiple of {NV_BLOCK} (got {k} and {kb_})")
        out = base.optional_dtype("output_dtype", output_dtype)
        if out != BF16:
            raise ValueError(f"output_dtype: NVFP4 grouped mm outputs bfloat16, got {out}")
        if offs is None:
            raise ValueError("offs: required (int32 cumulative group ends)")
        sizes = _offsets(offs, "2d-3d")
        if len(sizes) != g or int(sizes.sum()) > t:
            raise ValueError(f"offs: expected {g} non-decreasing group ends within the {t} rows of mat_a, got "
                             f"{np.asarray(offs).tolist()}")
        parts = {}
        for name, sc in (("scale_a", scale_a), ("scale_b", scale_b)):
            if not isinstance(sc, (list, tuple)) or len(sc) != 2:
                raise TypeError(f"{name}: expected [block scales, global scales], got {type(sc).__name__}")
            blocks, glob = base.as_array(f"{name}[0]", sc[0]), base.as_array(f"{name}[1]", sc[1])
            if blocks.dtype != E4M3:
                raise TypeError(f"{name}[0]: expected float8_e4m3fn block scales, got {blocks.dtype}")
            if glob.dtype != np.float32 or glob.shape != (g,):
                raise TypeError(f"{name}[1]: expected ({g},) float32 global scales (one per group), got {glob.dtype} "
                                f"{glob.shape}")
            parts[name] = (blocks, glob)
        kb = k // NV_BLOCK
        ls = group_blocks("scale_a[0]", parts["scale_a"][0], [(int(m), kb) for m in sizes], True, "NVFP4 block")
        rs = group_blocks("scale_b[0]", parts["scale_b"][0], [(n, kb)] * g, True, "NVFP4 block")
        return Problem("ragged_m", a, b, sizes, rhs_transposed=True, out_dtype=out, convention=self.name,
                       **self.policies("ragged_m"), lhs_quant=NVFP4_GLOBAL, lhs_scales=ls, rhs_quant=NVFP4_GLOBAL,
                       rhs_scales=rs, lhs_global=parts["scale_a"][1], rhs_global=parts["scale_b"][1])

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        sa, sb = blocked_2d_3d(p, E4M3)
        mat_b = np.swapaxes(pack_fp4(p.rhs), 1, 2)  # [G, K/2, N], a transposed view as torch wants it
        recipe = list(_NVFP4_RECIPE)
        return ((pack_fp4(p.lhs), mat_b, [sa, np.array(p.lhs_global)], recipe, [sb, np.array(p.rhs_global)], recipe),
                {"swizzle_a": ["SWIZZLE_32_4_4", "NO_SWIZZLE"], "swizzle_b": ["SWIZZLE_32_4_4", "NO_SWIZZLE"],
                 "offs": np.cumsum(base.sizes32(p)).astype(np.int32), "output_dtype": p.out_dtype})


SCALED_GROUPED_MM_V2 = _ScaledGroupedMMv2(
    name="torch.scaled_grouped_mm_v2", framework="torch", families=("ragged_m",),
    layouts=(("ragged_m", ((False, True, False),)),),
    dtype_pairs=((E2M1, BF16),), listed_pairs_only=True, tail="undefined", empty="zero",
    # K in whole 16-blocks, packed rows of 16 bytes (32 codes); N in 16-byte rows of the output
    multiple_of=(("k", 32), ("n", 8)), zero_extents=("m",), default_tiling=(128, 128, 128),
    quantizations=((NVFP4_GLOBAL, NVFP4_GLOBAL),),
    summary="torch F.scaled_grouped_mm(mat_a, mat_b, [blocks, global], [BlockWise1x16, TensorWise], ...): NVFP4, "
            "2d-3d",
)
scaled_grouped_mm_v2 = base.front_end(SCALED_GROUPED_MM_V2, "scaled_grouped_mm_v2")
