"""``torch.moe_experts``: the combined ``[T, N]`` output of a MoE layer's experts (docs/routed.md), its convention,
the built-in torch adapter, and broken twins, one per real bug class, each rejected naming token, slot and expert."""

from __future__ import annotations

import numpy as np
import pytest

import gmm_ref
from gmm_kernels.adapters.torch_moe import TorchMoEExperts
from gmm_ref import RoutedNumerics, conventions
from property_tests.checks.check import check_kernel

torch = pytest.importorskip("torch", reason="the torch.moe_experts kernel takes torch tensors (gmm-harness[torch])")
BF16 = gmm_ref.dtypes.as_dtype("bfloat16")


def broken_moe_experts(hidden_states, weight, topk_ids, topk_weights, expert_map=None, *, bug):
    """:func:`gmm_kernels.adapters.torch_moe.moe_experts` with one real bug: ``"bf16_sum"`` (the weighted slots
    cast to the tokens' dtype and summed in it, transformers' way, by a kernel that declares the float32 sum),
    ``"lost_updates"`` (``out[token] += y``: a token's second slot in one call overwrites its first),
    ``"unsorted_weights"`` (the weights taken in flat slot order, the products in expert order),
    ``"foreign_computed"`` (another rank's expert computed with local expert 0)."""
    t, top_k = topk_ids.shape
    n, e_local = weight.shape[1], weight.shape[0]
    sum_dtype = hidden_states.dtype if bug == "bf16_sum" else torch.float32
    out = torch.zeros((t, n), dtype=sum_dtype)
    flat = topk_ids.reshape(-1).long()
    local = flat if expert_map is None else expert_map.long()[flat]
    if bug == "foreign_computed":
        local = torch.clamp(local, min=0)
    slots = torch.nonzero(local >= 0).reshape(-1)
    if slots.numel():
        order = torch.argsort(local[slots], stable=True)
        slots = slots[order]
        counts = torch.bincount(local[slots], minlength=e_local)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        token = torch.div(slots, top_k, rounding_mode="floor")
        y = torch._grouped_mm(hidden_states[token], weight.transpose(-2, -1), offs=offs)
        w = topk_weights.reshape(-1)
        w = w[torch.nonzero(local >= 0).reshape(-1)] if bug == "unsorted_weights" else w[slots]
        weighted = (y * w.unsqueeze(-1)).to(sum_dtype)
        if bug == "lost_updates":
            out[token] += weighted
        elif bug == "bf16_sum":  # the per-slot output, then its slots added one by one in the output dtype
            per_slot = torch.zeros((t * top_k, n), dtype=sum_dtype)
            per_slot[slots] = weighted
            per_slot = per_slot.view(t, top_k, n)
            for j in range(top_k):
                out = out + per_slot[:, j]
        else:
            out.index_add_(0, token, weighted)
    return out.to(hidden_states.dtype)


class Broken(TorchMoEExperts):
    """The built-in adapter (its extents, refusals and declared numerics) around a broken kernel."""

    def __init__(self, bug: str, numerics: RoutedNumerics | None = None):
        super().__init__()
        self.bug, self.declared = bug, numerics
        self.name = f"torch.moe_experts[{bug}]"

    def numerics_for(self, routing):
        return self.declared or super().numerics_for(routing)

    def call(self, hidden_states, weight, topk_ids, topk_weights, expert_map=None):
        from gmm_kernels.sandbox.convert import to_framework

        (x, w, ids, tw), kw = to_framework("torch", (hidden_states, weight, topk_ids, topk_weights),
                                           {"expert_map": expert_map})
        return broken_moe_experts(x, w, ids, tw, kw["expert_map"], bug=self.bug)


class DeclaresItsSum(Broken):
    """The bf16-summing kernel declaring what it does (``combine`` = the output dtype, transformers' sum)."""

    def numerics_for(self, routing):
        import dataclasses

        return dataclasses.replace(TorchMoEExperts().numerics_for(routing), combine=routing.out_dtype)


SLOT = r"^token \d+, column \d+: got .* \(the combined row of token \d+: the weighted sum of slot 0 \(expert \d+, local"


# ------------------------------------------------------------------------------------------------ convention
def test_the_convention_is_routed_combined_and_always_weighted():
    conv = conventions.get("torch.moe_experts")
    assert "torch.moe_experts" in conventions.routed_names() and "torch.moe_experts" not in conventions.names()
    assert conv.output == "combined" and conv.mul_routed_weight is True and not conv.distinct_experts
    r = gmm_ref.Routing(np.ones((2, 8), BF16), np.ones((3, 4, 8), BF16), np.array([[0, 1], [2, 2]]),
                        np.ones((2, 2), np.float32))
    assert "always multiplies the weights in" in conv.refusal(r)
    with pytest.raises(ValueError, match="output: expected one of \\('slots', 'combined', 'd_slots'"):
        type(conv)(name="x", framework="torch", dtype_pairs=((BF16, BF16),), output="sum")


def test_arguments_parse_back_to_the_same_routing():
    emap = np.array([-1, 0, 1, -1], np.int64)
    r = gmm_ref.Routing(np.ones((2, 8), np.float32), np.ones((2, 4, 8), np.float32), np.array([[0, 1], [2, 2]]),
                        np.full((2, 2), 0.5, np.float32), expert_map=emap, mul_routed_weight=True)
    conv = conventions.get("torch.moe_experts")
    args, kwargs = conv.arguments(r)
    back = conv.parse(*args, **kwargs)
    assert np.array_equal(back.topk_ids, r.topk_ids) and np.array_equal(back.expert_map, emap)
    assert back.mul_routed_weight and back.out_dtype == np.float32
    with pytest.raises(ValueError, match=r"weight: expected \[E, N, K=8\]"):
        conv.parse(args[0], np.ones((2, 4, 6), np.float32), *args[2:])
    with pytest.raises(ValueError, match=r"topk_ids\[1, 0\] = 9: expected an expert id in \[0, 4\)"):
        conv.parse(*args[:2], np.array([[0, 1], [9, 2]]), args[3], expert_map=emap)


# ----------------------------------------------------------------------------------- the combined comparison
def _peaked(top_k: int) -> gmm_ref.Routing:
    """One token, one expert in all ``top_k`` slots, each column's product 3; weights 2, then ``1.5 * 2**-9``
    each: 6 and a tail of 0.0088 per slot, under half a bfloat16 unit in the last place of 6 (0.0156)."""
    experts = np.zeros((1, 8, 8), BF16)
    experts[0, :, :3] = 1
    weights = np.array([[2.0] + [1.5 * 2 ** -9] * (top_k - 1)], np.float32)
    return gmm_ref.Routing(np.ones((1, 8), BF16), experts, np.zeros((1, top_k), np.int64), weights,
                           mul_routed_weight=True)


def test_a_combine_summing_in_bf16_is_separated_from_float32_by_the_bound_from_top_k_8():
    r = _peaked(8)
    ref = gmm_ref.routed_reference(r)
    declared = TorchMoEExperts().numerics_for(r)
    good, bad = TorchMoEExperts().run(r), Broken("bf16_sum").run(r)
    assert float(ref.combined_exact[0, 0]) == 6 + 7 * 3 * 1.5 * 2 ** -9
    assert np.array_equal(good, ref.combined)  # float32 sum, one rounding: the once-rounded value
    assert float(bad[0, 0]) == 6.0  # every tail dropped by a bfloat16 add
    bound = ref.combined_bound(declared)
    assert 6 + 7 * 3 * 1.5 * 2 ** -9 - 6.0 > bound[0, 0] > 0
    gmm_ref.assert_routed_matches(good, ref, numerics=declared, output="combined")
    with pytest.raises(gmm_ref.Mismatch, match=r"^token 0, column 0: got 6.0, expected 6.0625 within 0.0") as info:
        gmm_ref.assert_routed_matches(bad, ref, numerics=declared, kernel="bf16", output="combined")
    assert "slot 7 (expert 0, local 0, weight 0.00292969)" in str(info.value)
    # declared as what it is (the sum in the output dtype) the same output is within its bound
    honest = DeclaresItsSum("bf16_sum").numerics_for(r)
    gmm_ref.assert_routed_matches(bad, ref, numerics=honest, output="combined")
    # top_k = 4: three tails dropped stay within the float32 sum's bound (too few slots to tell)
    r4 = _peaked(4)
    ref4 = gmm_ref.routed_reference(r4)
    gmm_ref.assert_routed_matches(Broken("bf16_sum").run(r4), ref4, numerics=declared, output="combined")


def test_the_combined_report_names_token_slots_experts_and_the_culprit():
    r = gmm_ref.Routing(np.ones((2, 8), np.float32), np.arange(3 * 2 * 8, dtype=np.float32).reshape(3, 2, 8),
                        np.array([[0, 1], [1, 2]]), np.array([[0.5, 0.25], [1.0, 2.0]], np.float32),
                        expert_map=None, mul_routed_weight=True)
    ref = gmm_ref.routed_reference(r)
    cases = {
        "dropped": (ref.combined_exact - ref.slots_exact[:, 1], "slot 1 (expert 1, local 1) is missing"),
        "doubled": (ref.combined_exact + ref.slots_exact[:, 0], "slot 0 (expert 0, local 0) is added twice"),
        "exchanged": (ref.products[:, 0] * 0.25 + ref.products[:, 1] * 0.5, "slots 1 and 0 of token 0 exchanged"),
    }
    for name, (rows, culprit) in cases.items():
        out = ref.combined.copy()
        out[0] = rows[0]
        with pytest.raises(gmm_ref.Mismatch, match=r"^token 0, column 0: got") as info:
            gmm_ref.assert_routed_matches(out.astype(np.float32), ref, kernel="k", output="combined")
        assert f"likely culprit: {culprit}" in str(info.value), name
        assert "slot 0 (expert 0, local 0, weight 0.5); slot 1 (expert 1, local 1, weight 0.25)" in str(info.value)
        assert "wrong tokens: [0]" in str(info.value)
    with pytest.raises(gmm_ref.Mismatch, match=r"shape/dtype: k returned float32 \(2, 2, 2\), expected float32 "
                                               r"\(2, 2\) \(\[T, N\]\)"):
        gmm_ref.assert_routed_matches(ref.slots.astype(np.float32), ref, kernel="k", output="combined")
    with pytest.raises(ValueError, match=r"output: expected one of \('slots', 'combined', .*\), got 'sum'"):
        gmm_ref.assert_routed_matches(ref.combined, ref, output="sum")


# ------------------------------------------------------------------------------------------ the torch kernel
def test_the_built_in_kernel_passes_every_routed_mode():
    report = check_kernel("torch.moe_experts", modes=["exact", "normal", "wide", "poisoned"], profile="gmm-ci")
    assert [(r.check, r.status.value) for r in report] == [(m, "pass") for m in ("exact", "normal", "wide",
                                                                                  "poisoned")]
    assert all(r.examples >= 40 for r in report)


def test_the_strategies_draw_peaked_routers_that_expose_a_bf16_combine():
    """Among derandomized draws of the built-in kernel's routings, some are peaked tokens with every slot on one
    expert at top_k 8 in bfloat16: the routings the bf16 combine fails on."""
    from hypothesis import HealthCheck, Phase, given, settings

    from property_tests import strategies as gst
    from property_tests.checks import declared

    opts = declared.routing_options(TorchMoEExperts())
    hits = []

    @settings(max_examples=300, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(gst.routings(**opts))
    def collect(r):
        w = r.topk_weights
        same = (r.topk_ids == r.topk_ids[:, :1]).all(axis=1)
        tail = (np.abs(w[:, 1:]) < np.abs(w[:, :1]) * 2 ** -8).all(axis=1) if r.top_k > 1 else same & False
        if r.top_k == 8 and r.out_dtype == BF16 and (same & tail).any():
            hits.append(r)

    collect()
    assert len(hits) >= 3


BUGS = {
    "bf16_sum": ("normal", "differs from the routed reference's combined output"),
    # one slot of a token kept, the others lost: named as the one kept (top_k > 2) or the one missing
    "lost_updates": ("exact", ("is the only one in the sum", "is missing from the sum (dropped, or overwritten")),
    "unsorted_weights": ("wide", "instead of its own"),
    "foreign_computed": ("exact", "computed anyway, with local expert 0"),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_broken_twins_are_rejected_naming_token_slot_and_expert(bug):
    mode, words = BUGS[bug]
    with pytest.raises(gmm_ref.Mismatch, match=SLOT) as info:
        check_kernel(Broken(bug), modes=[mode], profile="gmm-ci")
    assert any(w in str(info.value) for w in ((words,) if isinstance(words, str) else words)), str(info.value)
    assert "Routing: T=" in "\n".join(getattr(info.value, "__notes__", []))


def test_a_bf16_combine_that_declares_its_sum_passes():
    report = check_kernel(DeclaresItsSum("bf16_sum"), modes=["normal"], profile="gmm-ci")
    assert [r.status.value for r in report] == ["pass"]


def test_a_weight_dtype_is_a_numerics_option_with_its_own_bound():
    """``weight=float32``: the product rounded to the output dtype, the weight multiplied in float32 (torch's
    promotion of a bfloat16 product by float32 weights); its per-slot bound lies between the accumulator's and
    ``"output"``'s (whose weight is rounded to bfloat16 too), and an integer dtype is refused."""
    r = _peaked(2)
    ref = gmm_ref.routed_reference(r)
    acc, f32, out = (ref.slot_bound(RoutedNumerics(weight=w, combine=BF16)) for w in ("accumulator", np.float32,
                                                                                        "output"))
    assert (acc <= f32).all() and (f32 <= out).all() and (acc < f32).any()
    assert RoutedNumerics(weight="float32").weight == np.float32
    with pytest.raises(TypeError, match="weight: expected 'accumulator', 'output' or a float dtype, got int32"):
        RoutedNumerics(weight=np.int32)


def naive_moe_experts(hidden_states, weight, topk_ids, topk_weights, expert_map=None):
    """A user's MoE experts in the convention: every slot's float32 product times its weight, summed in float32
    (the default ``RoutedNumerics``: the weight and the sum in the accumulator)."""
    t, top_k = topk_ids.shape
    out = torch.zeros((t, weight.shape[1]), dtype=torch.float32)
    for i in range(t):
        for j in range(top_k):
            e = int(topk_ids[i, j]) if expert_map is None else int(expert_map[int(topk_ids[i, j])])
            if e >= 0:
                out[i] += float(topk_weights[i, j]) * (weight[e].float() @ hidden_states[i].float())
    return out.to(hidden_states.dtype)


def test_a_users_moe_experts_is_checked_in_the_convention():
    report = check_kernel(naive_moe_experts, convention="torch.moe_experts", modes=["exact", "normal"],
                          profile="gmm-ci", max_examples=20)
    assert [r.status.value for r in report] == ["pass", "pass"]

    def drops_last_slot(hidden_states, weight, topk_ids, topk_weights, expert_map=None):
        return naive_moe_experts(hidden_states, weight, topk_ids[:, :-1], topk_weights[:, :-1], expert_map) \
            if topk_ids.shape[1] > 1 else naive_moe_experts(hidden_states, weight, topk_ids, topk_weights, expert_map)

    with pytest.raises(gmm_ref.Mismatch, match=SLOT) as info:
        check_kernel(drops_last_slot, convention="torch.moe_experts", modes=["normal"], profile="gmm-ci")
    assert "is missing from the sum" in str(info.value)
