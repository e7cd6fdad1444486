"""DeepGEMM's m-grouped GEMMs: the contiguous layout (``padded_contiguous``) and the masked layout (``masked``).

``m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, ..., use_psum_layout=False, ...)``
and its bf16 twin ``m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, ...)``:

- ``a`` ``[M, K]`` (K-major), ``b`` ``[G, N, K]`` (the "nt" layout: each group's weights transposed),
  ``d`` ``[M, N]`` bfloat16, written in place (the functions return nothing);
- every group starts at a multiple of the M alignment (``get_mk_alignment_for_contiguous_layout()``, 128
  unless set; it is the kernel's ``BLOCK_M``), and ``grouped_layout`` says where the groups are:
  ``[M]`` int32 with each row's group and -1 for padding rows, or with ``use_psum_layout=True`` ``[G]`` int32
  cumulative ends: group 0 is rows ``[0, psum[0])``, group g rows ``[align(psum[g-1]), psum[g])``;
- padding rows of ``d`` are undefined: the kernel computes whole ``BLOCK_M`` blocks (a padding row inside
  a group's last block is that row of ``a`` times the group's weights; a block of padding rows may be
  written as zeros), and rows past the last block are never written.

``m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, ...)`` (bf16 twin alike):
``a`` ``[G, M, K]``, ``b`` ``[G, N, K]``, ``d`` ``[G, M, N]``; group g's rows ``[0, masked_m[g])`` are
computed, the rest undefined (rows up to the next ``BLOCK_M`` boundary are written, the others untouched).
``expected_m`` is a hint for the kernel's heuristics (a positive int).

FP8 operands are ``(codes, scales)`` pairs of float8_e4m3fn codes and float32 scale factors: per row of
``a`` and block of 128 along K (``sfa [M, ceil(K/128)]``, ``[G, M, ceil(K/128)]`` masked), per 128 x 128
block of ``b`` (``sfb [G, ceil(N/128), ceil(K/128)]``, SM90's recipe ``(1, 128, 128)``) or per row of ``b``
and 128 along K (``sfb [G, N, ceil(K/128)]``, SM100's recipe ``(1, 1, 128)``, whose scales must be powers of
two: the kernel casts them to UE8M0). The SM90 kernel applies both scales at every 128-wide K block as it
promotes the tensor cores' partial sums into float32; SM100's block-scaled MMA accumulates in float32 too.
Scale slots of padding rows (and of rows past a group's count) hold 1 in the arguments built here (a finite
scale, as DeepGEMM's own packer writes for them: the kernel does read them for the rows it computes).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from gmm_ref.conventions import base
from gmm_ref.conventions.base import Convention
from gmm_ref.problem import Problem, aligned_starts
from gmm_ref.scaled.model import Quantization

__all__ = ["CONTIGUOUS", "CONTIGUOUS_PSUM", "MASKED", "SM90_RECIPE", "SM100_RECIPE", "FP8Operand",
           "deep_gemm_m_grouped_contiguous", "deep_gemm_m_grouped_masked"]

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
#: DeepGEMM's default M alignment of the contiguous layout (``get_mk_alignment_for_contiguous_layout()``)
ALIGNMENT = 128
#: (lhs, rhs) quantizations of the two recipes: SM90 (1, 128, 128) with float32 scales, SM100 (1, 1, 128)
#: with power-of-two scales (given to the kernel as float32, which casts them to UE8M0)
SM90_RECIPE = (Quantization(E4M3, np.float32, (1, 128)), Quantization(E4M3, np.float32, (128, 128)))
SM100_RECIPE = (Quantization(E4M3, E8M0, (1, 128)), Quantization(E4M3, E8M0, (1, 128)))


class FP8Operand(NamedTuple):
    """A DeepGEMM FP8 operand, ``(codes, scale factors)`` (a plain tuple to the kernel)."""

    data: np.ndarray
    scale: np.ndarray


def _operand(name: str, x: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """(codes, float32 scale factors) of an FP8 pair, or (array, None) of a bf16 operand."""
    if isinstance(x, tuple):
        if len(x) != 2:
            raise ValueError(f"{name}: expected an array or a (codes, scale factors) pair, got {len(x)} items")
        codes, sf = base.as_array(f"{name}[0]", x[0]), base.as_array(f"{name}[1]", x[1])
        if codes.dtype != E4M3:
            raise TypeError(f"{name}[0]: expected float8_e4m3fn codes, got {codes.dtype}")
        if sf.dtype != np.float32:
            raise TypeError(f"{name}[1]: expected float32 scale factors (DeepGEMM casts them to UE8M0 itself where "
                            f"its recipe needs it), got {sf.dtype}")
        return codes, sf
    arr = base.as_array(name, x)
    if arr.dtype != BF16:
        raise TypeError(f"{name}: expected a bfloat16 array or an FP8 (codes, scale factors) pair, got {arr.dtype}")
    return arr, None


def _both(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]:
    ca, sa = _operand("a", a)
    cb, sb = _operand("b", b)
    if (sa is None) != (sb is None):
        raise TypeError("a, b: both FP8 (codes, scale factors) pairs or both bfloat16 arrays, not one of each")
    return ca, sa, cb, sb


def _k_blocks(k: int) -> int:
    return -(-k // 128)


def _rhs_quant(sb: np.ndarray, g: int, n: int, k: int, recipe: Any) -> tuple[Quantization, list[np.ndarray]]:
    """The rhs quantization of ``sfb`` (``[G, ceil(N/128), ceil(K/128)]`` or ``[G, N, ceil(K/128)]``) and its
    per-group blocks in the ``[N, K]`` view."""
    blocked, rowwise = (g, -(-n // 128), _k_blocks(k)), (g, n, _k_blocks(k))
    if recipe is not None:
        r = tuple(int(v) for v in recipe)
        if r not in ((1, 128, 128), (1, 1, 128)):
            raise ValueError(f"recipe: expected (1, 128, 128) or (1, 1, 128), got {recipe!r}")
        want = blocked if r[1] == 128 else rowwise
    else:
        want = blocked if sb.shape == blocked else rowwise
    if sb.shape != want:
        raise ValueError(f"b[1]: expected scale factors of shape {blocked} (recipe (1, 128, 128)) or {rowwise} "
                         f"(recipe (1, 1, 128)), got {sb.shape}")
    quant = Quantization(E4M3, np.float32, (128, 128) if want == blocked else (1, 128))
    return quant, [sb[i] for i in range(g)]


def _check_d(d: Any, shape: tuple[int, ...]) -> None:
    out = base.as_array("d", d)
    if out.shape != shape or out.dtype != BF16:
        raise ValueError(f"d: expected the bfloat16 output buffer of shape {shape}, got {out.dtype} {out.shape}")


def _sizes_from_layout(layout: np.ndarray, m: int, g: int, alignment: int, psum: bool) -> np.ndarray:
    """Group sizes of a contiguous layout given as per-row group ids or as cumulative ends."""
    if layout.dtype != np.int32 or layout.ndim != 1:
        raise TypeError(f"grouped_layout: expected a 1-D int32 array, got {layout.dtype} {layout.shape}")
    if psum:
        if layout.size != g:
            raise ValueError(f"grouped_layout: the psum layout holds one cumulative end per group ({g}), got "
                             f"{layout.size}")
        sizes, start = [], 0
        for i, end in enumerate(layout.astype(np.int64).tolist()):
            start = 0 if i == 0 else -(-start // alignment) * alignment
            if end < start:
                raise ValueError(f"grouped_layout: group {i} ends at {end}, before its start {start} (the previous "
                                 f"end rounded up to the alignment {alignment})")
            if end > m and end > start:
                raise ValueError(f"grouped_layout: group {i} ends at {end}, past M={m}")
            sizes.append(end - start)
            start = end
        return np.array(sizes, np.int64)
    if layout.size != m:
        raise ValueError(f"grouped_layout: expected one group id per row of a ({m}), got {layout.size}")
    if np.any((layout < -1) | (layout >= g)):
        raise ValueError(f"grouped_layout: expected group ids in [0, {g}) or -1 for padding rows")
    sizes = np.bincount(layout[layout >= 0], minlength=g).astype(np.int64)
    want = np.full(m, -1, np.int32)
    for i, (s, n) in enumerate(zip(aligned_starts(sizes, alignment).tolist(), sizes.tolist(), strict=True)):
        want[s:s + n] = i
    if not np.array_equal(want, layout):
        raise ValueError(f"grouped_layout: expected each group's rows contiguous, in group order, each group "
                         f"starting at a multiple of the alignment {alignment} (-1 elsewhere)")
    return sizes


class _Contiguous(Convention):
    #: the arguments built here give ``grouped_layout`` as cumulative ends (``use_psum_layout=True``)
    psum: bool = False

    def parse(self, a: Any, b: Any, d: Any, grouped_layout: Any, recipe: Any = None, compiled_dims: str = "nk",
              disable_ue8m0_cast: bool = False, use_psum_layout: bool = False, ensure_zero_padding: bool = True,
              expected_m_for_psum_layout: Any = None, *, alignment: int = ALIGNMENT) -> Problem:
        """DeepGEMM's m-grouped contiguous GEMM, FP8 or bf16: ``a [M, K]`` (or ``(codes, sfa)``), ``b [G, N, K]``
        (or ``(codes, sfb)``), ``d [M, N]`` bfloat16, ``grouped_layout`` per-row group ids (-1: padding) or,
        with ``use_psum_layout=True``, cumulative group ends. ``alignment`` is the M alignment every group
        starts at (DeepGEMM's ``get_mk_alignment_for_contiguous_layout()``, 128 unless set). Padding rows
        are undefined."""
        ca, sa, cb, sb = _both(a, b)
        base.expect_ndim("a", ca, 2)
        base.expect_ndim("b", cb, 3)
        m, k = ca.shape
        g, n, k2 = cb.shape
        if k != k2:
            raise ValueError(f"a, b: contracting extents differ: a has K={k}, b has K={k2}")
        _check_d(d, (m, n))
        if not isinstance(alignment, int) or alignment < 1:
            raise ValueError(f"alignment: expected a positive int, got {alignment!r}")
        for flag in ("disable_ue8m0_cast", "use_psum_layout", "ensure_zero_padding"):
            if not isinstance(locals()[flag], bool):
                raise TypeError(f"{flag}: expected a bool, got {locals()[flag]!r}")
        sizes = _sizes_from_layout(base.as_array("grouped_layout", grouped_layout), m, g, alignment,
                                   use_psum_layout)
        extra: dict[str, Any] = {}
        if sa is not None:
            if sa.shape != (m, _k_blocks(k)):
                raise ValueError(f"a[1]: expected scale factors of shape {(m, _k_blocks(k))} (a row's per 128 of K), "
                                 f"got {sa.shape}")
            starts = aligned_starts(sizes, alignment)
            rq, rs = _rhs_quant(sb, g, n, k, recipe)
            extra = dict(lhs_quant=SM90_RECIPE[0], lhs_scales=[sa[s:s + c] for s, c in zip(starts, sizes, strict=True)],
                         rhs_quant=rq, rhs_scales=rs)
        return Problem("padded_contiguous", ca, cb, sizes, rhs_transposed=True, alignment=alignment, out_dtype=BF16,
                       convention=self.name, **self.policies("padded_contiguous"), **extra)

    def _refusal(self, p: Problem) -> str | None:
        return _scale_refusal(self, p)

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        ids = np.full(p.m, -1, np.int32)
        starts, ends = p.spans_at(())
        for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            ids[s:e] = i
        a, b = _operands(p)
        d = np.full((p.m, p.n), np.nan, BF16)  # what the kernel does not write stays NaN
        if self.psum:
            return (a, b, d, ends.astype(np.int32)), {"use_psum_layout": True}
        return (a, b, d, ids), {}


def _scale_refusal(conv: Convention, p: Problem) -> str | None:
    if p.rhs_quant is not None and p.rhs_quant.scale == E8M0 and p.lhs_quant.scale != E8M0:
        return f"{conv.name}: power-of-two (UE8M0) scales on one operand only"
    return None


def _operands(p: Problem) -> tuple[Any, Any]:
    """``a`` and ``b`` as the kernel takes them: bf16 arrays, or (codes, float32 scale factors) with 1 in every
    slot no group owns; ``b`` as ``[G, N, K]``."""
    if p.lhs_quant is None:
        return np.array(p.lhs), np.array(p.rhs)
    kb = _k_blocks(p.k)
    g = p.num_groups
    if p.family_facts.is_grouped("lhs"):  # masked: [G, M, K]
        sfa = np.ones((g, p.m, kb), np.float32)
        for i in range(g):
            sfa[i, :p.group_sizes[i]] = p.scales_of("lhs", i).astype(np.float32)
    else:
        sfa = np.ones((p.m, kb), np.float32)
        starts, ends = p.spans_at(())
        for i in range(g):
            sfa[starts[i]:ends[i]] = p.scales_of("lhs", i).astype(np.float32)
    shape = p.rhs_quant.scale_shape(p.n, p.k)
    sfb = np.stack([p.scales_of("rhs", i).astype(np.float32) for i in range(g)]) if g else \
        np.zeros((0, *shape), np.float32)
    return FP8Operand(np.array(p.lhs), sfa), FP8Operand(np.array(p.rhs), sfb)


class _Masked(Convention):
    def parse(self, a: Any, b: Any, d: Any, masked_m: Any, expected_m: Any, recipe: Any = None,
              compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> Problem:
        """DeepGEMM's m-grouped masked GEMM, FP8 or bf16: ``a [G, M, K]`` (or ``(codes, sfa)`` with ``sfa
        [G, M, ceil(K/128)]``), ``b [G, N, K]`` (or ``(codes, sfb)``), ``d [G, M, N]`` bfloat16, ``masked_m``
        ``[G]`` int32 valid rows per group, ``expected_m`` a positive int (a hint). Rows past ``masked_m`` are
        undefined."""
        ca, sa, cb, sb = _both(a, b)
        g, m, k, n = base.expect_grouped_nt("a", ca, "b", cb)
        _check_d(d, (g, m, n))
        counts = base.as_array("masked_m", masked_m)
        if counts.dtype != np.int32 or counts.shape != (g,):
            raise TypeError(f"masked_m: expected a [{g}] int32 array of valid rows per group, got {counts.dtype} "
                            f"{counts.shape}")
        if isinstance(expected_m, bool) or not isinstance(expected_m, (int, np.integer)) or expected_m <= 0:
            raise ValueError(f"expected_m: expected a positive int (the kernel's hint), got {expected_m!r}")
        extra: dict[str, Any] = {}
        if sa is not None:
            if sa.shape != (g, m, _k_blocks(k)):
                raise ValueError(f"a[1]: expected scale factors of shape {(g, m, _k_blocks(k))}, got {sa.shape}")
            rq, rs = _rhs_quant(sb, g, n, k, recipe)
            extra = dict(lhs_quant=SM90_RECIPE[0], lhs_scales=[sa[i, :max(int(counts[i]), 0)] for i in range(g)],
                         rhs_quant=rq, rhs_scales=rs)
        return Problem("masked", ca, cb, counts.astype(np.int64), rhs_transposed=True, out_dtype=BF16,
                       convention=self.name, **self.policies("masked"), **extra)

    def _refusal(self, p: Problem) -> str | None:
        return _scale_refusal(self, p)

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        a, b = _operands(p)
        d = np.full((p.num_groups, p.m, p.n), np.nan, BF16)
        expected = max(1, int(np.ceil(np.mean(p.group_sizes)))) if p.num_groups else 1
        return (a, b, d, p.group_sizes.astype(np.int32), expected), {}


_FACTS = dict(
    framework="torch", dtype_pairs=((BF16, BF16), (E4M3, BF16)), listed_pairs_only=True, tail="undefined",
    # K in blocks of 128 (the FP8 kernels' BLOCK_K and scale blocks), N in 16-byte TMA rows of the output
    multiple_of=(("k", 128), ("n", 16)), zero_extents=("m",), default_tiling=(128, 128, 128),
    quantizations=((None, None), SM90_RECIPE, SM100_RECIPE), out_argument="d",
)
CONTIGUOUS = _Contiguous(
    name="deep_gemm.m_grouped_contiguous", families=("padded_contiguous",),
    layouts=(("padded_contiguous", ((False, True, False),)),), **_FACTS,
    summary="deep_gemm.m_grouped_{fp8,bf16}_gemm_nt_contiguous(a, b, d, grouped_layout, ...): groups at aligned "
            "rows, a group id per row (-1: padding)",
)


class _ContiguousPsum(_Contiguous):
    psum = True


#: the same kernels called with ``use_psum_layout=True``: ``grouped_layout`` holds the groups' cumulative ends
CONTIGUOUS_PSUM = _ContiguousPsum(
    name="deep_gemm.m_grouped_contiguous_psum", families=("padded_contiguous",),
    layouts=(("padded_contiguous", ((False, True, False),)),), **_FACTS,
    summary="deep_gemm.m_grouped_{fp8,bf16}_gemm_nt_contiguous(a, b, d, psum_ends, use_psum_layout=True): groups "
            "at aligned rows",
)
MASKED = _Masked(
    name="deep_gemm.m_grouped_masked", families=("masked",), layouts=(("masked", ((False, True, False),)),),
    **_FACTS,
    summary="deep_gemm.m_grouped_{fp8,bf16}_gemm_nt_masked(a, b, d, masked_m, expected_m, ...): [G, M, K] with "
            "valid rows per group",
)
deep_gemm_m_grouped_contiguous = base.front_end(CONTIGUOUS, "deep_gemm_m_grouped_contiguous")
deep_gemm_m_grouped_masked = base.front_end(MASKED, "deep_gemm_m_grouped_masked")
