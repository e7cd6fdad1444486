"""The amax reference quantizer (``gmm_ref.AmaxQuantizer``) and kernels that quantize inside with it.

Each real quantizer's rule is written here with torch's float32 (or float64) operations, step by step as its
source does it, and the reference quantizer must give the same codes and scales bit for bit; torchao's own
float8 quantizer is compared where it is installed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gmm_ref
from gmm_ref import AmaxQuantizer

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _data(seed=0, rows=48, k=256):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, k)) * np.exp2(rng.integers(-40, 40, (rows, 1)))).astype(np.float32)
    x[3] = 0  # an all-zero row: the clamp / zero rule decides its scale
    x[5, 7] = 448 * 2.0 ** 20  # a block whose amax is a power of two times the element's max
    return x


def _bits(a):
    return np.asarray(a).view(np.uint8 if np.asarray(a).dtype.itemsize == 1 else np.uint32)


def test_torchao_float8_rowwise_is_reproduced_bit_for_bit():
    torch = pytest.importorskip("torch", reason="torchao's quantizer takes torch tensors")
    fu = pytest.importorskip("torchao.float8.float8_utils", reason="torchao is not installed")
    from torchao.float8.config import ScalingGranularity

    x = _data()
    t = torch.from_numpy(x)
    for pow2 in (False, True):
        mult = fu.tensor_to_scale(t, torch.float8_e4m3fn, scaling_granularity=ScalingGranularity.AXISWISE,
                                  axiswise_dim=-1, round_scales_to_power_of_2=pow2)
        codes = fu.to_fp8_saturated(t * mult, torch.float8_e4m3fn).view(torch.uint8).numpy()
        q = AmaxQuantizer(E4M3, "row", rule="max/amax", codes="multiply", arith="float64", eps=1e-12,
                          pow2="floor" if pow2 else None)
        c, s = q.quantize(x)
        np.testing.assert_array_equal(c.view(np.uint8), codes)
        np.testing.assert_array_equal(_bits(s[:, 0]), _bits(mult.reciprocal().numpy()[:, 0]))


def _torch_rule(x, block, *, eps, reciprocal, ue8m0, rcp_of_max=False):
    """DeepGEMM's per_token_cast_to_fp8 (reciprocal) and vLLM's per_token_group_quant_fp8 (divide), in torch."""
    torch = pytest.importorskip("torch", reason="the rules are written with torch's float32 operations")
    t = torch.from_numpy(x).view(x.shape[0], -1, block)
    amax = t.abs().amax(dim=-1, keepdim=True).clamp(min=eps)
    sf = amax * (1.0 / 448.0) if rcp_of_max else amax / 448.0
    if ue8m0:
        sf = torch.exp2(torch.ceil(torch.log2(sf)))
    y = t * (1.0 / sf) if reciprocal else (t / sf).clamp(-448, 448)
    return y.to(torch.float8_e4m3fn).view(torch.uint8).reshape(x.shape).numpy(), sf[..., 0].numpy()


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize(("name", "eps", "reciprocal"), [("deep_gemm", 1e-4, True), ("vllm", 1e-10, False)])
def test_deep_gemm_and_vllm_token_group_rules_are_reproduced(name, eps, reciprocal, ue8m0):
    x = _data(1)
    codes, sf = _torch_rule(x, 128, eps=eps, reciprocal=reciprocal, ue8m0=ue8m0)
    q = AmaxQuantizer(E4M3, (1, 128), rule="amax/max", codes="reciprocal" if reciprocal else "divide", eps=eps,
                      pow2="ceil" if ue8m0 else None)
    c, s = q.quantize(x)
    np.testing.assert_array_equal(c.view(np.uint8), codes)
    np.testing.assert_array_equal(_bits(s), _bits(sf))


def test_blocks_restart_at_every_group_unless_shared_across_groups():
    rng = np.random.default_rng(2)
    rhs = rng.standard_normal((2, 64, 8)).astype(np.float32)
    rhs[0] *= 1024  # expert 0's weights are far larger
    p = gmm_ref.Problem("ragged_m", rng.standard_normal((10, 64)).astype(np.float32), rhs, np.array([4, 6]))
    own = AmaxQuantizer(E4M3, "row")
    shared = AmaxQuantizer(E4M3, "row", across_groups=True)
    a, b = gmm_ref.quantize_problem(p, own, own), gmm_ref.quantize_problem(p, None, shared)
    for g in (0, 1):  # per expert: each channel's own amax over K; shared: over every expert's K
        amax = np.abs(rhs[g]).max(axis=0)
        np.testing.assert_array_equal(a.scales_of("rhs", g)[:, 0], (amax / 448).astype(np.float32))
        np.testing.assert_array_equal(b.scales_of("rhs", g)[:, 0],
                                      (np.abs(rhs).max(axis=(0, 1)) / 448).astype(np.float32))
    np.testing.assert_array_equal(a.scales_of("lhs", 1)[:, 0], (np.abs(p.lhs[4:]).max(axis=1) / 448).astype(np.float32))


def test_qwix_ragged_dot_qt_shares_its_weight_scales_across_experts():
    """qwix's ragged_dot_qt quantizes the weights [G, K, N] per output channel over every expert at once. Held to
    its own format it passes every mode (the main job); held to per-expert scales, it fails on the small
    expert as soon as another expert's weights are far larger, the error naming that group."""
    pytest.importorskip("qwix", reason="qwix is not installed")
    from gmm_kernels import Scope, configure
    from gmm_kernels.adapters.ragged_dot import QwixRaggedDotQt, qwix_qt_format

    rng = np.random.default_rng(3)
    rhs = rng.standard_normal((2, 64, 16)).astype(np.float32)
    rhs[0] *= 2.0 ** 12
    p = gmm_ref.Problem("ragged_m", rng.standard_normal((32, 64)).astype(BF16), rhs.astype(BF16), np.array([16, 16]),
                        convention="ragged_dot")
    kernel = QwixRaggedDotQt()
    out = kernel.run(p)
    assert gmm_ref.check(out, kernel.reference_for(p), numerics=kernel.numerics_for(p)).ok
    per_expert = configure(QwixRaggedDotQt(), scope=Scope(dtypes=("bfloat16",), zero_extents=(),
                                                          numerics=kernel.scope.numerics,
                                                          quantizes=(qwix_qt_format("row"), qwix_qt_format("row"))))
    found = gmm_ref.check(out, per_expert.reference_for(p), numerics=per_expert.numerics_for(p))
    assert not found.ok and found.groups == (1,), found.message


@pytest.mark.parametrize(("fields", "exc", "text"), [
    (dict(elem="int4"), TypeError, "elem: expected one of"),
    (dict(scale_dtype="float8_e8m0fnu"), TypeError, "scale_dtype: expected one of"),
    (dict(rule="max"), ValueError, "rule: expected one of"),
    (dict(rule="max/amax"), ValueError, "codes: rule='max/amax' takes codes='multiply'"),
    (dict(codes="multiply"), ValueError, "codes: codes='multiply' goes with rule='max/amax'"),
    (dict(pow2="round"), ValueError, "pow2: expected one of"),
    (dict(eps=-1.0), ValueError, "eps: expected a finite non-negative number"),
    (dict(block="2x2"), ValueError, "block: expected one of"),
    (dict(across_groups=1), TypeError, "across_groups: expected a bool"),
])
def test_bad_quantizers_are_named(fields, exc, text):
    with pytest.raises(exc, match=text):
        AmaxQuantizer(**fields)


def test_a_declared_amax_format_round_trips_through_json_and_source():
    from gmm_kernels import Scope

    q = AmaxQuantizer(E4M3, (1, 128), scale_dtype=BF16, codes="reciprocal", eps=1e-4, pow2="ceil",
                      across_groups=True)
    scope = Scope(quantizes=(q, None))
    assert Scope.from_json(scope.to_json()).quantizes == (q, None)
    assert eval(repr(q), {"gmm_ref": gmm_ref}) == q
    assert "across groups" in scope.describe()
