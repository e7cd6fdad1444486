"""Scaled problems: ``gmm_ref.Problem`` with quantized operands (its reference against the independent exact
computation of test_scaled_reference.py, its bound, reproducers and bad input), and kernels that quantize
inside (``gmm_ref.quantize_problem``, ``MXQuantizer``, declared formats)."""

from __future__ import annotations

import numpy as np
import pytest

import gmm_ref
from gmm_ref.scaled.model import Quantization, to_mx
from tests.gmm_ref.test_scaled_reference import (
    BF16,
    CASES,
    E4M3,
    E5M2,
    _independent,
    _nearest_in,
    _random_case,
)


# ------------------------------------------------------------ scaled problems: gmm_ref.Problem and its reference
def _problem(case, seed, transposed=False):
    family, ea, eb, sdt, ba, bb, out = case
    lhs, rhs, sizes, qa, qb, sa, sb, a_blocks, b_blocks = _random_case(seed, family, ea, eb, sdt, ba, bb)
    if transposed:  # stored transposed: the scales stay in each operand's logical [rows, K] orientation
        lhs, rhs = np.ascontiguousarray(np.swapaxes(lhs, -1, -2)), np.ascontiguousarray(np.swapaxes(rhs, -1, -2))
    p = gmm_ref.Problem(family, lhs, rhs, sizes, out_dtype=out, lhs_transposed=transposed,
                        rhs_transposed=transposed, lhs_quant=qa, lhs_scales=sa, rhs_quant=qb, rhs_scales=sb)
    return p, qa, qb, sa, sb, a_blocks, b_blocks, sizes


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-{np.dtype(c[3])}-{c[4]}-{c[5]}" for c in CASES])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_scaled_problem_s_reference_is_the_independent_exact_sum(case, transposed):
    p, qa, qb, sa, sb, a_blocks, b_blocks, sizes = _problem(case, 1, transposed)
    ref = gmm_ref.reference(p)
    want = _independent(list(zip(a_blocks, sa, strict=True)), list(zip(b_blocks, sb, strict=True)), qa, qb,
                        case[-1])
    ends = None if sizes is None else np.concatenate([[0], np.cumsum(sizes)])
    for gi, (exact, rounded) in enumerate(want):
        where = ((slice(ends[gi], ends[gi + 1]), slice(None)) if p.family == "ragged_m" else
                 (slice(None), slice(ends[gi], ends[gi + 1])) if p.family == "ragged_n" else (gi,))
        np.testing.assert_array_equal(ref.values[where].astype(np.float64), rounded, err_msg=f"group {gi}")
        # the float64 exact may round each product and sum; its bound (U_REF terms) covers that
        np.testing.assert_allclose(ref.exact[where], exact, rtol=2.0**-45, atol=1e-300)
        np.testing.assert_array_equal(p.scales_of("lhs", gi), sa[gi])
        np.testing.assert_array_equal(p.scales_of("rhs", gi), sb[gi])
    assert np.all(ref.bound() >= 0) and ref.values.dtype == np.dtype(case[-1])


def test_the_bound_of_a_scaled_problem_catches_a_bfloat16_dequantization():
    # normal data, a float32 kernel's bound; dequantizing into bfloat16 first moves most elements past it
    rng = np.random.default_rng(9)
    q = Quantization(E4M3, np.float32, "row")
    a = (rng.standard_normal((16, 64)) * 100).astype(E4M3)
    b = (rng.standard_normal((2, 64, 8)) * 100).astype(E4M3)
    sizes = np.array([9, 7])
    sa = [rng.uniform(0.5, 2, (s, 1)).astype(np.float32) * 2.0**-6 for s in sizes]
    sb = [rng.uniform(0.5, 2, (8, 1)).astype(np.float32) * 2.0**-6 for _ in sizes]
    p = gmm_ref.Problem("ragged_m", a, b, sizes, out_dtype=np.float32, lhs_quant=q, lhs_scales=sa, rhs_quant=q,
                        rhs_scales=sb)
    ref = gmm_ref.reference(p)
    deq_a = a.astype(np.float64) * np.concatenate(sa)
    wrong = np.concatenate([gmm_ref.round_to(deq_a[:9], BF16).astype(np.float64)
                            @ gmm_ref.round_to(b[0].astype(np.float64) * sb[0].T, BF16).astype(np.float64),
                            gmm_ref.round_to(deq_a[9:], BF16).astype(np.float64)
                            @ gmm_ref.round_to(b[1].astype(np.float64) * sb[1].T, BF16).astype(np.float64)])
    assert not gmm_ref.check(wrong.astype(np.float32), ref).ok
    assert gmm_ref.check(wrong.astype(np.float32), ref, numerics=gmm_ref.Numerics(multiply=BF16)).ok
    assert gmm_ref.check(ref.values, ref).ok


def test_a_scaled_problem_round_trips_through_its_reproducer_and_npz(tmp_path):
    p = _problem(CASES[2], 0)[0]  # MX-style e8m0 scales
    small = _problem(CASES[7], 1)[0]  # int4 codes, bfloat16 scales
    for q in (p, small):
        loaded = gmm_ref.load_problem(gmm_ref.save_problem(q, tmp_path / "p.npz"))
        assert (loaded.lhs_quant, loaded.rhs_quant) == (q.lhs_quant, q.rhs_quant)
        np.testing.assert_array_equal(gmm_ref.reference(loaded).values.view(np.uint8),
                                      gmm_ref.reference(q).values.view(np.uint8))
    from gmm_ref.repro import problem_source

    imports, lines = problem_source(small, directory=tmp_path)
    ns: dict = {}
    exec("\n".join([*imports, *lines]), ns)
    assert ns["problem"].describe() == small.describe()
    np.testing.assert_array_equal(ns["problem"].rhs_scales.view(np.uint16), small.rhs_scales.view(np.uint16))


@pytest.mark.parametrize(("change", "exc", "text"), [
    (dict(lhs_scales=None), ValueError, "lhs_scales: required with lhs_quant"),
    (dict(lhs_quant=None), ValueError, "lhs_scales: given without lhs_quant"),
    (dict(lhs_quant="row"), TypeError, "lhs_quant: expected a gmm_ref.Quantization"),
    (dict(lhs_quant=Quantization(E5M2, np.float32, "row")), TypeError, "lhs: expected codes of dtype float8_e5m2"),
    (dict(lhs_scales=np.ones(3, np.float32)), ValueError, "lhs_scales: expected a 1-D array of 16 scales"),
    (dict(lhs_scales=np.ones(16, np.float64)), TypeError, "lhs_scales: expected dtype float32"),
    (dict(lhs_scales=[np.ones((9, 1), np.float32)]), ValueError, "lhs_scales: expected one array per local group"),
    (dict(lhs_scales=[np.ones((9, 2), np.float32), np.ones((7, 1), np.float32)]), ValueError,
     r"lhs_scales\[0\]: expected shape \(9, 1\)"),
    (dict(lhs_scales=7), TypeError, "lhs_scales: expected a 1-D array, or one array per local group"),
    (dict(out_dtype=None), TypeError, "out_dtype: required for a scaled problem"),
    (dict(out_dtype=np.int32), TypeError, "out_dtype: a scaled problem gives a float output"),
])
def test_bad_scaled_problems_are_named(change, exc, text):
    q = Quantization(E4M3, np.float32, "row")
    fields = dict(out_dtype=BF16, lhs_quant=q, lhs_scales=np.ones(16, np.float32), rhs_quant=q,
                  rhs_scales=np.ones(16, np.float32))
    fields.update(change)
    with pytest.raises(exc, match=text):
        gmm_ref.Problem("ragged_m", np.ones((16, 32), E4M3), np.ones((2, 32, 8), E4M3), np.array([9, 7]), **fields)


def test_a_scaled_problem_has_no_gradient_and_no_batch_dims():
    p = _problem(CASES[0], 0)[0]
    with pytest.raises(NotImplementedError, match="scaled"):
        gmm_ref.gradients(p, np.zeros(p.out_shape, p.out_dtype))
    q = Quantization(E4M3, np.float32, "row")
    with pytest.raises(ValueError, match="lhs_quant: scaled problems take no batch dims"):
        gmm_ref.Problem("ragged_m", np.ones((2, 4, 16), E4M3), np.ones((1, 2, 16, 8), E4M3), np.array([4]),
                        batch_ndim=1, out_dtype=BF16, lhs_quant=q, lhs_scales=np.ones(8, np.float32))


# ------------------------------------------------------------------ kernels that quantize inside (MXFP8)
def _mx_check(fn, modes=None):
    pytest.importorskip("torch", reason="the MXFP8 test kernels take torch tensors")
    from property_tests.checks.check import check_kernel

    return check_kernel(fn, convention="torch.grouped_mm", modes=modes, raise_on_failure=False)


def test_a_correct_mxfp8_kernel_passes_once_it_declares_its_format():
    from gmm_kernels import Status, declare
    from tests.corpus import broken_scaled as bs

    # (torchao's MXFP8 kernel, declared the same way, runs every mode in the main job)
    report = _mx_check(bs.mxfp8_correct, modes=["exact", "wide", "poisoned", "all_empty"])
    assert all(r.status is Status.PASSED for r in report), report
    # undeclared, the same kernel is held to the unquantized reference: the wide mode's blocks flush
    # elements far below their maximum, which no per-element bound of bfloat16 arithmetic allows
    plain = declare("torch.grouped_mm", families=("ragged_m",), dtypes=("bfloat16",), out_dtypes=("bfloat16",),
                    multiples={"k": 32}, zero_extents=("m",))(bs.mxfp8_correct_undeclared)
    wide = _mx_check(plain, modes=["wide"])
    assert wide.results[0].status is Status.FAILED


@pytest.mark.parametrize("name", ["mxfp8_floor_scales", "mxfp8_weight_blocks_along_n"])
def test_a_wrong_mxfp8_kernel_is_caught_against_its_declared_format(name):
    from tests.corpus import broken_scaled as bs

    pytest.importorskip("torch", reason="the MXFP8 test kernels take torch tensors")
    from property_tests.checks.check import check_kernel

    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(getattr(bs, name), convention="torch.grouped_mm", modes=["exact", "normal", "wide"])
    assert "Wrong groups:" in str(info.value) and "float8_e8m0fnu@1x32" in str(info.value)


def test_quantize_problem_restarts_blocks_at_groups_and_refuses_what_it_cannot_quantize():
    rng = np.random.default_rng(2)
    mx = gmm_ref.MXQuantizer(E4M3, 8, "floor")
    # ragged K: the K blocks of each group start at its own first column
    p = gmm_ref.Problem("ragged_k", rng.standard_normal((4, 20)).astype(np.float32),
                        rng.standard_normal((20, 3)).astype(np.float32), np.array([5, 0, 11]))
    q = gmm_ref.quantize_problem(p, mx, mx)
    for g, (lo, hi) in enumerate([(0, 5), (5, 5), (5, 16)]):
        codes, scales = to_mx(p.lhs[:, lo:hi].astype(np.float64), 8, E4M3, "floor")
        np.testing.assert_array_equal(q.lhs[:, lo:hi].view(np.uint8), codes.view(np.uint8))
        np.testing.assert_array_equal(q.scales_of("lhs", g).view(np.uint8), scales.view(np.uint8))
        codes, scales = to_mx(p.rhs[lo:hi].T.astype(np.float64), 8, E4M3, "floor")
        np.testing.assert_array_equal(q.rhs[lo:hi].T.view(np.uint8), codes.view(np.uint8))
        np.testing.assert_array_equal(q.scales_of("rhs", g).view(np.uint8), scales.view(np.uint8))
    with pytest.raises(TypeError, match=r"lhs: expected a gmm_ref\.MXQuantizer"):
        gmm_ref.quantize_problem(p, "mx")
    with pytest.raises(ValueError, match="untransposed"):
        gmm_ref.quantize_problem(p.replace(lhs=np.ascontiguousarray(p.lhs.T), lhs_transposed=True), mx)
    with pytest.raises(ValueError, match="already scaled"):
        gmm_ref.quantize_problem(q, mx)
    with pytest.raises(ValueError, match="scale_mode"):
        gmm_ref.MXQuantizer(E4M3, 32, "round")


def test_parse_quantizes_names_the_option():
    from property_tests.cli.options import parse_quantizes

    mx = gmm_ref.MXQuantizer("float8_e4m3fn", 32, "rceil")
    assert parse_quantizes("mx") == (mx, mx)
    assert parse_quantizes("rhs=mx:float8_e5m2:16:floor") == (None, gmm_ref.MXQuantizer("float8_e5m2", 16, "floor"))
    for bad, text in [("fp8", "expected mx"), ("mx:float8_e4m3fn:32:round", "scale_mode"), ("mx:int8", "elem"),
                      ("lhs=mx,lhs=mx", "lhs=SPEC and/or rhs=SPEC"), (",", "expected a quantizer")]:
        with pytest.raises(ValueError, match=text):
            parse_quantizes(bad, option="--quantizes")


def test_the_main_job_s_quantizes_option_declares_the_format(tmp_path):
    """From the command line, --quantizes declares the format: the MXFP8 kernel that fails the wide mode undeclared
    (test_a_correct_mxfp8_kernel_passes_once_it_declares_its_format) passes it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch", reason="the MXFP8 test kernel takes torch tensors")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    base = [sys.executable, "-m", "property_tests.cli.main", "check", "--kernel",
            "tests.corpus.broken_scaled:mxfp8_correct_undeclared", "--convention", "torch.grouped_mm",
            "--families", "ragged_m", "--dtypes", "bfloat16", "--out-dtypes", "bfloat16", "--multiple", "k=32",
            "--zero-extents", "m", "--modes", "wide", "--no-goldens", "--max-examples", "6"]
    declared = subprocess.run([*base, "--quantizes", "mx:float8_e4m3fn:32:rceil"], capture_output=True, text=True,
                              timeout=600, cwd=tmp_path, env=env)
    assert declared.returncode == 0, declared.stdout[-2000:] + declared.stderr[-2000:]
    assert "quantizes float8_e4m3fn/32/rceil x float8_e4m3fn/32/rceil" in declared.stdout


# ------------------------------------------------------- NVFP4's second level: per-group float32 global scales
def test_global_scales_multiply_each_group_exactly():
    """Code x e4m3 block scale x the group's float32 global scale, summed as Fractions, then rounded once."""
    from fractions import Fraction

    import ml_dtypes

    rng = np.random.default_rng(7)
    q = Quantization("float4_e2m1fn", "float8_e4m3fn", "1x16", global_scale=True)
    t, k, n, sizes = 12, 32, 3, np.array([5, 0, 7])
    e2m1 = np.dtype(ml_dtypes.float4_e2m1fn)
    a = rng.integers(0, 16, (t, k), dtype=np.uint8).view(e2m1)
    b = rng.integers(0, 16, (3, k, n), dtype=np.uint8).view(e2m1)
    sa = [rng.uniform(0.05, 8, q.scale_shape(int(m), k)).astype(ml_dtypes.float8_e4m3fn) for m in sizes]
    sb = [rng.uniform(0.05, 8, q.scale_shape(n, k)).astype(ml_dtypes.float8_e4m3fn) for _ in sizes]
    ga = rng.uniform(1e-4, 1, 3).astype(np.float32)
    gb = rng.uniform(1e-4, 1, 3).astype(np.float32)
    p = gmm_ref.Problem("ragged_m", a, b, sizes, out_dtype=np.float32, lhs_quant=q, lhs_scales=sa, rhs_quant=q,
                        rhs_scales=sb, lhs_global=ga, rhs_global=gb)
    ref = gmm_ref.reference(p)
    ends = np.concatenate([[0], np.cumsum(sizes)])
    for g in range(3):
        for i in range(int(ends[g]), int(ends[g + 1])):
            for j in range(n):
                total = sum(Fraction(float(a[i, kk])) * Fraction(float(sa[g][i - ends[g], kk // 16]))
                            * Fraction(float(ga[g])) * Fraction(float(b[g, kk, j]))
                            * Fraction(float(sb[g][j, kk // 16])) * Fraction(float(gb[g])) for kk in range(k))
                assert _nearest_in(total, np.dtype(np.float32)) == float(ref.values[i, j]), (g, i, j)
    # without the globals (all 1) the same codes give a different result: the globals are applied
    plain = p.replace(lhs_global=np.ones(3, np.float32), rhs_global=np.ones(3, np.float32))
    assert not np.array_equal(np.asarray(gmm_ref.reference(plain).values)[5:], np.asarray(ref.values)[5:])


def test_global_scales_are_checked():
    import ml_dtypes

    q = Quantization("float4_e2m1fn", "float8_e4m3fn", "1x16", global_scale=True)
    e2m1 = np.dtype(ml_dtypes.float4_e2m1fn)
    a, b = np.zeros((4, 16), e2m1), np.zeros((2, 16, 2), e2m1)
    sizes = np.array([1, 3])
    kw = dict(lhs_quant=q, rhs_quant=q, out_dtype=np.float32,
              lhs_scales=np.ones(4, ml_dtypes.float8_e4m3fn), rhs_scales=np.ones(4, ml_dtypes.float8_e4m3fn))
    with pytest.raises(ValueError, match="lhs_global: required"):
        gmm_ref.Problem("ragged_m", a, b, sizes, **kw)
    with pytest.raises(TypeError, match=r"rhs_global: expected a float32 array of shape \(2,\)"):
        gmm_ref.Problem("ragged_m", a, b, sizes, **kw, lhs_global=np.ones(2, np.float32),
                        rhs_global=np.ones(3, np.float32))
    plain = Quantization("float4_e2m1fn", "float8_e4m3fn", "1x16")
    with pytest.raises(ValueError, match="lhs_global: given, but lhs_quant has no second level"):
        gmm_ref.Problem("ragged_m", a, b, sizes, **{**kw, "lhs_quant": plain, "rhs_quant": plain},
                        lhs_global=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="global_scale: a second scale level takes block scales"):
        Quantization("float8_e4m3fn", "float32", "row", global_scale=True)
    with pytest.raises(TypeError, match="global_scale: expected a bool"):
        Quantization("float4_e2m1fn", "float8_e4m3fn", "1x16", global_scale=1)


def test_packed_fp4_puts_the_even_element_in_the_low_nibble():
    """torch's float4_e2m1fn_x2 / torchao's pack_uint4: [1.0, 6.0, -0.5, 0.0] is bytes 0x72, 0x09 (codes 2, 7, 9, 0:
    sign, two exponent bits, one mantissa bit)."""
    import ml_dtypes

    from gmm_ref.scaled.layouts import pack_fp4, unpack_fp4

    codes = np.array([1.0, 6.0, -0.5, 0.0]).astype(ml_dtypes.float4_e2m1fn)
    assert pack_fp4(codes).tolist() == [0x72, 0x09]
    every = np.arange(256, dtype=np.uint8).reshape(16, 16)
    assert np.array_equal(pack_fp4(unpack_fp4(every)), every)
    with pytest.raises(ValueError, match="even last axis"):
        pack_fp4(codes[:3])
    with pytest.raises(TypeError, match="expected uint8"):
        unpack_fp4(np.zeros(2, np.int16))


def test_int4_is_an_integer_dtype():
    import ml_dtypes

    from gmm_ref import dtypes

    assert dtypes.is_integer(np.dtype(ml_dtypes.int4)) and not np.issubdtype(np.dtype(ml_dtypes.int4), np.integer)
    assert (dtypes.iinfo(ml_dtypes.int4).min, dtypes.iinfo(ml_dtypes.int4).max) == (-8, 7)
    assert dtypes.standin_codes(np.array([-8, 7], ml_dtypes.int4)).dtype == np.int8
