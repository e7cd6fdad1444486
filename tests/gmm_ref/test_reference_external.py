"""The reference against the public implementations: jax.lax.ragged_dot_general in float64
on CPU (all three modes, batch dims, non-canonical dimension orders) and torch._grouped_mm
on CPU (its four forms). Small-integer inputs: exact sums, so agreement is bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gmm_ref

SET = settings(max_examples=25, deadline=None, derandomize=True)


def _ints(rng, shape, dtype=np.float64):
    return rng.integers(-4, 5, shape).astype(dtype)


@st.composite
def rdg_cases(draw):
    """(lhs, rhs, group_sizes, dimension numbers): a random axis order for every operand."""
    mode = draw(st.sampled_from([1, 2, 3]))
    nb = draw(st.integers(0 if mode != 3 else 1, 2))
    b = [draw(st.integers(1, 2)) for _ in range(nb)]
    m, k, n, g = (draw(st.integers(1, 4)) for _ in range(4))
    if mode == 3:
        g = b[0]
    # lhs logical axes: batch..., m, k; rhs: [group], batch..., k, n
    l_axes = [("b", i) for i in range(nb)] + [("m", 0), ("k", 0)]
    r_axes = ([("g", 0)] if mode == 1 else []) + [("b", i) for i in range(nb)] + [("k", 0), ("n", 0)]
    lp = draw(st.permutations(range(len(l_axes))))
    rp = draw(st.permutations(range(len(r_axes))))
    ext = {"b": b, "m": [m], "k": [k], "n": [n], "g": [g]}
    l_order = [l_axes[i] for i in lp]
    r_order = [r_axes[i] for i in rp]
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lhs = _ints(rng, [ext[a][i] for a, i in l_order])
    rhs = _ints(rng, [ext[a][i] for a, i in r_order])
    pos_l = {ax: j for j, ax in enumerate(l_order)}
    pos_r = {ax: j for j, ax in enumerate(r_order)}
    lc, rc = [pos_l[("k", 0)]], [pos_r[("k", 0)]]
    lb, rb = [pos_l[("b", i)] for i in range(nb)], [pos_r[("b", i)] for i in range(nb)]
    extent = {1: m, 2: k, 3: None}[mode]
    if mode == 3:
        sizes = np.ones(g, np.int32)
        ragged = [pos_l[("b", 0)]]
    else:
        s = draw(st.lists(st.integers(0, extent), min_size=g, max_size=g))
        while sum(s) > extent:
            s[int(np.argmax(s))] -= 1
        sizes = np.array(s, np.int32)
        if nb and draw(st.booleans()):  # per-batch sizes: the lhs batch dims must precede the ragged dim
            sizes = np.broadcast_to(sizes, (*b, g)).copy()
        ragged = [pos_l[("m", 0) if mode == 1 else ("k", 0)]]
    rg = [pos_r[("g", 0)]] if mode == 1 else []
    return lhs, rhs, sizes, (((lc, rc), (lb, rb)), ragged, rg)


@SET
@given(rdg_cases(), st.sampled_from(["float64", "float32"]))
def test_ragged_dot_general_matches_jax_float64(case, dt):
    jax = pytest.importorskip("jax", reason="jax is not installed")
    from jax import lax

    enable_x64 = getattr(jax, "enable_x64", None)
    if enable_x64 is None:  # older jax
        from jax.experimental import enable_x64
    lhs, rhs, sizes, (dn, lr, rg) = case
    lhs, rhs = lhs.astype(dt), rhs.astype(dt)
    with enable_x64(True):
        jdn = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=dn, lhs_ragged_dimensions=lr,
                                            rhs_group_dimensions=rg)
        try:
            want = np.asarray(lax.ragged_dot_general(jax.numpy.asarray(lhs), jax.numpy.asarray(rhs),
                                                     jax.numpy.asarray(sizes), jdn,
                                                     preferred_element_type=np.float64))
        except Exception as e:  # a dimension order jax itself refuses: skip that example
            if "ragged" in str(e).lower() or "group_sizes" in str(e):
                return
            raise
    got = gmm_ref.ragged_dot_general(lhs, rhs, sizes, gmm_ref.RaggedDotDimensionNumbers(*[dn, lr, rg]),
                                     preferred_element_type=np.float64, with_reference=True)
    assert got.mask.all()
    assert got.values.shape == want.shape
    np.testing.assert_array_equal(got.values, want)


FORMS = ["2d3d", "3d2d", "2d2d", "3d3d"]


@pytest.mark.parametrize("form", FORMS)
@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=4), st.integers(0, 2**32 - 1), st.integers(0, 3))
def test_grouped_mm_matches_torch_cpu(form, sizes, seed, slack):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    rng = np.random.default_rng(seed)
    g = len(sizes)
    t = max(1, sum(sizes) + slack)  # torch refuses zero-size operands
    m, k, n = 4, 8, 4  # leading strides a multiple of 16 bytes, as torch requires
    if form == "2d3d":
        a, b = _ints(rng, (t, k), np.float32), _ints(rng, (g, k, n), np.float32)
    elif form == "3d2d":
        t = -(-t // 4) * 4
        a, b = _ints(rng, (g, m, k), np.float32), _ints(rng, (k, t), np.float32)
    elif form == "2d2d":
        t = -(-t // 4) * 4
        a, b = _ints(rng, (m, t), np.float32), _ints(rng, (t, n), np.float32)
    else:
        a, b = _ints(rng, (g, m, k), np.float32), _ints(rng, (g, k, n), np.float32)
    offs = None if form == "3d3d" else np.cumsum(sizes).astype(np.int32)
    want = torch._grouped_mm(torch.from_numpy(a), torch.from_numpy(b),
                             offs=None if offs is None else torch.from_numpy(offs)).numpy()
    ref = gmm_ref.grouped_mm(a, b, offs, with_reference=True)
    assert ref.values.shape == want.shape and ref.values.dtype == want.dtype
    np.testing.assert_array_equal(ref.values[ref.mask], want[ref.mask])
    assert gmm_ref.check(want, ref).ok
