"""The ``scale`` mode for routed MoE kernels (``property_tests.checks.scale_routed``): slots past 65,535 in one call and
in one expert, experts past 256, 512 and 1,024, an expert map.

Each kernel of ``broken_scale_routed`` carries a bug that shows only there (slots past a grid axis of 65,535 blocks,
an expert scan of 1,024 threads; a weight table of 128, which the routed strategies' 257 and 513 experts reach too):
the scale mode rejects it naming the token, the slot and the expert; the default modes without it pass the first
two. The cells need only the routed convention's facts (``RoutedConvention``) and ``RoutedKernelAdapter``'s
interface, so they are checked here on a torch fused MoE in ``vllm.fused_moe``'s convention (native: every cell) and
on vLLM's own kernel in Triton's interpreter (the ``expert_map`` cell).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import gmm_ref
from gmm_kernels import Status, resolve_kernel
from gmm_ref.conventions.vllm import FUSED_MOE, FUSED_MOE_CONFIG, _FusedMoE
from property_tests.checks import scale_offsets as so
from property_tests.checks import scale_routed as sr
from property_tests.checks.check import check_kernel, check_mode
from property_tests.checks.modes import MODES
from tests.corpus import broken_scale_routed as bsr

pytest.importorskip("torch", reason="the fused MoE kernels here take torch tensors")

CONV = "vllm.fused_moe"
BM = FUSED_MOE_CONFIG["BLOCK_SIZE_M"]
DEFAULT_WITHOUT_SCALE = [m for m in MODES if m != "scale"]


class _ScanOf(_FusedMoE):
    """``vllm.fused_moe`` whose metadata an alignment with an expert scan of ``width`` threads builds."""

    def __init__(self, width: int) -> None:
        super().__init__(**{f.name: getattr(FUSED_MOE, f.name) for f in dataclasses.fields(FUSED_MOE)})
        object.__setattr__(self, "width", width)

    def _arguments(self, r):
        args, kwargs = super()._arguments(r)
        sorted_ids, blocks = bsr.scan_of(self.width, args[4], args[5], r.topk_ids, BM, r.num_experts, r.expert_map)
        return (*args[:4], sorted_ids, blocks, *args[6:]), kwargs


def _on_scan_of(adapter, width: int):
    """``adapter`` called with the metadata of an expert scan of ``width``."""
    conv = _ScanOf(width)
    adapter.__class__ = type(f"ScanOf{width}", (type(adapter),), {"convention_facts": property(lambda self: conv)})
    adapter.name = f"{adapter.name}[expert scan of {width}]"
    return adapter


def _torch(fn=bsr.fused_moe):
    return resolve_kernel(fn, convention=CONV, option="kernel")


def _rejected(adapter) -> str:
    result = check_mode(adapter, "scale")
    assert result.status is Status.FAILED, result
    assert isinstance(result.error, gmm_ref.Mismatch), result.error
    notes = "\n".join(getattr(result.error, "__notes__", []))
    assert "Routing: T=" in notes and "scale_routed.RoutedCell(" in notes, "the failure names its cell and routing"
    return str(result.error)


# ------------------------------------------------------------------------------------------------ the cells
def test_cells_cross_the_limits_exactly():
    """65,600 slots in one call (top_k 8) and in one expert; every expert of 257, 513, 1,025 holding a slot; an
    expert map with local ids past 512, global ids past 1,024 and other ranks' slots; exact, non-zero values."""
    adapter = _torch()
    seen = set()
    for cell in sr.cells(adapter):
        r = sr.scale_routing(adapter, cell)
        assert isinstance(r, gmm_ref.Routing), r
        counts = np.bincount(r.topk_ids.reshape(-1), minlength=r.num_experts)
        assert (counts > 0).all() and r.num_experts == cell.experts and r.k == r.n == sr.SMALL
        if cell.kind == "slots":
            assert r.topk_ids.size > 65_535 and r.top_k == 8
        elif cell.kind == "hot":
            assert counts.max() > 65_535 and counts.argmax() == 1
        elif cell.kind == "offsets":  # the last slot's offset past 2**31 - 1; a wrapped one (>= -2**31) in FRONT
            assert (r.topk_ids.size - 1) * so.ROW_STRIDE > 2**31 - 1 and so.FRONT >= 2**31
        elif cell.kind == "token_offsets":  # the last token's row offset past 2**31 - 1
            assert (r.num_tokens - 1) * so.ROW_STRIDE > 2**31 - 1 and so.FRONT >= 2**31
        else:
            assert counts.max() <= 3
        if cell.kind == "expert_map":
            local = r.local_ids
            assert local.max() >= 512 and (local == -1).any() and r.topk_ids.max() >= 1024
        assert not r.repeats_an_expert and r.mul_routed_weight
        assert abs(r.tokens.astype(float)).max() <= 2 and set(np.unique(r.topk_weights)) <= {-2, -1, 1, 2}
        ref = gmm_ref.routed_reference(r)
        local = r.local_ids >= 0
        assert (ref.slots_exact[..., 0][local] != 0).all(), "every local slot has a non-zero element"
        assert np.array_equal(ref.slots_exact, ref.slots.astype(np.float64)), "exact in the output dtype"
        seen.add(cell.kind)
    assert seen == {"slots", "hot", "experts", "expert_map", "offsets", "token_offsets"}


def test_the_scale_mode_draws_nothing_to_cover_for_a_routed_kernel():
    from property_tests.checks.check import coverage

    assert coverage(_torch(), "scale").status is Status.UNSUPPORTED


# ------------------------------------------------------------------------------------- a native fused MoE
def test_a_correct_fused_moe_passes_every_cell():
    result = check_mode(_torch(), "scale")
    assert result.status is Status.PASSED, result.detail
    n = len(sr.cells(_torch()))
    assert result.examples == n and result.cells == (n, n) and result.detail == ""


def test_a_correct_fused_moe_that_returns_its_output_passes_every_cell():
    """The offsets cell judges what a kernel returns, as every other call does; C only where it returns nothing."""
    result = check_mode(_torch(bsr.fused_moe_returning), "scale")
    assert result.status is Status.PASSED, result.detail


def _declining(why):
    """The torch fused MoE declining the routings ``why(routing)`` gives a reason for."""
    adapter = _torch()
    adapter.__class__ = type("Declining", (type(adapter),), {"_refusal": lambda self, r: why(r)})
    return adapter


def test_cells_a_kernel_declines_are_left_out_with_the_reason_and_none_is_na():
    ep = _declining(lambda r: "takes an expert_map only" if r.expert_map is None else None)
    result = check_mode(ep, "scale")
    assert result.status is Status.PASSED and result.cells == (1, 8), result
    assert result.detail == ("left out: T=8,200 x top_k=8 (65,600 slots), T=65,664 x top_k=1, 65,600 slots in "
                             "expert 1, E=257, E=513, E=1,025, T=16 x top_k=4, C's rows 67,108,864 elements apart "
                             "(offsets past 2**31), T=48 x top_k=2, A's rows 67,108,864 elements apart (offsets past "
                             f"2**31) ({ep.name} declines it: takes an expert_map only)")
    none = check_mode(_declining(lambda r: "takes no routing at all"), "scale")
    assert none.status is Status.UNSUPPORTED and "takes none of the scale cells" in none.detail, none
    assert "takes no routing at all" in none.detail


#: kernel -> the start of its report: the token, slot and expert of the first wrong element
EXPECTED = {
    # the slots cell (the first): flat slot 65,535 = token 8,191, slot 7
    "grid_capped": r"token 8191, slot 7 \(expert \d, local \d\)",
    # the E=1,025 cell: expert 1,024's slots are never placed
    "scan_of_1024": r"token \d+, slot \d \(expert 1024, local 1024\)",
    # the E=257 cell: the first slot of an expert past 127
    "table_of_128": r"token \d+, slot \d \(expert (12[89]|1[3-9]\d|2[0-5]\d), local \1\)",
}


def _broken(bug: str):
    if bug == "grid_capped":
        return _torch(bsr.grid_capped(bsr.fused_moe))
    if bug == "table_of_128":
        return _torch(bsr.table_of_128(bsr.fused_moe))
    return _on_scan_of(_torch(), 1024)


@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_the_scale_mode_rejects_it_naming_token_slot_and_expert(bug):
    text = _rejected(_broken(bug))
    assert re.match(EXPECTED[bug], text), text


def _past_row_end(kernel):
    """``kernel`` that also stores a zero one element past the end of each slot's row of C (a tile of N + 1
    columns, C's strides read)."""

    def past(A, B, C, *args, **kwargs):
        import torch

        kernel(A, B, C, *args, **kwargs)
        t, k, n = C.shape
        torch.as_strided(C, (t * k, n + 1), (C.stride(1), 1), C.storage_offset())[:, n] = 0

    return past


def test_a_store_past_a_row_of_the_strided_output_is_named_by_its_token_slot_and_expert():
    """The offsets cell's row margins (property_tests.checks.scale_offsets): between C's rows, outside any other guard
    (in the other cells C is contiguous: the store lands on the next row's column 0, a wrong element there)."""
    adapter = _torch(_past_row_end(bsr.fused_moe))
    with pytest.raises(gmm_ref.Mismatch) as info:
        so.check(adapter, sr.scale_routing(adapter, sr.OFFSETS))
    assert info.value.kind == "wrote_out_of_bounds"
    assert re.match(r"token 0, slot 0 \(expert 0\): kernel .* wrote within 4096 elements of this slot's row of C, "
                    r"outside it \(64 rows' margins changed\)", str(info.value)), info.value


@pytest.mark.parametrize("bug", ["grid_capped", "scan_of_1024"])
def test_the_default_modes_without_scale_miss_it(bug):
    report = check_kernel(_broken(bug), modes=DEFAULT_WITHOUT_SCALE, profile="gmm-ci", raise_on_failure=False)
    assert report.ok and not report.failures, report


@pytest.mark.parametrize(("width", "expert"), [(256, r"(25[6-9]|2[6-9]\d|[3-9]\d\d)"), (512, r"(51[2-9]|5[2-9]\d)")])
def test_narrower_scans_fail_their_first_cell_past_them(width, expert):
    """A scan of 256 or 512 fails the E=257 or E=513 cell (the routed strategies' 257 and 513 experts reach them
    too)."""
    text = _rejected(_on_scan_of(_torch(), width))
    assert re.match(rf"token \d+, slot \d \(expert {expert}, local \d+\)", text), text


@pytest.mark.parametrize("bug", ["table_of_128", "scan_of_256", "scan_of_512"])
def test_the_default_modes_already_catch_a_table_of_128_and_scans_of_256_and_512(bug):
    """Why those are not among the kernels only the scale mode catches: the strategies draw 257 and 513 experts."""
    adapter = _on_scan_of(_torch(), int(bug[-3:])) if bug.startswith("scan") else _broken(bug)
    with pytest.raises(gmm_ref.Mismatch, match=r"^token \d+, slot \d \(expert \d+, local \d+\)"):
        check_kernel(adapter, modes=["exact"], profile="gmm-ci")


# ------------------------------------------------------------------------------- vLLM's kernel, interpreted
pytest.importorskip("triton", reason="Triton is not installed (gmm-harness[triton]; the newest-JAX leg has none)")

from gmm_kernels import get  # noqa: E402
from gmm_kernels.adapters import vllm  # noqa: E402
from gmm_kernels.runtimes import triton_interpreter  # noqa: E402

needs_wheel = pytest.mark.skipif(vllm.find_wheel() is None, reason=f"no vLLM {vllm.WHEEL_VERSION} wheel here; get "
                                                                   f"it with: {vllm.DOWNLOAD}")
interpreted = pytest.mark.skipif(not triton_interpreter.use_if_no_gpu(),
                                 reason="torch sees a GPU here (or TRITON_INTERPRET is off): these tests run vLLM's "
                                        "kernel in Triton's interpreter")


@needs_wheel
@interpreted
def test_vllms_kernel_interpreted_gets_the_expert_map_cell_and_says_what_it_left_out():
    adapter = get("vllm.fused_moe")
    assert adapter.available() is None and adapter.interpreted() == "Triton's interpreter"
    result = check_mode(adapter, "scale")
    assert result.status is Status.PASSED and result.cells == (3, len(sr.cells(adapter))), result
    assert result.detail.startswith("left out: T=8,200 x top_k=8 (65,600 slots), ") and "interpreted" in result.detail


@needs_wheel
@interpreted
def test_vllms_kernel_on_an_expert_scan_of_1024_fails_the_expert_map_cell():
    adapter = vllm.VllmFusedMoE()  # not the registry's instance: its class is changed
    assert adapter.available() is None
    text = _rejected(_on_scan_of(adapter, 1024))
    assert re.match(r"token \d+, slot \d \(expert 102[45], local 51[12]\)", text), text


@pytest.mark.parametrize("name", ["vllm.fused_moe", "sglang.fused_moe", "unsloth.grouped_gemm",
                                  "unsloth.grouped_gemm_dX", "unsloth.grouped_gemm_dW",
                                  "unsloth.grouped_gemm_dW_accumulate"])
def test_every_routed_row_can_take_a_cell_of_its_own(name, monkeypatch):
    """Whatever a routed convention declares (no expert map, only some (K, N) extents), the cells it gets where
    it runs interpreted are cells it can take: built as routings, not declined."""
    adapter = resolve_kernel(name)
    monkeypatch.setattr(type(adapter), "interpreted", lambda self: "Triton's interpreter")
    for cell in sr.interpreted_cells(adapter):
        routing = sr.scale_routing(adapter, cell)
        conv = adapter.convention_facts
        if cell == sr.OFFSETS and (conv.out_argument is None or conv.output != "slots"):  # unsloth's: no C
            assert routing.endswith("does not write a per-slot [T, top_k, N] torch output in place (the cell "
                                    "strides its rows)"), routing
            continue
        if cell == sr.TOKEN_OFFSETS and conv.backward:
            assert routing.endswith("takes no tokens [T, K] as a torch tensor (the cell strides their rows)"), routing
            continue
        assert isinstance(routing, gmm_ref.RoutedBackward if conv.backward else gmm_ref.Routing), \
            f"{name}: {cell.describe()}: {routing}"
        if conv.backward:  # element 0 of every slot's input gradient is 1, (0, 0) of an expert's its slot count
            g = gmm_ref.routed_gradients(routing)
            assert (g.inputs.slots_exact[:, :, 0] == 1).all()
            counts = np.bincount(routing.topk_ids.reshape(-1), minlength=routing.num_local_experts)
            assert np.array_equal(g.experts_exact[:, 0, 0] - (0 if routing.existing is None else
                                                             routing.existing[:, 0, 0].astype(float)), counts)
        assert routing.num_experts > 1024 or cell in (sr.OFFSETS, sr.TOKEN_OFFSETS)
        assert (routing.tokens.shape[1], routing.n) in (adapter.convention_facts.extents or [(sr.SMALL, sr.SMALL)])


@pytest.mark.parametrize("kernel", ["fused_moe", "fused_moe_returning"])
def test_a_correct_fused_moe_passes_every_mode_whether_it_fills_c_or_returns(kernel):
    """Every mode that applies to a routed kernel, the graph mode's routings in turn and the scale cells included,
    reads the kernel's result one way: what it returns, else C."""
    from property_tests.checks.check import check_kernel

    report = check_kernel(getattr(bsr, kernel), convention="vllm.fused_moe", raise_on_failure=False,
                          max_examples=10)
    ran = [r for r in report if r.status is not Status.UNSUPPORTED]
    assert {"exact", "poisoned", "graph", "scale"} <= {r.check for r in ran}, [r.line() for r in report]
    assert report.ok, [r.line() for r in report if not r.ok]


def test_a_token_offset_formed_in_int32_is_caught_naming_the_token():
    """The tokens' cell: A's rows 2**26 elements apart, token 32 on past 2**31 - 1; a kernel forming t * stride_am
    in int32 reads those rows from before A (its margins and the untouched front: not the token)."""
    text = _rejected(_torch(bsr.fused_moe_int32_token_offsets))
    assert re.match(r"token (3[2-9]|4[0-7]), slot \d", text), text
    result = check_mode(_torch(bsr.fused_moe_int32_token_offsets), "scale")
    assert "A's rows (tokens) were 67,108,864 elements apart" in result.full_report()
