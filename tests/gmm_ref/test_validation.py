"""Every invalid input is refused with ValueError/TypeError naming the argument (texts pinned)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gmm_ref
from gmm_ref import Problem

F = np.float32
L2, R3 = np.zeros((4, 2), F), np.zeros((2, 2, 3), F)
GS = np.array([1, 3])
RD = gmm_ref.RaggedDotDimensionNumbers

CASES = [
    ("wrong ndim", lambda: Problem("ragged_m", np.zeros((4, 2, 1), F), R3, GS), ValueError,
     "lhs: expected 2 dims for family 'ragged_m' with batch_ndim=0, got shape (4, 2, 1)"),
    ("wrong ndim (front-end)", lambda: gmm_ref.ragged_dot(L2, np.zeros((2, 3), F), GS), ValueError,
     "rhs: expected 3 dims, got shape (2, 3)"),
    ("contracting extents differ", lambda: Problem("ragged_m", L2, np.zeros((2, 5, 3), F), GS), ValueError,
     "lhs/rhs: contracting extents differ: lhs has K=2, rhs has K=5"),
    ("G of sizes vs rhs", lambda: Problem("ragged_m", L2, R3, np.array([1, 1, 2])), ValueError,
     "rhs: expected 3 local groups on axis 0 (G=3, group_offset=0), got 2"),
    ("G vs rhs (ragged_dot)", lambda: gmm_ref.ragged_dot(L2, R3, np.array([4])), ValueError,
     "rhs: expected 1 groups on axis 0 (len(group_sizes)), got 2"),
    ("negative sizes", lambda: Problem("ragged_m", L2, R3, np.array([-1, 3])), ValueError,
     "group_sizes: must be non-negative, got [-1, 3]"),
    ("sum past extent", lambda: Problem("ragged_m", L2, R3, np.array([2, 3])), ValueError,
     "group_sizes: sum 5 exceeds the ragged extent 4 (M)"),
    ("huge sizes that wrap", lambda: Problem("ragged_m", L2, R3, np.array([2**62] * 2)), ValueError,
     "group_sizes: size 4611686018427387904 exceeds the ragged extent 4 (M)"),
    ("float sizes", lambda: Problem("ragged_m", L2, R3, np.array([1.0, 3.0])), TypeError,
     "group_sizes: expected an integer array of shape [G] or [b..., G], got dtype float64 shape (2,)"),
    ("bool sizes", lambda: Problem("ragged_m", L2, R3, np.array([True, True])), TypeError,
     "group_sizes: expected an integer array"),
    ("2-D sizes, no batch", lambda: Problem("ragged_m", L2, R3, np.array([[1, 3]])), ValueError,
     "group_sizes: expected shape [G], got (1, 2)"),
    ("0-D sizes", lambda: Problem("ragged_m", L2, R3, np.array(4)), TypeError,
     "group_sizes: expected an integer array of shape [G] or [b..., G], got dtype int64 shape ()"),
    ("2-D sizes (ragged_dot)", lambda: gmm_ref.ragged_dot(L2, R3, np.array([[1, 3]])), ValueError,
     "group_sizes: expected a 1-D array of G sizes, got shape (1, 2)"),
    ("non-monotonic offs", lambda: gmm_ref.grouped_mm(L2, R3, np.array([3, 2], np.int32)), ValueError,
     "offs: expected non-decreasing cumulative group ends, got [3, 2]"),
    ("negative offs", lambda: gmm_ref.grouped_mm(L2, R3, np.array([-1, 2], np.int32)), ValueError,
     "offs: expected non-negative cumulative group ends, got [-1, 2]"),
    ("group_offset too big", lambda: Problem("ragged_m", L2, R3, GS, group_offset=3), ValueError,
     "group_offset: expected 0 <= group_offset <= G=2, got 3"),
    ("group_offset negative", lambda: Problem("ragged_m", L2, R3, GS, group_offset=-1), ValueError,
     "group_offset: expected 0 <= group_offset <= G=2, got -1"),
    ("group_offset float", lambda: Problem("ragged_m", L2, R3, GS, group_offset=1.0), TypeError,
     "group_offset: expected an integer, got 1.0"),
    ("num_local_groups too big", lambda: Problem("ragged_m", L2, R3, GS, group_offset=1, num_local_groups=2),
     ValueError, "num_local_groups: expected 0 <= num_local_groups <= G - group_offset = 1, got 2"),
    ("gmm group_offset", lambda: gmm_ref.gmm(L2, R3, GS, group_offset=3), ValueError,
     "group_offset: expected 0 <= group_offset <= G=2, got 3"),
    ("tgmm num_actual_groups", lambda: gmm_ref.tgmm(L2, np.zeros((2, 3), F), np.array([1, 1]),
                                                     num_actual_groups=True), ValueError,
     "num_actual_groups: expected an int in [0, G - group_offset = 2], got True"),
    ("unsupported dtype", lambda: Problem("ragged_m", L2.astype(np.float128 if hasattr(np, "float128")
                                                               else np.complex64), R3, GS), TypeError,
     "lhs: unsupported dtype"),
    ("int64 inputs", lambda: Problem("ragged_m", L2.astype(np.int64), R3.astype(np.int64), GS), TypeError,
     "lhs: unsupported dtype int64"),
    ("mixed int/float", lambda: Problem("ragged_m", L2.astype(np.int8), R3, GS), TypeError,
     "lhs/rhs: integer and floating inputs cannot be mixed (got int8 and float32)"),
    ("no common dtype", lambda: Problem("ragged_m", L2.astype(ml_dtypes.float8_e4m3fn),
                                        R3.astype(ml_dtypes.float8_e5m2), GS), TypeError,
     "out_dtype: required, since lhs dtype float8_e4m3fn and rhs dtype float8_e5m2 have no common type"),
    ("int8 output", lambda: Problem("ragged_m", L2.astype(np.int8), R3.astype(np.int8), GS, out_dtype=np.int8),
     TypeError, "out_dtype: unsupported output dtype int8"),
    ("unknown out dtype", lambda: gmm_ref.ragged_dot(L2, R3, GS, preferred_element_type="int4"), TypeError,
     "preferred_element_type: unsupported dtype int4"),
    ("float out for int", lambda: Problem("ragged_m", L2.astype(np.int8), R3.astype(np.int8), GS, out_dtype=F),
     TypeError, "out_dtype: float32 does not fit inputs of dtype int8"),
    ("te first and last", lambda: gmm_ref.te_grouped_gemm(L2, R3, lhs_first_dims=GS, lhs_last_dims=GS),
     ValueError, "lhs_first_dims/lhs_last_dims: an operand may be ragged on one axis only"),
    ("te no sizes", lambda: gmm_ref.te_grouped_gemm(L2, R3), ValueError,
     "lhs_first_dims/lhs_last_dims/rhs_first_dims/rhs_last_dims: at least one must be given"),
    ("existing shape", lambda: gmm_ref.gmm(L2, R3, GS, existing_out=np.zeros((4, 2), F)), ValueError,
     "existing_out: expected shape (4, 3) and dtype float32, got shape (4, 2) and dtype float32"),
    ("existing dtype", lambda: gmm_ref.gmm(L2, R3, GS, existing_out=np.zeros((4, 3))), ValueError,
     "existing_out: expected shape (4, 3) and dtype float32, got shape (4, 3) and dtype float64"),
    ("existing not an array", lambda: Problem("ragged_m", L2, R3, GS, existing_out=[[0.0]]), TypeError,
     "existing_out: expected a numpy.ndarray, got list"),
    ("lhs not an array", lambda: Problem("ragged_m", [[1.0]], R3, GS), TypeError,
     "lhs: expected a numpy.ndarray, got list"),
    ("bad policy", lambda: Problem("ragged_m", L2, R3, GS, tail="garbage"), ValueError,
     "tail: expected one of ('zero', 'undefined'), got 'garbage'"),
    ("bad family", lambda: Problem("ragged_x", L2, R3, GS), ValueError, "family: expected one of"),
    ("missing sizes", lambda: Problem("ragged_m", L2, R3, None), ValueError,
     "group_sizes: required for family 'ragged_m'"),
    ("packed without a ragged last axis", lambda: Problem("ragged_m", L2, R3, GS, packed=True), ValueError,
     "packed: True, but no operand of this problem is ragged along its last axis"),
    ("batch sharding", lambda: Problem("batch", np.zeros((2, 4, 2), F), R3, None, group_offset=1), ValueError,
     "group_offset/num_local_groups: the batch family has no sharding"),
    ("tiling", lambda: Problem("ragged_m", L2, R3, GS, tiling=(0, 1, 1)), ValueError,
     "tiling: expected three positive ints (tm, tk, tn), got (0, 1, 1)"),
    ("rdg ragged dim out of range", lambda: gmm_ref.ragged_dot_general(L2, R3, GS, RD((([1], [1]), ([], [])),
                                                                                      [5], [0])),
     ValueError, "ragged_dot_dimension_numbers: lhs ragged dim 5 is not an axis of lhs (ndim 2)"),
    ("rdg dims repeated", lambda: gmm_ref.ragged_dot_general(L2, R3, GS, RD((([1], [1]), ([], [])), [0], [1])),
     ValueError, "ragged_dot_dimension_numbers: rhs dims [1, 1] must be distinct axes of rhs (ndim 3)"),
    ("rdg not dimension numbers", lambda: gmm_ref.ragged_dot_general(L2, R3, GS, 3), TypeError,
     "ragged_dot_dimension_numbers: expected a RaggedDotDimensionNumbers"),
    ("numerics type", lambda: gmm_ref.reference(Problem("ragged_m", L2, R3, GS)).bound("fp32"), TypeError,
     "numerics: expected gmm_ref.Numerics, got str"),
    ("check type", lambda: gmm_ref.check(np.zeros((4, 3), F), "problem"), TypeError,
     "problem_or_expected: expected a gmm_ref.Problem or gmm_ref.Reference, got str"),
]


@pytest.mark.parametrize(("make", "exc", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_input_is_refused_with_its_name(make, exc, text):
    with pytest.raises(exc, match=re.escape(text)):
        make()


shapes = st.tuples(st.integers(0, 3), st.integers(0, 3))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.sampled_from(["ragged_m", "ragged_n", "ragged_k", "batch"]),
       st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple),
       st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple),
       st.one_of(st.none(), st.lists(st.integers(-3, 6), max_size=4), st.lists(st.floats(0, 3), max_size=2)),
       st.integers(-1, 4), st.one_of(st.none(), st.integers(-1, 4)), st.booleans(), st.booleans(), st.booleans())
def test_arbitrary_inputs_raise_only_value_or_type_error(fam, ls, rs, gs, off, nl, lt, rt, packed):
    """Fuzz: no IndexError, no crash; whatever is accepted computes a reference of the right shape."""
    gs_arr = None if gs is None else np.array(gs)
    try:
        p = Problem(fam, np.ones(ls, F), np.ones(rs, F), gs_arr, group_offset=off, num_local_groups=nl,
                    lhs_transposed=lt, rhs_transposed=rt, packed=packed)
    except (ValueError, TypeError) as e:
        refusal = str(e)
    else:
        refusal = None
    if refusal is not None:
        assert re.match(r"^[a-z_/*]+[:(]", refusal) or refusal.startswith("lhs"), refusal
        return
    ref = gmm_ref.reference(p)
    assert ref.exact.shape == p.out_shape and ref.bound().shape == p.out_shape
