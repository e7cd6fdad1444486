"""The bound is sound (float32 accumulation in any order passes) and tight (bfloat16
partial sums and undeclared bfloat16 multiplies are caught); rounding is single."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gmm_ref
from gmm_ref import Numerics, Problem, round_to

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)


# ------------------------------------------------------------ simulated kernels
def _rounder(dtype):
    return lambda x: np.asarray(x, np.float32).astype(dtype).astype(np.float32)


def kernel(p: Problem, *, order: str, rng, acc=np.float32, multiply=None, fma=False) -> np.ndarray:
    """A grouped GEMM summing products in the accumulator dtype in a chosen order."""
    out = np.zeros(p.out_shape, np.float64)
    rnd_acc = (lambda x: np.asarray(x, np.float32)) if acc == np.float32 else _rounder(acc)
    for blk in gmm_ref.layouts.blocks(p):
        a, b = blk.a.astype(np.float64), blk.b.astype(np.float64)
        if multiply is not None:
            a, b = (round_to(x, multiply).astype(np.float64) for x in (a, b))
        prods = a[:, :, None] * b[None, :, :]  # [m, k, n], exact in float64
        prods = prods if fma else prods.astype(np.float32).astype(np.float64)
        k = blk.k
        if order == "pairwise":
            s = np.add.reduce(prods.astype(np.float32), axis=1)
        elif order.startswith("blocked"):
            bs = int(order[7:])
            parts = [rnd_acc(prods[:, i:i + bs].astype(np.float32).sum(1, dtype=np.float32))
                     for i in range(0, k, bs)]
            s = np.zeros(parts[0].shape, np.float32) if parts else np.zeros((a.shape[0], b.shape[1]), np.float32)
            for q in parts:
                s = rnd_acc(s + q)
        else:  # a random permutation, one element at a time
            s = np.zeros((a.shape[0], b.shape[1]), np.float32)
            for kk in rng.permutation(k):
                s = rnd_acc(s.astype(np.float64) + prods[:, kk] if fma else s + prods[:, kk].astype(np.float32))
        out[blk.out_index] = s
    return round_to(out, p.out_dtype)


def random_problem(rng, family, k, out_dtype=np.float32, in_dtype=np.float32, wide=False):
    g = 3
    scale = (lambda s: rng.standard_normal(s) * np.exp2(rng.integers(-20, 20, s))) if wide else rng.standard_normal
    sizes = rng.multinomial(k if family == "ragged_k" else 9, np.ones(g) / g)
    if family == "ragged_m":
        lhs, rhs = scale((10, k)), scale((g, k, 4))
    else:
        lhs, rhs = scale((4, k + 1)), scale((k + 1, 5))
    return Problem(family, lhs.astype(in_dtype), rhs.astype(in_dtype), sizes, out_dtype=out_dtype)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["ragged_m", "ragged_k"]),
       st.sampled_from([1, 7, 64, 300]), st.sampled_from(["random", "pairwise", "blocked8", "blocked32"]),
       st.booleans(), st.booleans(), st.sampled_from([np.float32, BF16]))
def test_float32_accumulation_in_any_order_passes(seed, family, k, order, fma, wide, out_dtype):
    rng = np.random.default_rng(seed)
    p = random_problem(rng, family, k, out_dtype=out_dtype, wide=wide)
    out = kernel(p, order=order, rng=rng, fma=fma)
    res = gmm_ref.check(out, p)
    assert res.ok, res.message


def assert_bf16_partial_sums_rejected(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = random_problem(rng, "ragged_m", 256)
    out = kernel(p, order="random", rng=rng, acc=BF16)
    res = gmm_ref.check(out, p)
    assert not res.ok and res.kind == "values", "bfloat16 partial sums passed the float32 bound"


@pytest.mark.parametrize("seed", range(3))
def test_bfloat16_partial_sums_are_rejected(seed):
    assert_bf16_partial_sums_rejected(seed)


@pytest.mark.parametrize("seed", range(3))
def test_bfloat16_multiply_passes_only_when_declared(seed):
    rng = np.random.default_rng(seed)
    p = random_problem(rng, "ragged_m", 128)
    out = kernel(p, order="random", rng=rng, multiply=BF16, fma=True)
    assert gmm_ref.check(out, p, numerics=Numerics(multiply=BF16)).ok
    assert not gmm_ref.check(out, p).ok


def test_bound_is_within_a_small_factor_of_the_worst_case():
    """Tight: for K equal products of one ulp-sensitive value the bound is ~K*u*|A||B|."""
    k = 1000
    p = Problem("ragged_m", np.full((1, k), 1 + 2**-12, np.float32), np.ones((1, k, 1), np.float32),
                np.array([1]))
    bnd = gmm_ref.reference(p).bound()[0, 0]
    assert bnd < 1.1 * k * 2**-24 * k * (1 + 2**-12) + 2**-24 * k * 1.01


# ------------------------------------------------------------------ exact mode
def test_exact_mode_bound_is_zero_and_breaks_past_the_significand():
    ones = Problem("ragged_m", np.ones((1, 4), np.float32), np.full((1, 4, 1), 3, np.float32), np.array([1]))
    assert gmm_ref.reference(ones).bound()[0, 0] == 0
    big = ones.replace(lhs=np.full((1, 4), 2.0**22, np.float32))  # sum 3 * 2**24 > 2**24
    assert gmm_ref.reference(big).bound()[0, 0] > 0
    frac = ones.replace(lhs=np.full((1, 4), 0.5, np.float32))
    assert gmm_ref.reference(frac).bound()[0, 0] > 0


# ------------------------------------------------------------------ single rounding
def _all_finite(dtype) -> tuple[np.ndarray, np.ndarray]:
    """Every finite value of the format, sorted, and whether its significand is even."""
    bits = np.arange(2 ** (8 * dtype.itemsize), dtype=np.uint16 if dtype.itemsize == 2 else np.uint8)
    with np.errstate(invalid="ignore"):  # the NaN bit patterns
        v = bits.view(dtype).astype(np.float64)
    keep = np.isfinite(v) & ~((v == 0) & np.signbit(v))
    v, bits = v[keep], bits[keep]
    order = np.argsort(v)
    return v[order], (bits[order] & 1) == 0


def _nearest_even(x: np.ndarray, dtype) -> np.ndarray:
    """Brute force: the nearest representable value, ties to the even significand."""
    grid, even = _all_finite(dtype)
    i = np.clip(np.searchsorted(grid, x), 1, len(grid) - 1)
    lo, hi = grid[i - 1], grid[i]
    dlo, dhi = x - lo, hi - x
    pick_lo = (dlo < dhi) | ((dlo == dhi) & even[i - 1])
    return np.where(pick_lo, lo, hi)


@pytest.mark.parametrize("dtype", [BF16, E4M3, E5M2, np.dtype(np.float16)])
def test_round_to_is_one_nearest_even_rounding(dtype):
    rng = np.random.default_rng(0)
    fin = ml_dtypes.finfo(dtype)
    mx = float(fin.max)
    x = np.concatenate([
        rng.uniform(-mx, mx, 20000),
        rng.standard_normal(20000) * np.exp2(rng.integers(int(fin.minexp) - int(fin.nmant) - 2, 4, 20000)),
    ])
    grid, _ = _all_finite(dtype)
    mids = (grid[1:] + grid[:-1]) / 2
    x = np.concatenate([x, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), grid])
    got = round_to(x, dtype).astype(np.float64)
    np.testing.assert_array_equal(got, _nearest_even(x, dtype))


def test_single_rounding_examples():
    x = np.array([1 + 2**-8 + 2**-30])
    assert round_to(x, BF16).astype(np.float64)[0] == 1.0078125
    assert x.astype(BF16).astype(np.float64)[0] == 1.0  # ml_dtypes rounds twice
    assert round_to(np.array([1 + 2**-11 + 2**-40]), np.float16)[0] == np.float16(1 + 2**-10)
    # float8 e4m3fn: 1 + 2**-4 is a tie (to 1.0), a hair above goes up
    assert round_to(np.array([1 + 2**-4 + 2**-40]), E4M3).astype(float)[0] == 1.125
    assert round_to(np.array([1 + 2**-4]), E4M3).astype(float)[0] == 1.0


def test_overflow_and_specials():
    # e4m3fn has no infinity: past max + half an ulp is NaN; the tie at 464 rounds to 448
    got = round_to(np.array([448.0, 464.0, 464.0001, 1e6, -1e6, np.inf, np.nan]), E4M3).astype(float)
    assert got[:2].tolist() == [448.0, 448.0] and np.isnan(got[2:]).all()
    got = round_to(np.array([57344.0, 61440.0, 61439.0, -1e9, np.inf]), E5M2).astype(float)
    assert got.tolist() == [57344.0, np.inf, 57344.0, -np.inf, np.inf]
    bmax = float(ml_dtypes.finfo(BF16).max)
    assert np.isinf(round_to(np.array([bmax + 2.0**119]), BF16).astype(float)[0])
    assert round_to(np.array([-0.0]), BF16).astype(float)[0] == 0 and np.signbit(round_to(np.array([-0.0]), BF16))


def test_subnormals():
    tiny = float(ml_dtypes.finfo(BF16).smallest_subnormal)
    got = round_to(np.array([tiny, tiny / 2, tiny * 0.5000001, tiny * 1.5, 3 * tiny / 2 * (1 + 1e-9)]),
                   BF16).astype(float)
    assert got.tolist() == [tiny, 0.0, tiny, 2 * tiny, 2 * tiny]
    t8 = 2.0**-9  # e4m3fn smallest subnormal
    assert round_to(np.array([t8 * 0.75, t8 * 2.5]), E4M3).astype(float).tolist() == [t8, 2 * t8]


# ------------------------------------------------------------ flush to zero
def _flush_problem():
    # a bfloat16 subnormal times 2**10 is 2**-120, a normal float32 result
    lhs = np.array([[2.0 ** -130]], ml_dtypes.bfloat16)
    rhs = np.array([[[2.0 ** 10]]], ml_dtypes.bfloat16)
    return gmm_ref.Problem("ragged_m", lhs, rhs, np.array([1]), out_dtype=np.float32)


def test_flushed_subnormal_input_passes_only_when_flushing_is_allowed():
    p = _flush_problem()
    flushed = np.zeros((1, 1), np.float32)  # XLA on CPU gives this
    assert not gmm_ref.check(flushed, p, numerics=gmm_ref.Numerics(flush_subnormals=False)).ok
    assert gmm_ref.check(flushed, p, numerics=gmm_ref.Numerics(flush_subnormals=True)).ok
    assert gmm_ref.check(flushed, p).ok  # the one default allows it, as XLA, GPUs and TPUs do (docs/numerics.md)


def test_flush_declaration_still_catches_a_wrong_value():
    p = _flush_problem()
    wrong = np.full((1, 1), 2.0 ** -100, np.float32)
    assert not gmm_ref.check(wrong, p, numerics=gmm_ref.Numerics(flush_subnormals=True)).ok


@pytest.mark.parametrize("family", ["ragged_m", "ragged_n", "ragged_k"])
def test_the_bound_in_row_chunks_equals_the_bound_at_once(family, monkeypatch):
    # huge problems compute the bound chunk by chunk; the chunks must change nothing, exact mode included
    from gmm_ref import numerics as gn

    rng = np.random.default_rng(7)
    m, k, n = 37, 24, 9
    sizes = {"ragged_m": [10, 0, 27], "ragged_n": [4, 5, 0], "ragged_k": [7, 0, 17]}[family]
    shapes = {"ragged_m": ((m, k), (3, k, n)), "ragged_n": ((3, m, k), (k, 9)),
              "ragged_k": ((m, 24), (24, n))}[family]
    for values in (lambda s: rng.standard_normal(s), lambda s: rng.integers(-3, 4, s)):
        lhs, rhs = (values(s).astype(np.float32) for s in shapes)
        p = gmm_ref.Problem(family, lhs, rhs, np.array(sizes), out_dtype=np.float32,
                            existing_out=np.ones(gmm_ref.Problem(family, lhs, rhs, np.array(sizes)).out_shape,
                                                 np.float32), existing_policy="accumulate")
        numerics = gmm_ref.Numerics(accumulate="float32", flush_subnormals=True)
        whole = gmm_ref.reference(p).bound(numerics)
        monkeypatch.setattr(gn, "BOUND_CHUNK_ELEMENTS", 50)  # two rows of K=24 at a time
        chunked = gmm_ref.reference(p).bound(numerics)
        monkeypatch.undo()
        # the same bound (float64 BLAS may sum in another order: an ulp), zero at the same places
        np.testing.assert_allclose(chunked, whole, rtol=1e-12, atol=0)
        np.testing.assert_array_equal(chunked == 0, whole == 0)
