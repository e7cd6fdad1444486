"""vLLM's fused MoE kernel (the built-in routed adapter ``vllm.fused_moe``), read from vLLM's wheel, checked as a
routed MoE kernel (docs/routed.md, "Checking a fused-MoE kernel").

The convention's checks need no wheel; the kernel's need vLLM 0.33.0's wheel (``scripts/setup.sh`` downloads it)
and run it in Triton's interpreter. Each broken twin is one real bug class: the wheel's own kernel with one line
changed (a stand-in wheel holding the edited source), or, where the bug lives in what builds the kernel's
arguments (the alignment, the expert map), the wheel's kernel called on metadata built that wrong way. Each must
fail naming the token, the slot and the expert of a wrong element.
"""

from __future__ import annotations

import dataclasses
import json
import re
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gmm_ref
from gmm_kernels import Status
from gmm_ref import conventions
from gmm_ref.conventions.vllm import FUSED_MOE, FUSED_MOE_CONFIG, _FusedMoE
from gmm_ref.routed.metadata import moe_align_block_size
from property_tests import strategies as gst
from property_tests.checks.declared import routing_options
from tests.corpus.wheel_twins import SLOT, edited_wheel, rejected

CONV = conventions.get("vllm.fused_moe")


# ------------------------------------------------------------------------------- the convention (no wheel)
ROUTINGS = gst.routings(expert_layouts="enk", dtypes=[("bfloat16", "bfloat16"), ("float32", "float32")],
                        block_size=16, max_tokens=24, foreign="zero")


@settings(max_examples=60, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(ROUTINGS)
def test_arguments_parse_back_to_the_same_slots(routing):
    args, kwargs = CONV.arguments(routing)
    c = args[2]
    assert c.shape == (routing.num_tokens, routing.top_k, routing.n) and np.isnan(c.astype(np.float32)).all()
    again = CONV.parse(*args, **kwargs)
    want, got = gmm_ref.routed_reference(routing), gmm_ref.routed_reference(again)
    assert np.array_equal(want.slots_exact, got.slots_exact)
    assert np.array_equal(want.local, got.local)


def test_the_routed_convention_is_looked_up_but_not_listed_with_the_grouped_ones():
    assert CONV is FUSED_MOE and "vllm.fused_moe" in conventions.routed_names()
    assert "vllm.fused_moe" not in conventions.names()
    with pytest.raises(ValueError, match=r"vllm\.fused_moe"):
        conventions.get("vllm.fused_mo")  # a typo: the known names, the routed ones too


def _args(t=3, top_k=2, e=4):
    ids = np.array([[0, 1], [1, 2], [3, 0]])[:t, :top_k]
    routing = gmm_ref.Routing(np.ones((t, 16), np.float32), np.ones((e, 8, 16), np.float32), ids.astype(np.int32),
                              np.ones((t, top_k), np.float32))
    return list(CONV.arguments(routing)[0]), CONV.arguments(routing)[1]


@pytest.mark.parametrize(("change", "words"), [
    (lambda a, k: a.__setitem__(2, a[2][:, :1]), "C: expected the output buffer of shape"),
    (lambda a, k: a.__setitem__(4, a[4][1:]), "lies in no block"),
    (lambda a, k: a.__setitem__(5, a[5] + 9), "expert_ids"),
    (lambda a, k: a.__setitem__(6, a[6] + 1), "num_tokens_post_padded"),
    (lambda a, k: a.__setitem__(8, 0), "top_k"),
    (lambda a, k: a.__setitem__(7, "yes"), "mul_routed_weight"),
    (lambda a, k: k.__setitem__("config", {"BLOCK_SIZE_N": 32}), "config"),
    (lambda a, k: k.__setitem__("compute_type", "float16"), "compute_type"),
])
def test_bad_arguments_are_refused_naming_them(change, words):
    args, kwargs = _args()
    change(args, kwargs)
    with pytest.raises((ValueError, TypeError), match=words):
        CONV.parse(*args, **kwargs)


def test_a_slot_in_two_blocks_is_refused():
    args, kwargs = _args()
    ids = args[4].copy()
    ids[1] = ids[0]
    args[4] = ids
    with pytest.raises(ValueError, match="lies in two blocks"):
        CONV.parse(*args, **kwargs)


def test_the_routed_report_names_token_slot_and_expert():
    ids = np.array([[0, 1], [1, 2]], np.int32)
    r = gmm_ref.Routing(np.ones((2, 4), np.float32), np.ones((3, 2, 4), np.float32), ids)
    ref = gmm_ref.routed_reference(r)
    out = ref.slots.astype(np.float32).copy()
    out[1, 0, 1] += 1
    with pytest.raises(gmm_ref.Mismatch, match=r"^token 1, slot 0 \(expert 1, local 1\), column 1: got 5.0"):
        gmm_ref.assert_routed_matches(out, ref, kernel="k")
    with pytest.raises(gmm_ref.Mismatch, match=r"shape/dtype: k returned float32 \(2, 2\)"):
        gmm_ref.assert_routed_matches(out[:, 0], ref, kernel="k")


# ------------------------------------------------------------------------------- the kernel (the wheel)
pytest.importorskip("torch", reason="vLLM's kernel takes torch tensors (gmm-harness[torch])")
pytest.importorskip("triton", reason="Triton is not installed (gmm-harness[triton]; the newest-JAX leg has none)")

from gmm_kernels import get  # noqa: E402
from gmm_kernels.adapters import vllm as adapter  # noqa: E402
from gmm_kernels.runtimes import triton_interpreter  # noqa: E402
from property_tests.checks.check import check_kernel, check_mode  # noqa: E402

WHEEL = adapter.find_wheel()
needs_wheel = pytest.mark.skipif(WHEEL is None, reason=f"no vLLM {adapter.WHEEL_VERSION} wheel here; get it with: "
                                                      f"{adapter.DOWNLOAD}")
interpreted = pytest.mark.skipif(not triton_interpreter.use_if_no_gpu(),
                                 reason="torch sees a GPU here (or TRITON_INTERPRET is off): these tests run vLLM's "
                                        "kernel on CPU tensors in Triton's interpreter")


def test_a_wheel_without_the_kernel_is_named(tmp_path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(adapter.FUSED_MOE_MEMBER, "import triton\n\n@triton.jit\ndef fused_moe_kernel(x):\n    pass\n")
    with pytest.raises(adapter.WheelLayoutError,
                       match="has no top-level function write_zeros_to_output, invoke_fused_moe_triton_kernel"):
        adapter.load_fused_moe(str(wheel))


@needs_wheel
@interpreted
def test_the_wheels_kernel_passes_every_routed_mode_and_the_others_say_why_not(monkeypatch):
    monkeypatch.setenv(adapter.WHEEL_ENV, WHEEL)
    # a dozen routings a mode, as the sglang twin of this test: the main job's vllm.fused_moe row runs the
    # wheel's kernel in every mode too
    report = check_kernel("vllm.fused_moe", max_examples=12)
    status = {r.check: r.status for r in report}
    assert {m for m, s in status.items() if s is Status.PASSED} == {"exact", "normal", "wide", "poisoned", "graph",
                                                                     "scale"}
    assert all(r.detail.startswith("routed: ") for r in report if r.status is Status.UNSUPPORTED)
    # the drawn modes' examples; the scale mode's two cells interpreted (test_scale_routed)
    assert all(r.examples >= 10 or r.cells == (3, 8) for r in report if r.status is Status.PASSED)


def test_the_row_reaches_past_256_experts_top_k_8_and_the_tile_edges():
    limits = get("vllm.fused_moe").routed_limits()
    assert limits.num_experts is None and limits.max_top_k is None and limits.max_tokens is None
    assert (40, 40) in limits.extents  # K and N past one 32-wide tile of FUSED_MOE_CONFIG
    assert FUSED_MOE_CONFIG["BLOCK_SIZE_K"] < 40 and FUSED_MOE_CONFIG["BLOCK_SIZE_N"] < 40


# the wheel's kernel, one line of fused_moe_kernel edited (each old text occurs once in the kernel's body)
WHEEL_EDITS = {
    # the padding sentinel T*top_k not skipped: wrapped into C's rows, token 0's slot 0 is read and overwritten
    "sentinel_not_skipped": ("offs_token = offs_token.to(tl.int64)",
                             "offs_token = (offs_token % num_valid_tokens).to(tl.int64)"),
    "weight_twice": ("accumulator *= moe_weight[:, None]", "accumulator *= moe_weight[:, None] * moe_weight[:, None]"),
    "weight_never": ("if MUL_ROUTED_WEIGHT:", "if MUL_ROUTED_WEIGHT and False:"),
    # each block computed with the expert of the block before it
    "expert_ids_shifted": ("off_experts = tl.load(expert_ids_ptr + pid_m).to(tl.int64)",
                           "off_experts = tl.load(expert_ids_ptr + tl.maximum(pid_m - 1, 0)).to(tl.int64)"),
    # slot j of a token stored in its slot top_k - 1 - j
    "slots_swapped": ("    c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]",
                      "    c_ptrs = c_ptr + stride_cm * (offs_token - 2 * (offs_token % top_k) + top_k - 1)[:, None] "
                      "+ stride_cn * offs_cn[None, :]"),
}


@needs_wheel
@interpreted
@pytest.mark.parametrize("bug", sorted(WHEEL_EDITS))
def test_the_wheels_kernel_with_one_line_broken_is_rejected_naming_token_slot_and_expert(bug, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setenv(adapter.WHEEL_ENV, edited_wheel(WHEEL, adapter.FUSED_MOE_MEMBER, "fused_moe_kernel",
                                                       *WHEEL_EDITS[bug], tmp_path / f"vllm-{bug}.whl"))
    text = rejected("vllm.fused_moe")
    assert re.match(SLOT, text), text


#: the flat index ``token * top_k + slot`` left int32 (the cast of the loaded ``sorted_token_ids`` removed): times
#: ``stride_cm`` it wraps past 2**31 - 1, which only the scale mode's offsets cell reaches (scale_offsets)
INT32_EDIT = ("offs_token = offs_token.to(tl.int64)", "offs_token = offs_token")


@needs_wheel
@interpreted
def test_the_wheels_kernel_with_an_int32_flat_index_fails_the_offsets_cell_naming_token_slot_and_expert(
        tmp_path, monkeypatch):
    monkeypatch.setenv(adapter.WHEEL_ENV, edited_wheel(WHEEL, adapter.FUSED_MOE_MEMBER, "fused_moe_kernel",
                                                       *INT32_EDIT, tmp_path / "vllm-int32.whl"))
    twin = get("vllm.fused_moe")
    result = check_mode(twin, "scale")
    assert result.status is Status.FAILED, result
    # flat slot 32 (token 8, slot 0) is the first at an offset past 2**31 - 1 (32 * 2**26): the interpreter's
    # checked stores see it land 2**31 elements before C
    text = str(result.error)
    assert re.match(r"kernel vllm.fused_moe wrote out of bounds: .* before the start of c_ptr .*wrapped in int32",
                    text), text
    notes = "\n".join(result.error.__notes__)
    assert "RoutedCell('offsets', 8)" in notes and "an offset computed in int32 wraps there" in notes, notes
    # the drawn routings (at most 40 tokens) never reach it
    assert check_kernel(twin, modes=["normal"], profile="gmm-ci", raise_on_failure=False).ok


class _MetadataBug(_FusedMoE):
    """The fused MoE convention whose arguments carry metadata built wrong (``bug``)."""

    def __init__(self, bug: str) -> None:
        super().__init__(**{f.name: getattr(FUSED_MOE, f.name) for f in dataclasses.fields(FUSED_MOE)})
        object.__setattr__(self, "bug", bug)

    def _arguments(self, r):
        args, kwargs = super()._arguments(r)
        sorted_ids, blocks = args[4].copy(), args[5].copy()
        bm, numel = FUSED_MOE_CONFIG["BLOCK_SIZE_M"], r.topk_ids.size
        if self.bug == "drops_past_256":  # the alignment's scan covers the first 256 (global) experts only
            _, global_ids, post = moe_align_block_size(r.topk_ids, bm, r.num_experts)
            for b in np.flatnonzero(global_ids[:post[0] // bm] >= 256):
                sorted_ids[b * bm:(b + 1) * bm] = numel
        elif self.bug == "computes_foreign" and r.num_local_experts:  # -1 (another rank's) read as local expert 0
            blocks[blocks == -1] = 0
        return (*args[:4], sorted_ids, blocks, *args[6:]), kwargs


class _BrokenMetadataKernel(adapter.VllmFusedMoE):
    name = "vllm.fused_moe[broken metadata]"

    def __init__(self, bug: str) -> None:
        self._conv = _MetadataBug(bug)

    @property
    def convention_facts(self):
        return self._conv


@needs_wheel
@interpreted
@pytest.mark.parametrize(("bug", "named"), [
    # (a slot of another rank's expert past 256 is caught too: vLLM writes it as zeros, this one never writes it)
    ("drops_past_256", r"token \d+, slot \d+ \(expert (25[6-9]|2[6-9]\d|[3-9]\d\d), local -?\d+"),
    ("computes_foreign", r"token \d+, slot \d+ \(expert \d+, local -1, on another rank\)"),
])
def test_the_wheels_kernel_on_wrong_metadata_is_rejected_naming_token_slot_and_expert(bug, named, monkeypatch):
    monkeypatch.setenv(adapter.WHEEL_ENV, WHEEL)
    text = rejected(_BrokenMetadataKernel(bug))
    assert re.match(named, text), text


@needs_wheel
@interpreted
def test_the_routed_row_of_the_main_job():
    from property_tests.cli.cells import run_cell
    from property_tests.cli.request import WorkRequest
    from property_tests.cli.table import TableCell, cells_of

    kernel = get("vllm.fused_moe")
    cells = cells_of(kernel, goldens=False, modes=["normal", "grad"])
    assert [(c.family, c.column) for c in cells] == [("routed", "normal"), ("routed", "grad")]
    normal = run_cell(kernel, TableCell(kernel.name, "routed", "normal"), WorkRequest(max_examples=5))
    grad = run_cell(kernel, TableCell(kernel.name, "routed", "grad"), WorkRequest(max_examples=5))
    assert normal.status is Status.PASSED and normal.examples == 5
    assert grad.status is Status.UNSUPPORTED and "a routed backward is a kernel of its own" in grad.note


def test_every_routed_kernel_is_in_the_default_run():
    from gmm_kernels.registry import registry, routed

    everything = [a.name for a in registry()]
    assert [a.name for a in routed()] and all(a.name in everything for a in routed())
    assert all(a.routed for a in routed()) and len(everything) == len(set(everything))
    # a grouped problem is refused with a reason, not an AttributeError (the default run offers it every kernel)
    p = gmm_ref.Problem("ragged_m", np.ones((2, 4), np.float32), np.ones((1, 4, 4), np.float32), np.array([2]))
    assert "takes a gmm_ref.Routing, not a Problem" in get("vllm.fused_moe").supports(p)


@needs_wheel
@interpreted
def test_the_default_run_checks_an_interpreted_routed_kernel_on_few_examples(monkeypatch, tmp_path, capsys):
    import json

    from gmm_kernels import resolve
    from golden.cases import CASES
    from property_tests.checks.tiers import ROUTED_INTERPRETED_EXAMPLES, examples_in_default_run
    from property_tests.cli import main

    kernel = get("vllm.fused_moe")
    assert kernel.interpreted() == "Triton's interpreter"
    assert examples_in_default_run(kernel, None) == ROUTED_INTERPRETED_EXAMPLES
    assert examples_in_default_run(kernel, 3) == 3 and examples_in_default_run(get("megablox.gmm"), None) is None
    monkeypatch.setenv(adapter.WHEEL_ENV, WHEEL)
    monkeypatch.setattr(resolve, "registry", lambda: [adapter.VllmFusedMoE()])  # the default run, this row alone
    out = tmp_path / "run.json"
    assert main.main(["check", "--in-process", "--modes", "normal,grad", "--json", str(out)]) == 0
    cells = {c["check"]: c for c in json.loads(out.read_text())["cells"]}
    assert cells["normal"]["family"] == "routed" and cells["normal"]["text"] == f"pass ({ROUTED_INTERPRETED_EXAMPLES})"
    assert cells["grad"]["text"].startswith("n/a: routed: not differentiated; a routed backward is a kernel")
    routed_cases = sum(c.convention == "vllm.fused_moe" for c in CASES)
    assert routed_cases >= 5 and cells["goldens"]["text"] == f"pass ({routed_cases}/{routed_cases})"
    assert "vllm.fused_moe" in capsys.readouterr().out


# ------------------------------------------------------------------- a user's fused MoE in this convention
def torch_fused_moe(A, B, C, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded, mul_routed_weight,
                    top_k, config=None, compute_type=None, bug=None, weight_after_rounding=False):
    """A fused MoE in torch taking exactly ``vllm.fused_moe``'s arguments (docs/routed.md's walkthrough): each
    block of ``BLOCK_SIZE_M`` slots computed with its expert in float32, written into ``C``. ``bug``: one real bug
    class, for the broken twins below."""
    import torch

    bm = config["BLOCK_SIZE_M"]
    numel = A.shape[0] * top_k
    out = C.view(numel, C.shape[-1])
    for b in range(int(num_tokens_post_padded[0]) // bm):
        rows = sorted_token_ids[b * bm:(b + 1) * bm].long()
        if bug != "reads_sentinel":
            rows = rows[rows < numel]
        else:  # the sentinel clamped to the last slot instead of skipped
            rows = torch.clamp(rows, max=numel - 1)
        e = int(expert_ids[b])
        if e < 0:
            out[rows] = 0
            continue
        acc = A[rows // top_k].float() @ B[e].float().T
        if weight_after_rounding and mul_routed_weight:  # unsloth's FUSE_MUL_POST: in C's dtype, rounded
            value = acc.to(C.dtype) * topk_weights.reshape(-1)[rows].to(C.dtype)[:, None]
        else:
            if mul_routed_weight or bug == "weight_without_flag":
                acc = acc * topk_weights.reshape(-1)[rows].float()[:, None]
            value = acc.to(C.dtype)
        if bug == "swaps_slots" and top_k > 1:
            rows = rows - rows % top_k + (rows % top_k + 1) % top_k
        out[rows] = value


def torch_fused_moe_weight_after_rounding(A, B, C, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
                                          mul_routed_weight, top_k, config=None, compute_type=None):
    """``torch_fused_moe`` whose weight multiplies the product rounded to C's dtype, in C's dtype (unsloth's
    ``FUSE_MUL_POST``): correct under ``RoutedNumerics(weight="output")``, two roundings where the default allows
    one."""
    torch_fused_moe(A, B, C, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded, mul_routed_weight,
                    top_k, config, weight_after_rounding=True)


def test_a_users_torch_fused_moe_passes_in_this_convention():
    pytest.importorskip("torch")
    report = check_kernel(torch_fused_moe, convention="vllm.fused_moe", modes=["exact", "normal", "poisoned"],
                          profile="gmm-ci")
    assert [r.status for r in report] == [Status.PASSED] * 3


@pytest.mark.parametrize("bug", ["reads_sentinel", "weight_without_flag", "swaps_slots"])
def test_a_users_broken_fused_moe_fails_naming_token_slot_and_expert(bug):
    pytest.importorskip("torch")

    def broken(*args, **kwargs):
        return torch_fused_moe(*args, **kwargs, bug=bug)

    with pytest.raises(gmm_ref.Mismatch, match=SLOT):
        check_kernel(broken, convention="vllm.fused_moe", modes=["normal"], profile="gmm-ci")


def test_a_routed_function_takes_its_products_numerics_and_a_scope_of_dtypes():
    from gmm_kernels import Scope, wrap

    product = gmm_ref.Numerics(accumulate="float32")
    assert wrap(torch_fused_moe, "vllm.fused_moe", numerics=product).numerics == gmm_ref.RoutedNumerics(product)
    with pytest.raises(TypeError, match=r"numerics: expected a gmm_ref\.RoutedNumerics \(or the product's Numerics\)"):
        wrap(torch_fused_moe, "vllm.fused_moe", numerics="accumulate=float32")
    bf16 = wrap(torch_fused_moe, "vllm.fused_moe", scope=Scope(dtypes=["bfloat16"]))
    assert bf16.dtype_refusal(np.float32, np.float32, np.float32) == (
        "the declared scope takes dtypes ('bfloat16',) / out_dtypes None, not float32 x float32 -> float32")
    assert bf16.dtype_refusal(*[gmm_ref.dtypes.as_dtype("bfloat16")] * 3) is None
    assert [tuple(map(str, p)) for p in routing_options(bf16)["dtypes"]] == [("bfloat16", "bfloat16")]
    for scope, words in ((Scope(families=["ragged_m"]), "families: the routed convention 'vllm.fused_moe' takes a "
                          "declared scope of dtypes, out_dtypes and known_issues only"),
                         (Scope(numerics=product), "numerics: .* \\(its numerics: a gmm_ref.RoutedNumerics"),
                         (Scope(dtypes=["float64"]), r"dtypes: \('float64',\) / out_dtypes: None leave none of "
                                                     "vllm.fused_moe's input/output dtypes")):
        with pytest.raises(ValueError, match=words):
            wrap(torch_fused_moe, "vllm.fused_moe", scope=scope)


def fused_moe_without_float32(A, B, *args, **kwargs):
    """A correct kernel that takes no float32 tokens (many Triton MoE kernels): it raises on them."""
    import torch

    if A.dtype == torch.float32:
        raise NotImplementedError("float32 tokens: not supported")
    return torch_fused_moe(A, B, *args, **kwargs)


def test_the_cli_declares_the_dtypes_a_routed_function_takes(capsys):
    """Without ``--dtypes`` its float32 routings and goldens fail (as they must: the kernel says nothing); with it
    they are out of scope, named, and the kernel passes."""
    pytest.importorskip("torch")
    from property_tests.cli.main import main

    argv = ["check", "--in-process", "--kernel", f"{__name__}:fused_moe_without_float32", "--convention",
            "vllm.fused_moe", "--modes", "normal"]
    assert main(argv) == 1
    assert "NotImplementedError: float32 tokens: not supported" in capsys.readouterr().out
    assert main([*argv, "--dtypes", "bfloat16,float16"]) == 0
    out = capsys.readouterr().out
    assert "declared scope: dtypes bfloat16,float16" in out and "pass (50)" in out, out
    assert "out of scope: 2 x the declared scope takes dtypes ('bfloat16', 'float16') / out_dtypes None, not " \
           "float32 x float32 -> float32" in out, out


def test_the_cli_declares_a_routed_functions_numerics(capsys, tmp_path):
    """A correct kernel of other numerics (the weight multiplied into the rounded product) fails the default, which
    allows one rounding, naming the slot; ``--numerics weight=output,...`` declares them and it passes."""
    pytest.importorskip("torch")
    from property_tests.cli.main import main

    argv = ["check", "--in-process", "--kernel", f"{__name__}:torch_fused_moe_weight_after_rounding", "--convention",
            "vllm.fused_moe", "--modes", "normal", "--no-goldens"]
    assert main(argv) == 1
    assert re.search(SLOT, capsys.readouterr().out)
    assert main([*argv, "--numerics", "weight=output,combine=float32", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    kernel, = json.loads((tmp_path / "r.json").read_text())["kernels"]
    assert kernel["numerics"] == {"product": None, "weight": "output", "combine": "float32"}, kernel
    assert "declared numerics: product the default for the dtypes; weight output; combine float32" in out, out
    assert "pass (50)" in out, out

    def broken(*args, **kwargs):  # the declared numerics' bound still holds a slot's bug
        return torch_fused_moe(*args, **kwargs, bug="swaps_slots", weight_after_rounding=True)

    with pytest.raises(gmm_ref.Mismatch, match=SLOT):
        check_kernel(broken, convention="vllm.fused_moe", modes=["normal"], profile="gmm-ci",
                     numerics=gmm_ref.RoutedNumerics(weight="output", combine="float32"))


def test_the_cli_takes_a_users_kernel_in_the_routed_convention(capsys):
    pytest.importorskip("torch")
    from property_tests.cli.main import main

    code = main(["check", "--in-process", "--kernel", f"{__name__}:torch_fused_moe", "--convention",
                 "vllm.fused_moe", "--modes", "normal,grad", "--max-examples", "5", "--no-goldens"])
    out = capsys.readouterr().out
    assert code == 0, out
    # five examples: one routing in each of the design's first five cells
    assert "| routed |" in out and "pass (5; 5/23 cells)" in out and "not differentiated" in out


def test_coverage_reaches_every_pair_of_a_routed_conventions_design(capsys):
    from property_tests.cli.main import main

    code = main(["coverage", "--convention", "vllm.fused_moe", "--modes", "exact,graph", "-v"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("130/130") == 2 and "260 pairs of relations reached" in out
    assert "routed: load=many_blocks & slots=below: no signature and token count drawn shows both" in out


@pytest.mark.parametrize(("argv", "words"), [
    (["--dtypes", "bfloat16"], "--dtypes: vllm.fused_moe is a routed MoE kernel whose adapter says what it takes "
                               "and its numerics; a declared scope or numerics is a routed function's"),
    (["--tiling", "16,32,32"], "--tiling: vllm.fused_moe is a routed MoE kernel: its launch config is its "
                               "convention's"),
    (["--numerics", "weight=float32"], "--numerics: vllm.fused_moe is a routed MoE kernel whose adapter says what "
                                       "it takes and its numerics"),
    (["--numerics", "weight=output"], "--numerics: combine: 'accumulator' sums the weighted products in the "
                                      "accumulator, but weight='output' rounds them"),
    (["--numerics", "combine"], "--numerics: expected combine=accumulator|DTYPE, got 'combine'"),
])
def test_the_cli_refuses_a_scope_or_tiling_for_a_routed_kernel(argv, words, capsys):
    from property_tests.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["check", "--kernel", "vllm.fused_moe", "--modes", "normal", *argv])
    assert info.value.code == 2 and words in capsys.readouterr().err
