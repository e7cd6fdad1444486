"""The swizzled scale layout of NVIDIA's block-scaled MMA (``gmm_ref.scaled.layouts``) and torch's MXFP8 grouped form.

The layout is checked against torch's own recipe, written here with torch's view / permute / reshape (the steps
of ``to_blocked`` in torch's tests), not with the module's index arithmetic.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gmm_ref
from gmm_ref.conventions.torch_scaled import MXFP8
from gmm_ref.scaled.layouts import blocked_shape, from_blocked, to_blocked

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _torch_recipe(x):
    """torch's to_blocked: pad to 128 x 4 tiles, view as (row blocks, 128, column blocks, 4), tiles row-major,
    each tile's rows in 4 runs of 32 interleaved into 32 rows of 16."""
    torch = pytest.importorskip("torch", reason="the recipe is written with torch's reshapes")
    t = torch.from_numpy(np.asarray(x, np.float32))
    h, w = t.shape
    rb, cb = -(-h // 128), -(-w // 4)
    padded = torch.zeros(rb * 128, cb * 4)
    padded[:h, :w] = t
    tiles = padded.view(rb, 128, cb, 4).permute(0, 2, 1, 3)
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16).flatten().numpy()


@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (128, 4), (130, 5), (256, 8), (300, 1)])
def test_to_blocked_is_torch_s_recipe_and_from_blocked_inverts_it(shape):
    x = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1
    flat = to_blocked(x)
    np.testing.assert_array_equal(flat, _torch_recipe(x))
    assert flat.size == np.prod(blocked_shape(*shape))
    np.testing.assert_array_equal(from_blocked(flat, *shape), x)
    with pytest.raises(ValueError, match="flat: expected"):
        from_blocked(flat[:-1], *shape)


def _mx_problem(rng, sizes, k=64, n=48):
    m = int(sum(sizes)) + 5
    a = rng.integers(-6, 7, size=(m, k)).astype(E4M3)
    b = rng.integers(-6, 7, size=(len(sizes), k, n)).astype(E4M3)
    kb = -(-k // 32)
    sa = [np.ldexp(1.0, rng.integers(-4, 4, size=(s, kb))).astype(E8M0) for s in sizes]
    sb = [np.ldexp(1.0, rng.integers(-4, 4, size=(n, kb))).astype(E8M0) for _ in sizes]
    return gmm_ref.Problem("ragged_m", a, b, np.array(sizes), out_dtype=BF16, tail="undefined",
                           convention="torch.scaled_grouped_mm", lhs_quant=MXFP8, lhs_scales=sa, rhs_quant=MXFP8,
                           rhs_scales=sb)


def test_the_mxfp8_2d_3d_arguments_hold_each_group_s_padded_swizzled_block():
    rng = np.random.default_rng(3)
    p = _mx_problem(rng, [130, 0, 3])
    (a, b, sa, sb), kw = gmm_ref.arguments(p)
    # scale_a: groups' blocks of 256, 0 and 128 rows by 4 columns (2 K blocks padded to 4), one after the other
    assert sa.shape == (384, 4) and sa.dtype == E8M0 and sb.shape == (3, 4 * 128)
    for want, got in ((p.scales_of("lhs", 2), sa.reshape(-1)[256 * 4:]), (p.scales_of("rhs", 1), sb[1])):
        recipe = _torch_recipe(want.astype(np.float64))  # zeros where it pads
        got = got.astype(np.float64)
        np.testing.assert_array_equal(got[recipe != 0], recipe[recipe != 0])
        assert np.all(got[recipe == 0] == 2.0 ** -127)  # padding: e8m0's code 0, as torch pads with zeros
    q = gmm_ref.problem_from_arguments("torch.scaled_grouped_mm", a, b, sa, sb, **kw)
    np.testing.assert_array_equal(gmm_ref.reference(q).values.view(np.uint16),
                                  gmm_ref.reference(p).values.view(np.uint16))
    # the reference of the MXFP8 form is each group's codes times the scales of its own rows
    want = (a[:130].astype(np.float64) * np.repeat(p.scales_of("lhs", 0).astype(np.float64), 32, axis=1)) @ (
        b[0].astype(np.float64) * np.repeat(p.scales_of("rhs", 0).astype(np.float64), 32, axis=1).T)
    np.testing.assert_allclose(gmm_ref.reference(p).exact[:130], want, rtol=2.0 ** -45)


def test_the_mxfp8_2d_2d_form_round_trips_and_bad_scales_are_named():
    rng = np.random.default_rng(4)
    k_sizes = [40, 0, 64]
    a = rng.integers(-6, 7, size=(8, 112)).astype(E4M3)
    b = rng.integers(-6, 7, size=(112, 16)).astype(E4M3)
    sa = [np.ldexp(1.0, rng.integers(-3, 3, size=(8, -(-s // 32)))).astype(E8M0) for s in k_sizes]
    sb = [np.ldexp(1.0, rng.integers(-3, 3, size=(16, -(-s // 32)))).astype(E8M0) for s in k_sizes]
    p = gmm_ref.Problem("ragged_k", a, b, np.array(k_sizes), out_dtype=BF16, convention="torch.scaled_grouped_mm",
                        lhs_quant=MXFP8, lhs_scales=sa, rhs_quant=MXFP8, rhs_scales=sb)
    args, kw = gmm_ref.arguments(p)
    assert args[2].shape == (128, 4 + 0 + 4)
    q = gmm_ref.problem_from_arguments("torch.scaled_grouped_mm", *args, **kw)
    np.testing.assert_array_equal(gmm_ref.reference(q).exact, gmm_ref.reference(p).exact)
    with pytest.raises(ValueError, match=r"scale_a: expected 1024 MXFP8 scales"):
        gmm_ref.scaled_grouped_mm(args[0], args[1], args[2][:, :4], args[3], **kw)
    with pytest.raises(TypeError, match="float8_e8m0fnu MXFP8 scales on both operands"):
        gmm_ref.scaled_grouped_mm(args[0], args[1], args[2], args[3].astype(np.float32), **kw)
    three = gmm_ref.Problem("batch", np.ones((2, 8, 32), E4M3), np.ones((2, 32, 16), E4M3), None, out_dtype=BF16,
                            lhs_quant=MXFP8, lhs_scales=np.ones(16, E8M0), rhs_quant=MXFP8,
                            rhs_scales=np.ones(32, E8M0), convention="torch.scaled_grouped_mm")
    assert "MXFP8 takes the 2d-3d and 2d-2d forms only" in gmm_ref.conventions.get(
        "torch.scaled_grouped_mm").refusal(three)


def test_problems_narrowed_to_mxfp8_draw_only_its_forms():
    from hypothesis import HealthCheck, given, settings

    from property_tests import strategies as gst

    seen = set()

    @settings(max_examples=30, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(gst.problems(convention="torch.scaled_grouped_mm", quantizations=[(MXFP8, MXFP8)]))
    def prop(p):
        assert p.lhs_quant == MXFP8 == p.rhs_quant
        seen.add(p.family)

    prop()
    assert seen == {"ragged_m", "ragged_k"}, seen
