"""unsloth's grouped GEMM backward (the built-in routed adapters ``unsloth.grouped_gemm_dX``,
``unsloth.grouped_gemm_dW`` and ``unsloth.grouped_gemm_dW_accumulate``), read from unsloth's wheel, checked against
the routed gradient model (docs/routed.md, "unsloth's backward kernels").

The conventions' checks need no wheel; the kernels' need unsloth 2026.10.9's wheel and run it in Triton's
interpreter. Each broken twin is the wheel's kernel with one line changed (the seeded accumulator: two), one real
bug class each, and must fail naming the token, the slot and the expert (dX) or the expert and the element (dW).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gmm_ref
from gmm_kernels import Status
from gmm_ref import RoutedBackward, conventions
from gmm_ref.conventions.unsloth import BACKWARD_FORMS, DW_EXTENTS, GROUPED_GEMM_DX, backward_form_of
from property_tests import strategies as gst

DX = conventions.get("unsloth.grouped_gemm_dX")
DW = conventions.get("unsloth.grouped_gemm_dW")
DW_ACC = conventions.get("unsloth.grouped_gemm_dW_accumulate")
SLOT = r"token \d+, slot \d+ \(expert \d+, local \d+\), k \d+: got "
EXPERT = r"expert \d+ \(local \d+\), n \d+, k \d+: got "


def _backwards(extents, existing=False):
    routings = gst.routings(expert_layouts="enk", dtypes=[("bfloat16", "bfloat16"), ("float32", "float32")],
                            shapes=extents, expert_parallel=False, distinct_experts=False, mul_routed_weight=False,
                            max_tokens=24)
    return gst.routed_backwards(routings, existing=existing)


# ------------------------------------------------------------------------------- the conventions (no wheel)
@settings(max_examples=40, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(_backwards(GROUPED_GEMM_DX.extents), _backwards(DW_EXTENTS, existing=True))
def test_arguments_parse_back_to_the_same_backward_and_a_right_output_maps_to_the_model(bx, bw):
    args, kwargs = DX.arguments(bx)
    again = DX.parse(*args, **kwargs)
    assert np.array_equal(again.topk_ids, bx.topk_ids) and np.array_equal(again.cotangent, bx.cotangent)
    want = gmm_ref.routed_gradients(bx).inputs.slots
    rows = want.reshape(-1, bx.k)
    dx = rows if kwargs["permute_x"] else rows[args[2]]  # slot order (permute_x), expert order (permute_y)
    assert np.array_equal(DX.per_slot(dx, args, kwargs), want)
    for conv, b in ((DW, RoutedBackward.of(bw.forward, bw.cotangent)), (DW_ACC, bw)):
        args, kwargs = conv.arguments(b)
        again = conv.parse(*args, **kwargs)
        assert np.array_equal(again.tokens, b.tokens) and np.array_equal(again.cotangent, b.cotangent)
        assert (again.existing is None) == (b.existing is None)
        g, g_again = gmm_ref.routed_gradients(b), gmm_ref.routed_gradients(again)
        assert np.array_equal(g.experts_exact, g_again.experts_exact)


def _backward(t=4, k=16, n=16, top_k=2, e=4, seed=0, existing=False):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, e, (t, top_k)).astype(np.int32)
    return RoutedBackward(rng.integers(-2, 3, (t, k)).astype(np.float32), rng.integers(-2, 3, (e, n, k))
                          .astype(np.float32), ids, cotangent=rng.integers(-2, 3, (t, top_k, n)).astype(np.float32),
                          existing=rng.integers(-2, 3, (e, n, k)).astype(np.float32) if existing else None)


def test_the_form_follows_the_ids_so_every_bucket_reaches_both():
    b = _backward()
    forms = {backward_form_of(RoutedBackward.of(gmm_ref.Routing(b.tokens, b.experts, ids), b.cotangent))
             for ids in (np.zeros((4, 2), np.int32), np.array([[1, 0], [0, 0], [0, 0], [0, 0]], np.int32))}
    assert forms == set(BACKWARD_FORMS)
    _, kwargs = DX.arguments(b)
    assert (kwargs["permute_x"], kwargs["permute_y"]) == BACKWARD_FORMS[backward_form_of(b)]


def test_a_routing_without_its_cotangent_or_with_an_existing_gradient_it_does_not_add_into_is_declined():
    b = _backward(k=8)
    assert "is a backward kernel: it takes a routing with its cotangent" in DW.refusal(b.forward)
    assert "adds into the experts' gradient: a routing with an existing" in DW_ACC.refusal(b)
    assert "returns the experts' gradient: a routing without an existing" in DW.refusal(
        RoutedBackward.of(b.forward, b.cotangent, np.zeros(b.experts.shape, np.float32)))
    assert "never multiplies the weights in" in DX.refusal(RoutedBackward.of(
        gmm_ref.Routing(b.tokens, b.experts, b.topk_ids, np.ones((4, 2), np.float32), mul_routed_weight=True),
        b.cotangent))


def _dx_args():
    args, kwargs = DX.arguments(_backward(seed=1))
    return list(args), dict(kwargs)


@pytest.mark.parametrize(("change", "words"), [
    (lambda a, k: k.update(fuse_mul_post=True), "fuse_mul_pre / fuse_mul_post: inference only"),
    (lambda a, k: k.update(permute_x=True, permute_y=True), "cannot permute both X and Y"),
    (lambda a, k: k.update(permute_x=False, permute_y=False), "with neither"),
    (lambda a, k: k.update(BLOCK_SIZE_N=32), r"asserts N % BLOCK_SIZE_N == 0"),
    (lambda a, k: k.update(BLOCK_SIZE_K=32), r"asserts K % BLOCK_SIZE_K == 0"),
    (lambda a, k: k.update(BLOCK_SIZE_M=8), "BLOCK_SIZE_M: expected an int of at least 16"),
    (lambda a, k: k.update(permute_x=False, permute_y=True, use_tma_load_dy=True), "use_tma_load_dy: TMA cannot"),
    (lambda a, k: k.update(permute_x=True, permute_y=False, use_tma_store=True), "use_tma_store: TMA cannot"),
    (lambda a, k: a.__setitem__(1, a[1].astype(np.float16)), "W: expected dY's dtype float32"),
    (lambda a, k: a.__setitem__(0, a[0][:, :8]), r"dY: expected N = 16 columns"),
    (lambda a, k: a.__setitem__(0, a[0][:-2]), r"dY: expected T\*topk = 8 rows"),
    (lambda a, k: a.__setitem__(3, np.cumsum(a[3]).astype(np.int32)), "m_sizes: expected non-negative"),
    (lambda a, k: a.__setitem__(4, 0), "topk: expected a positive int"),
    (lambda a, k: k.update(debug=1), "debug: expected a bool"),
])
def test_bad_dx_arguments_are_refused_naming_them(change, words):
    args, kwargs = _dx_args()
    change(args, kwargs)
    with pytest.raises((ValueError, TypeError), match=words):
        DX.parse(*args, **kwargs)


def _dw_args(accumulate=False):
    b = _backward(k=8, existing=accumulate, seed=2)
    args, kwargs = (DW_ACC if accumulate else DW).arguments(b)
    return list(args), dict(kwargs)


@pytest.mark.parametrize(("accumulate", "change", "words"), [
    (False, lambda a, k: k.update(fuse_mul_pre=True), "fuse_mul_pre / fuse_mul_post: unsloth's dW asserts"),
    (False, lambda a, k: k.update(permute_x=True, permute_y=False, use_tma_load_x=True), "use_tma_load_x: TMA"),
    (False, lambda a, k: k.update(permute_x=False, permute_y=True, use_tma_load_dy=True), "use_tma_load_dy: TMA"),
    (False, lambda a, k: k.update(dW_dtype="int32"), "dW_dtype: expected float16, bfloat16 or float32"),
    (False, lambda a, k: a.__setitem__(1, a[1].astype(np.float16)), "dY: expected X's dtype float32"),
    (False, lambda a, k: a.__setitem__(0, a[0][:-1]), "X: expected "),
    (False, lambda a, k: a.__setitem__(3, np.zeros_like(a[3])), "gather_indices: expected each flat slot index"),
    (True, lambda a, k: a.__setitem__(4, a[4][:, :8]), r"dW: expected E\*N\*K = 4\*16\*8 elements"),
    (True, lambda a, k: k.update(permute_x=True, permute_y=True), "cannot permute both X and Y"),
])
def test_bad_dw_arguments_are_refused_naming_them(accumulate, change, words):
    args, kwargs = _dw_args(accumulate)
    change(args, kwargs)
    with pytest.raises((ValueError, TypeError), match=words):
        (DW_ACC if accumulate else DW).parse(*args, **kwargs)


def test_the_backward_conventions_are_routed_and_return_gradients():
    assert {"unsloth.grouped_gemm_dX", "unsloth.grouped_gemm_dW", "unsloth.grouped_gemm_dW_accumulate"} <= set(
        conventions.routed_names())
    assert (DX.output, DW.output, DW_ACC.output) == ("d_slots", "d_experts", "d_experts")
    assert DX.backward and DW.backward and DW_ACC.accumulates and DW_ACC.out_argument == "dW"
    assert all(n % 16 == 0 and k % 16 == 0 for k, n in DX.extents)  # the dX kernel's static asserts
    assert {k % 16 != 0 for k, _ in DW.extents} == {n % 16 != 0 for _, n in DW.extents} == {True, False}


# ------------------------------------------------------------------------------- the kernels (the wheel)
pytest.importorskip("torch", reason="unsloth's kernels take torch tensors (gmm-harness[torch])")
pytest.importorskip("triton", reason="Triton is not installed (gmm-harness[triton]; the newest-JAX leg has none)")

from gmm_kernels import get  # noqa: E402
from gmm_kernels.adapters import unsloth as adapter  # noqa: E402
from gmm_kernels.runtimes import triton_interpreter  # noqa: E402
from property_tests.checks.check import check_kernel  # noqa: E402
from tests.corpus.wheel_twins import edited_wheel, rejected  # noqa: E402

ENV = adapter.WHEEL.env
WHEEL = adapter.WHEEL.find()
KERNELS = ("unsloth.grouped_gemm_dX", "unsloth.grouped_gemm_dW", "unsloth.grouped_gemm_dW_accumulate")
needs_wheel = pytest.mark.skipif(WHEEL is None, reason=f"no unsloth {adapter.WHEEL_VERSION} wheel here; get it "
                                                      f"with: {adapter.DOWNLOAD} (or set {ENV})")
interpreted = pytest.mark.skipif(not triton_interpreter.use_if_no_gpu(),
                                 reason="torch sees a GPU here (or TRITON_INTERPRET is off): these tests run "
                                        "unsloth's kernels on CPU tensors in Triton's interpreter")


def torch_dw(X, dY, m_sizes, gather_indices, topk, BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32,
             permute_x=False, permute_y=False, *, expert_order=False, **options):
    """A user's dW in torch, in the convention (``expert_order``: the bug of reading dY in expert order under
    ``permute_y``)."""
    import torch

    out = torch.zeros(m_sizes.shape[0], dY.shape[1], X.shape[1], dtype=torch.float32)
    start = 0
    for e, m in enumerate(m_sizes.tolist()):
        rows = gather_indices[start:start + m]
        x = X[rows // topk] if permute_x else X[start:start + m]
        dy = dY[start:start + m] if permute_x or expert_order else dY[rows]
        out[e] = dy.float().T @ x.float()
        start += m
    return out.to(X.dtype)


def torch_dw_expert_order(*args, **kwargs):
    return torch_dw(*args, expert_order=True, **kwargs)


def test_a_users_dw_in_the_convention_passes_and_its_broken_twin_is_named():
    report = check_kernel(torch_dw, convention="unsloth.grouped_gemm_dW", modes=["exact", "normal"],
                          profile="gmm-ci", max_examples=30)
    assert [(r.check, r.status) for r in report] == [("exact", Status.PASSED), ("normal", Status.PASSED)]
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(torch_dw_expert_order, convention="unsloth.grouped_gemm_dW", modes=["normal"], profile="gmm-ci",
                     max_examples=30)
    assert re.match(EXPERT, str(info.value)), str(info.value)
    assert "likely culprit: the cotangent rows read in expert order" in str(info.value), str(info.value)
    assert "Routing: T=" in "\n".join(info.value.__notes__)


@pytest.mark.parametrize("name", KERNELS)
def test_without_the_wheel_each_kernel_is_na_naming_how_to_get_it(name, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    reason = get(name)._unavailable()
    assert reason is not None and f"no unsloth {adapter.WHEEL_VERSION} wheel found" in reason
    assert "pip download --no-deps" in reason


@needs_wheel
@interpreted
@pytest.mark.parametrize("name", KERNELS)
def test_the_wheels_kernel_computes_each_form_exactly(name, monkeypatch):
    """Small integers, both forms, an expert without slots: every gradient element exact."""
    monkeypatch.setenv(ENV, WHEEL)
    kernel = get(name)
    k, n = (32, 48) if name.endswith("dX") else (40, 8)
    for ids in (np.array([[2, 0], [1, 2], [2, 2], [0, 1]], np.int32), np.array([[2, 1], [1, 2], [2, 2]], np.int32)):
        rng = np.random.default_rng(len(ids))
        b = RoutedBackward(rng.integers(-2, 3, (len(ids), k)).astype(np.float32),
                           rng.integers(-2, 3, (4, n, k)).astype(np.float32), ids,
                           cotangent=rng.integers(-2, 3, (*ids.shape, n)).astype(np.float32),
                           existing=rng.integers(-2, 3, (4, n, k)).astype(np.float32) if "accumulate" in name else None)
        out = kernel.run(b)
        g = gmm_ref.routed_gradients(b)
        want = g.inputs.slots if name.endswith("dX") else g.experts
        assert np.array_equal(out, want), backward_form_of(b)


@needs_wheel
@interpreted
@pytest.mark.parametrize("name", KERNELS)
def test_the_wheels_kernel_passes_the_routed_modes(name, monkeypatch):
    monkeypatch.setenv(ENV, WHEEL)
    report = check_kernel(name, modes=["exact", "normal", "poisoned"], profile="gmm-ci", max_examples=8)
    assert [(r.check, r.status) for r in report] == [(m, Status.PASSED) for m in ("exact", "normal", "poisoned")]


# the wheel's kernels, one line edited (each old text occurs once in its function)
DX_EDITS = {
    # permute_x: dX stored in expert order, the scatter back to slot order dropped
    "dx_not_scattered": ("store_idx = expert_token_offsets * K", "store_idx = indices_to_gather_64[:, None] * K"),
    # permute_y: dY read in expert order, the gather from slot order dropped
    "dy_not_gathered": ("load_a_idx = expert_token_offsets * N", "load_a_idx = indices_to_gather_64[:, None] * N"),
    # the last N block never loaded
    "n_block_dropped": ("for n_offset in range(0, N, BLOCK_SIZE_N):",
                        "for n_offset in range(0, N - BLOCK_SIZE_N, BLOCK_SIZE_N):"),
}
DW_EDITS = {
    # permute_x: X read at row gather (the flat slot index) instead of gather // topk (the token)
    "x_row_not_divided_by_topk": ("x_rows = token_idx // TOPK", "x_rows = token_idx"),
    # permute_y: dY read in expert order instead of at its slot's row
    "dy_read_in_expert_order": ("dY_rows = token_idx", "dY_rows = rows64"),
    # an expert without slots returns before writing its (torch.empty) tile, as the accumulating form may
    "empty_expert_not_written": ("    if ACCUMULATE:\n        if m_size == 0:",
                                 "    if True:\n        if m_size == 0:"),
    # the K tail dropped: the columns past the last whole K tile neither read nor written
    "k_tail_dropped": ("k_mask = block_range_k + k_offset < K",
                       "k_mask = block_range_k + k_offset < K // BLOCK_SIZE_K * BLOCK_SIZE_K"),
    # the N tail dropped
    "n_tail_dropped": ("n_mask = block_range_n + n_offset < N",
                       "n_mask = block_range_n + n_offset < N // BLOCK_SIZE_N * BLOCK_SIZE_N"),
}
ACCUMULATE_EDITS = {
    # the existing gradient overwritten, not added into
    "existing_overwritten": [("accumulator += prev.to(acc_dtype)", "accumulator = accumulator")],
}


def _cheap(name):
    """The adapter ``name`` drawing 8 experts only, dW at its extents of one to three tiles (K and N tails both
    drawn): a twin's failure shrinks in seconds rather than a minute."""
    base = type(get(name))
    extents = None if name.endswith("dX") else ((8, 16), (40, 8))

    class Cheap(base):
        def routed_limits(self):
            return dataclasses.replace(super().routed_limits(), num_experts=(8,), extents=extents)

    return Cheap()


def _edited(tmp_path, function, edits, bug):
    wheel = WHEEL
    for i, (old, new) in enumerate(edits):
        wheel = edited_wheel(wheel, adapter.BACKWARD_MEMBER, function, old, new, tmp_path / f"{bug}-{i}.whl")
    return wheel


@needs_wheel
@interpreted
@pytest.mark.parametrize("bug", sorted(DX_EDITS))
def test_the_dx_kernel_with_one_line_broken_is_rejected_naming_token_slot_and_expert(bug, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, _edited(tmp_path, "_grouped_gemm_dX_kernel", [DX_EDITS[bug]], bug))
    text = rejected(_cheap("unsloth.grouped_gemm_dX"), max_examples=20)
    assert re.match(SLOT, text), text


@needs_wheel
@interpreted
@pytest.mark.parametrize(("name", "bug"), [("unsloth.grouped_gemm_dW", b) for b in sorted(DW_EDITS)]
                         + [("unsloth.grouped_gemm_dW_accumulate", b) for b in sorted(ACCUMULATE_EDITS)])
def test_the_dw_kernel_with_one_line_broken_is_rejected_naming_expert_and_element(name, bug, tmp_path, monkeypatch):
    edits = [DW_EDITS[bug]] if bug in DW_EDITS else ACCUMULATE_EDITS[bug]
    monkeypatch.setenv(ENV, _edited(tmp_path, "_grouped_gemm_dW_per_expert_kernel", edits, bug))
    text = rejected(_cheap(name), max_examples=20)
    if bug == "x_row_not_divided_by_topk":  # rows up to T * top_k: the interpreter's checked loads see it first
        assert re.match(r"kernel \S+ read out of bounds: .* past the end of x_ptr", text), text
        return
    assert re.match(EXPERT, text), text
    culprit = {"empty_expert_not_written": "no slot routes to expert", "dy_read_in_expert_order":
               "the cotangent rows read in expert order", "existing_overwritten": "the existing gradient is missing"}
    assert culprit.get(bug, "") in text, text


@needs_wheel
@interpreted
def test_the_accumulating_kernel_seeded_with_the_existing_gradient_fails_where_the_bound_separates_it(tmp_path,
                                                                                                    monkeypatch):
    """Two lines moved: the accumulator starts from the existing tile instead of adding it after the reduction.
    float32 dW, 2**25 existing, three M tiles each adding 1 (test_routed_gradients.py has the arithmetic): the
    wheel's kernel gives the rounded reference, the seeded one loses every tile's 1."""
    ids = np.zeros((40, 1), np.int32)
    x = np.zeros((40, 8), np.float32)
    x[:, 0] = 1
    dy = np.zeros((40, 1, 16), np.float32)
    dy[[0, 16, 32], 0, 0] = 1
    existing = np.zeros((2, 16, 8), np.float32)
    existing[0, 0, 0] = 2.0 ** 25
    b = RoutedBackward(x, np.zeros((2, 16, 8), np.float32), ids, cotangent=dy, existing=existing)
    monkeypatch.setenv(ENV, WHEEL)
    kernel = get("unsloth.grouped_gemm_dW_accumulate")
    gmm_ref.assert_routed_matches(kernel.run(b), gmm_ref.routed_gradients(b), output="d_experts",
                                  numerics=kernel.numerics_for(b))
    seed = ("accumulator = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_K), dtype = acc_dtype)",
            "accumulator = tl.load(dW_ptr + (expert_idx.to(tl.int64) * N + n_offset + block_range_n)[:, None] * K "
            "+ (k_offset + block_range_k)[None, :], mask = n_mask[:, None] & k_mask[None, :], other = 0.0)"
            ".to(acc_dtype)")
    monkeypatch.setenv(ENV, _edited(tmp_path, "_grouped_gemm_dW_per_expert_kernel",
                                    [seed, ACCUMULATE_EDITS["existing_overwritten"][0]], "seeded"))
    with pytest.raises(gmm_ref.Mismatch, match=r"expert 0 \(local 0\), n 0, k 0: got 33554432\.0, expected "
                                                r"33554436\.0 within 2"):
        gmm_ref.assert_routed_matches(kernel.run(b), gmm_ref.routed_gradients(b), output="d_experts",
                                      numerics=kernel.numerics_for(b))
    # the drawn exact mode reaches it too: an expert over several M tiles, an existing element of +-2**25
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(_cheap("unsloth.grouped_gemm_dW_accumulate"), modes=["exact"], profile="gmm-ci",
                     max_examples=50)
    assert re.match(EXPERT, str(info.value)) and "plus the existing gradient" in str(info.value), str(info.value)
