"""The reference against an independent dense formulation, and metamorphic relations.

``dense(problem)`` below is written without gmm_ref's layouts or reference:
it decodes every operand into its logical matrix by index arithmetic, then
computes each family as one einsum over one-hot group masks, and applies the
policies as masks. Inputs are small integers, so every float64 sum is exact
whatever the order and the two must agree bit for bit.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gmm_ref
from gmm_ref import Problem
from gmm_ref.problem import RAGGED_FAMILIES

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


# --------------------------------------------------------------------------- oracle
def _offsets(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros((*sizes.shape[:-1], 1), np.int64), np.cumsum(sizes, -1)], -1)


def _unpack(mat: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Stored ``[R, T]`` packed matrix (group g a contiguous ``(R, size_g)`` block) -> logical."""
    r_, t_ = mat.shape
    ext = np.append(sizes, t_ - sizes.sum())  # the tail as one more block
    off = np.concatenate([[0], np.cumsum(ext)])
    r, t = np.indices((r_, t_))
    g = np.searchsorted(off[1:], t, side="right")
    return mat.reshape(-1)[r_ * off[g] + r * ext[g] + (t - off[g])]


def _logical(p: Problem, which: str) -> np.ndarray:
    """The operand as a float64 logical ``[..., rows, cols]`` array ((M, K) or (K, N))."""
    x = (p.lhs if which == "lhs" else p.rhs).astype(np.float64)
    ragged_last = p.ragged_last(which)
    if p.packed and ragged_last:
        x = x.copy()
        for bi in np.ndindex(*p.batch_shape):
            x[bi] = _unpack(x[bi], p.sizes_at(bi))
    if p.lhs_transposed if which == "lhs" else p.rhs_transposed:
        x = np.swapaxes(x, -1, -2)
    return x


def _onehot(p: Problem, extent: int) -> np.ndarray:
    """``[b..., G, T]``: position t of the ragged axis belongs to group g."""
    gs = np.broadcast_to(p.group_sizes, (*p.batch_shape, p.num_groups))
    off = _offsets(gs)
    t = np.arange(extent)
    return (off[..., :-1, None] <= t) & (t < off[..., 1:, None])


def dense(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """(values in float64/int64 before rounding, defined-mask), independently of gmm_ref."""
    lhs, rhs = _logical(p, "lhs"), _logical(p, "rhs")
    nb, g0, nl = p.batch_ndim, p.group_offset, p.num_local_groups
    local = np.zeros(p.num_groups, bool)
    local[g0:g0 + nl] = True
    ex = None if p.existing_out is None else p.existing_out.astype(np.float64)
    acc = ex is not None and p.existing_policy == "accumulate"
    if p.family in ("ragged_m", "ragged_n"):
        t_ = p.ragged_extent
        oh = _onehot(p, t_).astype(np.float64)
        full = np.zeros((p.num_groups, *(lhs if p.family == "ragged_n" else rhs).shape[1:]))
        full[g0:g0 + nl] = lhs if p.family == "ragged_n" else rhs
        full = np.moveaxis(full, 0, nb)  # [b..., G, ., .]
        if p.family == "ragged_m":
            out = np.einsum("...gt,...tk,...gkn->...tn", oh, lhs, full)
        else:
            out = np.einsum("...gt,...gmk,...kt->...mt", oh, full, rhs)
        computed = (oh * local[:, None]).sum(-2) > 0  # [b..., T]
        in_group = oh.sum(-2) > 0
        axis_mask = computed.copy()
        if p.foreign == "zero":
            axis_mask |= in_group & ~computed
        if p.tail == "zero":
            axis_mask |= ~in_group
        sl = (..., slice(None), None) if p.family == "ragged_m" else (..., None, slice(None))
        computed_e = np.broadcast_to(computed[sl], out.shape)
        mask = np.broadcast_to(axis_mask[sl], out.shape).copy()
        if ex is not None:
            mask[...] = True
            out = ex + np.where(computed_e, out, 0) if acc else np.where(computed_e, out, ex)
        return _wide(p, out), mask
    if p.family == "batch":
        out = np.einsum("g...mk,g...kn->g...mn", lhs, rhs)
        return _wide(p, ex + out if acc else out), np.ones(p.out_shape, bool)
    # ragged_k
    oh = _onehot(p, p.k).astype(np.float64)[..., g0:g0 + nl, :]  # [b..., L, T]
    out = np.moveaxis(np.einsum("...gt,...mt,...tn->...gmn", oh, lhs, rhs), nb, 0)
    empty = np.moveaxis(oh.sum(-1) == 0, nb, 0)[..., None, None]  # [L, b..., 1, 1]
    empty = np.broadcast_to(empty, out.shape)
    mask = np.ones(out.shape, bool)
    if ex is not None:
        res = ex + out if acc else np.where(empty, 0.0 if p.empty == "zero" else ex, out)
        if p.empty in ("untouched",) or acc:
            res = np.where(empty, ex, res)
    else:
        res = out
        if p.empty == "untouched":
            mask &= ~empty
    if p.empty == "undefined":
        mask &= ~empty
    return _wide(p, res), mask


def _wide(p: Problem, x: np.ndarray) -> np.ndarray:
    return x.astype(np.int64) if np.issubdtype(p.lhs.dtype, np.integer) else x


def assert_agrees_with_dense(p: Problem) -> None:
    """The oracle check used here and against the broken variants in test_reference_mutants."""
    ref = gmm_ref.reference(p)
    want, want_mask = dense(p)
    assert ref.exact.shape == want.shape == p.out_shape, (ref.exact.shape, want.shape)
    np.testing.assert_array_equal(ref.mask, want_mask, err_msg=f"mask differs on {p!r}")
    np.testing.assert_array_equal(np.where(want_mask, ref.exact, 0), np.where(want_mask, want, 0),
                                  err_msg=f"values differ on {p!r}")
    vals = ref.values
    assert vals.dtype == p.out_dtype and vals.shape == p.out_shape


# ------------------------------------------------------------------------- problems
def _store(logical: np.ndarray, sizes_per_batch, batch_shape, transposed: bool, packed_last: bool):
    """Inverse of _logical for one operand: logical [..., R, C] -> stored buffer."""
    x = np.swapaxes(logical, -1, -2) if transposed else logical
    if packed_last:
        x = x.copy()
        for bi in np.ndindex(*batch_shape):
            m = x[bi]
            r_, t_ = m.shape
            sizes = sizes_per_batch(bi)
            ext = np.append(sizes, t_ - sizes.sum())
            off = np.concatenate([[0], np.cumsum(ext)])
            flat = np.concatenate([m[:, off[g]:off[g + 1]].reshape(-1) for g in range(len(ext))])
            x[bi] = flat.reshape(r_, t_)
    return np.ascontiguousarray(x)


@st.composite
def problems(draw, *, families=RAGGED_FAMILIES, dtypes=("float32", "int8", "bfloat16"),
             policies=True, max_groups=4):
    fam = draw(st.sampled_from(families))
    nb = draw(st.integers(0, 1))
    batch = tuple(draw(st.lists(st.integers(1, 2), min_size=nb, max_size=nb)))
    g = draw(st.integers(1 if fam == "batch" else 0, max_groups))
    m, k, n = (draw(st.integers(1, 5)) for _ in range(3))
    lt, rt = draw(st.booleans()), draw(st.booleans())
    name = draw(st.sampled_from(dtypes))
    dt = np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name)
    extent = {"ragged_m": m, "ragged_n": n, "ragged_k": k}.get(fam)
    per_batch = nb and draw(st.booleans())
    sizes = None
    if fam != "batch":
        def one():
            s = draw(st.lists(st.integers(0, extent), min_size=g, max_size=g))
            while sum(s) > extent:
                s[int(np.argmax(s))] -= 1
            return s
        sizes = np.array([one() for _ in range(batch[0])] if per_batch else one(), np.int64).reshape(
            (*batch, g) if per_batch else (g,))
        if draw(st.booleans()) and g and not per_batch:  # often fill the extent exactly
            sizes[-1] += extent - sizes.sum()
    off, nl = 0, g
    if policies and fam in ("ragged_m", "ragged_n", "ragged_k") and draw(st.booleans()):
        off = draw(st.integers(0, g))
        nl = draw(st.integers(0, g - off))
    kw = {}
    if policies:
        kw = dict(tail=draw(st.sampled_from(("zero", "undefined"))),
                  foreign=draw(st.sampled_from(("zero", "undefined"))),
                  empty=draw(st.sampled_from(("zero", "untouched", "undefined"))))
    vals = st.integers(-4, 4)

    def arr(shape):
        return np.array(draw(st.lists(vals, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
                        np.float64).reshape(shape)

    grp_l, grp_r = fam in ("ragged_n", "batch"), fam in ("ragged_m", "batch")
    gl = (nl if fam == "ragged_n" else g,) if grp_l else ()
    gr = (nl if fam == "ragged_m" else g,) if grp_r else ()
    lhs_log, rhs_log = arr((*gl, *batch, m, k)), arr((*gr, *batch, k, n))
    packed = False
    probe = Problem(fam, np.zeros((*gl, *batch, *((k, m) if lt else (m, k))), dt),
                    np.zeros((*gr, *batch, *((n, k) if rt else (k, n))), dt), sizes,
                    lhs_transposed=lt, rhs_transposed=rt, batch_ndim=nb, group_offset=off,
                    num_local_groups=nl if fam != "batch" else None)
    if any(probe.ragged_last(o) for o in ("lhs", "rhs")):
        packed = draw(st.booleans())

    def stored(logical, which, transposed):
        return _store(logical, probe.sizes_at, batch, transposed, packed and probe.ragged_last(which)).astype(dt)

    lhs, rhs = stored(lhs_log, "lhs", lt), stored(rhs_log, "rhs", rt)
    p = Problem(fam, lhs, rhs, sizes, lhs_transposed=lt, rhs_transposed=rt, packed=packed, batch_ndim=nb,
                group_offset=off, num_local_groups=nl if fam != "batch" else None, **kw)
    if policies and draw(st.booleans()):
        ex = arr(p.out_shape).astype(p.out_dtype)
        p = p.replace(existing_out=ex, existing_policy=draw(st.sampled_from(("overwrite", "accumulate"))))
    return p


# ---------------------------------------------------------------------------- tests
@SETTINGS
@given(problems())
def test_reference_matches_dense_formulation(p):
    assert_agrees_with_dense(p)


@pytest.mark.parametrize("family", RAGGED_FAMILIES)
@settings(max_examples=15, deadline=None, derandomize=True)
@given(data=st.data())
def test_each_family_matches_dense(family, data):
    assert_agrees_with_dense(data.draw(problems(families=(family,))))


@SETTINGS
@given(problems(policies=False, dtypes=("float32",)), st.sampled_from(gmm_ref.conventions.names()))
def test_convention_arguments_round_trip(p, conv):
    """Problem -> a kernel's own arguments -> that convention's front-end -> the same reference."""
    if (p.family != "batch" and conv == "megablox.gmm") or conv == "torch.grouped_mm":
        p = p.replace(tail="undefined")
    p = p.replace(convention=conv)
    convention = gmm_ref.conventions.get(conv)
    if convention.refusal(p):
        return
    args, kwargs = gmm_ref.arguments(p)
    q = gmm_ref.problem_from_arguments(conv, *args, **kwargs)
    ref_q = convention.reference(*args, **kwargs)
    want, want_mask = dense(p)
    np.testing.assert_array_equal(ref_q.mask, want_mask)
    np.testing.assert_array_equal(np.where(want_mask, ref_q.exact, 0), np.where(want_mask, want, 0))
    assert q.out_dtype == p.out_dtype


def test_front_ends_by_hand():
    """Each front-end on a hand-checked example (sizes [1, 0, 2], one tail row)."""
    lhs = np.arange(8, dtype=np.float32).reshape(4, 2)  # rows 0..3
    rhs = np.stack([np.eye(2), 2 * np.eye(2), 3 * np.eye(2)]).astype(np.float32)
    gs = np.array([1, 0, 2], np.int32)
    want = np.array([[0, 1], [6, 9], [12, 15], [0, 0]], np.float32)
    np.testing.assert_array_equal(gmm_ref.ragged_dot(lhs, rhs, gs), want)
    r = gmm_ref.gmm(lhs, rhs, gs, with_reference=True)
    np.testing.assert_array_equal(r.values[:3], want[:3])
    assert r.mask[:3].all() and not r.mask[3].any()  # megablox never writes the tail
    t = gmm_ref.grouped_mm(lhs, rhs, np.cumsum(gs).astype(np.int32), with_reference=True)
    np.testing.assert_array_equal(t.values[t.mask], want[:3].ravel())
    te = gmm_ref.te_grouped_gemm(lhs, rhs, lhs_first_dims=gs)
    np.testing.assert_array_equal(te, want)
    # tgmm: lhs [M, sum K] x rhs [sum K, N] -> [G, M, N], empty group zero
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((3, 2), np.float32)
    out = gmm_ref.tgmm(a, b, np.array([1, 0, 2], np.int32))
    np.testing.assert_array_equal(out, [[[0, 0], [3, 3]], [[0, 0], [0, 0]], [[3, 3], [9, 9]]])
    # tgmm with group_offset and no num_actual_groups: G slots, the trailing one unwritten
    r = gmm_ref.tgmm(a, b, np.array([1, 0, 2], np.int32), group_offset=1, with_reference=True)
    assert r.exact.shape == (3, 2, 2) and not r.mask[2].any() and r.mask[:2].all()
    np.testing.assert_array_equal(r.values[:2], [[[0, 0], [0, 0]], [[3, 3], [9, 9]]])
    assert gmm_ref.check(r.values, r).ok  # the padded slots do not break comparison


# ---------------------------------------------------------------------- metamorphic
def _rm(lhs, rhs, sizes, **kw):
    return gmm_ref.reference(Problem("ragged_m", lhs, rhs, np.array(sizes), **kw))


int_arrays = st.integers(1, 4).flatmap(lambda k: st.tuples(
    st.lists(st.integers(0, 4), min_size=1, max_size=4),
    st.just(k), st.integers(1, 4), st.integers(0, 2**32 - 1)))


def _normal_operands(spec, tail_rows):
    """(sizes, lhs [sum + tail_rows, K], rhs [G, K, N]) of normal float32 values."""
    sizes, k, n, seed = spec
    rng = np.random.default_rng(seed)
    lhs = rng.standard_normal((sum(sizes) + tail_rows, k)).astype(np.float32)
    return sizes, lhs, rng.standard_normal((len(sizes), k, n)).astype(np.float32)


@SETTINGS
@given(int_arrays, st.data())
def test_splitting_a_group_with_the_same_weights(spec, data):
    sizes, lhs, rhs = _normal_operands(spec, 1)
    g = data.draw(st.integers(0, len(sizes) - 1))
    cut = data.draw(st.integers(0, sizes[g]))
    sizes2 = [*sizes[:g], cut, sizes[g] - cut, *sizes[g + 1:]]
    rhs2 = np.concatenate([rhs[:g + 1], rhs[g:]])
    a, b = _rm(lhs, rhs, sizes), _rm(lhs, rhs2, sizes2)
    np.testing.assert_array_equal(a.exact, b.exact)
    np.testing.assert_array_equal(a.mask, b.mask)


@SETTINGS
@given(int_arrays, st.randoms(use_true_random=False))
def test_permuting_groups_with_their_weights(spec, rnd):
    sizes, lhs, rhs = _normal_operands(spec, 2)
    m = lhs.shape[0]
    perm = list(range(len(sizes)))
    rnd.shuffle(perm)
    off = np.concatenate([[0], np.cumsum(sizes)])
    rows = np.concatenate([np.arange(off[g], off[g + 1]) for g in perm] + [np.arange(off[-1], m)]).astype(int)
    a = _rm(lhs, rhs, sizes)
    b = _rm(lhs[rows], rhs[perm], [sizes[g] for g in perm])
    np.testing.assert_array_equal(a.exact[rows], b.exact)


@SETTINGS
@given(int_arrays)
def test_ragged_m_is_ragged_n_transposed(spec):
    """Integer inputs: float64 sums of them are exact, so A @ B and (B^T @ A^T)^T agree bit for bit
    (for general floats BLAS may sum the two in different orders)."""
    sizes, k, n, seed = spec
    rng = np.random.default_rng(seed)
    m = sum(sizes) + 1
    lhs = rng.integers(-64, 65, (m, k)).astype(np.float32)
    rhs = rng.integers(-64, 65, (len(sizes), k, n)).astype(np.float32)
    a = _rm(lhs, rhs, sizes)
    b = gmm_ref.reference(Problem("ragged_n", np.ascontiguousarray(rhs.transpose(0, 2, 1)), np.ascontiguousarray(lhs.T),
                np.array(sizes)))
    np.testing.assert_array_equal(a.exact, b.exact.T)
    np.testing.assert_array_equal(a.values, b.values.T)


@SETTINGS
@given(problems(policies=False, dtypes=("float32",)), st.integers(-3, 3))
def test_linearity(p, c):
    """ref(c*A + A') = c*ref(A) + ref(A') exactly (small integers: exact sums)."""
    other = np.roll(p.lhs, 1).astype(np.float32)
    sum_ = p.replace(lhs=(c * p.lhs.astype(np.float64) + other).astype(np.float32))
    r, r1, r2 = gmm_ref.reference(sum_), gmm_ref.reference(p), gmm_ref.reference(p.replace(lhs=other))
    np.testing.assert_array_equal(np.where(r.mask, r.exact, 0), np.where(r.mask, c * r1.exact + r2.exact, 0))


@pytest.mark.parametrize("family", ["ragged_m", "ragged_n", "ragged_k"])
def test_empty_groups_give_exact_zeros(family):
    rng = np.random.default_rng(0)
    big = np.float32(3e38)
    m = k = n = 4
    sizes = np.array([0, 4, 0])
    shapes = {"ragged_m": ((m, k), (3, k, n)), "ragged_n": ((3, m, k), (k, n)), "ragged_k": ((m, k), (k, n))}
    lhs, rhs = (np.full(s, big, np.float32) for s in shapes[family])
    if family != "ragged_k":  # the empty groups' weights are huge and NaN; nothing may leak
        (rhs if family == "ragged_m" else lhs)[[0, 2]] = np.nan
        (lhs if family == "ragged_m" else rhs)[...] = rng.standard_normal(lhs.shape if family == "ragged_m"
                                                                          else rhs.shape)
    ref = gmm_ref.reference(Problem(family, lhs, rhs, sizes))
    if family == "ragged_k":
        assert np.array_equal(ref.exact[[0, 2]], np.zeros((2, m, n))) and not np.signbit(ref.exact[[0, 2]]).any()
    assert np.isfinite(ref.exact).all() or family == "ragged_k"


def test_poisoned_padding_never_reaches_the_output():
    """NaN/Inf in rows, columns or K-slices of no group (tail, foreign shard) stay out."""
    rng = np.random.default_rng(1)
    lhs = rng.standard_normal((7, 3)).astype(np.float32)
    lhs[5:] = np.nan  # tail rows
    lhs[0] = np.inf   # rows of group 0, outside the shard
    rhs = rng.standard_normal((2, 3, 4)).astype(np.float32)
    p = Problem("ragged_m", lhs, rhs, np.array([1, 2, 2]), group_offset=1, num_local_groups=2)
    ref = gmm_ref.reference(p)
    assert np.isfinite(ref.exact).all() and np.isfinite(ref.values[ref.mask]).all()
    # ragged K: NaN in K columns past sum(sizes), both operands, strided and packed
    for packed in (False, True):
        a = rng.standard_normal((3, 6)).astype(np.float32)
        b = rng.standard_normal((6, 2)).astype(np.float32)
        if packed:
            a.reshape(-1)[3 * 4:] = np.nan  # past the packed (3, 1) and (3, 3) blocks
        else:
            a[:, 4:] = np.nan
        b[4:] = np.nan
        r = gmm_ref.reference(Problem("ragged_k", a, b, np.array([1, 3]), packed=packed))
        assert np.isfinite(r.exact).all()


def test_nan_and_inf_propagate_within_a_group():
    lhs = np.array([[np.inf, 1.0], [1.0, 1.0]], np.float32)
    rhs = np.array([[[0.0], [1.0]], [[1.0], [np.nan]]], np.float32)
    ref = gmm_ref.reference(Problem("ragged_m", lhs, rhs, np.array([1, 1])))
    assert np.isnan(ref.exact).all()  # inf * 0 and x * nan


# ------------------------------------------------------------------------ exact mode
@SETTINGS
@given(problems(policies=False, dtypes=("float32", "bfloat16")), st.randoms(use_true_random=False))
def test_exact_mode_any_summation_order_is_bit_identical(p, rnd):
    """Small-integer inputs: bound 0, and a float32 sum in any order equals ref.values bit for bit."""
    ref = gmm_ref.reference(p)
    assert not ref.bound()[ref.mask].any()
    got = np.zeros(ref.exact.shape, np.float32)
    for _, blk in enumerate(gmm_ref.layouts.blocks(p)):
        a, b = blk.a.astype(np.float32), blk.b.astype(np.float32)
        order = list(range(blk.k))
        rnd.shuffle(order)
        acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for kk in order:
            acc = (acc + a[:, kk:kk + 1] * b[kk:kk + 1, :]).astype(np.float32)
        got[blk.out_index] = acc
    assert gmm_ref.check(got.astype(p.out_dtype), ref).ok or not ref.mask.any() or \
        np.array_equal(got[ref.mask].astype(p.out_dtype), ref.values[ref.mask])
    np.testing.assert_array_equal(got[ref.mask].astype(p.out_dtype), ref.values[ref.mask])


def test_import_gmm_ref_needs_only_numpy_and_ml_dtypes():
    import subprocess
    import sys

    code = ("import sys, gmm_ref, gmm_kernels; "
            "heavy = [m for m in ('jax', 'torch', 'hypothesis', 'pytest') if m in sys.modules]; "
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("family", ["ragged_m", "ragged_n", "ragged_k", "batch"])
def test_threaded_products_equal_serial_ones(monkeypatch, family):
    """The multi-threaded path (large problems) gives the serial path's answer."""
    pytest.importorskip("threadpoolctl")
    from gmm_ref import exact as ref_mod

    rng = np.random.default_rng(7)
    g, m, k, n = 6, 40, 24, 16
    sizes = np.array([0, 9, 1, 17, 0, 13])
    shapes = {"ragged_m": ((m, k), (g, k, n)), "ragged_n": ((g, m, k), (k, 40)),
              "ragged_k": ((m, 40), (40, n)), "batch": ((g, m, k), (g, k, n))}[family]
    lhs = rng.integers(-3, 4, shapes[0]).astype(np.float32)
    rhs = rng.integers(-3, 4, shapes[1]).astype(np.float32)
    p = gmm_ref.Problem(family, lhs, rhs, None if family == "batch" else sizes)
    serial = gmm_ref.reference(p).exact
    monkeypatch.setattr(ref_mod, "PARALLEL_MIN_MACS", 0)
    threaded = gmm_ref.reference(p).exact
    np.testing.assert_array_equal(threaded, serial)
