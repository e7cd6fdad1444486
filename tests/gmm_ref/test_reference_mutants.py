"""The oracle tests have teeth: each check rejects a deliberately broken reference.

Every test here monkeypatches one small bug into gmm_ref (boundary off by one,
double rounding, a bound without its K factor, a mask that ignores a policy,
...) and asserts that the corresponding check of the suite fails on it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

import gmm_ref
import gmm_ref.dtypes
import gmm_ref.exact
import gmm_ref.layouts
import gmm_ref.numerics
from gmm_ref import Numerics, Problem

from .test_reference import assert_agrees_with_dense, problems
from .test_reference_numerics import BF16, kernel, random_problem

FIND = settings(max_examples=300, deadline=None, derandomize=True, database=None)


def _some_problem_fails(check, strategy=None) -> bool:
    def fails(p):
        try:
            check(p)
        except AssertionError:
            return True
        return False
    try:
        find(strategy or problems(), fails, settings=FIND)
        return True
    except NoSuchExample:
        return False


def test_sound_reference_passes_the_dense_check():
    assert not _some_problem_fails(assert_agrees_with_dense)


def test_boundary_off_by_one_is_caught(monkeypatch):
    real = gmm_ref.layouts._ragged_slice

    def off_by_one(mat, axis, start, size, packed):
        return real(mat, axis, start, size + (1 if start + size < mat.shape[axis] else 0), packed)[..., :size] \
            if axis == 1 and not packed else real(mat, axis, max(0, start - (start > 0)), size, packed)

    monkeypatch.setattr(gmm_ref.layouts, "_ragged_slice", off_by_one)
    assert _some_problem_fails(assert_agrees_with_dense)


def test_packed_read_as_strided_is_caught(monkeypatch):
    real = gmm_ref.layouts._ragged_slice
    monkeypatch.setattr(gmm_ref.layouts, "_ragged_slice", lambda m, a, s, z, packed: real(m, a, s, z, False))
    assert _some_problem_fails(assert_agrees_with_dense)


def test_mask_ignoring_tail_policy_is_caught(monkeypatch):
    monkeypatch.setattr(gmm_ref.exact, "_undefine_outside", lambda p, mask: None)
    assert _some_problem_fails(assert_agrees_with_dense)


def test_empty_policy_ignored_is_caught(monkeypatch):
    real = gmm_ref.exact.reference

    def compute(p):
        return real(p.replace(empty="zero")) if p.family == "ragged_k" else real(p)

    monkeypatch.setattr(gmm_ref, "reference", compute)
    assert _some_problem_fails(assert_agrees_with_dense)


def test_sharding_ignored_is_caught(monkeypatch):
    real = gmm_ref.layouts.blocks

    def blocks(p):  # local slot i taken as group i instead of group_offset + i
        for blk in real(p):
            blk.group = blk.local
            yield blk

    monkeypatch.setattr(gmm_ref.layouts, "blocks", blocks)
    real_off = Problem.offsets_at
    monkeypatch.setattr(Problem, "local_groups", property(lambda self: range(self.num_local_groups)))
    assert _some_problem_fails(assert_agrees_with_dense)
    assert real_off is Problem.offsets_at


def test_accumulate_treated_as_overwrite_is_caught(monkeypatch):
    real = gmm_ref.exact.reference
    monkeypatch.setattr(gmm_ref, "reference",
                        lambda p: real(p.replace(existing_policy="overwrite") if p.existing_out is not None else p))
    assert _some_problem_fails(assert_agrees_with_dense)


# ------------------------------------------------------------------- rounding
def _single_rounding_check() -> None:
    p = Problem("ragged_m", np.array([[1.0, 2**-8, 2**-30]]), np.ones((1, 3, 1)), np.array([1]),
                out_dtype=ml_dtypes.bfloat16)
    got = gmm_ref.reference(p).values.astype(np.float64)[0, 0]
    assert got == 1.0078125, got


def test_single_rounding_check_passes():
    _single_rounding_check()


def test_double_rounding_via_ml_dtypes_is_caught(monkeypatch):
    monkeypatch.setattr(gmm_ref.dtypes, "round_to", lambda x, dtype: np.asarray(x).astype(dtype))
    with pytest.raises(AssertionError):
        _single_rounding_check()


# ---------------------------------------------------------------------- bound
def _float32_orders_pass(seeds=range(3)) -> None:
    """Positive inputs summed one by one in float32: the error grows with K (the bound must too)."""
    for seed in seeds:
        rng = np.random.default_rng(seed)
        k = 2048
        p = Problem("ragged_m", rng.uniform(0, 1, (4, k)).astype(np.float32),
                    rng.uniform(0, 1, (1, k, 4)).astype(np.float32), np.array([4]))
        res = gmm_ref.check(kernel(p, order="random", rng=rng), p)
        assert res.ok, res.message
        p = random_problem(rng, "ragged_m", 300)
        res = gmm_ref.check(kernel(p, order="blocked32", rng=rng), p)
        assert res.ok, res.message


def test_bound_checks_pass_with_the_real_bound():
    _float32_orders_pass()
    from .test_reference_numerics import assert_bf16_partial_sums_rejected
    assert_bf16_partial_sums_rejected(0)


def test_bound_missing_the_k_factor_is_caught(monkeypatch):
    real = gmm_ref.numerics.gamma
    monkeypatch.setattr(gmm_ref.numerics, "gamma", lambda k, u: real(1, u))
    with pytest.raises(AssertionError):
        _float32_orders_pass()


def test_bound_far_too_loose_is_caught(monkeypatch):
    real = gmm_ref.numerics.gamma
    monkeypatch.setattr(gmm_ref.numerics, "gamma", lambda k, u: real(k, u) * 2**20)
    from .test_reference_numerics import assert_bf16_partial_sums_rejected
    with pytest.raises(AssertionError):
        assert_bf16_partial_sums_rejected(0)


def test_bound_ignoring_declared_multiply_is_caught(monkeypatch):
    monkeypatch.setattr(Numerics, "u_in", lambda self, *dts: 0.0)
    rng = np.random.default_rng(0)
    p = random_problem(rng, "ragged_m", 128)
    out = kernel(p, order="random", rng=rng, multiply=BF16, fma=True)
    assert not gmm_ref.check(out, p, numerics=Numerics(multiply=BF16)).ok


