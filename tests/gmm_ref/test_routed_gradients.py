"""The routed gradient model (``gmm_ref.routed_gradients``, docs/routed.md "The routed gradient model"): its exact
values against an independent float64 computation and torch's autograd of the forward, its bounds against kernels
that round where they declare, NaN where nothing reads, and the reports that name a wrong element's token, slot and
expert (the experts' gradient: its expert, element and culprit)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gmm_ref
from gmm_ref import RoutedBackward, RoutedNumerics, routed_gradients
from property_tests import strategies as gst

BF16 = np.dtype(ml_dtypes.bfloat16)
SETTINGS = settings(max_examples=60, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))
#: routed backwards of every kind: expert parallelism, both layouts, weighted or not, repeats, all value kinds
BACKWARDS = gst.routed_backwards(gst.routings(num_experts=(8, 13), top_k=(1, 2, 3), distinct_experts=False,
                                              max_tokens=12, values="normal"), values="normal")


def _by_hand(b: RoutedBackward) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(per-slot input gradient, token gradient, experts' gradient, weights' gradient) in float64, slot by slot."""
    x = b.tokens.astype(np.float64)
    w = b.experts.astype(np.float64)
    wnk = w if b.expert_layout == "enk" else w.transpose(0, 2, 1)  # [E, N, K]
    weights = b.weights64()
    dx = np.zeros((b.num_tokens, b.top_k, b.k))
    dw = np.zeros(wnk.shape)
    dweights = np.zeros(b.topk_ids.shape)
    for t in range(b.num_tokens):
        for j in range(b.top_k):
            e = int(b.local_ids[t, j])
            if e < 0:
                continue
            dy = b.cotangent[t, j].astype(np.float64)
            dx[t, j] = weights[t, j] * (dy @ wnk[e])
            dw[e] += weights[t, j] * np.outer(dy, x[t])
            dweights[t, j] = dy @ (wnk[e] @ x[t]) if b.mul_routed_weight else 0.0
    if b.existing is not None:
        dw += (b.existing.astype(np.float64) if b.expert_layout == "enk"
               else b.existing.astype(np.float64).transpose(0, 2, 1))
    return dx, dx.sum(axis=1), dw if b.expert_layout == "enk" else dw.transpose(0, 2, 1), dweights


@SETTINGS
@given(BACKWARDS)
def test_the_gradients_are_an_independent_float64_computation(b):
    g = routed_gradients(b)
    dx, dt, dw, dweights = _by_hand(b)
    for got, want in ((g.inputs.slots_exact, dx), (g.inputs.combined_exact, dt), (g.experts_exact, dw),
                      (g.weights_exact, dweights)):
        assert np.allclose(got, want, rtol=1e-12, atol=1e-300, equal_nan=True)


@SETTINGS
@given(gst.routed_backwards(gst.routings(num_experts=(8, 13), top_k=(1, 2, 3), distinct_experts=False,
                                         max_tokens=12, values="normal", mul_routed_weight=True,
                                         expert_parallel=True), values="normal", existing=True))
def test_the_gradients_are_torch_autograd_of_the_forward_reference(b):
    torch = pytest.importorskip("torch")
    x = torch.tensor(b.tokens.astype(np.float64), requires_grad=True)
    w = torch.tensor(b.experts.astype(np.float64), requires_grad=True)
    weights = torch.tensor(b.weights64(), requires_grad=True)
    local = torch.tensor(b.local_ids)
    wnk = w if b.expert_layout == "enk" else w.transpose(1, 2)
    out = torch.zeros(b.num_tokens, b.top_k, b.n, dtype=torch.float64)
    for t in range(b.num_tokens):
        for j in range(b.top_k):
            if local[t, j] >= 0:
                out[t, j] = weights[t, j] * (wnk[local[t, j]] @ x[t])
    g = routed_gradients(b)
    if not (b.local_ids >= 0).any():  # nothing computed: every gradient 0 (the experts': the existing one)
        assert not g.inputs.combined_exact.any() and not g.weights_exact.any()
        assert np.array_equal(g.experts_exact, b.existing.astype(np.float64))
        return
    (out * torch.tensor(b.cotangent.astype(np.float64))).sum().backward()
    assert np.allclose(g.inputs.combined_exact, x.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert np.allclose(g.experts_exact - b.existing.astype(np.float64), w.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert np.allclose(g.weights_exact, weights.grad.numpy(), rtol=1e-10, atol=1e-12)


def _float32_kernels(b: RoutedBackward, weight_in_accumulator: bool = True):
    """A backward that does what ``RoutedNumerics()`` declares: float32 products and sums, one rounding."""
    g = routed_gradients(b)
    f32 = np.float32
    x, w = b.tokens.astype(f32), b.experts.astype(f32)
    wnk = w if b.expert_layout == "enk" else w.transpose(0, 2, 1)
    weights = b.weights64().astype(f32)
    dy = b.cotangent.astype(f32)
    dx = np.zeros((b.num_tokens, b.top_k, b.k), f32)
    dw = np.zeros(wnk.shape, f32)
    dweights = np.zeros(b.topk_ids.shape, f32)
    for t in range(b.num_tokens):
        for j in range(b.top_k):
            e = int(b.local_ids[t, j])
            if e < 0:
                continue
            dx[t, j] = weights[t, j] * (dy[t, j] @ wnk[e])
            dw[e] += np.outer(weights[t, j] * dy[t, j], x[t])
            dweights[t, j] = dy[t, j] @ (wnk[e] @ x[t])
    dw = dw if b.expert_layout == "enk" else dw.transpose(0, 2, 1)
    if b.existing is not None:
        dw = dw + b.existing.astype(f32)
    tokens = dx.astype(b.tokens.dtype).astype(f32).sum(axis=1)  # the rounded slots summed in float32
    return g, dx.astype(b.tokens.dtype), tokens.astype(b.tokens.dtype), dw.astype(b.experts.dtype), dweights


@SETTINGS
@given(gst.routed_backwards(gst.routings(num_experts=(8, 13), top_k=(1, 2, 4), distinct_experts=False,
                                         max_tokens=12, values=("normal", "wide")), values="normal", existing=True))
def test_a_float32_backward_is_within_every_bound(b):
    g, dx, tokens, dw, dweights = _float32_kernels(b)
    flush = RoutedNumerics(product=gmm_ref.Numerics(flush_subnormals=True), combine="float32")
    gmm_ref.assert_routed_matches(dx, g, output="d_slots", numerics=flush)
    gmm_ref.assert_routed_matches(tokens, g, output="d_tokens", numerics=flush)
    gmm_ref.assert_routed_matches(dw, g, output="d_experts", numerics=flush)
    if b.mul_routed_weight:
        gmm_ref.assert_routed_matches(dweights.astype(b.topk_weights.dtype), g, output="d_weights", numerics=flush)


@SETTINGS
@given(gst.routed_backwards(gst.routings(num_experts=(8, 13), top_k=(1, 2, 3), expert_parallel=True,
                                         max_tokens=12, values="poisoned"), values="poisoned", existing=True))
def test_nan_where_nothing_reads_never_reaches_a_gradient(b):
    """Poisoned: NaN / Inf in the tokens only other ranks' slots route, the experts no slot reads, the weights and
    cotangent rows of other ranks' slots. Every gradient element that nothing poisoned feeds stays finite."""
    g = routed_gradients(b)
    assert np.isfinite(g.inputs.slots_exact).all() and np.isfinite(g.inputs.combined_exact).all()
    assert np.isfinite(g.experts_exact).all() and np.isfinite(g.weights_exact).all()
    assert np.isfinite(g.experts_bound()).all() and np.isfinite(g.inputs.slot_bound()).all()


def _plain(t=6, top_k=2, e=3, k=8, n=16, dtype=np.float32, existing=False, seed=0, ids=None):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, e, (t, top_k)).astype(np.int32) if ids is None else np.asarray(ids, np.int32)
    return RoutedBackward(rng.integers(-3, 4, (ids.shape[0], k)).astype(dtype),
                          rng.integers(-3, 4, (e, n, k)).astype(dtype), ids,
                          cotangent=rng.integers(-3, 4, (*ids.shape, n)).astype(dtype),
                          existing=rng.integers(-3, 4, (e, n, k)).astype(dtype) if existing else None)


def test_the_model_refuses_what_it_is_not_naming_it():
    b = _plain()
    with pytest.raises(ValueError, match="cotangent: required"):
        RoutedBackward(b.tokens, b.experts, b.topk_ids)
    with pytest.raises(ValueError, match=r"cotangent: expected shape \(6, 2, 16\) and dtype float32"):
        RoutedBackward.of(b.forward, b.cotangent[:, :1])
    with pytest.raises(ValueError, match="existing: expected the experts' shape"):
        RoutedBackward.of(b.forward, b.cotangent, np.zeros((3, 16, 8), BF16))
    with pytest.raises(TypeError, match=r"expected a gmm_ref\.RoutedBackward"):
        routed_gradients(b.forward)
    with pytest.raises(ValueError, match="'d_weights' needs a routing with mul_routed_weight"):
        gmm_ref.assert_routed_matches(np.zeros((6, 2), np.float32), routed_gradients(b), output="d_weights")
    with pytest.raises(TypeError, match=r"judged against a gmm_ref\.RoutedGradients"):
        gmm_ref.assert_routed_matches(np.zeros((6, 2, 8)), gmm_ref.routed_reference(b), output="d_slots")


def _experts_failure(b: RoutedBackward, out: np.ndarray) -> str:
    with pytest.raises(gmm_ref.Mismatch) as info:
        gmm_ref.assert_routed_matches(out.astype(b.experts.dtype), routed_gradients(b), output="d_experts")
    return str(info.value)


def test_the_experts_report_names_the_expert_the_element_and_the_slot_that_explains_it():
    b = _plain(ids=[[0, 1], [2, 0], [0, 0], [1, 2]])
    g = routed_gradients(b)
    dy, x = b.cotangent.astype(np.float64), b.tokens.astype(np.float64)
    dropped = g.experts_exact.copy()
    dropped[0] -= np.outer(dy[2, 1], x[2])  # token 2's slot 1 left out of expert 0's sum
    text = _experts_failure(b, dropped)
    assert text.startswith("expert 0 (local 0), n ") and "the sum over its 4 slots: token 0 slot 0, token 1 slot 1, " \
        "token 2 slot 0, token 2 slot 1" in text, text
    assert "likely culprit: slot 1 of token 2 is missing from the sum" in text, text
    assert "wrong local experts: [0]" in text, text
    twice = g.experts_exact.copy()
    twice[1] += np.outer(dy[3, 0], x[3])
    assert "likely culprit: slot 0 of token 3 is added twice" in _experts_failure(b, twice)


def test_the_experts_report_names_rows_read_from_the_wrong_token_or_slot():
    b = _plain(t=5, top_k=2, e=3, ids=[[0, 1], [2, 0], [0, 2], [1, 2], [0, 1]])
    g = routed_gradients(b)
    dy, x = b.cotangent.astype(np.float64).reshape(-1, b.n), b.tokens.astype(np.float64)
    swapped = g.experts_exact.copy()
    swapped[0] += np.outer(dy[4], x[4] - x[2])  # token 2's slot 0 read token 4's row
    text = _experts_failure(b, swapped)
    assert "likely culprit: slot 0 of token 2 read token 4's row instead of token 2's" in text, text
    other = g.experts_exact.copy()
    other[2] += np.outer(dy[0] - dy[2], x[1])  # token 1's slot 0 (flat 2, expert 2) took the cotangent of flat row 0
    text = _experts_failure(b, other)
    assert "likely culprit: slot 0 of token 1 took the cotangent of slot 0 of token 0 (flat row 0)" in text, text
    b = _plain(t=6, top_k=2, e=3, ids=[[2, 0], [2, 1], [0, 1], [1, 0], [0, 1], [1, 0]])
    g = routed_gradients(b)
    dy, x = b.cotangent.astype(np.float64).reshape(-1, b.n), b.tokens.astype(np.float64)
    flat_rows = g.experts_exact.copy()  # expert 2's slots (flat 0 and 2) read token rows 0 and 2, not 0 and 1
    flat_rows[2] = sum(np.outer(dy[f], x[f]) for f in (0, 2))
    text = _experts_failure(b, flat_rows)
    assert "likely culprit: the token rows read at the flat slot index (token * top_k + slot) instead of the " \
        "token" in text, text


def test_an_expert_without_slots_left_unwritten_and_an_existing_gradient_overwritten_are_named():
    b = _plain(ids=[[0, 1], [1, 0]], e=3, existing=True)
    g = routed_gradients(b)
    unwritten = g.experts_exact.copy()
    unwritten[2] = np.nan
    text = _experts_failure(b, unwritten)
    assert text.startswith("expert 2 (local 2), n 0, k 0: got nan") and "(no slot routes to it, plus the existing " \
        "gradient)" in text, text
    assert "its gradient is the existing one, but the kernel left NaN or Inf there" in text, text
    overwritten = g.experts_exact - b.existing.astype(np.float64)
    assert "likely culprit: the existing gradient is missing (overwritten instead of added into)" in \
        _experts_failure(b, overwritten)


def test_an_accumulator_seeded_with_the_existing_gradient_is_separated_from_one_adding_it_after():
    """float32 dW: 2**25 existing, three M tiles each adding 1. Added after the reduction: 2**25 + 3 rounds once to
    2**25 + 4, the rounded reference. Seeded: each tile's 1 is lost (the spacing at 2**25 is 4): 2**25, an error
    of 3 against a bound of u_f32 (2**25 + 3) = 2."""
    ids = np.zeros((40, 1), np.int32)
    x = np.zeros((40, 8), np.float32)
    x[:, 0] = 1
    dy = np.zeros((40, 1, 16), np.float32)
    dy[[0, 16, 32], 0, 0] = 1  # one slot of each tile of 16
    existing = np.zeros((1, 16, 8), np.float32)
    existing[0, 0, 0] = 2.0 ** 25
    b = RoutedBackward(x, np.zeros((1, 16, 8), np.float32), ids, cotangent=dy, existing=existing)
    g = routed_gradients(b)
    after = np.float32(2.0 ** 25) + np.float32(3)
    seeded = np.float32(2.0 ** 25)
    for _ in range(3):
        seeded = seeded + np.float32(1)
    out = existing.copy()
    out[0, 0, 0] = after
    gmm_ref.assert_routed_matches(out, g, output="d_experts")
    out[0, 0, 0] = seeded
    text = _experts_failure(b, out)
    assert text.startswith("expert 0 (local 0), n 0, k 0: got 33554432.0, expected 33554436.0 within 2"), text


def test_an_element_of_each_output_is_named_in_its_words():
    """What a determinism failure (a second call's other bits) says where: the token, slot and expert; the
    experts' gradient: its expert and element, in either layout."""
    from gmm_ref.routed.compare import routed_element

    b = _plain(ids=[[0, 1], [2, 0], [0, 0], [1, 2], [0, 1], [2, 2]])
    assert routed_element(b, "slots", (3, 1, 5)) == "token 3, slot 1 (expert 2, local 2), column 5"
    assert routed_element(b, "d_slots", (3, 1, 5)) == "token 3, slot 1 (expert 2, local 2), k 5"
    assert routed_element(b, "d_tokens", (4, 2)) == "token 4, k 2"
    assert routed_element(b, "d_weights", (1, 0)) == "token 1, slot 0 (expert 2, local 2)"
    assert routed_element(b, "d_experts", (2, 7, 3)) == "expert 2 (local 2), n 7, k 3"
    ekn = RoutedBackward.of(gmm_ref.Routing(b.tokens, b.experts.transpose(0, 2, 1).copy(), b.topk_ids,
                                            expert_layout="ekn"), b.cotangent)
    assert routed_element(ekn, "d_experts", (2, 3, 7)) == "expert 2 (local 2), n 7, k 3"
