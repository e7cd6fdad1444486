"""The routed MoE model (gmm_ref.routed.routing) and its metadata (gmm_ref.routed.metadata), docs/routed.md.

Hand-checked examples use small integers, so every value is exact and written out by hand; the metadata's
expected arrays are worked out by hand from the semantics in the docs (never copied from a kernel's output);
each validator is shown to reject a deliberately corrupted metadata with a message naming the index; each
bound holds for a simulated kernel of its numerics and fails for a broken one.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from gmm_ref.numerics import Numerics
from gmm_ref.routed.metadata import (
    max_num_tokens_padded,
    moe_align_block_size,
    unsloth_routing_indices,
    validate_moe_align_block_size,
    validate_unsloth_routing,
)
from gmm_ref.routed.routing import RoutedNumerics, Routing, routed_reference

BF16 = ml_dtypes.bfloat16
I32 = np.int32


def _ids(rows) -> np.ndarray:
    return np.array(rows, I32).reshape(len(rows), -1)


# ------------------------------------------------------------------------------------------ hand-checked
# tokens [3, 2], experts [3, N=2, K=2] (enk): W[e] @ x is easy by hand
X = np.array([[1, 2], [3, 4], [-1, 1]], np.float32)
W = np.array([[[1, 0], [0, 1]],        # expert 0: identity -> (x0, x1)
              [[1, 1], [0, 0]],        # expert 1: (x0 + x1, 0)
              [[2, 0], [0, -1]]],      # expert 2: (2 x0, -x1)
             np.float32)


def test_top_k_1_by_hand():
    ref = routed_reference(Routing(X, W, _ids([[1], [0], [2]])))
    assert ref.slots.shape == (3, 1, 2)
    np.testing.assert_array_equal(ref.slots[:, 0], [[3, 0], [3, 4], [-2, -1]])
    np.testing.assert_array_equal(ref.combined, [[3, 0], [3, 4], [-2, -1]])
    assert ref.slots.dtype == np.float32


def test_top_k_2_with_weights_and_an_expert_without_tokens_by_hand():
    # expert 1 gets no slot; token 1 lists expert 2 in both slots (the model allows it)
    w = np.array([[0.5, 2], [1, -1], [4, 0]], np.float32)
    r = Routing(X, W, _ids([[0, 2], [2, 2], [0, 2]]), w, mul_routed_weight=True)
    ref = routed_reference(r)
    assert r.repeats_an_expert
    np.testing.assert_array_equal(ref.products[:, :, :], [[[1, 2], [2, -2]], [[6, -4], [6, -4]],
                                                          [[-1, 1], [-2, -1]]])
    np.testing.assert_array_equal(ref.slots, [[[0.5, 1], [4, -4]], [[6, -4], [-6, 4]], [[-4, 4], [0, 0]]])
    np.testing.assert_array_equal(ref.combined, [[4.5, -3], [0, 0], [-4, 4]])


def test_without_mul_routed_weight_the_weights_are_not_applied():
    w = np.full((3, 2), 3, np.float32)
    ref = routed_reference(Routing(X, W, _ids([[0, 1], [0, 1], [0, 1]]), w))
    np.testing.assert_array_equal(ref.slots[0], [[1, 2], [3, 0]])
    np.testing.assert_array_equal(ref.combined[0], [4, 2])


def test_every_token_on_one_expert_and_the_ekn_layout():
    ekn = np.ascontiguousarray(W.transpose(0, 2, 1))
    a = routed_reference(Routing(X, W, _ids([[2], [2], [2]])))
    b = routed_reference(Routing(X, ekn, _ids([[2], [2], [2]]), expert_layout="ekn"))
    np.testing.assert_array_equal(a.slots[:, 0], [[2, -2], [6, -4], [-2, -1]])
    np.testing.assert_array_equal(a.slots, b.slots)


def test_non_local_experts_give_zeros_and_nan_rows_do_not_leak():
    # 4 global experts; this rank holds global 1 (local 0) and global 3 (local 1)
    emap = np.array([-1, 0, -1, 1], I32)
    x = X.copy()
    x[2] = np.nan  # token 2 goes to non-local experts only
    w_local = W[:2]
    r = Routing(x, w_local, _ids([[1, 0], [2, 3], [0, 2]]), expert_map=emap)
    ref = routed_reference(r)
    np.testing.assert_array_equal(r.local_ids, [[0, -1], [-1, 1], [-1, -1]])
    np.testing.assert_array_equal(ref.slots, [[[1, 2], [0, 0]], [[0, 0], [7, 0]], [[0, 0], [0, 0]]])
    np.testing.assert_array_equal(ref.combined, [[1, 2], [7, 0], [0, 0]])
    assert ref.slots_mask.all()
    weights = np.array([[1, np.nan], [np.inf, 2], [np.nan, np.nan]], np.float32)  # on non-local slots only
    weighted = routed_reference(Routing(x, w_local, r.topk_ids, weights, expert_map=emap, mul_routed_weight=True))
    np.testing.assert_array_equal(weighted.combined, [[1, 2], [14, 0], [0, 0]])
    assert np.isfinite(weighted.combined_bound()).all()
    assert np.isfinite(weighted.combined_bound(RoutedNumerics(weight="output", combine=np.float32))).all()
    und = routed_reference(Routing(x, w_local, r.topk_ids, expert_map=emap, foreign="undefined"))
    np.testing.assert_array_equal(und.slots_mask[:, :, 0], [[True, False], [False, True], [False, False]])


def test_a_rank_with_no_local_expert():
    r = Routing(X, np.zeros((0, 2, 2), np.float32), _ids([[0], [1], [0]]), expert_map=np.array([-1, -1], I32))
    ref = routed_reference(r)
    np.testing.assert_array_equal(ref.slots, np.zeros((3, 1, 2)))
    assert (ref.slot_bound() == 0).all()


def test_t_0_and_t_1():
    empty = routed_reference(Routing(np.zeros((0, 2), np.float32), W, np.zeros((0, 2), I32)))
    assert empty.slots.shape == (0, 2, 2) and empty.combined.shape == (0, 2)
    assert empty.combined_bound().shape == (0, 2)
    one = routed_reference(Routing(X[:1], W, _ids([[2, 0]])))
    np.testing.assert_array_equal(one.combined, [[3, 0]])


# ----------------------------------------------------------------------------------- against a direct loop
def _loop(x, w, ids, weights, emap, layout, mul):
    t_, k_ = ids.shape
    n = w.shape[1] if layout == "enk" else w.shape[2]
    slots = np.zeros((t_, k_, n))
    for t in range(t_):
        for j in range(k_):
            e = int(ids[t, j]) if emap is None else int(emap[ids[t, j]])
            if e < 0:
                continue
            mat = w[e].astype(np.float64) if layout == "ekn" else w[e].astype(np.float64).T
            for c in range(n):
                acc = 0.0
                for kk in range(x.shape[1]):
                    acc += float(x[t, kk]) * float(mat[kk, c])
                slots[t, j, c] = acc * (float(weights[t, j]) if mul else 1.0)
    return slots


@pytest.mark.parametrize("seed", range(6))
def test_the_reference_matches_a_direct_float64_loop(seed):
    rng = np.random.default_rng(seed)
    t_, k, n, e_glob, top_k = int(rng.integers(0, 7)), int(rng.integers(1, 9)), int(rng.integers(1, 6)), 5, \
        int(rng.integers(1, 4))
    layout = ("enk", "ekn")[seed % 2]
    emap = np.array([0, -1, 1, 2, -1], I32) if seed % 3 == 0 else None
    e_loc = 3 if emap is not None else e_glob
    x = rng.integers(-8, 8, (t_, k)).astype(BF16)
    shape = (e_loc, n, k) if layout == "enk" else (e_loc, k, n)
    w = rng.integers(-8, 8, shape).astype(BF16)
    ids = rng.integers(0, e_glob, (t_, top_k)).astype(np.int64)
    weights = (rng.integers(-4, 5, (t_, top_k)) / 4).astype(np.float32)
    r = Routing(x, w, ids, weights, expert_layout=layout, expert_map=emap, mul_routed_weight=True,
                out_dtype=np.float32)
    ref = routed_reference(r)
    want = _loop(x, w, ids, weights, emap, layout, True)
    np.testing.assert_array_equal(ref.slots_exact, want)  # small integers and quarters: exact
    np.testing.assert_array_equal(ref.combined_exact, want.sum(axis=1))


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(("kwargs", "exc", "words"), [
    ({"topk_ids": _ids([[0], [3], [1]])}, ValueError, "topk_ids[1, 0] = 3: expected an expert id in [0, 3)"),
    ({"topk_ids": _ids([[0], [-1], [1]])}, ValueError, "topk_ids[1, 0] = -1"),
    ({"topk_ids": np.zeros((3, 1), np.float32)}, TypeError, "topk_ids: expected int32 or int64"),
    ({"topk_ids": np.zeros((3, 0), I32)}, ValueError, "top_k >= 1"),
    ({"topk_ids": np.zeros((2, 1), I32)}, ValueError, "topk_ids: expected shape [T=3"),
    ({"experts": np.zeros((3, 2, 5), np.float32)}, ValueError, "experts: expected K = 2"),
    ({"experts": np.zeros((3, 2, 2), np.int8)}, TypeError, "experts: expected a float dtype"),
    ({"tokens": X[0]}, ValueError, "tokens: expected 2 dimensions"),
    ({"mul_routed_weight": True}, ValueError, "topk_weights: required with mul_routed_weight"),
    ({"topk_weights": np.ones((3, 2), np.float32)}, ValueError, "topk_weights: expected the shape of topk_ids"),
    ({"topk_weights": np.ones((3, 1), np.float64)}, TypeError, "topk_weights: expected one of"),
    ({"expert_map": np.array([0, 3, -1], I32)}, ValueError, "expert_map[1] = 3"),
    ({"expert_map": np.array([0, 0, 1, 2], I32)}, ValueError, "expert_map[0] and expert_map[1] both map"),
    ({"expert_layout": "nke"}, ValueError, "expert_layout: expected one of"),
    ({"foreign": "garbage"}, ValueError, "foreign: expected one of"),
])
def test_bad_routings_are_refused_naming_the_argument(kwargs, exc, words):
    args = {"tokens": X, "experts": W, "topk_ids": _ids([[0], [1], [2]])} | kwargs
    with pytest.raises(exc, match=re.escape(words)):
        Routing(**args)


def test_bad_numerics_are_refused():
    with pytest.raises(ValueError, match="weight: expected one of"):
        RoutedNumerics(weight="twice")
    with pytest.raises(ValueError, match="combine: 'accumulator' sums the weighted products"):
        RoutedNumerics(weight="output")
    with pytest.raises(TypeError, match="combine: expected 'accumulator' or a float dtype"):
        RoutedNumerics(combine=np.int32)
    with pytest.raises(TypeError, match="routing: expected"):
        routed_reference(X)
    ref = routed_reference(Routing(X, W, _ids([[0], [1], [2]])))
    with pytest.raises(TypeError, match=r"numerics: expected a gmm_ref.RoutedNumerics or None, got Numerics \(wrap"):
        ref.slot_bound(Numerics())
    with pytest.raises(TypeError, match=r"numerics: expected a gmm_ref\.Numerics, got str"):
        ref.product_error("float32")
    with pytest.raises(TypeError, match=r"product: expected a gmm_ref\.Numerics or None"):
        RoutedNumerics(product="float32")


# ------------------------------------------------------------------------------------- vLLM's metadata
# topk_ids [[2, 3, 0], [1, 2, 0], [1, 3, 0], [1, 2, 3]] flattens to experts
# flat index: 0  1  2  3  4  5  6  7  8  9 10 11
# expert:     2  3  0  1  2  0  1  3  0  1  2  3
# expert 0: 2 5 8; expert 1: 3 6 9; expert 2: 0 4 10; expert 3: 1 7 11; each padded by one sentinel (12).
IDS = _ids([[2, 3, 0], [1, 2, 0], [1, 3, 0], [1, 2, 3]])
S = 12


def test_moe_align_block_size_by_hand():
    sorted_ids, expert_ids, post = moe_align_block_size(IDS, 4, 4)
    # 12 + 4 * 3 = 24 entries, 6 blocks; past 16 all sentinels, blocks past 4 hold 0
    np.testing.assert_array_equal(sorted_ids, [2, 5, 8, S, 3, 6, 9, S, 0, 4, 10, S, 1, 7, 11, S] + [S] * 8)
    np.testing.assert_array_equal(expert_ids, [0, 1, 2, 3, 0, 0])
    np.testing.assert_array_equal(post, [16])
    assert sorted_ids.dtype == expert_ids.dtype == post.dtype == np.int32
    validate_moe_align_block_size(IDS, 4, 4, sorted_ids, expert_ids, post)


def test_moe_align_block_size_experts_without_slots_and_full_blocks():
    # 6 experts, block 2: expert 0 x1, expert 1 none, expert 2 x2, expert 3 none, expert 4 x3, expert 5 none
    ids = _ids([[4, 0], [2, 4], [2, 4]])  # flat: 0:4 1:0 2:2 3:4 4:2 5:4
    sorted_ids, expert_ids, post = moe_align_block_size(ids, 2, 6, pad_sorted_ids=True)
    assert max_num_tokens_padded(6, 2, 6, True) == 12 == sorted_ids.size  # 6 + 6 * 1 = 12, a multiple of 2
    np.testing.assert_array_equal(sorted_ids, [1, 6, 2, 4, 0, 3, 5, 6, 6, 6, 6, 6])
    np.testing.assert_array_equal(expert_ids, [0, 2, 4, 4, 0, 0])
    np.testing.assert_array_equal(post, [8])


def test_moe_align_block_size_fewer_slots_than_experts_and_t_0():
    sorted_ids, expert_ids, post = moe_align_block_size(_ids([[5]]), 4, 8)
    # numel 1 < 8 experts: min(1 * 4, 1 + 8 * 3) = 4 entries, one block
    np.testing.assert_array_equal(sorted_ids, [0, 1, 1, 1])
    np.testing.assert_array_equal(expert_ids, [5])
    np.testing.assert_array_equal(post, [4])
    sorted_ids, expert_ids, post = moe_align_block_size(np.zeros((0, 2), I32), 4, 8)
    assert sorted_ids.size == 0 and expert_ids.size == 0
    np.testing.assert_array_equal(post, [0])
    validate_moe_align_block_size(np.zeros((0, 2), I32), 4, 8, sorted_ids, expert_ids, post)


def test_moe_align_block_size_under_an_expert_map():
    emap = np.array([-1, 0, -1, 1], I32)  # global 1 -> local 0, global 3 -> local 1
    sorted_ids, expert_ids, post = moe_align_block_size(IDS, 4, 4, emap)
    # every expert is aligned, then the block ids are mapped: 0 -> -1, 1 -> 0, 2 -> -1, 3 -> 1; the trailing
    # blocks' 0 becomes expert_map[0] = -1
    np.testing.assert_array_equal(sorted_ids[:16], [2, 5, 8, S, 3, 6, 9, S, 0, 4, 10, S, 1, 7, 11, S])
    np.testing.assert_array_equal(expert_ids, [-1, 0, -1, 1, -1, -1])
    validate_moe_align_block_size(IDS, 4, 4, sorted_ids, expert_ids, post, emap)
    sorted_ids, expert_ids, post = moe_align_block_size(IDS, 4, 4, emap, ignore_invalid_experts=True)
    # non-local slots left out; runs by local id: local 0 (global 1) = 3 6 9, local 1 (global 3) = 1 7 11
    np.testing.assert_array_equal(sorted_ids, [3, 6, 9, S, 1, 7, 11, S] + [S] * 16)
    np.testing.assert_array_equal(expert_ids, [0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(post, [8])
    validate_moe_align_block_size(IDS, 4, 4, sorted_ids, expert_ids, post, emap, ignore_invalid_experts=True)


def test_moe_align_block_size_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"topk_ids\[0, 2\] = 4: expected an expert id in \[0, 4\)"):
        moe_align_block_size(_ids([[0, 1, 4]]), 4, 4)
    with pytest.raises(ValueError, match="block_size: expected a positive integer, got 0"):
        moe_align_block_size(IDS, 0, 4)
    with pytest.raises(ValueError, match="expert_map: expected num_experts = 4 entries"):
        moe_align_block_size(IDS, 4, 4, np.array([0, 1], I32))


def _corrupt(change):
    sorted_ids, expert_ids, post = (a.copy() for a in moe_align_block_size(IDS, 4, 4))
    change(sorted_ids, expert_ids, post)
    return sorted_ids, expert_ids, post


@pytest.mark.parametrize(("change", "words"), [
    # a sentinel before a real slot of expert 0
    (lambda s, e, p: s.__setitem__(slice(2, 4), [S, 8]), "sorted_token_ids[2] = 12 (the sentinel) inside expert 0"),
    # a real slot where the padding belongs
    (lambda s, e, p: s.__setitem__(3, 9), "sorted_token_ids[3] = 9: expected the sentinel 12"),
    # a slot of expert 1 in expert 0's run
    (lambda s, e, p: s.__setitem__(0, 3), "sorted_token_ids[0] = 3 (token 1, slot 0) routes to expert 1"),
    (lambda s, e, p: s.__setitem__(0, 5), "sorted_token_ids[1] = 5 (token 1, slot 2, expert 0) repeats"),
    (lambda s, e, p: s.__setitem__(0, 13), "sorted_token_ids[0] = 13: expected a flat slot index"),
    # expert_ids shifted by one block
    (lambda s, e, p: e.__setitem__(slice(0, 4), [1, 2, 3, 0]), "expert_ids[0] = 1: block 0 holds the slots of "
                                                               "expert 0"),
    (lambda s, e, p: p.__setitem__(0, 12), "num_tokens_post_padded[0] = 12: expected 16"),
    (lambda s, e, p: s.__setitem__(20, 0), "sorted_token_ids[20] = 0: past num_tokens_post_padded"),
])
def test_the_vllm_validator_names_the_corrupted_index(change, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        validate_moe_align_block_size(IDS, 4, 4, *_corrupt(change))


def test_the_vllm_validator_accepts_any_order_inside_a_run_and_checks_the_mapped_ids():
    sorted_ids, expert_ids, post = moe_align_block_size(IDS, 4, 4)
    sorted_ids[:3] = [8, 2, 5]  # the CUDA op's atomics may place an expert's slots in any order
    validate_moe_align_block_size(IDS, 4, 4, sorted_ids, expert_ids, post)
    emap = np.array([-1, 0, -1, 1], I32)
    s, e, p = moe_align_block_size(IDS, 4, 4, emap)
    e[0] = 0  # expert 0 is not local: its block must be -1 (written as zeros), not computed with local expert 0
    with pytest.raises(ValueError, match=r"expert_ids\[0\] = 0: block 0 holds the slots of expert 0, expected "
                                         r"expert_map\[0\] = -1"):
        validate_moe_align_block_size(IDS, 4, 4, s, e, p, emap)
    s, e, p = moe_align_block_size(IDS, 4, 4, emap, ignore_invalid_experts=True)
    s[0] = 0  # a non-local slot where ignore_invalid_experts leaves them out
    with pytest.raises(ValueError, match=r"sorted_token_ids\[0\] = 0 \(token 0, slot 0\) routes to expert -1"):
        validate_moe_align_block_size(IDS, 4, 4, s, e, p, emap, ignore_invalid_experts=True)


# ----------------------------------------------------------------------------------- unsloth's metadata
def test_unsloth_routing_indices_by_hand():
    m_sizes, gather = unsloth_routing_indices(IDS, 5)
    np.testing.assert_array_equal(m_sizes, [3, 3, 3, 3, 0])  # per expert, not cumulative; expert 4 has none
    np.testing.assert_array_equal(gather, [2, 5, 8, 3, 6, 9, 0, 4, 10, 1, 7, 11])
    assert m_sizes.dtype == np.int32 and gather.dtype == np.int64
    validate_unsloth_routing(IDS, 5, m_sizes, gather)
    one = unsloth_routing_indices(_ids([[1], [1]]), 2)
    np.testing.assert_array_equal(one[0], [0, 2])
    np.testing.assert_array_equal(one[1], [0, 1])


@pytest.mark.parametrize(("change", "words"), [
    (lambda m, g: m.__setitem__(slice(None), np.cumsum(m)), "m_sizes[1] = 6: topk_ids routes 3 slots to expert 1 "
                                                            "(m_sizes holds per-expert counts, not cumulative"),
    (lambda m, g: m.__setitem__(slice(0, 2), [4, 2]), "m_sizes[0] = 4: topk_ids routes 3 slots to expert 0"),
    (lambda m, g: g.__setitem__(slice(2, 4), [3, 8]), "gather_indices[2] = 3 (token 1, slot 0) routes to expert 1, "
                                                      "but row 2 is in expert 0's rows"),
    (lambda m, g: g.__setitem__(1, 2), "gather_indices[1] = 2 (token 0, slot 2) repeats gather_indices[0]"),
    (lambda m, g: g.__setitem__(11, 12), "gather_indices[11] = 12: expected a flat slot index in [0, 12)"),
])
def test_the_unsloth_validator_names_the_corrupted_index(change, words):
    m_sizes, gather = unsloth_routing_indices(IDS, 5)
    change(m_sizes, gather)
    with pytest.raises(ValueError, match=re.escape(words)):
        validate_unsloth_routing(IDS, 5, m_sizes, gather)


# ------------------------------------------------------------------------------------------------ bounds
def _routing(seed, top_k=4, t_=16, k=64, n=24, e=6):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t_, k)).astype(BF16)
    w = rng.standard_normal((e, n, k)).astype(BF16)
    ids = np.stack([rng.permutation(e)[:top_k] for _ in range(t_)]).astype(I32)
    weights = rng.random((t_, top_k)).astype(np.float32)
    return Routing(x, w, ids, weights, mul_routed_weight=True, out_dtype=BF16)


def _kernel_products(r: Routing) -> np.ndarray:
    """float32 products as a bf16 kernel's float32 accumulator forms them."""
    x = r.tokens.astype(np.float32)
    w = r.experts.astype(np.float32)
    return np.einsum("tk,tjnk->tjn", x, w[r.topk_ids], dtype=np.float32)


def _vllm_like(r: Routing, twice: bool = False) -> np.ndarray:
    """vLLM: the accumulator times the float32 weight, one rounding to bf16 (``twice``: a broken kernel)."""
    acc = _kernel_products(r) * r.topk_weights[:, :, None]
    if twice:
        acc = acc * r.topk_weights[:, :, None]
    return acc.astype(BF16)


def _check(actual: np.ndarray, exact: np.ndarray, bound: np.ndarray) -> float:
    """The largest error over bound (<= 1: within it)."""
    return float((np.abs(actual.astype(np.float64) - exact) / np.maximum(bound, 1e-300)).max())


@pytest.mark.parametrize("seed", range(3))
def test_the_slot_bound_holds_for_vllm_like_numerics_and_catches_a_weight_applied_twice(seed):
    r = _routing(seed)
    ref = routed_reference(r)
    bound = ref.slot_bound()
    assert _check(_vllm_like(r), ref.slots_exact, bound) <= 1
    assert _check(ref.slots, ref.slots_exact, bound) <= 1  # the reference's own rounding is within it
    assert _check(_vllm_like(r, twice=True), ref.slots_exact, bound) > 1
    # the bound is that of one rounding to bf16 and a float32 K = 64 sum, not more
    assert (bound <= 2 ** -8 * np.abs(ref.slots_exact) + 1e-3).all()


@pytest.mark.parametrize("seed", range(3))
def test_the_slot_bound_of_unsloths_weight_after_rounding(seed):
    r = _routing(seed)
    ref = routed_reference(r)
    y = _kernel_products(r).astype(BF16)  # FUSE_MUL_POST: rounded, then times the weight rounded, in bf16
    actual = (y.astype(np.float32) * r.topk_weights.astype(BF16).astype(np.float32)[:, :, None]).astype(BF16)
    late = RoutedNumerics(weight="output", combine=BF16)
    assert _check(actual, ref.slots_exact, ref.slot_bound(late)) <= 1
    assert (ref.slot_bound(late) >= ref.slot_bound()).all()


def test_the_combined_bounds_hold_for_their_numerics_and_a_bf16_sum_fails_the_accumulator_one():
    r = _routing(7, top_k=4)
    ref = routed_reference(r)
    slots = _vllm_like(r)
    bf16_sum = slots[:, 0]
    for j in range(1, r.top_k):  # vLLM's moe_sum: each add rounds to bf16
        bf16_sum = (bf16_sum.astype(np.float32) + slots[:, j].astype(np.float32)).astype(BF16)
    f32_sum = slots.astype(np.float32).sum(axis=1).astype(BF16)
    fused = (_kernel_products(r) * r.topk_weights[:, :, None]).sum(axis=1, dtype=np.float32).astype(BF16)
    assert _check(bf16_sum, ref.combined_exact, ref.combined_bound(RoutedNumerics(combine=BF16))) <= 1
    assert _check(f32_sum, ref.combined_exact, ref.combined_bound(RoutedNumerics(combine=np.float32))) <= 1
    assert _check(fused, ref.combined_exact, ref.combined_bound()) <= 1
    assert _check(ref.combined, ref.combined_exact, ref.combined_bound()) <= 1
    # a sum in bf16 cancelling: slots 1 + 2**-8 and -1 (each rounded to bf16 first) give 0, not 2**-8
    x = np.array([[1, 2 ** -8]], BF16)
    w = np.array([[[1, 1]], [[-1, 0]]], BF16)  # [E=2, N=1, K=2]
    cancel = routed_reference(Routing(x, w, _ids([[0, 1]]), out_dtype=BF16))
    assert cancel.combined_exact[0, 0] == 2 ** -8
    assert cancel.combined_bound()[0, 0] < 2 ** -8  # the accumulator's bound catches a bf16 combine
    assert cancel.combined_bound(RoutedNumerics(combine=BF16))[0, 0] >= 2 ** -8  # the declared bf16 one allows it


def test_the_bounds_grow_with_the_accumulator_declared():
    r = _routing(3)
    ref = routed_reference(r)
    narrow = ref.slot_bound(RoutedNumerics(product=Numerics(accumulate=np.float16)))
    assert (narrow >= ref.slot_bound()).all() and (narrow > ref.slot_bound()).any()
    assert ref.product_error(Numerics()).shape == ref.slots.shape


@pytest.mark.parametrize("broken", ["no weight", "dropped slot", "swapped slots", "next expert"])
def test_broken_kernels_fail_every_declared_bound(broken):
    r = _routing(11)
    ref = routed_reference(r)
    prods = _kernel_products(r)
    if broken == "next expert":  # expert_ids shifted by one: each slot computed with the next expert
        shifted = Routing(r.tokens, r.experts, (r.topk_ids + 1) % r.num_experts)
        prods = _kernel_products(shifted)
    weights = np.ones_like(r.topk_weights) if broken == "no weight" else r.topk_weights
    slots = (prods * weights[:, :, None]).astype(BF16)
    if broken == "dropped slot":
        slots[3, 1] = 0
    if broken == "swapped slots":
        slots[5] = slots[5, ::-1]
    for numerics in (RoutedNumerics(), RoutedNumerics(weight="output", combine=BF16)):
        assert _check(slots, ref.slots_exact, ref.slot_bound(numerics)) > 1
    if broken != "swapped slots":  # a swap inside one token leaves its sum as it was
        for numerics in (RoutedNumerics(combine=BF16), RoutedNumerics(combine=np.float32)):
            total = slots.astype(np.float32).sum(axis=1).astype(BF16)
            assert _check(total, ref.combined_exact, ref.combined_bound(numerics)) > 1


@pytest.mark.parametrize("seed", range(8))
def test_the_builders_pass_their_validators_and_a_moved_slot_does_not(seed):
    rng = np.random.default_rng(seed)
    e = int(rng.integers(1, 40))
    ids = rng.integers(0, e, (int(rng.integers(0, 30)), int(rng.integers(1, 5)))).astype((I32, np.int64)[seed % 2])
    bs = int(rng.choice([1, 2, 4, 16]))
    emap = None
    if seed % 3:
        local = rng.random(e) < 0.5
        emap = np.where(local, np.cumsum(local) - 1, -1).astype(I32)
    ignore = bool(seed % 2) and emap is not None
    meta = moe_align_block_size(ids, bs, e, emap, pad_sorted_ids=bool(seed % 4 == 1), ignore_invalid_experts=ignore)
    validate_moe_align_block_size(ids, bs, e, *meta, emap, ignore)
    sorted_ids, expert_ids, post = (a.copy() for a in meta)
    real = np.flatnonzero(sorted_ids[:post[0]] < ids.size)
    if real.size:  # a slot moved onto a sentinel of another run, or its own run's slot replaced
        i = int(real[0])
        sorted_ids[i] = ids.size
        with pytest.raises(ValueError, match=r"sorted_token_ids\[\d+\]"):
            validate_moe_align_block_size(ids, bs, e, sorted_ids, expert_ids, post, emap, ignore)
    m_sizes, gather = unsloth_routing_indices(ids, e)
    validate_unsloth_routing(ids, e, m_sizes, gather)
    assert m_sizes.sum() == ids.size
    np.testing.assert_array_equal(np.sort(gather), np.arange(ids.size))


def test_a_nan_token_on_a_local_expert_stays_in_its_own_rows():
    x = X.copy()
    x[0, 1] = np.nan
    ref = routed_reference(Routing(x, W, _ids([[0, 1], [1, 2], [2, 0]]), np.ones((3, 2), np.float32),
                                   mul_routed_weight=True))
    assert np.isnan(ref.slots[0]).all() and np.isfinite(ref.slots[1:]).all()
    assert np.isnan(ref.combined[0]).all() and np.isfinite(ref.combined[1:]).all()
    assert np.isfinite(ref.slot_bound()[1:]).all() and np.isfinite(ref.combined_bound()[1:]).all()
