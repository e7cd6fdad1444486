"""unsloth's grouped GEMM forward (the built-in routed adapter ``unsloth.grouped_gemm``), read from unsloth's
wheel, checked as a routed MoE kernel (docs/routed.md, "unsloth's grouped GEMM").

The convention's checks need no wheel; the kernel's need unsloth 2026.10.9's wheel (``scripts/setup.sh``
downloads it; ``GMM_HARNESS_UNSLOTH_WHEEL`` names another) and run it in Triton's interpreter. Each broken twin is
one real bug class: the wheel's kernel with one line changed (a stand-in wheel holding the edited source), or the
wheel's kernel on metadata built wrong. Each must fail naming the token, the slot and the expert of a wrong
element.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gmm_ref
from gmm_kernels import Status
from gmm_ref import conventions
from gmm_ref.conventions.unsloth import FORMS, GROUPED_GEMM, _GroupedGemm, form_of
from property_tests import strategies as gst

CONV = conventions.get("unsloth.grouped_gemm")
SLOT = r"token \d+, slot \d+ \(expert \d+, local \d+\)"


# ------------------------------------------------------------------------------- the convention (no wheel)
@settings(max_examples=60, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(gst.routings(expert_layouts="enk", dtypes=[("bfloat16", "bfloat16"), ("float32", "float32")],
                    shapes=GROUPED_GEMM.extents, expert_parallel=False, distinct_experts=False, max_tokens=24))
def test_arguments_parse_back_to_the_same_slots_and_a_right_y_maps_to_the_reference(routing):
    args, kwargs = CONV.arguments(routing)
    again = CONV.parse(*args, **kwargs)
    want = gmm_ref.routed_reference(routing)
    assert np.array_equal(want.slots_exact, gmm_ref.routed_reference(again).slots_exact, equal_nan=True)
    rows = want.slots.reshape(-1, routing.n)
    y = rows[args[4]] if kwargs["permute_x"] else rows  # expert order (permute_x), slot order (permute_y)
    assert np.array_equal(CONV.per_slot(y, args, kwargs), want.slots, equal_nan=True)


def test_every_form_is_reached_by_a_rule_of_the_routing():
    def routing(t, weighted):
        ids = np.zeros((t, 2), np.int32)
        return gmm_ref.Routing(np.ones((t, 16), np.float32), np.ones((2, 8, 16), np.float32), ids,
                               np.ones((t, 2), np.float32), mul_routed_weight=weighted)

    assert [form_of(routing(t, w)) for t, w in ((2, False), (3, False), (2, True), (3, True))] == \
        ["permute_x", "permute_y", "permute_y+fuse_mul_post", "permute_y+fuse_mul_post"]
    for t, w in ((2, False), (3, False), (3, True)):
        _, kwargs = CONV.arguments(routing(t, w))
        assert (kwargs["permute_x"], kwargs["permute_y"], kwargs["fuse_mul_post"]) == FORMS[form_of(routing(t, w))]


def test_an_expert_map_or_a_k_off_the_tiles_is_declined_with_its_reason():
    ids = np.zeros((1, 1), np.int32)
    r = gmm_ref.Routing(np.ones((1, 16), np.float32), np.ones((1, 8, 16), np.float32), ids,
                        expert_map=np.array([0, -1], np.int64))
    assert "no expert parallelism" in CONV.refusal(r)
    r = gmm_ref.Routing(np.ones((1, 20), np.float32), np.ones((1, 8, 20), np.float32), ids)
    assert "(K, N) extents" in CONV.refusal(r)


def _args(form="permute_y"):
    ids = np.array([[0, 1], [1, 2], [3, 0]], np.int32)
    routing = gmm_ref.Routing(np.arange(48, dtype=np.float32).reshape(3, 16), np.ones((4, 8, 16), np.float32), ids,
                              np.ones((3, 2), np.float32), mul_routed_weight=form.endswith("post"))
    if form == "permute_x":
        routing = dataclasses.replace(routing, tokens=np.ones((4, 16), np.float32), topk_ids=np.zeros((4, 2), np.int32),
                                      topk_weights=np.ones((4, 2), np.float32))
    args, kwargs = CONV.arguments(routing)
    return list(args), dict(kwargs)


@pytest.mark.parametrize(("change", "words"), [
    (lambda a, k: k.update(permute_x=True), "cannot permute both X and Y"),
    (lambda a, k: k.update(permute_y=False), "with neither"),
    (lambda a, k: k.update(permute_y=False, permute_x=True, fuse_mul_post=True), "fuse_mul_post: unsloth requires"),
    (lambda a, k: k.update(BLOCK_SIZE_K=32), "K % BLOCK_SIZE_K"),
    (lambda a, k: a.__setitem__(3, np.cumsum(a[3]).astype(np.int32)), "cumulative offsets"),
    (lambda a, k: a.__setitem__(4, np.zeros_like(a[4])), "gather_indices: expected each flat slot index"),
    (lambda a, k: a.__setitem__(0, a[0][:-1]), "X: expected T\\*topk = 6"),
    (lambda a, k: a.__setitem__(0, a[0] + np.arange(6, dtype=np.float32)[:, None]), "X: rows of token"),
    (lambda a, k: a.__setitem__(2, 0), "topk"),
    (lambda a, k: a.__setitem__(5, None), "topk_weights: required"),
    (lambda a, k: k.update(use_tma_store=True), "use_tma_load_x / use_tma_store"),
])
def test_bad_arguments_are_refused_naming_them(change, words):
    args, kwargs = _args("permute_y+fuse_mul_post")
    change(args, kwargs)
    with pytest.raises((ValueError, TypeError), match=words):
        CONV.parse(*args, **kwargs)


def test_the_routed_convention_is_looked_up_but_not_listed_with_the_grouped_ones():
    assert CONV is GROUPED_GEMM and "unsloth.grouped_gemm" in conventions.routed_names()
    assert "unsloth.grouped_gemm" not in conventions.names()


# ------------------------------------------------------------------------------- the kernel (the wheel)
pytest.importorskip("torch", reason="unsloth's kernel takes torch tensors (gmm-harness[torch])")
pytest.importorskip("triton", reason="Triton is not installed (gmm-harness[triton]; the newest-JAX leg has none)")

from gmm_kernels import get  # noqa: E402
from gmm_kernels.adapters import unsloth as adapter  # noqa: E402
from gmm_kernels.runtimes import triton_interpreter  # noqa: E402
from property_tests.checks.check import check_kernel  # noqa: E402
from tests.corpus.wheel_twins import edited_wheel, rejected  # noqa: E402

ENV = adapter.WHEEL.env
WHEEL = adapter.WHEEL.find()
needs_wheel = pytest.mark.skipif(WHEEL is None, reason=f"no unsloth {adapter.WHEEL_VERSION} wheel here; get it "
                                                      f"with: {adapter.DOWNLOAD} (or set {ENV})")
interpreted = pytest.mark.skipif(not triton_interpreter.use_if_no_gpu(),
                                 reason="torch sees a GPU here (or TRITON_INTERPRET is off): these tests run "
                                        "unsloth's kernel on CPU tensors in Triton's interpreter")


def test_without_the_wheel_the_kernel_is_na_naming_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    reason = get("unsloth.grouped_gemm")._unavailable()
    assert reason is not None and f"no unsloth {adapter.WHEEL_VERSION} wheel found" in reason
    assert "pip download --no-deps" in reason and f"unsloth=={adapter.WHEEL_VERSION}" in reason


def test_the_set_up_downloads_the_version_the_adapter_reads():
    from pathlib import Path

    setup = (Path(__file__).resolve().parents[2] / "scripts" / "setup.sh").read_text()
    assert f"UNSLOTH_VERSION={adapter.WHEEL_VERSION}\n" in setup


@needs_wheel
@interpreted
@pytest.mark.parametrize("form", ["permute_x", "permute_y", "permute_y+fuse_mul_post"])
def test_the_wheels_kernel_computes_each_form(form, monkeypatch):
    """One hand-made routing per form, exact small integers: each slot as the reference has it."""
    monkeypatch.setenv(ENV, WHEEL)
    rng = np.random.default_rng(7)
    t = 4 if form == "permute_x" else 5
    ids = np.array([[2, 0], [1, 2], [2, 2], [0, 1], [3, 2]], np.int32)[:t]
    r = gmm_ref.Routing(rng.integers(-2, 3, (t, 32)).astype(np.float32), rng.integers(-2, 3, (4, 24, 32))
                        .astype(np.float32), ids, rng.integers(-2, 3, (t, 2)).astype(np.float32),
                        mul_routed_weight=form.endswith("post"))
    assert form_of(r) == form
    kernel = get("unsloth.grouped_gemm")
    ref = gmm_ref.routed_reference(r)
    gmm_ref.assert_routed_matches(kernel.run(r), ref, numerics=kernel.numerics_for(r), kernel=kernel.name)


@needs_wheel
@interpreted
def test_the_wheels_kernel_passes_the_routed_modes(monkeypatch):
    monkeypatch.setenv(ENV, WHEEL)
    report = check_kernel("unsloth.grouped_gemm", modes=["exact", "normal", "poisoned"], profile="gmm-ci",
                          max_examples=12)
    assert [(r.check, r.status) for r in report] == [(m, Status.PASSED) for m in ("exact", "normal", "poisoned")]


# the wheel's kernel, one line of _grouped_gemm_forward_kernel edited (each old text occurs once in the file)
WHEEL_EDITS = {
    # the last K block never loaded (as if K % BLOCK_SIZE_K were a tail to drop)
    "k_tail_dropped": ("for k_offset in range(0, K, BLOCK_SIZE_K):",
                       "for k_offset in range(0, K - BLOCK_SIZE_K, BLOCK_SIZE_K):"),
    # fuse_mul_post: the weight of the expert-ordered row i, not of the slot gather_indices[i] it holds
    "weight_of_the_wrong_slot": ("topk_load_idx = expert_token_offsets",
                                 "topk_load_idx = indices_to_gather_64[:, None]"),
    # permute_y: y stored in expert order, the scatter to slot order forgotten
    "y_not_scattered": ("store_idx = expert_token_offsets * N", "store_idx = indices_to_gather_64[:, None] * N"),
    # m_sizes read as cumulative ends (each expert's rows end at m_sizes[e]); on counts every row stays in bounds
    "m_sizes_read_as_cumulative": ("m_size = tl.load(m_sizes_ptr + expert_idx).to(tl.int32)",
                                   "m_size = tl.load(m_sizes_ptr + expert_idx).to(tl.int32) - m_start"),
}


@needs_wheel
@interpreted
@pytest.mark.parametrize("bug", sorted(WHEEL_EDITS))
def test_the_wheels_kernel_with_one_line_broken_is_rejected_naming_token_slot_and_expert(bug, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setenv(ENV, edited_wheel(WHEEL, adapter.FORWARD_MEMBER, "_grouped_gemm_forward_kernel",
                                         *WHEEL_EDITS[bug], tmp_path / f"unsloth-{bug}.whl"))
    text = rejected("unsloth.grouped_gemm", max_examples=20)
    assert re.match(SLOT, text), text


class _MetadataBug(_GroupedGemm):
    """The grouped GEMM convention whose arguments carry ``gather_indices`` built wrong (``bug``)."""

    def __init__(self, bug: str) -> None:
        super().__init__(**{f.name: getattr(GROUPED_GEMM, f.name) for f in dataclasses.fields(GROUPED_GEMM)})
        object.__setattr__(self, "bug", bug)

    def _arguments(self, r):
        args, kwargs = super()._arguments(r)
        gather = args[4].copy()
        if self.bug == "gather_off_by_one" and gather.size:  # each row holds the next row's slot (a permutation
            gather = np.roll(gather, -1)  # still: cumulative m_sizes given to the kernel would store past y instead)
        return (*args[:4], gather, *args[5:]), kwargs


class _BrokenMetadataKernel(adapter.UnslothGroupedGemm):
    name = "unsloth.grouped_gemm[broken metadata]"

    def __init__(self, bug: str) -> None:
        self._conv = _MetadataBug(bug)

    @property
    def convention_facts(self):
        return self._conv


@needs_wheel
@interpreted
@pytest.mark.parametrize("bug", ["gather_off_by_one"])
def test_the_wheels_kernel_on_wrong_metadata_is_rejected_naming_token_slot_and_expert(bug, monkeypatch):
    monkeypatch.setenv(ENV, WHEEL)
    text = rejected(_BrokenMetadataKernel(bug), max_examples=20)
    assert re.match(SLOT, text), text
