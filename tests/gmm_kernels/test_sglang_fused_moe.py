"""SGLang's fused MoE kernel (the built-in routed adapter ``sglang.fused_moe``), read from SGLang's wheel, checked
as a routed MoE kernel (docs/routed.md), and SGLang's own metadata (``moe_align_block_size``'s +1 buckets).

The convention's and the metadata's checks need no wheel; the kernel's need SGLang 0.5.23's wheel
(``scripts/setup.sh`` downloads it) and run it in Triton's interpreter (20-60 ms a call here: few examples).
Each broken twin is one real bug class: the wheel's own kernel with one line changed, or the wheel's kernel on
metadata built wrong; each must fail naming the token, the slot and the expert of a wrong element.
"""

from __future__ import annotations

import dataclasses
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gmm_ref
from gmm_kernels import Status
from gmm_ref import conventions
from gmm_ref.conventions.sglang import FUSED_MOE, FUSED_MOE_CONFIG, _FusedMoE
from gmm_ref.routed.metadata import (
    moe_align_block_size,
    sglang_moe_align_block_size,
    validate_sglang_moe_align_block_size,
)
from property_tests import strategies as gst
from tests.corpus.wheel_twins import SLOT, edited_wheel, rejected

CONV = conventions.get("sglang.fused_moe")
ROUTINGS = gst.routings(expert_layouts="enk", dtypes=[("bfloat16", "bfloat16"), ("float32", "float32")],
                        block_size=16, max_tokens=24, foreign="zero")
FEW = settings(max_examples=30, derandomize=True, database=None, deadline=None,
               suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------------------- SGLang's metadata (no wheel)
def test_the_alignment_puts_the_minus_one_run_first_in_plus_one_buckets():
    # slots 0..3: (0, 0) -> 1, (0, 1) -> -1, (1, 0) -> 0, (1, 1) -> 1; 2 local experts, 3 buckets, block 2
    ids = np.array([[1, -1], [0, 1]], np.int32)
    sorted_ids, blocks, post = sglang_moe_align_block_size(ids, 2, 2)
    # runs: bucket 0 (the -1 slot 1), bucket 1 (expert 0: slot 2), bucket 2 (expert 1: slots 0, 3), each padded
    # with the sentinel 4 to a multiple of 2; length 4 + 3 * (2 - 1) = 7 rounded up to 8
    assert sorted_ids.tolist() == [1, 4, 2, 4, 0, 3, 4, 4] and post.tolist() == [6]
    assert blocks.tolist() == [-1, 0, 1, -1]  # the last block lies past num_tokens_post_padded: never written
    validate_sglang_moe_align_block_size(ids, 2, 2, sorted_ids, blocks, post)


def test_the_alignments_length_below_the_bucket_count_and_with_no_local_expert():
    ids = np.array([[0]], np.int32)  # 1 slot < 3 + 1 buckets: 1 * 16 entries
    sorted_ids, blocks, post = sglang_moe_align_block_size(ids, 16, 3)
    assert sorted_ids.shape == (16,) and blocks.shape == (1,) and post.tolist() == [16]
    sorted_ids, blocks, post = sglang_moe_align_block_size(np.full((2, 2), -1, np.int32), 2, 0)
    assert sorted_ids.tolist() == [0, 1, 2, 3, 4, 4, 4, 4] and blocks.tolist()[:2] == [-1, -1]
    with pytest.raises(ValueError, match=r"topk_ids\[0, 1\] = 3: expected a local expert in \[0, 3\) or -1"):
        sglang_moe_align_block_size(np.array([[0, 3]], np.int32), 16, 3)


@FEW
@given(ROUTINGS)
def test_the_alignment_is_vllms_over_the_buckets_and_validates(routing):
    ids = routing.local_ids.astype(np.int32)
    e = routing.num_local_experts
    sorted_ids, blocks, post = sglang_moe_align_block_size(ids, 16, e)
    validate_sglang_moe_align_block_size(ids, 16, e, sorted_ids, blocks, post)
    v_sorted, v_blocks, v_post = moe_align_block_size(ids + 1, 16, e + 1)
    assert post == v_post and np.array_equal(sorted_ids[:post[0]], v_sorted[:post[0]])
    assert np.array_equal(blocks[:post[0] // 16], v_blocks[:post[0] // 16] - 1)


@pytest.mark.parametrize(("change", "words"), [
    (lambda s, b: b.__setitem__(0, b[0] + 1), r"expert_ids\[0\]"),
    (lambda s, b: s.__setitem__(0, s[1]), r"sorted_token_ids\[0\]"),
    (lambda s, b: s.__setitem__(slice(None), np.roll(s, 1)), "sorted_token_ids"),
])
def test_the_validator_names_the_first_wrong_entry(change, words):
    ids = np.array([[1, -1], [0, 1]], np.int32)
    sorted_ids, blocks, post = sglang_moe_align_block_size(ids, 2, 2)
    change(sorted_ids, blocks)
    with pytest.raises(ValueError, match=words):
        validate_sglang_moe_align_block_size(ids, 2, 2, sorted_ids, blocks, post)


# ------------------------------------------------------------------------------- the convention (no wheel)
@FEW
@given(ROUTINGS)
def test_arguments_parse_back_to_the_same_slots(routing):
    args, kwargs = CONV.arguments(routing)
    c = args[3]
    assert c.shape == (routing.num_tokens, routing.top_k, routing.n) and np.isnan(c.astype(np.float32)).all()
    assert np.array_equal(args[8], routing.local_ids)  # topk_ids: local, -1 for another rank's
    for given_c in (c, c.reshape(-1, routing.n)):  # SGLang's up GEMM passes C as [T*top_k, N]
        again = CONV.parse(*args[:3], given_c, *args[4:], **kwargs)
        want, got = gmm_ref.routed_reference(routing), gmm_ref.routed_reference(again)
        assert np.array_equal(want.slots_exact, got.slots_exact)
        assert np.array_equal(want.local, got.local)


def test_the_routed_convention_is_looked_up_but_not_listed_with_the_grouped_ones():
    assert CONV is FUSED_MOE and "sglang.fused_moe" in conventions.routed_names()
    assert "sglang.fused_moe" not in conventions.names()


def _args():
    ids = np.array([[0, 1], [1, 2], [3, 0]], np.int32)
    routing = gmm_ref.Routing(np.ones((3, 16), np.float32), np.ones((4, 8, 16), np.float32), ids,
                              np.ones((3, 2), np.float32))
    args, kwargs = CONV.arguments(routing)
    return list(args), dict(kwargs)


@pytest.mark.parametrize(("change", "words"), [
    (lambda a, k: a.__setitem__(2, np.ones((4, 8), np.float32)), "bias: expected None"),
    (lambda a, k: a.__setitem__(5, np.ones(4, np.float32)), "B_scale: expected None"),
    (lambda a, k: k.__setitem__("use_fp8_w8a8", True), "use_fp8_w8a8: expected False"),
    (lambda a, k: k.__setitem__("c_sorted", True), "c_sorted: expected False"),
    (lambda a, k: k.__setitem__("fuse_swiglu", True), "fuse_swiglu: expected False"),
    (lambda a, k: a.__setitem__(3, a[3][:, :1]), "C: expected the output buffer of shape"),
    (lambda a, k: a.__setitem__(7, None), "topk_weights"),
    (lambda a, k: a.__setitem__(8, a[8][:, ::-1].copy()), r"topk_ids\[0, 0\] = 1: sorted_token_ids places"),
    (lambda a, k: a.__setitem__(8, a[8][:2]), r"topk_ids: expected \[3, 2\]"),
    (lambda a, k: a.__setitem__(9, a[9][1:]), "lies in no block"),
    (lambda a, k: a.__setitem__(10, a[10] + 9), "expert_ids"),
    (lambda a, k: a.__setitem__(11, a[11] + 1), "num_tokens_post_padded"),
    (lambda a, k: a.__setitem__(13, 0), "top_k"),
    (lambda a, k: a.__setitem__(14, {"BLOCK_SIZE_N": 32}), "config"),
    (lambda a, k: a.__setitem__(15, "float16"), "compute_type"),
])
def test_bad_arguments_are_refused_naming_them(change, words):
    args, kwargs = _args()
    change(args, kwargs)
    with pytest.raises((ValueError, TypeError), match=words):
        CONV.parse(*args, **kwargs)


# ------------------------------------------------------------------------------- the kernel (the wheel)
pytest.importorskip("torch", reason="SGLang's kernel takes torch tensors (gmm-harness[torch])")
pytest.importorskip("triton", reason="Triton is not installed (gmm-harness[triton]; the newest-JAX leg has none)")

from gmm_kernels import get  # noqa: E402
from gmm_kernels.adapters import sglang as adapter  # noqa: E402
from gmm_kernels.runtimes import triton_interpreter  # noqa: E402
from gmm_kernels.runtimes.wheels import WheelLayoutError  # noqa: E402
from property_tests.checks.check import check_kernel, check_mode  # noqa: E402

WHEEL = adapter.WHEEL.find()
needs_wheel = pytest.mark.skipif(WHEEL is None, reason=f"no SGLang {adapter.WHEEL_VERSION} wheel here; get it "
                                                      f"with: {adapter.WHEEL.download}")
interpreted = pytest.mark.skipif(not triton_interpreter.use_if_no_gpu(),
                                 reason="torch sees a GPU here (or TRITON_INTERPRET is off): these tests run "
                                        "SGLang's kernel on CPU tensors in Triton's interpreter")


def test_setup_downloads_the_wheel_the_adapter_reads():
    setup = (Path(__file__).resolve().parents[2] / "scripts" / "setup.sh").read_text()
    assert f"SGLANG_VERSION={adapter.WHEEL_VERSION}\n" in setup


def test_a_wheel_without_the_kernel_is_named(tmp_path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(adapter.FUSED_MOE_MEMBER, "import triton\n\n@triton.jit\ndef fused_moe_kernel(x):\n    pass\n")
    with pytest.raises(WheelLayoutError, match="has no top-level function write_zeros_to_output, "
                                               "invoke_fused_moe_kernel"):
        adapter.load_fused_moe(str(wheel))


def test_unavailable_without_a_wheel_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv(adapter.WHEEL_ENV, str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    reason = get("sglang.fused_moe").available()
    assert "no SGLang 0.5.23 wheel found" in reason and "pip download --no-deps" in reason
    assert "sglang==0.5.23" in reason


@needs_wheel
@interpreted
def test_the_wheels_kernel_passes_every_routed_mode_and_the_others_say_why_not(monkeypatch):
    monkeypatch.setenv(adapter.WHEEL_ENV, WHEEL)
    report = check_kernel("sglang.fused_moe", max_examples=12)
    status = {r.check: r.status for r in report}
    # scale: the routed scale cell an interpreted kernel gets (property_tests.checks.scale_routed), one seeded routing
    assert {m for m, s in status.items() if s is Status.PASSED} == {"exact", "normal", "wide", "poisoned", "graph",
                                                                     "scale"}
    assert all(r.detail.startswith("routed: ") for r in report if r.status is Status.UNSUPPORTED)
    assert all(r.examples >= 10 for r in report if r.status is Status.PASSED and r.check != "scale")


@needs_wheel
@interpreted
def test_the_wheels_kernel_takes_a_token_listing_one_expert_twice(monkeypatch):
    # SGLang's grid spans all of sorted_token_ids (no small-batch trim): the convention draws repeats
    monkeypatch.setenv(adapter.WHEEL_ENV, WHEEL)
    assert not FUSED_MOE.distinct_experts
    rng = np.random.default_rng(0)
    ids = np.array([[1, 1], [0, 0], [1, 0]], np.int32)
    routing = gmm_ref.Routing(rng.standard_normal((3, 8)).astype(np.float32),
                              rng.standard_normal((2, 4, 8)).astype(np.float32), ids,
                              rng.random((3, 2)).astype(np.float32), mul_routed_weight=True)
    kernel = get("sglang.fused_moe")
    gmm_ref.assert_routed_matches(kernel.run(routing), kernel.reference_for(routing),
                                  numerics=kernel.numerics_for(routing), kernel=kernel.name)


def test_the_row_reaches_the_even_k_path_and_the_tile_edges():
    limits = get("sglang.fused_moe").routed_limits()
    assert limits.num_experts is None and limits.max_top_k is None and limits.max_tokens is None
    assert (32, 8) in limits.extents and 32 % FUSED_MOE_CONFIG["BLOCK_SIZE_K"] == 0  # even_Ks: unmasked K loads
    assert (40, 40) in limits.extents and FUSED_MOE_CONFIG["BLOCK_SIZE_N"] < 40


# the wheel's kernel, one line of fused_moe_kernel edited (each old text occurs once in the kernel's body)
WHEEL_EDITS = {
    # the padding sentinel T*top_k not skipped: wrapped into C's rows, token 0's slot 0 is read and overwritten
    "sentinel_not_skipped": ("offs_token = offs_token.to(tl.int64)",
                             "offs_token = (offs_token % num_valid_tokens).to(tl.int64)"),
    "weight_twice": ("accumulator *= moe_weight[:, None]", "accumulator *= moe_weight[:, None] * moe_weight[:, None]"),
    # each block computed with the expert of the block before it (the -1 run's blocks come first)
    "expert_ids_shifted": ("off_experts_i32 = tl.load(expert_ids_ptr + pid_m)",
                           "off_experts_i32 = tl.load(expert_ids_ptr + tl.maximum(pid_m - 1, 0))"),
    # the plain store taken for one of SGLang's fused epilogues, which leave an inactive block's rows alone: the
    # slots of other ranks' experts keep what torch.empty held
    "inactive_left_unwritten": ("if not (c_sorted or FUSE_SWIGLU or", "if not (True or c_sorted or FUSE_SWIGLU or"),
}
NAMED = {"inactive_left_unwritten": r"token \d+, slot \d+ \(expert \d+, local -1, on another rank\)"}


@needs_wheel
@interpreted
@pytest.mark.parametrize("bug", sorted(WHEEL_EDITS))
def test_the_wheels_kernel_with_one_line_broken_is_rejected_naming_token_slot_and_expert(bug, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setenv(adapter.WHEEL_ENV, edited_wheel(WHEEL, adapter.FUSED_MOE_MEMBER, "fused_moe_kernel",
                                                       *WHEEL_EDITS[bug], tmp_path / f"sglang-{bug}.whl"))
    text = rejected("sglang.fused_moe")
    assert re.match(NAMED.get(bug, SLOT), text), text


@needs_wheel
@interpreted
def test_the_wheels_kernel_with_an_int32_flat_index_fails_the_offsets_cell_naming_token_slot_and_expert(
        tmp_path, monkeypatch):
    """SGLang's kernel casts the loaded ``sorted_token_ids`` to int64 as vLLM's does; without the cast
    ``stride_cm`` times the flat index wraps in the scale mode's offsets cell (property_tests.checks.scale_offsets)."""
    monkeypatch.setenv(adapter.WHEEL_ENV, edited_wheel(WHEEL, adapter.FUSED_MOE_MEMBER, "fused_moe_kernel",
                                                       "offs_token = offs_token.to(tl.int64)",
                                                       "offs_token = offs_token", tmp_path / "sglang-int32.whl"))
    result = check_mode(get("sglang.fused_moe"), "scale")
    assert result.status is Status.FAILED, result
    assert re.match(r"kernel sglang.fused_moe wrote out of bounds: .* before the start of c_ptr .*wrapped in int32",
                    str(result.error)), result.error


class _MetadataBug(_FusedMoE):
    """The convention whose arguments carry SGLang's metadata with the -1 run's blocks read as local expert 0
    (the +1 bucket shift undone for them only)."""

    def __init__(self) -> None:
        super().__init__(**{f.name: getattr(FUSED_MOE, f.name) for f in dataclasses.fields(FUSED_MOE)})

    def _arguments(self, r):
        args, kwargs = super()._arguments(r)
        blocks = args[10].copy()
        if r.num_local_experts:
            blocks[:args[11][0] // FUSED_MOE_CONFIG["BLOCK_SIZE_M"]] = np.maximum(
                blocks[:args[11][0] // FUSED_MOE_CONFIG["BLOCK_SIZE_M"]], 0)
        return (*args[:10], blocks, *args[11:]), kwargs


class _BrokenMetadataKernel(adapter.SglangFusedMoE):
    name = "sglang.fused_moe[broken metadata]"

    @property
    def convention_facts(self):
        return _MetadataBug()


@needs_wheel
@interpreted
def test_the_wheels_kernel_computing_other_ranks_slots_is_rejected_naming_them(monkeypatch):
    monkeypatch.setenv(adapter.WHEEL_ENV, WHEEL)
    text = rejected(_BrokenMetadataKernel())
    assert re.match(NAMED["inactive_left_unwritten"], text), text
