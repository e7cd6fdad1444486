"""The comparison: order of checks, pinned report text, reproducers that re-execute."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gmm_ref
from gmm_ref import Mismatch, Problem


def small_problem(**kw) -> Problem:
    lhs = np.arange(12, dtype=np.float32).reshape(6, 2)
    rhs = np.ones((2, 2, 3), np.float32)
    return Problem("ragged_m", lhs, rhs, np.array([2, 3]), tiling=(2, 2, 2), **kw)


def _message(out, p, **kw) -> tuple[str, str]:
    with pytest.raises(Mismatch) as info:
        gmm_ref.assert_matches_reference(out, p, **kw)
    return str(info.value), info.value.__notes__[0]


def test_report_text_is_pinned():
    p = small_problem()
    out = gmm_ref.reference(p).values.copy()
    out[3, 1] += 1
    msg, note = _message(out, p, kernel="k")
    assert msg == """\
kernel k vs gmm_ref on ragged_m lhs[6, 2]:float32 rhs[2, 2, 3]:float32 out[6, 3]:float32 \
group_sizes=[2, 3] tiling=(2, 2, 2)
Not equal under bit-for-bit equality (exact mode)
Mismatched elements: 1 / 18 defined (5.56%)
First mismatches (index: ACTUAL vs DESIRED [exact], bound, group):
  [3, 1]: 14.0 vs 13.0 [13.0], bound 0, group 1
Max absolute difference among violations: 1
Bound is 0 here: the exact result is representable, so it must match bit for bit
Wrong groups:
  group 1 (rows [2, 5), size 3): 1 wrong
  tile map of out[:, :] (2x2 tiles; X wrong, . right, blank undefined):
         0 |..|
         2 |X.|
         4 |..|"""
    assert note.startswith("Reproduce with:\n")


def test_report_with_a_bound_names_the_ratio_and_the_tail():
    rng = np.random.default_rng(0)
    p = Problem("ragged_m", rng.standard_normal((5, 8)).astype(np.float32),
                rng.standard_normal((2, 8, 3)).astype(np.float32), np.array([1, 2]), tail="undefined")
    ref = gmm_ref.reference(p)
    out = ref.values.copy()
    out[0, 0] += 1e-3
    out[3:] = 7  # tail rows: undefined, never compared
    msg, _ = _message(out, p)
    assert "Not equal under |actual - exact| <= bound (docs/numerics.md)" in msg
    assert "Mismatched elements: 1 / 9 defined (11.1%)" in msg
    assert "Max |error| / bound: " in msg and "group 0 (rows [0, 1), size 1): 1 wrong" in msg
    ratio = float(msg.split("Max |error| / bound: ")[1].split()[0])
    assert ratio > 1
    assert gmm_ref.check(ref.values, p).ok
    # defined tail (tail='zero') that is wrong: group "tail"
    q = p.replace(tail="zero")
    out = gmm_ref.reference(q).values.copy()
    out[4, 2] = 1
    msg, _ = _message(out, q)
    assert "tail (past sum(group_sizes)): 1 wrong" in msg and "group -1" in msg


def test_shape_and_dtype_are_checked_first():
    p = small_problem()
    res = gmm_ref.check(np.full((6, 3), np.nan, np.float64), p)
    assert res.kind == "shape" and res.message.endswith(
        "shape/dtype mismatch: ACTUAL (6, 3) float64, DESIRED (6, 3) float32")


def test_nan_inf_positions_are_checked_before_values():
    p = small_problem()
    out = gmm_ref.reference(p).values.copy()
    out[0, 0] = 1e30  # a wrong value ...
    out[1, 1] = np.inf  # ... and an Inf where the reference is finite
    res = gmm_ref.check(out, p)
    assert res.kind == "nonfinite" and "NaN/Inf at the same positions as the reference" in res.message
    assert "[1, 1]: inf vs 5.0" in res.message and "[0, 0]" not in res.message
    lhs = p.lhs.copy()
    lhs[0, 0] = np.nan
    q = p.replace(lhs=lhs)
    good = gmm_ref.reference(q).values
    assert np.isnan(good[0]).all() and gmm_ref.check(good, q).ok
    bad = good.copy()
    bad[0, 0] = 0
    assert gmm_ref.check(bad, q).kind == "nonfinite"


def test_overflow_rounds_to_inf_or_nan_by_format():
    big = np.full((1, 2), 300.0, np.float32)
    p = Problem("ragged_m", big, np.ones((1, 2, 1), np.float32), np.array([1]), out_dtype=ml_dtypes.float8_e4m3fn)
    ref = gmm_ref.reference(p)
    assert np.isnan(ref.values.astype(float)).all()  # 600 > 464: NaN in e4m3fn
    assert gmm_ref.check(ref.values, p).ok
    q = p.replace(out_dtype=np.float16, lhs=np.full((1, 2), 60000.0, np.float32))
    out = np.array([[np.inf]], np.float16)
    assert gmm_ref.check(out, q).ok
    assert gmm_ref.check(-out, q).kind == "nonfinite"


def test_poisoned_padding_must_not_reach_a_correct_output():
    """A kernel that masks by multiplying with zero leaks NaN from rows of no group."""
    lhs = np.arange(10, dtype=np.float32).reshape(5, 2)
    lhs[3:] = np.nan  # rows past sum(sizes)
    rhs = np.ones((2, 2, 2), np.float32)
    p = Problem("ragged_m", lhs, rhs, np.array([1, 2]))  # tail='zero': rows 3, 4 must be 0
    ref = gmm_ref.reference(p)
    assert (ref.values[3:] == 0).all() and gmm_ref.check(ref.values, p).ok
    leaky = np.zeros((5, 2), np.float64)
    for g, (lo, hi) in enumerate([(0, 1), (1, 3)]):
        sel = np.zeros((5, 1))
        sel[lo:hi] = 1
        leaky += (lhs.astype(np.float64) * sel) @ rhs[g]  # nan * 0 = nan everywhere in rows 3, 4
    res = gmm_ref.check(leaky.astype(np.float32), p)
    assert not res.ok and res.kind == "nonfinite" and "tail (past sum(group_sizes))" in res.message


def test_wrong_groups_and_batch_index_for_per_batch_sizes():
    rng = np.random.default_rng(2)
    p = Problem("ragged_k", rng.standard_normal((2, 3, 6)).astype(np.float32),
                rng.standard_normal((2, 6, 4)).astype(np.float32), np.array([[2, 4], [5, 1]]), batch_ndim=1)
    out = gmm_ref.reference(p).values.copy()
    out[1, 1] += 10  # group 1 at batch index 1
    res = gmm_ref.check(out, p)
    assert res.groups == (1,)
    assert "group 1 (K range [5, 6) at batch index [1], size 1): 12 wrong" in res.message


def _run_reproducer(p: Problem) -> Problem:
    src = gmm_ref.reproducer(p)
    ns: dict = {}
    exec(compile(src, "<reproducer>", "exec"), ns)
    return ns["problem"]


@pytest.mark.parametrize("big", [False, True])
def test_reproducer_rebuilds_the_same_problem(big):
    rng = np.random.default_rng(3)
    m = 704 if big else 8  # 704 * 8 > the inline limit: encoded bytes; megablox needs M % tm == 0
    lhs = rng.standard_normal((m, 8)).astype(ml_dtypes.bfloat16)
    lhs[0, 0] = np.nan
    lhs[1, 1] = -np.inf
    rhs = rng.standard_normal((2, 3, 8)).astype(ml_dtypes.bfloat16)
    ex = rng.standard_normal((m, 3)).astype(np.float32)
    p = Problem("ragged_m", lhs, rhs, np.array([2, 2]), rhs_transposed=True, tail="undefined",
                out_dtype=np.float32, existing_out=ex, group_offset=0, num_local_groups=2, tiling=(8, 8, 8),
                convention="megablox.gmm")
    q = _run_reproducer(p)
    assert q.describe() == p.describe()
    for f in ("lhs", "rhs", "existing_out", "group_sizes"):
        a, b = getattr(p, f), getattr(q, f)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), f
    ra, rb = gmm_ref.reference(p), gmm_ref.reference(q)
    np.testing.assert_array_equal(ra.exact, rb.exact)
    np.testing.assert_array_equal(ra.mask, rb.mask)
    # and the one in a failure note re-executes too
    out = ra.values.copy()
    out[3, 0] += 1
    _, note = _message(out, p)
    ns: dict = {}
    source = note.split("Reproduce with:\n", 1)[1]
    assert source.startswith("```python\n") and source.endswith("\n```")
    exec(source.removeprefix("```python\n").removesuffix("\n```"), ns)
    assert ns["problem"].describe() == p.describe()


def test_padded_tgmm_reference_compares():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((3, 2), np.float32)
    r = gmm_ref.tgmm(a, b, np.array([1, 0, 2], np.int32), group_offset=1, with_reference=True)
    out = r.values.copy()
    out[2] = np.nan  # the unwritten slot
    assert gmm_ref.check(out, r).ok
    out[0, 0, 0] = 5
    assert gmm_ref.check(out, r).groups == (1,)
