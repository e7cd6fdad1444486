"""torchao's NVFP4 grouped GEMM: ``_emulated_nvfp4_scaled_grouped_mm_2d_3d(A_data, A_scale, B_data, B_scale,
offs=None, out_dtype=torch.bfloat16, block_size=16)`` (``torchao.nvfp4_grouped_mm``, torchao 0.18's
``prototype.moe_training.nvfp4_grouped_mm``).

- ``A_data`` ``[sum M, K // 2]`` and ``B_data`` ``[G, N, K // 2]``: float4_e2m1fn codes packed two a byte
  (uint8, or torch's ``float4_e2m1fn_x2`` viewed as bytes), the element of even index along K in the low
  nibble; the weights are stored ``[N, K]`` per expert (the kernel transposes them);
- ``A_scale`` ``[sum M, K // 16]`` and ``B_scale`` ``[G, N, K // 16]``: one float8_e4m3fn scale per 16
  elements along K, unswizzled and unpadded (NVFP4's block scales, without the per-tensor second level that
  torch's SM100 ``F.scaled_grouped_mm`` adds: torchao's emulation takes none);
- ``offs``: int32 cumulative group ends; rows past ``offs[-1]`` are never written (undefined);
- the result in ``out_dtype`` (bfloat16, or float32).

The emulation dequantizes into ``out_dtype`` and calls ``torch._grouped_mm``. The 2d-2d form (groups along
K) is not modelled: its scales run over the whole of K, so a 16-block may straddle two groups, where the model's
blocks restart at every group.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from gmm_ref.conventions import base
from gmm_ref.conventions.base import Convention
from gmm_ref.problem import Problem
from gmm_ref.scaled.layouts import pack_fp4, unpack_fp4
from gmm_ref.scaled.model import Quantization

__all__ = ["NVFP4", "NVFP4_GROUPED_MM", "nvfp4_grouped_mm"]

E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
BLOCK = 16
#: NVFP4's block scales: e2m1 codes, one e4m3 scale per 16 elements along K
NVFP4 = Quantization(E2M1, E4M3, (1, BLOCK))


def _codes(name: str, data: Any, ndim: int) -> np.ndarray:
    arr = base.as_array(name, data)
    if arr.dtype != np.uint8:
        raise TypeError(f"{name}: expected uint8 bytes of packed float4_e2m1fn codes (two a byte), got {arr.dtype}")
    base.expect_ndim(name, arr, ndim)
    return unpack_fp4(arr, name)


class _NVFP4GroupedMM(Convention):
    def parse(self, A_data: Any, A_scale: Any, B_data: Any, B_scale: Any, offs: Any = None,
              out_dtype: Any = BF16, block_size: int = BLOCK) -> Problem:
        """torchao's NVFP4 grouped mm, 2d-3d: packed e2m1 codes ``A_data [sum M, K/2]`` and ``B_data [G, N, K/2]``,
        float8_e4m3fn scales per 16 of K (``A_scale [sum M, K/16]``, ``B_scale [G, N, K/16]``), int32 ``offs``."""
        if isinstance(block_size, bool) or block_size != BLOCK:
            raise ValueError(f"block_size: NVFP4 scales cover {BLOCK} elements, got {block_size!r}")
        a, b = _codes("A_data", A_data, 2), _codes("B_data", B_data, 3)
        sa, sb = base.as_array("A_scale", A_scale), base.as_array("B_scale", B_scale)
        for name, arr in (("A_scale", sa), ("B_scale", sb)):
            if arr.dtype != E4M3:
                raise TypeError(f"{name}: expected float8_e4m3fn block scales, got {arr.dtype}")
        t, k = a.shape
        g, n, kb = b.shape
        if kb != k:
            raise ValueError(f"A_data, B_data: K differs ({k} and {kb} codes, two a byte)")
        if k % BLOCK:
            raise ValueError(f"A_data: K ({k}) must be a multiple of the {BLOCK}-element scale block")
        if sa.shape != (t, k // BLOCK):
            raise ValueError(f"A_scale: expected shape {(t, k // BLOCK)} (a scale per {BLOCK} of K), got {sa.shape}")
        if sb.shape != (g, n, k // BLOCK):
            raise ValueError(f"B_scale: expected shape {(g, n, k // BLOCK)}, got {sb.shape}")
        if offs is None:
            raise ValueError("offs: required (int32 cumulative group ends)")
        o = base.as_array("offs", offs)
        if o.shape != (g,) or o.dtype != np.int32:
            raise TypeError(f"offs: expected [{g}] int32 cumulative group ends (one per expert), got {o.dtype} "
                            f"{o.shape}")
        sizes = np.diff(np.concatenate([[0], o.astype(np.int64)]))
        if np.any(sizes < 0) or (g and int(o[-1]) > t):
            raise ValueError(f"offs: expected non-decreasing group ends within the {t} rows of A_data, got "
                             f"{o.tolist()}")
        out = base.optional_dtype("out_dtype", out_dtype)
        if out not in (BF16, np.dtype(np.float32)):
            raise ValueError(f"out_dtype: expected bfloat16 or float32, got {out}")
        ends = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return Problem("ragged_m", a, b, sizes, rhs_transposed=True, out_dtype=out, convention=self.name,
                       **self.policies("ragged_m"), lhs_quant=NVFP4, rhs_quant=NVFP4,
                       lhs_scales=[sa[ends[i]:ends[i + 1]] for i in range(g)], rhs_scales=list(sb))

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        g, kb = p.num_groups, p.k // BLOCK
        # rows past the groups: NaN scales, which no correct kernel uses for a row it writes
        tail = np.full((p.m - int(p.group_sizes.sum()), kb), np.nan).astype(E4M3)
        sa = np.concatenate([*(p.scales_of("lhs", i) for i in range(g)), tail])
        sb = np.stack([p.scales_of("rhs", i) for i in range(g)]) if g else np.zeros((0, p.n, kb), E4M3)
        return (pack_fp4(p.lhs), sa, pack_fp4(p.rhs), sb), {"offs": np.cumsum(base.sizes32(p)).astype(np.int32),
                                                             "out_dtype": p.out_dtype}


NVFP4_GROUPED_MM = _NVFP4GroupedMM(
    name="torchao.nvfp4_grouped_mm", framework="torch", families=("ragged_m",),
    layouts=(("ragged_m", ((False, True, False),)),),
    dtype_pairs=((E2M1, BF16), (E2M1, np.float32)), listed_pairs_only=True, tail="undefined", empty="zero",
    # K in whole scale blocks; the dequantized operands and the output in rows of 16 bytes (torch._grouped_mm),
    # which a zero K or N does not give
    multiple_of=(("k", BLOCK), ("n", 8)), zero_extents=("m",), default_tiling=(32, 32, 32),
    quantizations=((NVFP4, NVFP4),),
    summary="torchao _emulated_nvfp4_scaled_grouped_mm_2d_3d(A_data, A_scale, B_data, B_scale, offs, ...): "
            "packed e2m1 codes, e4m3 scales per 16 of K",
)
nvfp4_grouped_mm = base.front_end(NVFP4_GROUPED_MM, "nvfp4_grouped_mm")
