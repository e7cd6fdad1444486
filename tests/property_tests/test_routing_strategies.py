"""The routed strategies (property_tests/strategies/routing.py, docs/routed.md "Strategies"): every edge class
of the routed family is drawn, drawn routings validate and their reference and metadata build, a correct NumPy
fused MoE passes a small @given test and broken ones fail it naming the token, the slot and the expert."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

import gmm_ref
from gmm_ref.routed.metadata import (
    moe_align_block_size,
    unsloth_routing_indices,
    validate_moe_align_block_size,
    validate_unsloth_routing,
)
from gmm_ref.routed.routing import RoutedNumerics, Routing, routed_reference
from property_tests import strategies as gst
from property_tests.strategies.routing import ID_PATTERNS, _config, routed_buckets

BLOCK = 16
FIND = settings(database=None, max_examples=2000, phases=[Phase.generate, Phase.shrink], deadline=None,
                suppress_health_check=list(HealthCheck))


def draws(strategy, n: int) -> list:
    """n examples from a fixed seed (generation only, no shrinking, no database)."""
    out: list = []

    @settings(max_examples=n, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(x):
        out.append(x)

    collect()
    return out


@functools.lru_cache(maxsize=1)
def _sample() -> tuple[Routing, ...]:
    return tuple(draws(gst.routings(block_size=BLOCK), 400))


def _counts(r: Routing) -> np.ndarray:
    return np.bincount(r.topk_ids.reshape(-1).astype(np.int64), minlength=r.num_experts)


def _local(r: Routing) -> np.ndarray:
    return r.local_ids >= 0


def _poisoned_foreign_row(r: Routing) -> bool:
    foreign_only = ~_local(r).any(axis=1)
    return bool(foreign_only.any() and not np.isfinite(r.tokens[foreign_only].astype(np.float64)).all())


# ------------------------------------------------------------------------------------------- cases drawn
CASES = {
    "an expert with no slot": lambda r: r.num_tokens > 0 and (_counts(r) == 0).any(),
    "every token on one expert": lambda r: r.num_tokens >= 2 and r.num_experts > r.top_k and any(
        (r.topk_ids == e).any(axis=1).all() for e in np.unique(r.topk_ids[0])),
    "a slot on an expert past 256": lambda r: bool((r.topk_ids >= 256).any()),
    "a slot on an expert past 512": lambda r: bool((r.topk_ids >= 512).any()),
    "a slot on the last of more than 256 experts": lambda r: r.num_experts > 256 and bool(
        (r.topk_ids == r.num_experts - 1).any()),
    **{f"top_k = {k} with local slots": (lambda r, k=k: r.top_k == k and bool(_local(r).any()))
       for k in (1, 2, 3, 4, 8)},
    "a token with a local and a non-local slot": lambda r: bool((_local(r).any(axis=1) & ~_local(r).all(axis=1)).any()),
    "a token with only non-local slots": lambda r: r.expert_map is not None and r.num_local_experts > 0 and bool(
        (~_local(r).any(axis=1)).any()),
    "a rank with no local expert": lambda r: r.num_local_experts == 0 and r.num_tokens > 0,
    "T = 0": lambda r: r.num_tokens == 0,
    "T = 1": lambda r: r.num_tokens == 1,
    "counts that never fill a block": lambda r: r.num_tokens * r.top_k >= BLOCK and _counts(r).max() < BLOCK,
    "some count past a block": lambda r: r.num_tokens > 0 and _counts(r).max() > BLOCK,
    "sentinels next to real ids (a count not a multiple of the block)": lambda r: bool(
        (_counts(r) % BLOCK != 0).any() and r.num_tokens > 0),
    "a zero weight, multiplied in": lambda r: r.mul_routed_weight and bool(
        (r.topk_weights.astype(np.float64)[_local(r)] == 0).any()),
    "a negative weight, multiplied in": lambda r: r.mul_routed_weight and bool(
        (r.topk_weights.astype(np.float64)[_local(r)] < 0).any()),
    "NaN or Inf in the row of a token routed to no local expert": _poisoned_foreign_row,
    "NaN or Inf in a weight no local slot multiplies": lambda r: r.num_tokens > 0 and not np.isfinite(
        r.topk_weights.astype(np.float64)).all(),
    "the ekn layout": lambda r: r.expert_layout == "ekn",
    "int64 ids": lambda r: r.topk_ids.dtype == np.int64,
    "foreign undefined under expert parallelism": lambda r: r.foreign == "undefined" and r.expert_map is not None,
    "a map that is no contiguous range": lambda r: r.expert_map is not None and r.num_local_experts > 1 and bool(
        np.any(np.diff(np.flatnonzero(r.expert_map >= 0)) > 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_case_is_drawn(name):
    found = sum(bool(CASES[name](r)) for r in _sample())
    assert found >= 5, f"{name}: drawn {found} times in {len(_sample())} routings"


def test_the_default_contract_never_repeats_an_expert_and_repeats_are_drawn_when_asked():
    assert not any(r.repeats_an_expert for r in _sample())
    loose = draws(gst.routings(distinct_experts=False, top_k=(2, 4)), 150)
    assert sum(r.repeats_an_expert for r in loose) >= 30
    assert any(r.num_tokens >= 2 and (r.topk_ids == r.topk_ids[0, 0]).all() for r in loose)  # every slot on one


def test_the_buckets_are_few_and_cover_every_top_k_and_expert_count_with_local_experts():
    buckets = {(r.k, r.n, r.num_experts, r.num_local_experts, r.top_k, r.expert_layout, str(r.tokens.dtype),
                str(r.out_dtype), str(r.topk_ids.dtype), r.mul_routed_weight) for r in _sample()}
    assert len(buckets) <= 8
    cfg = DEFAULTS
    live = [b for b in routed_buckets(cfg) if b.num_local > 0]
    assert {b.top_k for b in live} == {1, 2, 3, 4, 8} and {b.num_experts for b in live} == {8, 60, 257, 513}
    assert all(b.k * b.n <= 16 for b in routed_buckets(cfg) if b.num_experts > 256)  # tiny past 256 experts
    assert routed_buckets(cfg)[0].top_k == 1 and routed_buckets(cfg)[0].ep == "off"


def test_static_tokens_and_one_bucket():
    rs = draws(gst.routings(num_tokens=(0, 1, 5), max_buckets=3, num_experts=8, top_k=2, dtypes="float32"), 60)
    assert {r.num_tokens for r in rs} <= {0, 1, 5}
    assert len({(r.num_tokens, r.k, r.n, r.num_local_experts, r.expert_layout, r.mul_routed_weight) for r in rs}) <= 3


def test_free_static_parameters_and_tokens_from_a_strategy():
    rs = draws(gst.routings(max_buckets=None, num_tokens=st.integers(2, 3)), 120)
    assert {r.num_tokens for r in rs} == {2, 3}
    assert len({(r.k, r.n, r.num_experts, r.num_local_experts, r.top_k, r.expert_layout, str(r.tokens.dtype))
                for r in rs}) > 20
    assert all(r.k * r.n <= 16 for r in rs if r.num_experts > 256)
    for r in rs[:30]:
        routed_reference(r)


def test_the_documented_example_runs():  # docs/routed.md, "Strategies"
    @settings(max_examples=20, derandomize=True, database=None, deadline=None)
    @given(gst.routings(dtypes=["bfloat16"], mul_routed_weight=True))
    def test_my_fused_moe(routing):
        ref = gmm_ref.routed_reference(routing)
        out = fused_moe(routing)
        ok = (out == ref.slots) | (abs(out - ref.slots_exact) <= ref.slot_bound()) | ~ref.slots_mask
        assert ok.all()

    test_my_fused_moe()


def test_topk_ids_and_weights_alone():
    ids = draws(gst.topk_ids(num_experts=6, top_k=3, block_size=4), 120)
    assert all(a.dtype == np.int32 and a.shape[1] == 3 and ((a >= 0) & (a < 6)).all() for a in ids)
    assert all(len(set(row)) == 3 for a in ids for row in a.tolist())
    assert {0, 1} <= {a.shape[0] for a in ids}
    w = draws(gst.topk_weights(num_tokens=5, top_k=2, values="exact"), 30)
    assert all(x.shape == (5, 2) and x.dtype == np.float32 for x in w)
    allw = np.concatenate([x.ravel() for x in w])
    assert (allw == np.rint(allw)).all() and (allw == 0).any() and (allw < 0).any()
    assert ID_PATTERNS[0] == "few"


# ----------------------------------------------------------------------- drawn routings: reference, metadata
def test_drawn_routings_validate_and_their_reference_runs():
    for r in _sample()[:150]:
        again = Routing(r.tokens, r.experts, r.topk_ids, r.topk_weights, r.expert_layout, r.expert_map,
                        r.mul_routed_weight, r.out_dtype, r.foreign)  # the model's own checks, once more
        ref = routed_reference(again)
        assert ref.slots.shape == (r.num_tokens, r.top_k, r.n) and ref.combined.shape == (r.num_tokens, r.n)
        # nothing unread leaks: every value is finite (poison lies only where no local slot reads)
        assert np.isfinite(ref.slots_exact).all() and np.isfinite(ref.combined_exact).all(), r
        assert np.isfinite(ref.slot_bound()).all() and np.isfinite(ref.combined_bound()).all()


def test_poisoned_routings_keep_the_reference_finite():
    for r in draws(gst.routings(values="poisoned", expert_parallel=True), 60):
        ref = routed_reference(r)
        assert np.isfinite(ref.slots_exact).all() and np.isfinite(ref.combined_exact).all(), r
        assert np.isfinite(ref.slot_bound()).all() and np.isfinite(ref.combined_bound()).all()


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_the_metadata_of_drawn_routings_validates(block_size):
    for r in _sample()[::3]:
        for ignore in (False, True) if r.expert_map is not None else (False,):
            meta = moe_align_block_size(r.topk_ids, block_size, r.num_experts, r.expert_map,
                                        pad_sorted_ids=ignore, ignore_invalid_experts=ignore)
            validate_moe_align_block_size(r.topk_ids, block_size, r.num_experts, *meta, r.expert_map, ignore)
        if r.expert_map is None:
            validate_unsloth_routing(r.topk_ids, r.num_experts, *unsloth_routing_indices(r.topk_ids, r.num_experts))


# ------------------------------------------------------------------ a NumPy fused MoE, correct and broken
def fused_moe(r: Routing, broken: str | None = None, block_size: int = BLOCK) -> np.ndarray:
    """vLLM's ``fused_moe_kernel`` in NumPy: the slots aligned per expert (``moe_align_block_size``), each block
    of ``block_size`` slots computed with its expert in float32, the weight multiplied into the accumulator,
    one rounding; a block of expert -1 (another rank's) written with zeros. Returns ``[T, top_k, N]``.

    ``broken``: ``"drops_past_256"`` (the alignment's scan covers the first 256 experts only: the others'
    slots are never written), ``"computes_foreign"`` (a block of expert -1 computed with ``experts[-1]``,
    the last local expert, as pointer arithmetic with -1 does), ``"weight_twice"``, ``"weight_without_flag"``
    (the weight multiplied in whatever ``mul_routed_weight`` says)."""
    t_, top_k = r.topk_ids.shape
    numel = t_ * top_k
    sorted_ids, expert_ids, post = moe_align_block_size(r.topk_ids, block_size, r.num_experts, r.expert_map)
    if broken == "drops_past_256":
        _, global_ids, _ = moe_align_block_size(r.topk_ids, block_size, r.num_experts)
        for b in np.flatnonzero(global_ids[:post[0] // block_size] >= 256):
            sorted_ids[b * block_size:(b + 1) * block_size] = numel
    out = np.full((numel, r.n), np.nan, np.float32)  # torch.empty: a row nobody writes is garbage
    x = r.tokens.astype(np.float32)
    w = (r.topk_weights.astype(np.float32).reshape(-1) if r.mul_routed_weight or broken == "weight_without_flag"
         else None)
    for b in range(int(post[0]) // block_size):
        rows = sorted_ids[b * block_size:(b + 1) * block_size]
        rows = rows[rows < numel]
        e = int(expert_ids[b])
        if e < 0 and not (broken == "computes_foreign" and r.num_local_experts):
            out[rows] = 0
            continue
        mat = r.experts[e].astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):  # a broken kernel reads poison: NaN as IEEE says
            acc = x[rows // top_k] @ (mat.T if r.expert_layout == "enk" else mat)
            if w is not None:
                acc = acc * w[rows][:, None]
                if broken == "weight_twice":
                    acc = acc * w[rows][:, None]
        out[rows] = acc
    with np.errstate(invalid="ignore", over="ignore"):
        return gmm_ref.dtypes.round_to(out.astype(np.float64), r.out_dtype).reshape(t_, top_k, r.n)


def check_routed(r: Routing, slots: np.ndarray) -> None:
    """Raise AssertionError naming the token, the slot and the expert of the first per-slot element outside
    its bound (or, for the float32 combine of the slots, the token and its experts)."""
    ref = routed_reference(r)
    for actual, exact, rounded, bound, mask, what in (
            (slots, ref.slots_exact, ref.slots, ref.slot_bound(), ref.slots_mask, "slot"),
            (slots.astype(np.float32).sum(axis=1), ref.combined_exact, ref.combined,
             ref.combined_bound(RoutedNumerics(combine=np.float32)), None, "combined")):
        a = actual.astype(np.float64)
        with np.errstate(invalid="ignore"):
            ok = (a == rounded) | (np.abs(a - exact) <= bound) | (np.isnan(a) & np.isnan(exact))
        if mask is not None:
            ok |= ~mask
        bad = np.argwhere(~ok)
        if bad.size:
            at = tuple(int(i) for i in bad[0])
            t = at[0]
            where = (f"token {t}, slot {at[1]} (expert {int(r.topk_ids[t, at[1]])}, local "
                     f"{int(r.local_ids[t, at[1]])}), column {at[2]}" if what == "slot" else
                     f"token {t} (experts {r.topk_ids[t].tolist()}), combined column {at[1]}")
            raise AssertionError(f"{where}: got {float(a[at])}, expected {float(rounded[at])} within {bound[at]:.3g} "
                                 f"({int((~ok).sum())} elements wrong)")


ROUTED = gst.routings(block_size=BLOCK)
GIVEN = settings(max_examples=120, derandomize=True, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck))


def _run(broken: str | None, strategy=ROUTED) -> None:
    @GIVEN
    @given(strategy)
    def prop(r):
        check_routed(r, fused_moe(r, broken))

    prop()


def test_a_correct_numpy_fused_moe_passes():
    _run(None)
    _run(None, gst.routings(distinct_experts=False, values=("exact", "poisoned")))


@pytest.mark.parametrize(("broken", "named"), [
    ("drops_past_256", r"token \d+, slot \d+ \(expert (25[6-9]|2[6-9]\d|[3-9]\d\d)\b"),
    ("computes_foreign", r"token \d+, slot \d+ \(expert \d+, local -1\)"),
    ("weight_twice", r"token \d+, slot \d+ \(expert \d+, local \d+\)"),
    ("weight_without_flag", r"token \d+, slot \d+ \(expert \d+, local \d+\)"),
])
def test_broken_fused_moes_fail_naming_the_token_slot_and_expert(broken, named):
    with pytest.raises(AssertionError, match=named):
        _run(broken)


def _fails(broken: str, r: Routing) -> bool:
    try:
        check_routed(r, fused_moe(r, broken))
    except AssertionError:
        return True
    return False


@pytest.mark.parametrize("broken", ["drops_past_256", "computes_foreign", "weight_twice", "weight_without_flag"])
def test_a_broken_kernel_shrinks_to_one_token_and_few_slots(broken):
    r = find(ROUTED, functools.partial(_fails, broken), settings=FIND)
    assert r.num_tokens == 1, r
    if broken != "drops_past_256":  # an expert past 256: the buckets of more experts have top_k 3 and 4
        assert r.top_k == min(b.top_k for b in routed_buckets(DEFAULTS) if _could_fail(broken, b)), r


DEFAULTS = _config(((4, 4), (16, 8), (32, 24)), (8, 60, 257, 513), (1, 2, 3, 4, 8), None, ("enk", "ekn"), None,
                   ("float32",), ("int32", "int64"), None, None, 8, True, BLOCK)


def _could_fail(broken: str, b) -> bool:
    if broken == "drops_past_256":
        return b.num_experts > 256
    if broken == "computes_foreign":
        return b.ep == "part"
    if broken == "weight_without_flag":
        return not b.mul_routed_weight and b.num_local > 0
    return b.mul_routed_weight and b.num_local > 0


# ------------------------------------------------------------------------------------------- bad arguments
INVALID = [
    (gst.routings, {"top_k": 9, "num_experts": 8}, "top_k=9"),
    (gst.routings, {"num_experts": 0}, "num_experts=0"),
    (gst.routings, {"top_k": ()}, "top_k=()"),
    (gst.routings, {"dtypes": ["int8"]}, "dtypes="),
    (gst.routings, {"values": "fuzzy"}, "values="),
    (gst.routings, {"expert_layouts": "nke"}, "expert_layouts="),
    (gst.routings, {"weight_dtypes": "float64"}, "weight_dtypes="),
    (gst.routings, {"id_dtypes": "int8"}, "id_dtypes="),
    (gst.routings, {"shapes": [(4, 4, 4)]}, "shapes="),
    (gst.routings, {"expert_parallel": "yes"}, "expert_parallel="),
    (gst.routings, {"max_buckets": 0}, "max_buckets=0"),
    (gst.routings, {"foreign": "skip"}, "foreign="),
    (gst.topk_ids, {"top_k": 5, "num_experts": 3}, "top_k=5"),
    (gst.topk_ids, {"dtype": "float32"}, "dtype="),
    (gst.topk_weights, {"num_tokens": 2, "top_k": 1, "dtype": "int8"}, "dtype="),
    (gst.topk_weights, {"num_tokens": 2, "top_k": 1, "values": "wide"}, "values="),
]


@pytest.mark.parametrize(("fn", "kwargs", "named"), INVALID, ids=[i[2] for i in INVALID])
def test_impossible_arguments_raise_invalid_argument_naming_them(fn, kwargs, named):
    @settings(max_examples=1, database=None)
    @given(st.data())
    def build_and_draw_one(data):
        data.draw(fn(**kwargs))

    with pytest.raises(InvalidArgument, match=named.replace("(", r"\(").replace(")", r"\)")):
        build_and_draw_one()
