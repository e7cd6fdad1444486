"""Reverse-mode gradients of real kernels against ``gmm_ref.gradients``.

megablox ``ops.gmm`` (its custom VJP: w.r.t. lhs, rhs and existing_out) and
``jax.lax.ragged_dot`` (mode 1), over a few Hypothesis examples in fixed shape
buckets (interpreted Pallas compiles about 1 s per shape). megablox's gradient
w.r.t. ``existing_out`` is wrong upstream: a strict xfail, and a passing test
shows the harness names the overwritten rows' groups.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gmm_ref
from gmm_kernels.adapters.megablox import MegabloxGmm
from gmm_kernels.adapters.ragged_dot import JaxRaggedDot
from gmm_ref.gradients import gradients
from property_tests import strategies as gst

pytest.importorskip("jax")

M, K, N, G = 32, 16, 24, 4
TILING = (8, 8, 8)
EXAMPLES = settings(max_examples=6, deadline=None)
MEGABLOX = MegabloxGmm()
RAGGED_DOT = JaxRaggedDot()

MEGABLOX_EXISTING_OUT_BUG = MEGABLOX.known_gradient_issue("existing_out")


def _values(rng: np.random.Generator, shape, dtype, kind: str) -> np.ndarray:
    if kind == "exact":  # small integers: every gradient is exact, so bit for bit
        return rng.integers(-2, 3, size=shape).astype(np.float32).astype(dtype)
    return rng.standard_normal(size=shape, dtype=np.float32).astype(dtype)


@st.composite
def problems_and_cotangents(draw, *, convention: str, dtype=np.float32, transpose_rhs: bool = False,
                            shards: int = 1, existing: bool = False):
    """(problem, cotangent) in one fixed shape bucket; sizes, shard, values and cotangent vary.

    Shrinks towards the first shard, sizes of 0 and exact (small-integer) values.
    """
    sizes = draw(gst.group_sizes(num_groups=G, extent=M, tile=TILING[0]))
    local = G // shards
    offset = draw(st.integers(0, shards - 1)) * local
    kind = draw(st.sampled_from(("exact", "normal")))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dt = np.dtype(dtype)
    lhs = _values(rng, (M, K), dt, kind)
    rhs = _values(rng, (local, N, K) if transpose_rhs else (local, K, N), dt, kind)
    megablox = convention == "megablox.gmm"
    p = gmm_ref.Problem(
        "ragged_m", lhs, rhs, np.asarray(sizes), rhs_transposed=transpose_rhs, out_dtype=dt,
        tail="undefined" if megablox else "zero", group_offset=offset, num_local_groups=local,
        existing_out=_values(rng, (M, N), dt, kind) if existing else None,
        convention=convention, tiling=TILING if megablox else None,
    )
    return p, _values(rng, (M, N), dt, kind)


def _check_all(adapter, problem, cotangent, wrt=("lhs", "rhs")):
    __tracebackhide__ = True
    got = adapter.vjp(problem, cotangent)
    grads = gradients(problem, cotangent)
    for name in wrt:
        gp = grads[name]
        gmm_ref.assert_matches_reference(got[name], gp, numerics=adapter.numerics_for(gp),
                                         kernel=f"{adapter.name} d{name}")


# ------------------------------------------------------------------ megablox
@pytest.mark.parametrize(
    ("dtype", "transpose_rhs", "shards"),
    [(np.float32, False, 1), (np.float32, True, 1), (np.float32, False, 2), ("bfloat16", False, 1)],
    ids=["f32", "f32-transpose_rhs", "f32-sharded", "bf16"],
)
def test_megablox_vjp_lhs_rhs(dtype, transpose_rhs, shards):
    dtype = gmm_ref.round_to(np.zeros(1), dtype).dtype if isinstance(dtype, str) else dtype

    @EXAMPLES
    @given(pc=problems_and_cotangents(convention="megablox.gmm", dtype=dtype,
                                      transpose_rhs=transpose_rhs, shards=shards))
    def prop(pc):
        _check_all(MEGABLOX, *pc)

    prop()


def test_megablox_vjp_lhs_rhs_with_existing_out():
    @EXAMPLES
    @given(pc=problems_and_cotangents(convention="megablox.gmm", shards=2, existing=True))
    def prop(pc):
        _check_all(MEGABLOX, *pc)

    prop()


@pytest.mark.xfail(MEGABLOX_EXISTING_OUT_BUG is not None, strict=True, raises=gmm_ref.Mismatch,
                   reason=MEGABLOX_EXISTING_OUT_BUG or "")
def test_megablox_vjp_existing_out():
    @EXAMPLES
    @given(pc=problems_and_cotangents(convention="megablox.gmm", shards=2, existing=True))
    def prop(pc):
        _check_all(MEGABLOX, *pc, wrt=("existing_out",))

    prop()


def _fixed_existing_problem() -> tuple[gmm_ref.Problem, np.ndarray]:
    """Shard 1 of 2 (groups 2, 3), a tail: rows [0, 13) foreign, [13, 21) group 2, [21, 24) group 3."""
    rng = np.random.default_rng(0)
    sizes = np.array([5, 8, 8, 3], np.int32)
    p = gmm_ref.Problem(
        "ragged_m", _values(rng, (M, K), np.float32, "exact"), _values(rng, (2, K, N), np.float32, "exact"),
        sizes, out_dtype=np.float32, tail="undefined", group_offset=2, num_local_groups=2,
        existing_out=_values(rng, (M, N), np.float32, "exact"), convention="megablox.gmm", tiling=TILING,
    )
    return p, rng.integers(1, 4, size=(M, N)).astype(np.float32)  # no zero in the cotangent


def test_harness_catches_megablox_existing_out_bug():
    p, dout = _fixed_existing_problem()
    got = MEGABLOX.vjp(p, dout)["existing_out"]
    np.testing.assert_array_equal(got, dout)  # the bug: the cotangent, untouched
    ref = gradients(p, dout).existing_out
    with pytest.raises(gmm_ref.Mismatch) as info:
        gmm_ref.assert_matches_reference(got, ref, kernel="megablox.gmm dexisting_out")
    assert info.value.groups == (2, 3), "exactly the overwritten rows' groups are named"
    msg = str(info.value)
    assert "Mismatched elements: 264 / 768 defined" in msg  # 11 overwritten rows x 24
    assert "group 2 (rows [13, 21), size 8): 192 wrong" in msg
    assert "group 3 (rows [21, 24), size 3): 72 wrong" in msg
    assert "bit-for-bit" in msg
    # the rows megablox keeps (foreign groups 0, 1 and the tail) pass through correctly
    fixed = got.copy()
    fixed[13:24] = 0
    gmm_ref.assert_matches_reference(fixed, ref)


def test_harness_rejects_broken_gradients():
    """Each gradient check fails on a deliberately broken backward pass."""
    p, dout = _fixed_existing_problem()
    grads = gradients(p, dout)
    good = MEGABLOX.vjp(p, dout)
    gmm_ref.assert_matches_reference(good["lhs"], grads.lhs, kernel="dlhs")
    gmm_ref.assert_matches_reference(good["rhs"], grads.rhs, kernel="drhs")
    # d existing_out forgetting the pass-through rows: foreign groups 0, 1 and the tail are named
    with pytest.raises(gmm_ref.Mismatch) as info:
        gmm_ref.assert_matches_reference(np.zeros_like(dout), grads.existing_out)
    assert info.value.groups == (-1, 0, 1)
    # drhs with the local groups swapped
    with pytest.raises(gmm_ref.Mismatch) as info:
        gmm_ref.assert_matches_reference(good["rhs"][::-1], grads.rhs)
    assert set(info.value.groups) == {2, 3}
    # dlhs of a kernel whose group boundary is one row late (group 2 loses its first row)
    late = p.replace(group_sizes=np.array([5, 9, 7, 3]))
    with pytest.raises(gmm_ref.Mismatch) as info:
        gmm_ref.assert_matches_reference(MEGABLOX.vjp(late, dout)["lhs"], grads.lhs)
    assert info.value.groups == (2,)
    assert "group 2 (rows [13, 21), size 8): 14 wrong" in str(info.value)  # row 13 (2 true zeros)


# ---------------------------------------------------------------- lax.ragged_dot
@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_ragged_dot_vjp(dtype):
    dtype = gmm_ref.round_to(np.zeros(1), dtype).dtype if isinstance(dtype, str) else dtype

    @EXAMPLES
    @given(pc=problems_and_cotangents(convention="ragged_dot", dtype=dtype))
    def prop(pc):
        _check_all(RAGGED_DOT, *pc)

    prop()


def test_ragged_dot_vjp_broken_is_rejected():
    """lax's VJP with the sizes of a kernel that drops each group's last row is rejected."""
    p, dout = _fixed_existing_problem()
    p = gmm_ref.Problem("ragged_m", p.lhs, np.concatenate([p.rhs, p.rhs[::-1]]), p.group_sizes,
                        out_dtype=np.float32, convention="ragged_dot")
    grads = gradients(p, dout)
    gmm_ref.assert_matches_reference(RAGGED_DOT.vjp(p, dout)["lhs"], grads.lhs)
    short = p.replace(group_sizes=np.array([4, 8, 8, 3]))
    got = RAGGED_DOT.vjp(short, dout)
    with pytest.raises(gmm_ref.Mismatch) as info:
        gmm_ref.assert_matches_reference(got["lhs"], grads.lhs)
    assert info.value.groups[:1] == (0,)
    with pytest.raises(gmm_ref.Mismatch):
        gmm_ref.assert_matches_reference(got["rhs"], grads.rhs)


# ---------------------------------------------------------------- a signature without a gradient
def test_a_signature_without_a_jax_gradient_is_declined_at_once_the_next_time():
    """jax decides at trace time, from shapes, dtypes and static arguments: a signature found without a
    gradient is declined again without tracing; another signature is still tried, and a gradient that
    exists is still taken (and checked)."""
    import jax
    from jax import lax

    from gmm_kernels.sandbox import autodiff
    from gmm_ref.conventions import get as get_convention

    traced = []

    @jax.custom_vjp
    def odd_k_has_no_gradient(lhs, rhs, gs):
        return lax.ragged_dot(lhs, rhs, gs)

    def fwd(lhs, rhs, gs):
        traced.append(lhs.shape)
        if lhs.shape[1] % 2:
            raise NotImplementedError("no gradient for an odd K")
        return lax.ragged_dot(lhs, rhs, gs), (lhs, rhs, gs)

    def bwd(res, ct):
        lhs, rhs, gs = res
        _, pullback = jax.vjp(lambda a, b: lax.ragged_dot(a, b, gs), lhs, rhs)
        return (*pullback(ct), None)

    odd_k_has_no_gradient.defvjp(fwd, bwd)
    spec = get_convention("ragged_dot")
    rng = np.random.default_rng(0)

    def attempt(k, sizes):
        lhs, rhs = rng.standard_normal((6, k)).astype(np.float32), rng.standard_normal((2, k, 3)).astype(np.float32)
        p = gmm_ref.Problem("ragged_m", lhs, rhs, np.array(sizes), out_dtype=np.float32, convention="ragged_dot")
        ct = rng.standard_normal((6, 3)).astype(np.float32)
        got = autodiff.vjp(odd_k_has_no_gradient, spec, (lhs, rhs, np.array(sizes, np.int32)), {}, ct, name="odd")
        gmm_ref.assert_matches_reference(got["lhs"], gradients(p, ct).lhs)

    for sizes in ([3, 3], [6, 0]):
        with pytest.raises(NotImplementedError, match="odd: no jax gradient: no gradient for an odd K"):
            attempt(5, sizes)
    assert traced == [(6, 5)]  # the second size vector of the same signature was not traced again
    attempt(4, [2, 4])
    assert traced == [(6, 5), (6, 4)]
    with pytest.raises(NotImplementedError):
        attempt(7, [1, 5])
    assert traced[-1] == (6, 7)
