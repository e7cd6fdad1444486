"""The serving layouts: the ``masked`` and ``padded_contiguous`` families and their conventions (DeepGEMM's
m-grouped contiguous, its psum form and its masked layout; vLLM's batched experts).

The reference is held to an independent computation that reads each convention's own arguments (per-row group
ids, cumulative ends, valid row counts, scale factors indexed by row and 128-wide K block) without going
through ``gmm_ref.Problem``; the model and the front-ends refuse bad input naming the argument.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gmm_ref
from gmm_ref.conventions.deep_gemm import FP8Operand
from property_tests import strategies as gst

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------------- the independent computation
def _values(x, rows_per_scale=1):
    """An operand's values (float64): bf16 as they are, FP8 codes times their scale factor, one per row (or per
    ``rows_per_scale`` rows) and 128-wide K block."""
    if not isinstance(x, tuple):
        return np.asarray(x).astype(np.float64)
    codes, sf = (np.asarray(v) for v in x)
    k = codes.shape[-1]
    scale = np.repeat(np.repeat(sf.astype(np.float64), 128, axis=-1)[..., :k], rows_per_scale, axis=-2)
    return codes.astype(np.float64) * scale[..., :codes.shape[-2], :]


def _weights(b):
    """``[G, N, K]`` weight values: 128x128 blocks when sfb has ceil(N/128) rows, else one scale per row."""
    if not isinstance(b, tuple):
        return _values(b)
    n = b[0].shape[1]
    return _values(b, 128 if b[1].shape[1] != n or n == 1 else 1)


def _row_groups(grouped_layout, use_psum, m):
    """Each row's group (-1: padding) from DeepGEMM's grouped_layout, read the way its scheduler reads it."""
    layout = np.asarray(grouped_layout)
    if not use_psum:
        return layout.astype(np.int64)
    ids = np.full(m, -1)
    prev = 0
    for g, end in enumerate(layout.tolist()):
        start = 0 if g == 0 else (prev + 127) // 128 * 128
        ids[start:min(end, m)] = g
        prev = end
    return ids


def _independent_contiguous(a, b, d, grouped_layout, use_psum_layout=False, **_):
    va, vb = _values(a), _weights(b)
    ids = _row_groups(grouped_layout, use_psum_layout, va.shape[0])
    out, mag = np.zeros((va.shape[0], vb.shape[1])), np.zeros((va.shape[0], vb.shape[1]))
    with np.errstate(invalid="ignore", over="ignore"):
        for r in np.flatnonzero(ids >= 0):
            out[r], mag[r] = vb[ids[r]] @ va[r], np.abs(vb[ids[r]]) @ np.abs(va[r])
    return out, np.broadcast_to((ids >= 0)[:, None], out.shape), mag


def _independent_masked(a, b, d, masked_m, expected_m, **_):
    va, vb = _values(a), _weights(b)
    out = np.zeros((va.shape[0], va.shape[1], vb.shape[1]))
    defined, mag = np.zeros(out.shape, bool), np.zeros(out.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for g, count in enumerate(np.asarray(masked_m).tolist()):
            out[g, :count] = va[g, :count] @ vb[g].T
            mag[g, :count] = np.abs(va[g, :count]) @ np.abs(vb[g]).T
            defined[g, :count] = True
    return out, defined, mag


def _independent_batched(A, B, C, expert_num_tokens, compute_type=None, A_scale=None, B_scale=None,
                         per_act_token_quant=False, block_shape=None, **_):
    a, b = np.asarray(A).astype(np.float64), np.asarray(B).astype(np.float64)
    out = np.asarray(C).astype(np.float64).copy()  # rows past an expert's count keep C
    mag = np.zeros(out.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for e, count in enumerate(np.asarray(expert_num_tokens).tolist()):
            if A_scale is None:
                va, vb = a[e, :count], b[e]
            elif block_shape is not None:
                va = _values((A[e, :count], A_scale[e, :count]))
                vb = _weights((B[e][None], B_scale[e][None]))[0]
            else:
                sa = np.asarray(A_scale[e, :count, 0] if per_act_token_quant else np.full(count, A_scale[e, 0, 0]))
                sb = np.asarray(B_scale[e, :, 0] if per_act_token_quant else np.full(b.shape[1], B_scale[e]))
                va, vb = a[e, :count] * sa.astype(np.float64)[:, None], b[e] * sb.astype(np.float64)[:, None]
            out[e, :count], mag[e, :count] = va @ vb.T, np.abs(va) @ np.abs(vb).T
    return out, np.ones(out.shape, bool), mag


def _close(got, want, magnitude):
    """Equal up to the float64 sums' own rounding (a few units in 2**-53 of sum |a||b|); NaN and Inf alike."""
    with np.errstate(invalid="ignore"):
        special = ~np.isfinite(want)
        np.testing.assert_array_equal(np.where(special, got, 0), np.where(special, want, 0))
        err = np.abs(np.where(special, 0, got - want))
    assert np.all(err <= 2.0 ** -44 * np.where(special, 0, magnitude)), float(np.max(err))


INDEPENDENT = {"deep_gemm.m_grouped_contiguous": _independent_contiguous,
               "deep_gemm.m_grouped_contiguous_psum": _independent_contiguous,
               "deep_gemm.m_grouped_masked": _independent_masked, "vllm.batched_moe": _independent_batched}


@pytest.mark.parametrize("name", sorted(INDEPENDENT))
@pytest.mark.parametrize("values", ["exact", "normal", "wide", "poisoned"])
def test_the_reference_agrees_with_an_independent_reading_of_the_arguments(name, values):
    seen = set()

    @SETTINGS
    @given(gst.problems(convention=name, values=values))
    def prop(p):
        args, kwargs = gmm_ref.arguments(p)
        want, defined, magnitude = INDEPENDENT[name](*args, **kwargs)
        ref = gmm_ref.reference(p)
        np.testing.assert_array_equal(ref.mask, defined)
        _close(np.where(defined, ref.exact, 0), np.where(defined, want, 0), magnitude)
        seen.add("scaled" if p.scaled else "plain")

    prop()
    assert seen == {"scaled", "plain"}, seen  # both precisions drawn


def test_the_independent_reading_sees_a_misplaced_group():
    # the same problem with its groups one alignment step later: the comparison above would fail
    rng = np.random.default_rng(0)
    a = rng.standard_normal((384, 128)).astype(BF16)
    b = rng.standard_normal((2, 16, 128)).astype(BF16)
    p = gmm_ref.Problem("padded_contiguous", a, b, np.array([5, 100]), rhs_transposed=True, alignment=128,
                        tail="undefined", out_dtype=BF16, convention="deep_gemm.m_grouped_contiguous")
    args, _ = gmm_ref.arguments(p)
    shifted = np.roll(args[3], 128)
    _, defined, _ = _independent_contiguous(*args[:3], shifted)
    assert not np.array_equal(gmm_ref.reference(p).mask, defined)


# ---------------------------------------------------------------------------------------------- the model
def test_group_spans_of_the_serving_families():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 4)).astype(np.float32)
    b = rng.standard_normal((4, 4, 3)).astype(np.float32)
    p = gmm_ref.Problem("padded_contiguous", a, b, np.array([5, 0, 9, 0]), alignment=8, tail="undefined")
    starts, ends = p.spans_at(())
    assert starts.tolist() == [0, 8, 8, 24] and ends.tolist() == [5, 8, 17, 24]
    ref = gmm_ref.reference(p)
    assert ref.mask[:, 0].tolist() == [True] * 5 + [False] * 3 + [True] * 9 + [False] * 23
    from gmm_ref.compare import group_span, groups_of

    assert groups_of(p, np.array([[4, 0], [5, 0], [8, 0], [16, 0], [17, 0]])).tolist() == [0, -1, 2, 2, -1]
    assert group_span(p, 2, (9, 0)) == "group 2 (rows [8, 17), size 9)"
    assert group_span(p, -1, (6, 0)) == "padding rows (no group's)"
    m = gmm_ref.Problem("masked", rng.standard_normal((2, 6, 4)).astype(np.float32), b[:2], np.array([6, 2]))
    assert groups_of(m, np.array([[0, 5, 0], [1, 1, 2], [1, 2, 2]])).tolist() == [0, 1, -1]
    assert gmm_ref.reference(m).mask.all()  # tail "zero": rows past a count are zeros, defined
    assert not gmm_ref.reference(m).exact[1, 2:].any()


@pytest.mark.parametrize(("family", "change", "exc", "text"), [
    ("padded_contiguous", dict(alignment=None), ValueError, "alignment: the padded_contiguous family needs"),
    ("padded_contiguous", dict(alignment=0), ValueError, "alignment: the padded_contiguous family needs"),
    ("padded_contiguous", dict(group_sizes=np.array([17, 9, 9, 0])), ValueError, "end at row 49, past"),
    ("padded_contiguous", dict(lhs_transposed=True, lhs=np.ones((4, 40), np.float32)), ValueError,
     "lhs_transposed: the padded_contiguous family stores lhs"),
    ("padded_contiguous", dict(group_sizes=np.array([[1, 1, 1, 1]])), TypeError, "group_sizes: expected a 1-D"),
    ("padded_contiguous", dict(group_sizes=np.array([1, 1])), ValueError, "rhs: expected 2 groups"),
    ("masked", dict(group_sizes=np.array([7, 0, 0, 0])), ValueError, "valid row count 7 exceeds"),
    ("masked", dict(group_offset=1, num_local_groups=3), ValueError, "has no sharding"),
    ("masked", dict(existing_policy="accumulate", existing_out=np.zeros((4, 6, 3), np.float32)), ValueError,
     "existing_policy: the masked family's existing output is kept"),
    ("masked", dict(alignment=8), ValueError, "alignment: only the padded_contiguous family takes one"),
    ("masked", dict(group_sizes=np.array([-1, 0, 0, 0])), ValueError, "must be non-negative"),
])
def test_bad_serving_problems_are_named(family, change, exc, text):
    b = np.ones((4, 4, 3), np.float32)
    fields = dict(lhs=np.ones((40, 4) if family == "padded_contiguous" else (4, 6, 4), np.float32), rhs=b,
                  group_sizes=np.array([5, 0, 9, 0]), alignment=8 if family == "padded_contiguous" else None)
    fields.update(change)
    with pytest.raises(exc, match=text):
        gmm_ref.Problem(family, **fields)


# ------------------------------------------------------------------------------------------ the front-ends
def _fp8(shape, rng):
    return rng.integers(-8, 9, size=shape).astype(E4M3)


def test_deep_gemm_front_ends_take_both_forms_and_both_recipes():
    rng = np.random.default_rng(2)
    a = _fp8((256, 256), rng)
    sfa = rng.uniform(0.5, 2, (256, 2)).astype(np.float32)
    b = _fp8((2, 144, 256), rng)
    sfb_blocks = rng.uniform(0.5, 2, (2, 2, 2)).astype(np.float32)
    sfb_rows = np.ldexp(1.0, rng.integers(-3, 3, (2, 144, 2))).astype(np.float32)
    d = np.zeros((256, 144), BF16)
    ids = np.full(256, -1, np.int32)
    ids[:100], ids[128:131] = 0, 1
    refs = []
    for sfb in (sfb_blocks, sfb_rows):
        refs.append(ref := gmm_ref.deep_gemm_m_grouped_contiguous(FP8Operand(a, sfa), (b, sfb), d, ids,
                                                                  with_reference=True))
        psum = gmm_ref.deep_gemm_m_grouped_contiguous((a, sfa), (b, sfb), d, np.array([100, 131], np.int32),
                                                      use_psum_layout=True, with_reference=True)
        np.testing.assert_array_equal(ref.mask, psum.mask)
        np.testing.assert_array_equal(ref.exact, psum.exact)
        want, defined, magnitude = _independent_contiguous((a, sfa), (b, sfb), d, ids)
        _close(np.where(defined, ref.exact, 0), want, magnitude)
    masked = gmm_ref.deep_gemm_m_grouped_masked(
        (a.reshape(2, 128, 256), sfa.reshape(2, 128, 2)), (b, sfb_blocks), d.reshape(2, 128, 144),
        np.array([100, 3], np.int32), 64, with_reference=True)
    np.testing.assert_array_equal(masked.exact.reshape(256, 144)[ids >= 0], refs[0].exact[ids >= 0])


@pytest.mark.parametrize(("change", "exc", "text"), [
    (dict(grouped_layout=np.zeros(255, np.int32)), ValueError, "expected one group id per row of a"),
    (dict(grouped_layout=np.zeros(256, np.int64)), TypeError, "grouped_layout: expected a 1-D int32"),
    (dict(grouped_layout=np.r_[np.zeros(50), -np.ones(10), np.zeros(40), -np.ones(156)].astype(np.int32)), ValueError,
     "each group's rows contiguous, in group order"),
    (dict(grouped_layout=np.full(256, 2, np.int32)), ValueError, r"group ids in \[0, 2\) or -1"),
    (dict(grouped_layout=np.array([100, 90], np.int32), use_psum_layout=True), ValueError,
     "group 1 ends at 90, before its start 128"),
    (dict(grouped_layout=np.array([100], np.int32), use_psum_layout=True), ValueError, "one cumulative end per group"),
    (dict(d=np.zeros((256, 16), BF16)), ValueError, "d: expected the bfloat16 output buffer of shape"),
    (dict(a=np.ones((256, 256), np.float32)), TypeError, "a: expected a bfloat16 array or an FP8"),
    (dict(b=np.ones((2, 144, 256), BF16)), TypeError, "both FP8 .* or both bfloat16"),
    (dict(a=(np.ones((256, 256), E4M3), np.ones((256, 2), np.float64))), TypeError, r"a\[1\]: expected float32"),
    (dict(b=(np.ones((2, 144, 256), E4M3), np.ones((2, 3, 2), np.float32))), ValueError, r"b\[1\]: expected scale"),
    (dict(recipe=(1, 32, 32)), ValueError, "recipe: expected"),
    (dict(use_psum_layout=1), TypeError, "use_psum_layout: expected a bool"),
])
def test_bad_deep_gemm_contiguous_arguments_are_named(change, exc, text):
    args = dict(a=(np.ones((256, 256), E4M3), np.ones((256, 2), np.float32)),
                b=(np.ones((2, 144, 256), E4M3), np.ones((2, 2, 2), np.float32)), d=np.zeros((256, 144), BF16),
                grouped_layout=np.r_[np.zeros(100), -np.ones(28), np.ones(3), -np.ones(125)].astype(np.int32))
    args.update(change)
    with pytest.raises(exc, match=text):
        gmm_ref.deep_gemm_m_grouped_contiguous(**args)


@pytest.mark.parametrize(("change", "exc", "text"), [
    (dict(masked_m=np.array([1, 2], np.int64)), TypeError, "masked_m: expected a"),
    (dict(masked_m=np.array([1, 200], np.int32)), ValueError, "valid row count 200 exceeds"),
    (dict(expected_m=0), ValueError, "expected_m: expected a positive int"),
    (dict(d=np.zeros((2, 128, 16), BF16)), ValueError, "d: expected the bfloat16 output buffer"),
])
def test_bad_deep_gemm_masked_arguments_are_named(change, exc, text):
    args = dict(a=np.ones((2, 128, 256), BF16), b=np.ones((2, 144, 256), BF16), d=np.zeros((2, 128, 144), BF16),
                masked_m=np.array([1, 2], np.int32), expected_m=2)
    args.update(change)
    with pytest.raises(exc, match=text):
        gmm_ref.deep_gemm_m_grouped_masked(**args)


@pytest.mark.parametrize(("change", "exc", "text"), [
    (dict(C=np.zeros((2, 8, 15), BF16)), ValueError, "C: expected the output buffer of shape"),
    (dict(use_int8_w8a16=True), ValueError, "take unquantized or FP8 operands only"),
    (dict(use_fp8_w8a8=True), TypeError, "A: expected float8_e4m3fn codes"),
    (dict(A_scale=np.ones((2, 1, 1), np.float32)), ValueError, "only with use_fp8_w8a8=True"),
    (dict(compute_type="float32"), TypeError, "compute_type: the result is cast to it and stored in C"),
    (dict(expert_num_tokens=np.array([1.0, 2.0])), TypeError, "expert_num_tokens: expected"),
])
def test_bad_vllm_batched_arguments_are_named(change, exc, text):
    args = dict(A=np.ones((2, 8, 32), BF16), B=np.ones((2, 16, 32), BF16), C=np.zeros((2, 8, 16), BF16),
                expert_num_tokens=np.array([1, 2], np.int32))
    args.update(change)
    with pytest.raises(exc, match=text):
        gmm_ref.vllm_batched_moe(**args)


def test_vllm_fp8_scale_forms_are_named():
    codes = np.ones((2, 8, 256), E4M3), np.ones((2, 16, 256), E4M3)
    base = dict(A=codes[0], B=codes[1], C=np.zeros((2, 8, 16), BF16), expert_num_tokens=np.array([3, 8], np.int32),
                use_fp8_w8a8=True)
    ref = gmm_ref.vllm_batched_moe(**base, A_scale=np.full((2, 1, 1), 2, np.float32), B_scale=np.ones(2, np.float32),
                                   with_reference=True)
    assert ref.exact[0, :3].tolist() == [[512.0] * 16] * 3 and not ref.exact[0, 3:].any()  # C kept past the count
    with pytest.raises(ValueError, match=r"A_scale: expected shape \(2, 8, 2\) for this form"):
        gmm_ref.vllm_batched_moe(**base, A_scale=np.ones((2, 8, 1), np.float32),
                                 B_scale=np.ones((2, 1, 2), np.float32), block_shape=[128, 128])
    with pytest.raises(ValueError, match=r"block_shape: expected \[128, 128\]"):
        gmm_ref.vllm_batched_moe(**base, A_scale=np.ones((2, 8, 2), np.float32),
                                 B_scale=np.ones((2, 1, 2), np.float32), block_shape=[64, 64])
    with pytest.raises(ValueError, match="A_scale, B_scale: required"):
        gmm_ref.vllm_batched_moe(**base)


# ------------------------------------------------------------------------------------------ the strategies
@pytest.mark.parametrize("family", ["masked", "padded_contiguous"])
def test_the_strategies_draw_sizes_at_the_alignment_plus_or_minus_one(family):
    tile = 16
    found = set()

    @settings(max_examples=200, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(gst.problems(families=(family,), tiling=(tile, tile, tile), max_buckets=None, max_extent=70))
    def prop(p):
        for s in p.group_sizes.tolist():
            found.add(("edge", s % tile) if s % tile in (1, tile - 1) else ("zero",) if s == 0 else
                      ("aligned",) if s % tile == 0 else ("other",))
        assert not p.batch_ndim and p.num_local_groups == p.num_groups

    prop()
    assert {("edge", 1), ("edge", tile - 1), ("zero",), ("aligned",)} <= found, found


# -------------------------------------------------------- partial sums promoted every K block (DeepGEMM SM90)
def _truncated(x, bits):
    """``x`` with ``bits`` significant bits, rounded toward zero (an accumulator that truncates)."""
    m, e = np.frexp(x)
    return np.ldexp(np.trunc(m * 2.0 ** bits) / 2.0 ** bits, e)


def _promoting_kernel(a, b, every, bits=14):
    """``a @ b`` with partial sums of ``every`` K terms kept to ``bits`` bits (truncated), each promoted into a
    float32 accumulator: Hopper's FP8 tensor cores and DeepGEMM's promotion, emulated."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for lo in range(0, a.shape[1], every):
        part = np.zeros(acc.shape)
        for k in range(lo, min(lo + every, a.shape[1])):
            part = _truncated(part + np.outer(a[:, k], b[k]), bits)
        acc = (acc + part.astype(np.float32)).astype(np.float32)
    return acc


def test_partial_sums_promoted_every_k_block_earn_their_bound_and_too_rare_a_promotion_is_caught():
    # one-signed activations (as after SiLU): no cancellation hides the partial sums' truncation
    rng = np.random.default_rng(5)
    a = rng.integers(1, 64, size=(16, 1024)).astype(np.float64)
    b = rng.integers(1, 64, size=(1024, 8)).astype(np.float64)
    q = gmm_ref.Quantization(E4M3, np.float32, (1, 128))
    p = gmm_ref.Problem("ragged_m", a.astype(E4M3), b[None].astype(E4M3), np.array([16]), out_dtype=np.float32,
                        lhs_quant=q, lhs_scales=np.ones(16 * 8, np.float32), rhs_quant=q,
                        rhs_scales=np.ones(8 * 8, np.float32))
    ref = gmm_ref.reference(p)
    hopper = gmm_ref.Numerics(promote_every=128, partial_accumulate=2.0 ** -13, flush_subnormals=True)
    right = _promoting_kernel(a, b, 128)
    assert gmm_ref.check(right, ref, numerics=hopper).ok
    # held to one float32 accumulator over K, the same correct kernel would be failed: the declaration matters
    assert not gmm_ref.check(right, ref).ok
    rare = gmm_ref.check(_promoting_kernel(a, b, 1024), ref, numerics=hopper)
    assert not rare.ok and rare.max_error_over_bound > 1
    narrow = _promoting_kernel(a, b, 128, bits=8)  # partial sums in a bfloat16-wide accumulator
    assert not gmm_ref.check(narrow, ref, numerics=hopper).ok


@pytest.mark.parametrize(("fields", "text"), [
    (dict(promote_every=0), "promote_every: expected a positive int"),
    (dict(promote_every=True), "promote_every: expected a positive int"),
    (dict(partial_accumulate=2.0 ** -13), "partial_accumulate: given without promote_every"),
    (dict(promote_every=128, partial_accumulate=2.0), r"partial_accumulate: expected a dtype or a unit roundoff"),
])
def test_bad_promotion_numerics_are_named(fields, text):
    with pytest.raises(ValueError, match=text):
        gmm_ref.Numerics(**fields)


def test_promotion_numerics_round_trip_through_json_source_and_the_command_line():
    from gmm_ref.numerics import parse_numerics

    n = gmm_ref.Numerics(promote_every=128, partial_accumulate=2.0 ** -13, flush_subnormals=True)
    assert gmm_ref.Numerics.from_json(n.to_json()) == n
    assert eval(n.source(), {"gmm_ref": gmm_ref}) == n
    assert parse_numerics("accumulate=float32,flush,promote_every=128,partial=2**-13") == n
    assert parse_numerics("promote_every=64,partial=bfloat16").partial_accumulate == BF16
    with pytest.raises(ValueError, match="--numerics: partial_accumulate: given without promote_every"):
        parse_numerics("partial=2**-13")
