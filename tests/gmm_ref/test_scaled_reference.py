"""The scaled (quantized) grouped GEMM reference against an independent computation.

Every output element is recomputed here with Python fractions: each element
dequantized on its own (its scale looked up by its group-local block index,
not through ``Quantization.expand``), the products summed exactly, and the
sum rounded by comparing it with the neighbouring values of the output dtype
(ties to the even bit pattern), not by ``round_exact``. The cases cover every
scale granularity, partial blocks, group boundaries inside a block, every
family and torch's four rowwise forms; and cases where rounding the float64
sum would round twice.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import gmm_ref
from gmm_ref import scaled_grouped_mm, unit_roundoff
from gmm_ref.scaled import model as scaled
from gmm_ref.scaled.model import Quantization, round_exact, scaled_reference, to_mx

E4M3, E5M2, E2M1 = (np.dtype(d) for d in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn))
E8M0, BF16 = np.dtype(ml_dtypes.float8_e8m0fnu), np.dtype(ml_dtypes.bfloat16)
INT4 = np.dtype(ml_dtypes.int4)


# ------------------------------------------------------------------------------ the independent side
def _nearest_in(frac: Fraction, dtype: np.dtype) -> float:
    """``frac`` rounded to nearest (ties to the even bit pattern) among ``dtype``'s finite values."""
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
    info = ml_dtypes.finfo(dtype)
    top_ulp = Fraction(2) ** (int(info.maxexp) - 1 - int(info.nmant))
    if abs(frac) >= Fraction(float(info.max)) + top_ulp / 2:  # past the last finite value's rounding range
        return math.copysign(math.inf, frac)
    approx = np.array([float(frac)]).astype(np.float32 if dtype.itemsize <= 4 else np.float64).astype(dtype)
    code = int(approx.view(bits)[0])
    candidates = []
    for c in (code - 1, code, code + 1):
        if c < 0 or c >= 1 << (8 * dtype.itemsize):
            continue
        v = float(np.array([c], bits).view(dtype)[0].astype(np.float64))
        if math.isfinite(v):
            candidates.append((abs(Fraction(v) - frac), c & 1, v))
    if frac < 0:  # the neighbours of a negative value: mirror
        return -_nearest_in(-frac, dtype)
    best = min(candidates)
    return best[2]


def _scale_of(scales: np.ndarray, block: tuple, r: int, k: int) -> Fraction:
    br, bk = block
    return Fraction(float(scales[0 if br is None else r // br, 0 if bk is None else k // bk].astype(np.float64)))


def _independent(a_blocks, b_blocks, qa, qb, out_dtype):
    """[(lhs codes [M, K], lhs scales), ...] and rhs [(codes [N, K], scales)] per group -> exact and rounded."""
    results = []
    for (a, sa), (b, sb) in zip(a_blocks, b_blocks, strict=True):
        m, k = a.shape
        n = b.shape[0]
        exact = np.zeros((m, n))
        rounded = np.zeros((m, n))
        for i in range(m):
            for j in range(n):
                total = sum((Fraction(float(a[i, kk].astype(np.float64))) * _scale_of(sa, qa.block, i, kk)
                             * Fraction(float(b[j, kk].astype(np.float64))) * _scale_of(sb, qb.block, j, kk)
                             for kk in range(k)), Fraction(0))
                exact[i, j] = float(total)
                rounded[i, j] = _nearest_in(total, np.dtype(out_dtype))
        results.append((exact, rounded))
    return results


# ------------------------------------------------------------------------------ random cases
def _codes(rng, shape, elem):
    if elem in (np.dtype(np.int8), INT4):
        lo, hi = (-128, 128) if elem == np.dtype(np.int8) else (-8, 8)
        return rng.integers(lo, hi, size=shape).astype(elem)
    limit = float(ml_dtypes.finfo(elem).max)
    x = rng.standard_normal(shape) * rng.choice([0.01, 1.0, limit / 4], size=shape)
    x[rng.random(shape) < 0.1] = 0.0
    x[rng.random(shape) < 0.05] = limit  # the largest code
    return np.clip(x, -limit, limit).astype(elem)


def _scales(rng, shape, dtype):
    if dtype == E8M0:
        return np.ldexp(1.0, rng.integers(-20, 21, size=shape)).astype(E8M0)
    span = 8 if dtype == E4M3 else 12  # float8_e4m3fn scales stay within its range
    x = np.exp2(rng.uniform(-span, span, size=shape)) * rng.choice([1.0, 1.3], size=shape)
    return x.astype(np.float32).astype(dtype)


def _quant(rng, elem, scale, block):
    return Quantization(elem, scale, block)


CASES = [
    # (family, lhs elem, rhs elem, scale dtype, lhs block, rhs block, out dtype)
    ("ragged_m", E4M3, E4M3, np.float32, "row", "row", BF16),
    ("ragged_m", E4M3, E4M3, np.float32, "tensor", "tensor", np.float32),
    ("ragged_m", E4M3, E4M3, E8M0, (1, 8), (1, 8), BF16),  # MX-style, small blocks: partial last block
    ("ragged_m", E5M2, E4M3, E8M0, (1, 8), (1, 8), np.float32),
    ("ragged_m", E4M3, E4M3, np.float32, (1, 16), (4, 16), BF16),  # DeepSeek-style 1xB / BxB, B=16
    ("ragged_m", E2M1, E2M1, E4M3, (1, 4), (1, 4), np.float32),  # NVFP4-style
    ("ragged_m", np.dtype(np.int8), np.dtype(np.int8), np.float32, "row", "row", np.float32),
    ("ragged_m", INT4, INT4, BF16, (1, 8), (3, 8), BF16),  # sub-channel int4
    ("ragged_m", E4M3, E4M3, np.float32, (1, 8), (1, 12), np.float64),  # blocks of different widths
    ("ragged_n", E4M3, E4M3, np.float32, "row", (2, 8), BF16),
    ("ragged_k", E4M3, E4M3, E8M0, (1, 8), (1, 8), BF16),  # K blocks restart at each group
    ("ragged_k", E4M3, E5M2, np.float32, (3, 8), "row", np.float32),
    ("batch", E4M3, E4M3, np.float32, (2, 8), (2, 8), BF16),
    ("batch", E5M2, E5M2, E8M0, "row", "tensor", np.float16),
]


def _random_case(seed, family, ea, eb, sdt, ba, bb):
    rng = np.random.default_rng(seed)
    g, m, k, n = 3, 7, 21, 5
    qa, qb = Quantization(ea, sdt, ba), Quantization(eb, sdt, bb)
    sizes = rng.multinomial(m if family == "ragged_m" else n if family == "ragged_n" else k, [1 / g] * g)
    sizes[rng.integers(g)] = 0 if seed % 2 else sizes[rng.integers(g)]  # sometimes an empty group
    if family == "ragged_m":
        lhs, rhs = _codes(rng, (m, k), ea), _codes(rng, (g, k, n), eb)
        ends = np.concatenate([[0], np.cumsum(sizes)])
        a_blocks = [lhs[ends[i]:ends[i + 1]] for i in range(g)]
        b_blocks = [rhs[i].T for i in range(g)]
    elif family == "ragged_n":
        lhs, rhs = _codes(rng, (g, m, k), ea), _codes(rng, (k, n), eb)
        ends = np.concatenate([[0], np.cumsum(sizes)])
        a_blocks = [lhs[i] for i in range(g)]
        b_blocks = [rhs[:, ends[i]:ends[i + 1]].T for i in range(g)]
    elif family == "ragged_k":
        lhs, rhs = _codes(rng, (m, k), ea), _codes(rng, (k, n), eb)
        ends = np.concatenate([[0], np.cumsum(sizes)])
        a_blocks = [lhs[:, ends[i]:ends[i + 1]] for i in range(g)]
        b_blocks = [rhs[ends[i]:ends[i + 1]].T for i in range(g)]
    else:
        lhs, rhs = _codes(rng, (g, m, k), ea), _codes(rng, (g, k, n), eb)
        sizes = None
        a_blocks = [lhs[i] for i in range(g)]
        b_blocks = [rhs[i].T for i in range(g)]
    sa = [_scales(rng, qa.scale_shape(*blk.shape), sdt) for blk in a_blocks]
    sb = [_scales(rng, qb.scale_shape(*blk.shape), sdt) for blk in b_blocks]
    return lhs, rhs, sizes, qa, qb, sa, sb, a_blocks, b_blocks


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-{np.dtype(c[3])}-{c[4]}-{c[5]}" for c in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_reference_is_the_exact_sum_rounded_once(case, seed):
    family, ea, eb, sdt, ba, bb, out = case
    lhs, rhs, sizes, qa, qb, sa, sb, a_blocks, b_blocks = _random_case(seed, family, ea, eb, sdt, ba, bb)
    ref = scaled_reference(lhs, sa, rhs, sb, sizes, lhs_quant=qa, rhs_quant=qb, family=family, out_dtype=out)
    want = _independent(list(zip(a_blocks, sa, strict=True)), list(zip(b_blocks, sb, strict=True)), qa, qb, out)
    ends = None if sizes is None else np.concatenate([[0], np.cumsum(sizes)])
    for gi, (exact, rounded) in enumerate(want):
        if family == "ragged_m":
            where = (slice(ends[gi], ends[gi + 1]), slice(None))
        elif family == "ragged_n":
            where = (slice(None), slice(ends[gi], ends[gi + 1]))
        else:
            where = (gi,)
        np.testing.assert_array_equal(ref.exact[where], exact, err_msg=f"group {gi}: exact")
        np.testing.assert_array_equal(ref.values[where].astype(np.float64), rounded, err_msg=f"group {gi}: rounded")
    assert ref.values.dtype == np.dtype(out)
    assert np.all(ref.magnitude >= np.abs(ref.exact) * (1 - 1e-12))  # sum |a||b|, in float64


def test_one_rounding_where_the_float64_sum_would_round_twice():
    # 1 + 2**-8 + 2**-60: bfloat16's nearest is 1 + 2**-7; the float64 sum drops 2**-60, lands on the
    # midpoint 1 + 2**-8 and rounds to even, 1.0
    q = Quantization(E4M3, E8M0, (1, 4))
    a = np.zeros((1, 12), np.float32)
    a[0, [0, 4, 8]] = 1.0
    b = np.zeros((1, 1, 12), np.float32)
    b[0, 0, [0, 4, 8]] = 1.0
    sa = [np.array([[1.0, 2.0**-8, 2.0**-60]]).astype(E8M0)]
    sb = [np.ones((1, 3)).astype(E8M0)]
    ref = scaled_reference(a.astype(E4M3), sa, np.swapaxes(b, 1, 2).astype(E4M3), sb, [1], lhs_quant=q,
                           rhs_quant=q, out_dtype=BF16)
    assert float(ref.values[0, 0]) == 1.0 + 2.0**-7
    naive = np.array([1.0 + 2.0**-8 + 2.0**-60]).astype(np.float32).astype(BF16)
    assert float(naive[0]) == 1.0  # the double rounding this guards against


def test_round_exact_overflow_underflow_and_ties():
    assert round_exact(3, -1, BF16) == 1.5
    assert round_exact(1, 200, BF16) == math.inf and round_exact(-1, 200, BF16) == -math.inf
    assert round_exact(1, -200, BF16) == 0.0  # below half the smallest subnormal
    assert round_exact(1, -133, BF16) == 2.0**-133  # bfloat16's smallest subnormal
    assert round_exact(3, -135, BF16) == 2.0**-133  # 0.75 of it rounds up
    assert round_exact(1, -134, BF16) == 0.0  # half of it: a tie, to even (zero)
    assert round_exact(2**8 + 1, -8, BF16) == 1.0  # 1 + 2**-8 is a tie: to even
    assert round_exact(2**8 + 3, -8, BF16) == 1.0 + 2.0**-6  # 1 + 3 * 2**-8: a tie, to even (up)
    assert math.isnan(round_exact(1, 10, E4M3))  # 1024: float8_e4m3fn has no infinity
    assert round_exact(2**53 + 1, 0, np.float64) == 2.0**53


def test_nan_and_inf_codes_and_the_nan_scale_poison_only_what_they_reach():
    q = Quantization(E4M3, E8M0, (1, 4))
    a = np.ones((3, 8), np.float32)
    a[1, 5] = np.nan
    b = np.ones((2, 1, 8), np.float32)
    sa = [np.ones((2, 2)).astype(E8M0), np.ones((1, 2)).astype(E8M0)]
    sb = [np.ones((1, 2)).astype(E8M0), np.array([[1.0, np.nan]]).astype(E8M0)]
    assert np.isnan(sb[1].astype(np.float64)[0, 1])  # e8m0's 0xFF
    ref = scaled_reference(a.astype(E4M3), sa, np.swapaxes(b, 1, 2).astype(E4M3), sb, [2, 1], lhs_quant=q,
                           rhs_quant=q, out_dtype=np.float32)
    assert ref.values[0, 0] == 8.0  # group 0, row 0: untouched
    assert np.isnan(ref.values[1, 0])  # the NaN code's row
    assert np.isnan(ref.values[2, 0])  # group 1 meets the NaN scale


def test_nvfp4_per_group_global_scales():
    rng = np.random.default_rng(8)
    q = Quantization(E2M1, E4M3, "1x16")
    a, b = _codes(rng, (6, 40), E2M1), _codes(rng, (2, 40, 3), E2M1)
    sa = [_scales(rng, q.scale_shape(r, 40), E4M3) for r in (4, 2)]
    sb = [_scales(rng, q.scale_shape(3, 40), E4M3) for _ in range(2)]
    ga, gb = [0.75, 2.0**-10], [3.0, 1.5]
    ref = scaled_reference(a, sa, b, sb, [4, 2], lhs_quant=q, rhs_quant=q, out_dtype=np.float32, lhs_global=ga,
                           rhs_global=gb)
    plain = scaled_reference(a, sa, b, sb, [4, 2], lhs_quant=q, rhs_quant=q, out_dtype=np.float64)
    for g, rows in ((0, slice(0, 4)), (1, slice(4, 6))):
        want = [[_nearest_in(Fraction(float(v)) * Fraction(ga[g]) * Fraction(gb[g]), np.dtype(np.float32))
                 for v in row] for row in plain.exact[rows]]  # plain.exact is exact here: few terms, float64
        np.testing.assert_array_equal(ref.values[rows].astype(np.float64), want)


def test_group_boundaries_restart_the_blocks():
    # the same codes, one group of 8 rows against two groups of 4: with (4, K) blocks the scales align either
    # way; with (3, K) blocks the second split starts a block at row 4, not row 6
    q = Quantization(np.int8, np.float32, (3, None))
    a = np.arange(16, dtype=np.int8).reshape(8, 2)
    b = np.ones((2, 2, 1), np.int8)
    ones = [np.ones((1, 1), np.float32)] * 2
    sa = [np.array([[1.0], [10.0]], np.float32), np.array([[100.0], [1000.0]], np.float32)]
    ref = scaled_reference(a, sa, b, ones, [4, 4], lhs_quant=q, rhs_quant=Quantization(np.int8, np.float32, "row"),
                           out_dtype=np.float64)
    row_sums = a.astype(np.float64).sum(axis=1)
    want = row_sums * np.array([1, 1, 1, 10, 100, 100, 100, 1000])
    np.testing.assert_array_equal(ref.values[:, 0], want)


# ------------------------------------------------------------------------------ torch's rowwise front-end
def _fp8(rng, shape):
    return (rng.standard_normal(shape) * 8).astype(np.float32).astype(E4M3)


def _rowwise(a, b, sa, sb):
    """sum_k a[i,k] b[k,j] * sa[i] * sb[j], exactly, rounded to bfloat16 (independently)."""
    out = np.zeros((a.shape[0], b.shape[1]))
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            s = sum((Fraction(float(a[i, kk].astype(np.float64))) * Fraction(float(b[kk, j].astype(np.float64)))
                     for kk in range(a.shape[1])), Fraction(0))
            out[i, j] = _nearest_in(s * Fraction(float(sa[i])) * Fraction(float(sb[j])), BF16)
    return out


def test_scaled_grouped_mm_four_forms():
    rng = np.random.default_rng(3)
    g, m, k, n = 3, 4, 12, 5
    sizes = np.array([2, 0, 3])
    offs = np.cumsum(sizes).astype(np.int32)
    # 2d-3d: ragged M
    a, b = _fp8(rng, (5, k)), _fp8(rng, (g, k, n))
    sa, sb = rng.uniform(0.5, 2, 5).astype(np.float32), rng.uniform(0.5, 2, (g, n)).astype(np.float32)
    out = scaled_grouped_mm(a, b, sa, sb, offs=offs)
    ends = np.concatenate([[0], offs])
    for i in range(g):
        lo, hi = ends[i], ends[i + 1]
        np.testing.assert_array_equal(out[lo:hi].astype(np.float64), _rowwise(a[lo:hi], b[i], sa[lo:hi], sb[i]))
    assert out.dtype == BF16
    # 3d-3d: batched
    a, b = _fp8(rng, (g, m, k)), _fp8(rng, (g, k, n))
    sa, sb = rng.uniform(0.5, 2, (g, m)).astype(np.float32), rng.uniform(0.5, 2, (g, n)).astype(np.float32)
    out = scaled_grouped_mm(a, b, sa, sb)
    for i in range(g):
        np.testing.assert_array_equal(out[i].astype(np.float64), _rowwise(a[i], b[i], sa[i], sb[i]))
    # 3d-2d: ragged N
    a, b = _fp8(rng, (g, m, k)), _fp8(rng, (k, 5))
    sa, sb = rng.uniform(0.5, 2, (g, m)).astype(np.float32), rng.uniform(0.5, 2, 5).astype(np.float32)
    out = scaled_grouped_mm(a, b, sa, sb, offs=offs)
    for i in range(g):
        lo, hi = ends[i], ends[i + 1]
        np.testing.assert_array_equal(out[:, lo:hi].astype(np.float64), _rowwise(a[i], b[:, lo:hi], sa[i], sb[lo:hi]))
    # 2d-2d: ragged K, one [M, N] output per group, scales per (group, row)
    kk = 5
    a, b = _fp8(rng, (m, kk)), _fp8(rng, (kk, n))
    sa, sb = rng.uniform(0.5, 2, g * m).astype(np.float32), rng.uniform(0.5, 2, g * n).astype(np.float32)
    out = scaled_grouped_mm(a, b, sa, sb, offs=offs)
    for i in range(g):
        lo, hi = ends[i], ends[i + 1]
        want = _rowwise(a[:, lo:hi], b[lo:hi], sa[i * m:(i + 1) * m], sb[i * n:(i + 1) * n])
        np.testing.assert_array_equal(out[i].astype(np.float64), want)
    assert not np.any(out[1])  # the empty group: zeros


@pytest.mark.parametrize(("call", "exc", "text"), [
    (lambda a, b, s: scaled_grouped_mm(a.astype(np.float32), b, s, s, offs=np.array([4], np.int32)), TypeError,
     "mat_a: expected float8_e4m3fn"),
    (lambda a, b, s: scaled_grouped_mm(a, b, s.astype(np.float64), s, offs=np.array([4], np.int32)), TypeError,
     "scale_a: expected float32"),
    (lambda a, b, s: scaled_grouped_mm(a, b, s, s), ValueError, "offs: required by the 2d-3d form"),
    (lambda a, b, s: scaled_grouped_mm(a, b, s, s, offs=np.array([4], np.int64)), TypeError, "offs: expected a 1-D"),
    (lambda a, b, s: scaled_grouped_mm(a, b, s[:3], s, offs=np.array([4], np.int32)), ValueError,
     "scale_a: expected shape (4,)"),
    (lambda a, b, s: scaled_grouped_mm(a, b, s, s, offs=np.array([4], np.int32), out_dtype=np.float32),
     ValueError, "out_dtype: rowwise scaled grouped mm outputs bfloat16"),
    (lambda a, b, s: Quantization(np.float32), TypeError, "elem: expected one of"),
    (lambda a, b, s: Quantization(E4M3, np.float64), TypeError, "scale: expected one of"),
    (lambda a, b, s: Quantization(E4M3, block="1x7"), ValueError, "block: expected one of"),
    (lambda a, b, s: Quantization(E4M3, block=(0, 32)), ValueError, "block: expected one of"),
    (lambda a, b, s: to_mx(np.ones(4), scale_mode="round"), ValueError, "scale_mode: expected one of"),
    (lambda a, b, s: to_mx(np.ones(4), block_size=0), ValueError, "block_size: expected a positive int"),
    (lambda a, b, s: to_mx(np.ones(4, np.int32)), TypeError, "x: expected a float array"),
    (lambda a, b, s: scaled_reference(a, [s], b, [s], [4], lhs_quant=Quantization(E4M3), rhs_quant=None),
     TypeError, "rhs_quant: expected a gmm_ref.scaled.model.Quantization"),
    (lambda a, b, s: scaled_reference(a, [s[:, None]], b, [np.ones((2, 1), np.float32)], [4],
                                      lhs_quant=Quantization(E4M3), rhs_quant=Quantization(E4M3)),
     ValueError, "rhs scales: expected shape (3, 1)"),
    (lambda a, b, s: scaled_reference(a, [s], b, [s], [5], lhs_quant=Quantization(E4M3),
                                      rhs_quant=Quantization(E4M3)), ValueError, "group_sizes: expected non-negative"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_input_is_named(call, exc, text):
    a, b = np.ones((4, 6), np.float32).astype(E4M3), np.ones((1, 6, 3), np.float32).astype(E4M3)
    with pytest.raises(exc, match=__import__("re").escape(text)):
        call(a, b, np.ones(4, np.float32))


# ------------------------------------------------------------------------------ the MX quantizer
def _floor_log2(x: Fraction) -> int:
    e = 0
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    return e


@pytest.mark.parametrize("elem", [E4M3, E5M2, E2M1])
@pytest.mark.parametrize("mode", scaled.SCALE_MODES)
def test_to_mx_scales_and_codes(elem, mode):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((3, 70)) * np.exp2(rng.integers(-30, 30, size=(3, 1)))).astype(np.float32)
    x[1, 32:64] = 0.0  # an all-zero block
    codes, scales = to_mx(x, 32, elem, mode)
    assert codes.dtype == elem and scales.dtype == E8M0 and scales.shape == (3, 3)
    top = Fraction(float(ml_dtypes.finfo(elem).max))
    emax = _floor_log2(top)
    mbits = int(ml_dtypes.finfo(elem).nmant)
    for r in range(3):
        for bi in range(3):
            block = x[r, bi * 32:(bi + 1) * 32].astype(np.float64)
            amax = Fraction(float(np.max(np.abs(block))))
            e = math.log2(float(scales[r, bi].astype(np.float64)))
            assert e == int(e)
            e = int(e)
            if amax == 0:
                assert e == -127
                continue
            if mode == "rceil":  # the smallest power of two with amax / scale <= max
                assert amax / Fraction(2) ** e <= top < amax / Fraction(2) ** (e - 1) or e == -127
            elif mode == "ceil":  # 2**e >= amax / 2**emax > 2**(e - 1)
                assert (Fraction(2) ** (e + emax) >= amax > Fraction(2) ** (e + emax - 1)) or e in (-127, 127)
            else:
                a = amax
                if mode != "floor":
                    quantum = Fraction(2) ** (_floor_log2(a) - mbits)
                    q = a / quantum
                    fl = math.floor(q)
                    half = Fraction(1, 2)
                    up = q - fl > half or (q - fl == half and fl % 2)
                    a = (fl + up) * quantum
                assert e == max(-127, min(127, _floor_log2(a) - emax))
            # every code is x / scale rounded once to nearest, saturated at the largest finite value
            for v, c in zip(block, codes[r, bi * 32:(bi + 1) * 32].astype(np.float64), strict=True):
                target = Fraction(v) / Fraction(2) ** e
                want = _nearest_in(max(-top, min(top, target)), elem)
                assert c == want, (v, c, want, mode)


def test_to_mx_hand_cases():
    one = np.zeros((1, 32), np.float32)
    for amax, mode, scale in [(448.0, "floor", 1.0), (449.0, "floor", 1.0), (449.0, "rceil", 2.0),
                              (256.0, "ceil", 1.0), (257.0, "ceil", 2.0), (448.0, "ceil", 2.0), (490.0, "even", 1.0),
                              (500.0, "even", 2.0), (1.0, "floor", 2.0**-8), (1.0, "rceil", 2.0**-8),
                              (np.inf, "rceil", 2.0**127), (np.inf, "floor", 2.0**120), (np.inf, "even", 2.0**120),
                              (np.inf, "ceil", 2.0**120)]:
        one[0, 0] = amax
        codes, scales = to_mx(one, 32, E4M3, mode)
        assert float(scales[0, 0].astype(np.float64)) == scale, (amax, mode)
        assert float(codes[0, 0].astype(np.float64)) == min(448.0, float(np.float32(amax / scale).astype(E4M3))), \
            (amax, mode)
    one[0, 0] = np.nan
    assert np.isnan(to_mx(one)[1].astype(np.float64)[0, 0])


@pytest.mark.parametrize("mode", ["floor", "rceil", "even"])
def test_to_mx_agrees_with_torchao_bit_for_bit(mode):
    """torchao's to_mx (the quantizer of its MXFP8 grouped mm) and gmm_ref's, on normal, wide and non-finite
    blocks: the same codes and scales. (torchao's ``ceil`` is the same rule; its bits differ only where float32
    amax arithmetic rounds, so it is left out.)"""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor", reason="torchao is not installed")
    config = pytest.importorskip("torchao.prototype.mx_formats.config", reason="torchao is not installed")
    from gmm_kernels.sandbox.convert import to_torch

    rng = np.random.default_rng(4)
    x = np.ldexp(rng.uniform(1, 2, (64, 128)), rng.integers(-140, 120, (64, 128))) * rng.choice([-1, 1], (64, 128))
    x[:32] = rng.standard_normal((32, 128))
    x[3, 5], x[7, 40], x[9, 64] = np.inf, -np.inf, np.nan
    x[11, :32] = 0.0
    xb = x.astype(BF16)
    s, q = mx.to_mx(to_torch(xb), elem_dtype=torch.float8_e4m3fn, block_size=32,
                    scaling_mode=getattr(config.ScaleCalculationMode, mode.upper()))
    codes, scales = to_mx(xb, 32, E4M3, mode)
    theirs_s, theirs_q = gmm_ref.as_numpy(s), gmm_ref.as_numpy(q)
    np.testing.assert_array_equal(theirs_s.view(np.uint8), scales.view(np.uint8))
    finite = np.repeat(~np.isnan(scales.astype(np.float64)), 32, axis=1)  # a NaN scale's block decodes to NaN
    np.testing.assert_array_equal(theirs_q.view(np.uint8)[finite], codes.view(np.uint8)[finite])


# ------------------------------------------------------------------------------ a real kernel: torch._scaled_mm
def _torch_rowwise_2d3d(mat_a, mat_b, scale_a, scale_b, offs, *, wrong_group=False):
    """torch._scaled_grouped_mm's 2d-3d rowwise form as a loop over torch._scaled_mm (which runs on CPU)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the torch adapters need it)")
    a = torch.from_numpy(mat_a.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    b = torch.from_numpy(mat_b.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    sa, sb = torch.from_numpy(scale_a), torch.from_numpy(scale_b)
    out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.bfloat16)
    lo = 0
    for g, hi in enumerate(offs.tolist()):
        if hi > lo:
            gb = max(g - 1, 0) if wrong_group else g  # the bug: the previous group's column scales
            bt = b[g].t().contiguous().t()  # column-major, as _scaled_mm wants its second operand
            out[lo:hi] = torch._scaled_mm(a[lo:hi], bt, scale_a=sa[lo:hi, None], scale_b=sb[gb][None, :],
                                          out_dtype=torch.bfloat16)
        lo = hi
    return out.float().numpy()


def test_a_per_group_loop_over_torch_scaled_mm_meets_the_reference_and_a_misrouted_scale_does_not():
    rng = np.random.default_rng(5)
    g, k, n = 4, 96, 24
    sizes = np.array([5, 0, 9, 3])
    offs = np.cumsum(sizes).astype(np.int32)
    a, b = _fp8(rng, (int(sizes.sum()) + 2, k)), _fp8(rng, (g, k, n))  # two tail rows past the groups
    sa = rng.uniform(0.25, 4, a.shape[0]).astype(np.float32)
    sb = rng.uniform(0.25, 4, (g, n)).astype(np.float32)
    want = scaled_grouped_mm(a, b, sa, sb, offs=offs).astype(np.float64)
    rows = slice(0, int(offs[-1]))
    q = Quantization(E4M3, np.float32, "row")
    ends = np.concatenate([[0], offs])
    ref = scaled_reference(a, [sa[ends[i]:ends[i + 1], None] for i in range(g)], b, [sb[i][:, None] for i in range(g)],
                           sizes, lhs_quant=q, rhs_quant=q)
    # torch on CPU: codes to float32, a float32 dot product, the two scales, one rounding to bfloat16
    u32, u16 = unit_roundoff(np.float32), unit_roundoff(BF16)  # 2**-24, 2**-8
    err = ((k + 2) * u32 / (1 - (k + 2) * u32)) * ref.magnitude
    bound = u16 * (np.abs(ref.exact) + err) + err + 2.0**-133
    got = _torch_rowwise_2d3d(a, b, sa, sb, offs)
    np.testing.assert_array_equal(want[rows], ref.values[rows].astype(np.float64))
    assert np.all(np.abs(got[rows] - ref.exact[rows]) <= bound[rows])
    assert np.mean(got[rows] == want[rows]) > 0.9  # mostly the correctly rounded value itself
    broken = _torch_rowwise_2d3d(a, b, sa, sb, offs, wrong_group=True)
    wrong = np.abs(broken[rows] - ref.exact[rows]) > bound[rows]
    assert wrong[ends[2]:ends[3]].any() and not wrong[: ends[1]].any()  # group 2 (after an empty one), not group 0
