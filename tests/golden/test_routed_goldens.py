"""Routed goldens (docs/goldens.md, "Routed cases"): the corpus' routed cases reach the routed family's edge
classes, are stored and verified like the grouped ones, and a fused-MoE kernel that is wrong fails them naming
the token, the slot and the expert of a wrong element."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import numpy as np
import pytest

import gmm_ref
from gmm_kernels import Status, wrap
from golden.case import Case, build_problem
from golden.cases import CASES
from golden.judge import check_goldens
from golden.regeneration import regenerate
from golden.routed import is_routed
from golden.store import MANIFEST, GoldenStore
from golden.verification import verify

DATA = Path(__file__).resolve().parents[2] / "golden" / "data"
needs_data = pytest.mark.skipif(not (DATA / MANIFEST).exists(), reason="no golden/data here (not a checkout)")
ROUTED = [c for c in CASES if is_routed(c)]
#: the cases of vLLM's convention: the ones a kernel in it (the torch fused MoE below, vLLM's own) is checked on
VLLM = [c for c in ROUTED if c.convention == "vllm.fused_moe"]
SLOT = r"token \d+, slot \d+ \(expert \d+, local -?\d+"


def test_the_routed_cases_reach_the_edge_classes():
    """Read from the routings the cases build, not from their tags."""
    routings = {c.name: build_problem(c) for c in ROUTED}
    assert {str(r.tokens.dtype) for r in routings.values()} == {"bfloat16", "float16", "float32"}
    assert {1, 2, 8} <= {r.top_k for r in routings.values()}
    assert any((r.local_ids < 0).any() and (r.local_ids >= 0).any() for r in routings.values()), "a -1 expert"
    assert any((r.local_ids < 0).all(axis=1).any() for r in routings.values()), "a token on other ranks only"
    assert any(np.bincount(r.local_ids[r.local_ids >= 0], minlength=r.num_local_experts).min() == 0
               for r in routings.values()), "a local expert no slot routes to"
    assert any(r.num_tokens == 1 for r in routings.values())
    assert any(r.mul_routed_weight for r in routings.values()) and not all(r.mul_routed_weight
                                                                            for r in routings.values())


def test_a_routed_case_refuses_a_grouped_field_and_the_wrong_family():
    case = ROUTED[0]
    with pytest.raises(ValueError, match=rf"case {case.name}: tiling=\(16, 16, 16\) is a grouped case's field"):
        build_problem(dataclasses.replace(case, tiling=(16, 16, 16)))
    with pytest.raises(ValueError, match="a routed convention's cases are of the routed family"):
        build_problem(dataclasses.replace(case, family="ragged_m"))
    with pytest.raises(ValueError, match="top_k=9 distinct experts of 8"):
        build_problem(dataclasses.replace(case, top_k=9))


def test_a_routed_spec_round_trips_and_a_grouped_spec_is_unchanged():
    for c in ROUTED:
        assert Case.from_json(c.to_json()) == c
    grouped = next(c for c in CASES if not is_routed(c))
    assert not {"top_k", "expert_map", "mul_routed_weight"} & set(grouped.to_json())  # its golden is not stale


@needs_data
def test_the_routed_goldens_verify_and_a_changed_case_is_stale():
    code, report = verify(DATA, CASES, cases="moe-*")
    assert code == 0, report
    moved = [dataclasses.replace(c, seed=7) if c.name == ROUTED[0].name else c for c in CASES]
    code, report = verify(DATA, moved, cases=ROUTED[0].name)
    assert code == 1 and "seed 200 -> 7" in report and f"regenerate --cases {ROUTED[0].name} --update" in report


def _torch_moe(bug=None, name=None):
    pytest.importorskip("torch")
    from tests.gmm_kernels.test_vllm_fused_moe import torch_fused_moe

    def fused_moe(*args, **kwargs):
        return torch_fused_moe(*args, **kwargs, bug=bug)

    return wrap(fused_moe, "vllm.fused_moe", name=name or f"fused_moe[{bug}]")


@needs_data
def test_a_correct_fused_moe_passes_the_routed_goldens():
    results = check_goldens(_torch_moe(), DATA)
    assert len(results) == len(VLLM) and all(r.status is Status.PASSED for r in results), \
        [r.line() for r in results]


@needs_data
@pytest.mark.parametrize("bug", ["reads_sentinel", "weight_without_flag", "swaps_slots"])
def test_a_broken_fused_moe_fails_the_routed_goldens_naming_token_slot_and_expert(bug):
    failed = [r for r in check_goldens(_torch_moe(bug), DATA) if r.status is Status.FAILED]
    assert failed, f"{bug}: no routed golden caught it"
    for r in failed:
        assert re.search(rf"case moe-[a-z0-9-]+: \d+ / \d+ defined elements wrong .*first at {SLOT}", r.detail), \
            r.detail


def test_a_kernels_own_routed_goldens_are_stored_with_its_numerics_and_matched_bit_for_bit(tmp_path):
    kernel = _torch_moe()
    corpus = VLLM[:2]
    assert regenerate(corpus, tmp_path, stream=io.StringIO())[0] == 0
    code, report = regenerate(corpus, tmp_path, kernel=kernel, stream=io.StringIO())
    assert code == 0, report
    entries = [e for _, key, e in GoldenStore(tmp_path).goldens() if key != "reference"]
    assert len(entries) == 2 and all(set(e["numerics"]) == {"routed_numerics"} for e in entries)
    assert verify(tmp_path, corpus)[0] == 0
    results = check_goldens(kernel, tmp_path)
    assert [r.criterion for r in results] == ["bit-for-bit"] * 2 and all(r.status is Status.PASSED for r in results)
    # the same kernel's output changed (its weight applied without the flag): its own golden no longer matches
    broken = _torch_moe("weight_without_flag", name=kernel.name)
    failed = [r for r in check_goldens(broken, tmp_path) if r.status is Status.FAILED]
    assert failed and all("not bit-for-bit equal to its own golden" in r.detail for r in failed)
    assert all(re.search(f"first at {SLOT}", r.detail) for r in failed), [r.detail for r in failed]


@needs_data
def test_vllms_kernel_with_one_line_broken_fails_the_routed_goldens(tmp_path, monkeypatch):
    """The wheel's own kernel, each block computed with the expert of the block before it."""
    from tests.gmm_kernels import test_vllm_fused_moe as twins

    if twins.WHEEL is None or not twins.triton_interpreter.use_if_no_gpu():
        pytest.skip("needs vLLM's wheel and Triton's interpreter")
    edit = twins.WHEEL_EDITS["expert_ids_shifted"]
    monkeypatch.setenv(twins.adapter.WHEEL_ENV, twins.edited_wheel(twins.WHEEL, twins.adapter.FUSED_MOE_MEMBER,
                                                                   "fused_moe_kernel", *edit,
                                                                   tmp_path / "vllm-shifted.whl"))
    results = check_goldens("vllm.fused_moe", DATA)
    failed = [r for r in results if r.status is Status.FAILED]
    assert len(results) == len(VLLM) and failed, [r.line() for r in results]
    assert all(re.search(f"first at {SLOT}", r.detail) for r in failed), [r.detail for r in failed]


# -------------------------------------------------------------- the combined [T, N] output: torch.moe_experts
#: the cases of the combined convention: their goldens hold [T, N], the weighted sum of each token's slots
TORCH = [c for c in ROUTED if c.convention == "torch.moe_experts"]
#: a failure on a combined golden: the case, the wrong tokens, the first wrong element's token and column, and the
#: slots (experts, weights) feeding that row
ROW = (r"case moe-torch-[a-z0-9-]+: (.*: )?\d+ / \d+ defined elements wrong in \d+ token\(s\) \[[\d, ]+\]( \.\.\.)?; "
       r"first at token (?P<t>\d+), column \d+: \S+ vs \S+ \(the combined row of token (?P=t): the weighted sum of "
       r"slot 0 \(expert \d+, local -?\d+")


def _case(name):
    return next(c for c in TORCH if c.name == name)


def test_the_output_kind_follows_from_the_convention_and_the_new_fields_are_left_out_of_older_specs():
    """No case field says what a golden holds: a routed convention's kernels return one kind (its ``output``)."""
    from golden.routed import output_of, record_of

    for c in ROUTED:
        r = build_problem(c)
        want = {"torch.moe_experts": ("combined", (r.num_tokens, r.n)),
                "unsloth.grouped_gemm_dX": ("d_slots", (r.num_tokens, r.top_k, r.k)),
                "unsloth.grouped_gemm_dW": ("d_experts", r.experts.shape),
                "unsloth.grouped_gemm_dW_accumulate": ("d_experts", r.experts.shape)}.get(
                    c.convention, ("slots", (r.num_tokens, r.top_k, r.n)))
        assert (output_of(c), record_of(r, c)[0]) == want, c.name
        assert Case.from_json(c.to_json()) == c
    assert len(TORCH) >= 4
    # the cases older than these fields (all but the combined and the backward ones) keep their specs
    assert not {"router", "repeat_tokens"} & {k for c in CASES if c not in TORCH + BACKWARD for k in c.to_json()}


def test_the_combined_cases_reach_their_edge_classes():
    """Read from the routings the cases build, not from their tags."""
    rs = [build_problem(c) for c in TORCH]
    bf16 = [r for r in rs if str(r.tokens.dtype) == "bfloat16" and r.top_k >= 4]
    peaked = [r for r in bf16 if (np.abs(r.topk_weights[:, 1:]) < np.abs(r.topk_weights[:, :1]) * 2 ** -8).all()
              and (np.sign(r.topk_weights[:, 1:]) == np.sign(r.topk_weights[:, :1])).all()]
    assert peaked, "bf16, top_k >= 4, a peaked router: a dominant slot and a tail of its sign in every token"
    assert any(r.repeats_an_expert and (r.topk_ids == r.topk_ids[:, :1]).all(axis=1).any() for r in peaked)
    assert any(str(r.tokens.dtype) == "float32" for r in rs)
    mapped = [r for r in rs if r.expert_map is not None]
    assert any((r.local_ids < 0).all(axis=1).any() and np.isnan(r.tokens.astype(np.float64)).any() for r in mapped), \
        "an expert_map: a token on other ranks only, its row poisoned (nothing reads it)"
    assert any(r.num_tokens == 1 for r in rs)


def test_routed_case_fields_are_checked_by_name():
    peaked = _case("moe-torch-bf16-top8-peaked-repeats")
    with pytest.raises(ValueError, match=r"case moe-torch-bf16-top8-peaked-repeats: router='flat': expected one of "
                                         r"\[None, 'peaked'\]"):
        build_problem(dataclasses.replace(peaked, router="flat"))
    with pytest.raises(ValueError, match=r"repeat_tokens holds 10: expected a token in \[0, 10\)"):
        build_problem(dataclasses.replace(peaked, repeat_tokens=(10,)))
    with pytest.raises(ValueError, match="router='peaked' needs top_k >= 2"):
        build_problem(dataclasses.replace(peaked, top_k=1, repeat_tokens=()))
    with pytest.raises(ValueError, match=r"vllm\.fused_moe's callers never list one expert twice"):
        build_problem(dataclasses.replace(VLLM[0], repeat_tokens=(0,)))
    grouped = next(c for c in CASES if not is_routed(c))
    with pytest.raises(ValueError, match=rf"case {grouped.name}: router='peaked' is a routed case's field"):
        build_problem(dataclasses.replace(grouped, router="peaked"))


@needs_data
def test_the_combined_goldens_verify_and_hold_the_once_rounded_combined_output():
    code, report = verify(DATA, CASES, cases="moe-torch-*")
    assert code == 0 and f"{len(TORCH)} case(s)" in report, report
    man = GoldenStore(DATA).manifest()["cases"]
    for c in TORCH:
        g = GoldenStore(DATA).load(c.name, man[c.name]["reference"])
        ref = gmm_ref.routed_reference(build_problem(c))
        assert g.out.shape == ref.combined.shape and g.mask.all(), c.name  # [T, N], every element defined
        assert np.array_equal(g.out.view(np.uint8), ref.combined.view(np.uint8)), c.name


@needs_data
def test_the_built_in_torch_moe_experts_passes_the_combined_goldens():
    pytest.importorskip("torch")
    results = check_goldens("torch.moe_experts", DATA)
    assert len(results) == len(TORCH) and all(r.status is Status.PASSED and r.criterion == "bound"
                                              for r in results), [r.line() for r in results]


#: each broken torch twin of test_torch_moe.py, with the case built to catch it
TWINS = {"bf16_sum": "moe-torch-bf16-top8-peaked-repeats", "lost_updates": "moe-torch-f32-top4",
         "unsorted_weights": "moe-torch-f32-top4", "foreign_computed": "moe-torch-f16-expert-map-poison"}


@needs_data
@pytest.mark.parametrize("bug", sorted(TWINS))
def test_the_broken_torch_twins_fail_the_combined_goldens_naming_the_token(bug):
    pytest.importorskip("torch")
    from tests.gmm_kernels.test_torch_moe import Broken

    results = check_goldens(Broken(bug), DATA)
    failed = {r.check: r for r in results if r.status is Status.FAILED}
    assert len(results) == len(TORCH) and TWINS[bug] in failed, [r.line() for r in results]
    for r in failed.values():
        assert re.search(ROW, r.detail), r.detail


@needs_data
def test_a_bf16_combine_declaring_its_sum_passes_the_combined_goldens():
    """The bf16 combine fails the peaked case by its declared float32 sum's bound, not by a wrong golden."""
    pytest.importorskip("torch")
    from tests.gmm_kernels.test_torch_moe import DeclaresItsSum

    results = check_goldens(DeclaresItsSum("bf16_sum"), DATA)
    assert len(results) == len(TORCH) and all(r.status is Status.PASSED for r in results), \
        [r.line() for r in results]


def test_a_kernels_own_combined_goldens_match_bit_for_bit_and_go_stale_when_the_case_changes(tmp_path):
    pytest.importorskip("torch")
    from tests.gmm_kernels.test_torch_moe import Broken

    corpus = [_case("moe-torch-f32-top4")]
    assert regenerate(corpus, tmp_path, stream=io.StringIO())[0] == 0
    code, report = regenerate(corpus, tmp_path, kernel="torch.moe_experts", stream=io.StringIO())
    assert code == 0, report
    own = [e for _, key, e in GoldenStore(tmp_path).goldens() if key != "reference"]
    assert len(own) == 1 and own[0]["out_shape"] == [7, 8] and set(own[0]["numerics"]) == {"routed_numerics"}
    assert verify(tmp_path, corpus)[0] == 0
    [ok] = check_goldens("torch.moe_experts", tmp_path)
    assert ok.status is Status.PASSED and ok.criterion == "bit-for-bit", ok.line()
    broken = Broken("lost_updates")
    broken.name = "torch.moe_experts"  # the same kernel, its output changed: its own golden no longer matches
    [bad] = check_goldens(broken, tmp_path)
    assert bad.status is Status.FAILED and "not bit-for-bit equal to its own golden" in bad.detail, bad.line()
    assert re.search(ROW, bad.detail), bad.detail
    moved = [dataclasses.replace(corpus[0], seed=7)]
    [stale] = check_goldens("torch.moe_experts", tmp_path, corpus=moved)
    assert stale.status is Status.FAILED and stale.criterion == "stale" and "seed 231 -> 7" in stale.detail, \
        stale.line()
    code, report = verify(tmp_path, moved)
    assert code == 1 and "regenerate --cases moe-torch-f32-top4 --update" in report, report


def test_the_golden_command_takes_a_routed_convention_for_a_function(tmp_path):
    """`python -m golden check --kernel pkg.mod:fn --convention C` takes the routed conventions too (its choices
    were the grouped ones only): a user's fused-MoE function is judged on its convention's cases."""
    import subprocess
    import sys

    pytest.importorskip("torch")  # the user's function is torch.moe_experts' torch code

    (tmp_path / "mymoe.py").write_text("from gmm_kernels.adapters.torch_moe import moe_experts\n\n\n"
                                       "def kernel(*args, **kwargs):\n    return moe_experts(*args, **kwargs)\n")
    done = subprocess.run([sys.executable, "-m", "golden", "check", "--kernel", "mymoe:kernel", "--convention",
                           "torch.moe_experts", "--cases", "moe-torch-f32-*"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASSED      mymoe:kernel :: moe-torch-f32-top4" in done.stdout, done.stdout


# ------------------------------------------------ the backward kernels' goldens: a gradient, with its cotangent
BACKWARD = [c for c in ROUTED if gmm_ref.conventions.get(c.convention).backward]
EXPERT = r"first at expert \d+ \(local \d+\), n \d+, k \d+: "


def test_the_backward_cases_carry_their_cotangent_and_reach_both_forms_and_both_gradients():
    """Read from the backwards the cases build: a cotangent each, an existing gradient where the convention adds
    into one, both of unsloth's forms (permute_x, permute_y) and a token listing one expert twice."""
    from gmm_ref.conventions.unsloth import backward_form_of

    bs = {c.name: build_problem(c) for c in BACKWARD}
    assert all(isinstance(b, gmm_ref.RoutedBackward) for b in bs.values())
    assert {c.convention for c in BACKWARD} == {n for n in gmm_ref.conventions.routed_names()
                                                if gmm_ref.conventions.get(n).backward}
    for c in BACKWARD:
        assert (bs[c.name].existing is not None) == gmm_ref.conventions.get(c.convention).accumulates, c.name
    for conv in ("unsloth.grouped_gemm_dX", "unsloth.grouped_gemm_dW"):
        assert {backward_form_of(bs[c.name]) for c in BACKWARD if c.convention == conv} == {"permute_x",
                                                                                           "permute_y"}, conv
    assert any(b.repeats_an_expert for b in bs.values())
    assert any(np.bincount(b.topk_ids.ravel(), minlength=b.num_experts).min() == 0 for b in bs.values())


@needs_data
def test_the_backward_goldens_hold_the_once_rounded_gradients():
    man = GoldenStore(DATA).manifest()["cases"]
    for c in BACKWARD:
        g = GoldenStore(DATA).load(c.name, man[c.name]["reference"])
        grads = gmm_ref.routed_gradients(build_problem(c))
        want = grads.inputs.slots if c.convention.endswith("dX") else grads.experts
        assert g.out.shape == want.shape, c.name
        assert np.array_equal(g.out.view(np.uint8), np.where(g.mask, want, 0).astype(want.dtype).view(np.uint8)), \
            c.name


@needs_data
def test_a_users_dw_passes_the_gradient_goldens_and_its_expert_order_twin_is_named():
    """A torch dW in unsloth's convention passes; its twin reading dY in expert order under permute_y fails the
    permute_y case, naming the expert, the element and the culprit."""
    pytest.importorskip("torch")
    from tests.gmm_kernels.test_unsloth_backward import torch_dw, torch_dw_expert_order

    ok = check_goldens(wrap(torch_dw, "unsloth.grouped_gemm_dW"), DATA)
    assert len(ok) == 2 and all(r.status is Status.PASSED for r in ok), [r.line() for r in ok]
    bad = {r.check: r for r in check_goldens(wrap(torch_dw_expert_order, "unsloth.grouped_gemm_dW"), DATA)}
    r = bad["moe-unsloth-dw-f16-top2-empty-experts"]
    assert r.status is Status.FAILED and re.search(EXPERT, r.detail), r.detail
    assert "the cotangent rows read in expert order" in r.detail, r.detail


def _unsloth_wheel():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from gmm_kernels.adapters import unsloth as adapter
    from gmm_kernels.runtimes import triton_interpreter

    if adapter.WHEEL.find() is None:
        pytest.skip(f"no unsloth {adapter.WHEEL_VERSION} wheel here; get it with: {adapter.DOWNLOAD}")
    if not triton_interpreter.use_if_no_gpu():
        pytest.skip("torch sees a GPU here (or TRITON_INTERPRET is off): this runs unsloth's kernels interpreted")
    return adapter


@needs_data
@pytest.mark.parametrize(("name", "function", "bug", "case", "where"), [
    ("unsloth.grouped_gemm_dX", "_grouped_gemm_dX_kernel", "dy_not_gathered", "moe-unsloth-dx-bf16-top2-repeat", SLOT),
    ("unsloth.grouped_gemm_dX", "_grouped_gemm_dX_kernel", "dx_not_scattered", "moe-unsloth-dx-f32-top4-exact", SLOT),
    ("unsloth.grouped_gemm_dW", "_grouped_gemm_dW_per_expert_kernel", "dy_read_in_expert_order",
     "moe-unsloth-dw-f16-top2-empty-experts", EXPERT),
    ("unsloth.grouped_gemm_dW_accumulate", "_grouped_gemm_dW_per_expert_kernel", "existing_overwritten",
     "moe-unsloth-dw-accumulate-bf16-top2", EXPERT),
], ids=["dX-dy_not_gathered", "dX-dx_not_scattered", "dW-dy_read_in_expert_order",
        "dW_accumulate-existing_overwritten"])
def test_unsloths_backward_kernels_pass_the_gradient_goldens_and_fail_them_with_one_line_broken(
        name, function, bug, case, where, tmp_path, monkeypatch):
    adapter = _unsloth_wheel()
    from tests.gmm_kernels.test_unsloth_backward import _edited

    ok = check_goldens(name, DATA)
    assert ok and all(r.status is Status.PASSED for r in ok), [r.line() for r in ok]
    monkeypatch.setenv(adapter.WHEEL.env, str(_edited(tmp_path, function, _edits(bug), bug)))
    bad = {r.check: r for r in check_goldens(name, DATA)}
    assert bad[case].status is Status.FAILED and re.search(where, bad[case].detail), bad[case].detail


def _edits(bug):
    from tests.gmm_kernels.test_unsloth_backward import ACCUMULATE_EDITS, DW_EDITS, DX_EDITS

    return ACCUMULATE_EDITS[bug] if bug in ACCUMULATE_EDITS else [{**DX_EDITS, **DW_EDITS}[bug]]
