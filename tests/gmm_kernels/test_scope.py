"""A kernel declares its scope and the harness checks exactly that, all of it.

The kernels here support part of ``ragged_dot`` only (float32, K a multiple of
32, every row in a group); without a declaration they fail on inputs they
never claimed, with one they pass, and a bug inside the declared scope is
still caught.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings

import gmm_kernels
import gmm_ref
from gmm_kernels import KnownIssue, Scope, Status, configure, declare, get, resolve_kernel
from gmm_ref.conventions.base import has_tail
from property_tests import strategies as gst
from property_tests.checks.check import check_kernel
from property_tests.cli.options import apply_scope, parse_multiples, parse_numerics, scope_fields
from tests.corpus.broken_kernels import _ends, _mm32

MODES = ["exact", "normal", "poisoned", "all_empty", "many_groups"]


def narrow_kernel(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Correct for float32, K % 32 == 0 and no rows past the last group; refuses anything else."""
    lhs, rhs = np.asarray(lhs), np.asarray(rhs)
    gs, starts, ends = _ends(group_sizes)
    if lhs.dtype != np.float32 or lhs.shape[1] % 32 or ends[-1] != lhs.shape[0]:
        raise NotImplementedError(f"narrow_kernel: float32, K % 32 == 0, no tail only; got {lhs.dtype} {lhs.shape}")
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
    for g in range(gs.size):
        out[starts[g]:ends[g]] = _mm32(lhs[starts[g]:ends[g]], rhs[g])
    return out


def narrow_kernel_last_group_dropped(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """The same scope, but the last non-empty group's rows are left zero (a loop bound off by one)."""
    out = narrow_kernel(lhs, rhs, group_sizes, precision, preferred_element_type).copy()
    gs, starts, ends = _ends(group_sizes)
    last = np.flatnonzero(gs)
    if last.size > 1:
        out[starts[last[-1]]:ends[last[-1]]] = 0
    return out


SCOPE = dict(dtypes=["float32"], multiples={"k": 32}, tail=False)


def test_undeclared_narrow_kernel_fails_on_inputs_it_never_claimed():
    report = check_kernel(narrow_kernel, convention="ragged_dot", modes=MODES, raise_on_failure=False)
    assert report.failures, report
    assert any("narrow_kernel: float32" in r.detail for r in report.failures)


def test_declared_narrow_kernel_passes_everything_it_claims():
    report = check_kernel(narrow_kernel, convention="ragged_dot", modes=MODES, scope=Scope(**SCOPE))
    assert {m: r.status for m, r in report.by_check().items()} == dict.fromkeys(MODES, Status.PASSED), report
    assert all(r.examples > 0 for r in report)


def test_decorated_kernel_brings_its_convention_and_scope():
    fn = declare("ragged_dot", **SCOPE)(narrow_kernel)
    report = check_kernel(fn, modes=MODES)
    assert report.ok and report.count(Status.PASSED) == len(MODES), report
    adapter = resolve_kernel(fn)
    assert adapter.convention == "ragged_dot" and adapter.scope == Scope(**SCOPE)


def test_configure_sets_the_run_state_on_a_copy_and_checks_it():
    builtin = gmm_kernels.get("jax.ragged_dot")
    scoped = configure(builtin, scope=Scope(**SCOPE), tiling="8,16,32", version="1.2", origin="jax.ragged_dot")
    assert (scoped.scope, scoped.tiling, scoped.version, scoped.origin) == (
        Scope(**SCOPE), (8, 16, 32), "1.2", "jax.ragged_dot")
    assert (builtin.scope, builtin.tiling, builtin.version, builtin.origin) == (None, None, None, None)
    assert configure(builtin) is builtin
    numerics = parse_numerics("accumulate=float32")
    assert configure(scoped, numerics=numerics).scope == Scope(**SCOPE, numerics=numerics)
    with pytest.raises(ValueError, match=r"families: .* leaves none"):
        configure(builtin, scope=Scope(families=("masked",)))
    with pytest.raises(TypeError, match=r"scope: expected a gmm_kernels\.Scope"):
        configure(builtin, scope={"families": ("ragged_m",)})
    with pytest.raises(ValueError, match="--tiling"):
        configure(builtin, tiling="8,16")


def test_a_bug_inside_the_declared_scope_is_still_caught():
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(narrow_kernel_last_group_dropped, convention="ragged_dot", modes=["exact", "normal"],
                     scope=Scope(**SCOPE))
    assert "Wrong groups:" in str(info.value)


@settings(max_examples=60, deadline=None)
@given(gst.problems(convention="ragged_dot", dtypes=[("float32", "float32")], multiple_of={"k": 32},
                    allow_tail=False))
def test_strategies_draw_only_inside_the_scope(problem):
    assert problem.k % 32 == 0 and not has_tail(problem) and str(problem.lhs.dtype) == "float32"
    assert Scope(**SCOPE).refusal(problem) is None


@pytest.mark.parametrize(("scope", "message"), [
    (dict(families=["ragged_n"]), r"families: \('ragged_n',\) leaves none of ragged_dot's"),
    (dict(dtypes=["int8"], out_dtypes=["float32"]), "leave none of ragged_dot's input/output dtypes"),
])
def test_a_scope_that_leaves_nothing_is_a_usage_error(scope, message):
    with pytest.raises(ValueError, match=message):
        check_kernel(narrow_kernel, convention="ragged_dot", scope=Scope(**scope))


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(families=[]), ValueError, "families: expected at least one value"),
    (dict(families=["ragged_x"]), ValueError, r"families: expected some of \('ragged_m'"),
    (dict(dtypes=["float33"]), TypeError, "dtypes"),
    (dict(multiples={"q": 2}), ValueError, "multiples: expected"),
    (dict(multiples={"k": 0}), ValueError, "multiples: expected"),
    (dict(multiples={"k": True}), ValueError, "multiples: expected"),
    (dict(tail="no"), TypeError, "tail: expected a bool"),
    (dict(numerics="float32"), TypeError, "numerics: expected a gmm_ref.Numerics"),
    (dict(known_issues=["a bug"]), TypeError, "known_issues: expected KnownIssue"),
    (dict(layouts="plane"), ValueError, r"layouts: expected one or more of the layouts \('plain', 'rhsT', 'lhsT'"),
    (dict(layouts=[]), ValueError, "layouts: expected one or more of the layouts"),
    (dict(layouts="none"), ValueError, "layouts: expected one or more of the layouts"),
    (dict(alignment=12), ValueError, "alignment: expected a power of two of bytes"),
    (dict(alignment=0), ValueError, "alignment: expected a power of two of bytes"),
    (dict(alignment=True), ValueError, "alignment: expected a power of two of bytes"),
    (dict(alignment="lhs=16,out=16"), ValueError, "alignment: expected a power of two of bytes"),
    (dict(alignment={"lhs": "x"}), ValueError, "alignment: expected a power of two of bytes"),
])
def test_bad_scope_is_a_named_error(kwargs, error, message):
    with pytest.raises(error, match=message):
        Scope(**kwargs)


def test_known_issue_applies_only_on_the_versions_it_is_known_on():
    numpy_version = np.__version__
    assert KnownIssue(("poisoned",), "x", {"numpy": f"=={numpy_version}"}).applies()
    assert not KnownIssue(("poisoned",), "x", {"numpy": f"!={numpy_version}"}).applies()
    assert not KnownIssue(("poisoned",), "x", {"no-such-distribution-xyz": ">=0"}).applies()
    assert KnownIssue(("poisoned",), "x").applies()
    with pytest.raises(ValueError, match="versions"):
        KnownIssue(("poisoned",), "x", {"numpy": "not a specifier"})
    with pytest.raises(ValueError, match="modes: expected one or more mode names"):
        KnownIssue((), "x")
    with pytest.raises(ValueError, match=r"scope: known_issues name the modes \['no_such_mode'\]"):
        check_kernel(narrow_kernel, convention="ragged_dot",
                     scope=Scope(**SCOPE, known_issues=(KnownIssue("no_such_mode", "x"),)))


def test_a_declared_known_issue_turns_the_failure_into_a_known_bug():
    issue = KnownIssue(("exact",), "upstream bug: drops the last group")
    report = check_kernel(narrow_kernel_last_group_dropped, convention="ragged_dot", modes=["exact"],
                          scope=Scope(**SCOPE, known_issues=(issue,)), raise_on_failure=False)
    (result,) = report
    assert result.status is Status.KNOWN_BUG and "drops the last group" in result.detail
    stale = KnownIssue(("exact",), "fixed since", {"numpy": "<1"})
    report = check_kernel(narrow_kernel_last_group_dropped, convention="ragged_dot", modes=["exact"],
                          scope=Scope(**SCOPE, known_issues=(stale,)), raise_on_failure=False)
    assert report.failures, "a known issue outside its versions is not assumed"


def test_check_kernel_fails_a_declared_known_bug_it_no_longer_catches():
    # a correct kernel declaring an upstream bug in a mode it passes: the bug is fixed upstream or the harness stopped
    # catching it; either way a failure naming the bug, as in the main job's table and the plugin's strict xfail
    issue = KnownIssue(("exact",), "upstream bug: a made-up bug in a correct kernel")
    scope = Scope(**SCOPE, known_issues=(issue,))
    (result,) = check_kernel(narrow_kernel, convention="ragged_dot", modes=["exact"], scope=scope,
                             raise_on_failure=False)
    assert result.status is Status.FAILED, result
    assert "declared known upstream bug not caught" in result.detail and "a made-up bug" in result.detail
    with pytest.raises(gmm_ref.Mismatch, match="narrow the versions it is known on"):
        check_kernel(narrow_kernel, convention="ragged_dot", modes=["exact"], scope=scope)
    # where the examples are not the same every run, whether they meet the bug is luck: no verdict on it
    for other in (dict(seed=3), dict(max_examples=5), dict(tier="gmm-quick")):
        (result,) = check_kernel(narrow_kernel, convention="ragged_dot", modes=["exact"], scope=scope, **other)
        assert result.status is Status.PASSED, (other, result)


def test_parsers_name_their_option():
    assert parse_multiples(["k=32", "n=16", "k=48"]) == {"k": 96, "n": 16}
    for bad in ("k", "k=0", "q=2", "k=x"):
        with pytest.raises(ValueError, match="--multiple: expected AXIS=N"):
            parse_multiples([bad])
    assert parse_numerics("accumulate=float32,flush") == gmm_ref.Numerics(None, "float32", True)
    assert parse_numerics("multiply=bfloat16,accumulate=float32") == gmm_ref.Numerics("bfloat16", "float32", False)
    for bad in ("accumulate", "fast", "flush=maybe"):
        with pytest.raises(ValueError, match="--numerics: expected"):
            parse_numerics(bad)
    with pytest.raises(ValueError, match="--numerics"):
        parse_numerics("accumulate=float99")


def test_numerics_with_weight_or_combine_are_a_routed_kernels():
    from gmm_ref.routed.routing import parse_declared_numerics, parse_routed_numerics

    assert parse_declared_numerics("accumulate=float32,flush") == gmm_ref.Numerics(None, "float32", True)
    assert parse_declared_numerics("weight=bfloat16") == gmm_ref.RoutedNumerics(weight="bfloat16")
    assert parse_routed_numerics("accumulate=float32,weight=output,combine=float32") == gmm_ref.RoutedNumerics(
        gmm_ref.Numerics(None, "float32", False), weight="output", combine="float32")
    assert parse_routed_numerics("flush") == gmm_ref.RoutedNumerics(gmm_ref.Numerics(None, "float32", True))
    for bad, words in (("weight", "expected weight=accumulator|output|DTYPE, got 'weight'"),
                       ("weight=int8", "weight: expected 'accumulator', 'output' or a float dtype"),
                       ("combine=xx", "combine: "), ("weight=float32,fast", "expected accumulate=DTYPE")):
        with pytest.raises(ValueError, match=re.escape(f"--gmm-numerics: {words}")):
            parse_declared_numerics(bad, option="--gmm-numerics")
    kernel = get("jax.ragged_dot")
    fields = scope_fields({"numerics": "weight=output,combine=float32"}, prefix="--gmm-")
    with pytest.raises(ValueError, match=r"--gmm-numerics: weight= and combine= are a routed MoE kernel's; "
                                         r"jax\.ragged_dot is a grouped GEMM \(ragged_dot\)"):
        apply_scope(kernel, fields, prefix="--gmm-")
    with pytest.raises(ValueError, match=r"numerics: weight= and combine= are a routed MoE kernel's"):
        configure(kernel, numerics=fields["numerics"])


def test_a_routed_function_takes_declared_dtypes_and_numerics_only():
    pytest.importorskip("torch")
    from tests.gmm_kernels.test_vllm_fused_moe import torch_fused_moe

    kernel = resolve_kernel(torch_fused_moe, convention="vllm.fused_moe")
    declared = apply_scope(kernel, scope_fields({"numerics": "weight=output,combine=float32"}, prefix="--gmm-"),
                           prefix="--gmm-")
    assert declared.numerics == gmm_ref.RoutedNumerics(weight="output", combine="float32") and kernel.numerics is None
    assert configure(kernel, numerics=gmm_ref.Numerics(None, "float32", False)).numerics == gmm_ref.RoutedNumerics(
        gmm_ref.Numerics(None, "float32", False))
    both = apply_scope(kernel, scope_fields({"dtypes": "bfloat16", "out-dtypes": "bfloat16", "numerics": "flush"},
                                            prefix="--gmm-"), prefix="--gmm-")
    assert both.scope == Scope(dtypes=("bfloat16",), out_dtypes=("bfloat16",)), both.scope
    assert both.numerics == gmm_ref.RoutedNumerics(gmm_ref.Numerics(None, "float32", True))
    for values, option in (({"families": "ragged_m", "numerics": "flush"}, "families"),
                           ({"no-tail": True}, "no-tail"), ({"multiple": ["k=32"]}, "multiple")):
        with pytest.raises(ValueError, match=rf"--gmm-{option}: .* is a routed MoE kernel: it takes only --gmm-dtypes, "
                                             "--gmm-out-dtypes and --gmm-numerics"):
            apply_scope(kernel, scope_fields(values, prefix="--gmm-"), prefix="--gmm-")
    with pytest.raises(ValueError, match=r"--gmm-dtypes: \('float64',\) / out_dtypes: None leave none"):
        apply_scope(kernel, scope_fields({"dtypes": "float64"}, prefix="--gmm-"), prefix="--gmm-")


def test_scope_round_trips_through_json():
    scope = Scope(families=["ragged_m"], dtypes=["bfloat16"], multiples={"k": 32}, tail=False,
                  numerics=gmm_ref.Numerics(None, "float32", True))
    assert Scope.from_json(scope.to_json()) == scope


def test_a_built_in_routed_kernel_refuses_a_declared_scope_with_one_message_on_every_path():
    # configure (check_kernel, wrap) and the options of the CLI and the plugin ask one function, so the user reads
    # the same reason whichever front-end they used, led by what they gave
    from property_tests.cli.options import apply_scope

    kernel = get("vllm.fused_moe")
    with pytest.raises(ValueError, match=r"^scope: ") as by_configure:
        configure(kernel, scope=Scope(dtypes=["bfloat16"]))
    with pytest.raises(ValueError, match=r"^--gmm-dtypes: ") as by_option:
        apply_scope(kernel, {"dtypes": ("bfloat16",)}, prefix="--gmm-")
    given, why = str(by_configure.value).split(": ", 1)
    assert given == "scope" and str(by_option.value) == f"--gmm-dtypes: {why}"
    assert "vllm.fused_moe is a routed MoE kernel whose adapter says what it takes" in why


def test_zero_extents_are_spelled_alike_everywhere():
    """``none`` (the command line's word), an empty list and ``"m,k"`` mean in ``declare`` what they mean there."""
    from property_tests.cli.options import scope_fields

    assert Scope(zero_extents="none").zero_extents == Scope(zero_extents=[]).zero_extents == ()
    assert Scope(zero_extents="k,m").zero_extents == Scope(zero_extents=["m", "k"]).zero_extents == ("m", "k")
    assert scope_fields({"zero-extents": "none"})["zero_extents"] == Scope(zero_extents="none").zero_extents
    with pytest.raises(ValueError, match="zero_extents: expected some of the axes"):
        Scope(zero_extents="q")


# ------------------------------------------------------------------ layouts and alignment
def test_layouts_and_alignment_are_spelled_alike_everywhere():
    """A tuple, a list and ``"a,b"`` mean in ``declare`` what they mean on the command line; one int (or ``"16"``) is
    every operand's alignment, ``"none"`` and ``{}`` none."""
    assert Scope(layouts="rhsT,plain").layouts == Scope(layouts=["plain", "rhsT"]).layouts == ("plain", "rhsT")
    assert Scope().layouts is None and Scope(layouts="lhsT+rhsT").layouts == ("lhsT+rhsT",)
    both = {"lhs": 16, "rhs": 16}
    assert Scope(alignment=16).alignment == Scope(alignment="16").alignment == both
    assert Scope(alignment="lhs=16,rhs=16").alignment == Scope(alignment=both).alignment == both
    assert Scope(alignment="rhs=32").alignment == {"rhs": 32}
    assert Scope(alignment="none").alignment == Scope(alignment={}).alignment == Scope(alignment=1).alignment == {}
    assert scope_fields({"layouts": "plain,lhsT", "alignment": "lhs=16"}) == {"layouts": ("plain", "lhsT"),
                                                                              "alignment": {"lhs": 16}}
    assert scope_fields({"alignment": "32"}, prefix="--gmm-") == {"alignment": {"lhs": 32, "rhs": 32}}
    with pytest.raises(ValueError, match=r"^--gmm-layouts: expected one or more of the layouts \('plain'"):
        scope_fields({"layouts": "plain,rhst"}, prefix="--gmm-")
    with pytest.raises(ValueError, match=r"^--alignment: expected a power of two of bytes"):
        scope_fields({"alignment": "lhs=24"})
    scope = Scope(layouts=("plain", "rhsT"), alignment={"lhs": 16, "rhs": 32})
    assert Scope.from_json(json.loads(json.dumps(scope.to_json()))) == scope
    assert "layouts plain,rhsT; alignment lhs=16,rhs=32" in scope.describe()


def test_a_declared_layout_leaves_the_families_it_has_and_must_leave_one():
    def te_kernel(*args, **kwargs):  # never called: only its declaration is read
        raise NotImplementedError

    adapter = resolve_kernel(te_kernel, convention="te.grouped_gemm", scope=Scope(layouts=("plain",)))
    assert adapter.families == ("ragged_m",), adapter.families  # te's ragged_k layouts are all packed
    assert adapter.limits().layouts == ("plain",)
    with pytest.raises(ValueError, match=r"^layouts: \('packed',\) leaves none of ragged_dot's layouts \('plain',\)"):
        configure(get("jax.ragged_dot"), scope=Scope(layouts=("packed",)))
    with pytest.raises(ValueError, match=r"^--layouts: \('rhsT',\) leaves none of ragged_dot's layouts"):
        apply_scope(get("jax.ragged_dot"), scope_fields({"layouts": "rhsT"}))


def _problem(convention, lhs_shape, rhs_shape, sizes, **kwargs):
    rng = np.random.default_rng(0)
    return gmm_ref.Problem("ragged_m", rng.standard_normal(lhs_shape).astype(np.float32),
                           rng.standard_normal(rhs_shape).astype(np.float32), sizes, convention=convention, **kwargs)


def test_a_declared_layout_or_alignment_refuses_the_problems_outside_it():
    transposed = _problem("ragged_dot_general", (4, 8), (2, 3, 8), [2, 2], rhs_transposed=True)
    assert Scope(layouts=("plain", "lhsT")).refusal(transposed) == \
        "the declared scope takes the layouts plain, lhsT, not rhsT"
    assert Scope(layouts="rhsT").refusal(transposed) is None
    # a chunk of a split starts one row in: 4 float32 = 16 bytes
    chunk = _problem("torch.grouped_mm", (4, 4), (2, 4, 8), [2, 2], storage=("chunk", "contiguous"))
    why = Scope(alignment={"lhs": 32}).refusal(chunk)
    assert why == ("the declared scope takes lhs aligned to 32 bytes (its offset and every stride but its unit one), "
                   "not lhs [4, 4]:float32 stored chunk, with a byte offset of 16"), why
    assert Scope(alignment=16).refusal(chunk) is None and Scope(alignment={"rhs": 32}).refusal(chunk) is None
    # odd K: rows of 12 bytes
    odd = _problem("ragged_dot", (4, 3), (2, 3, 8), [2, 2])
    assert "lhs [4, 3]:float32 stored contiguous, with a stride of 12 bytes (axis 0)" in \
        Scope(alignment={"lhs": 16}).refusal(odd)
    assert Scope(alignment={"rhs": 16}).refusal(odd) is None  # rhs rows: 8 float32


def test_the_geometry_a_scope_judges_is_the_one_a_kernel_gets():
    """A stored operand's offset and strides, as ``gmm_ref.layouts.stored_geometry`` says, are those of the guarded
    copy the harness hands a kernel (a view contiguous after all copied by itself)."""
    from gmm_kernels.sandbox import guards
    from gmm_ref.layouts import stored, stored_geometry

    for shape in ((3, 5), (1, 7), (4, 1), (2, 3, 5), (2, 1, 5), (2, 5, 1), (1, 3, 5), (1, 1)):
        for dtype in (np.float32, np.int8, np.float64):
            for kind in gmm_ref.problem.STORAGES:
                with guards.call("k") as call:
                    copy = call.copy("x", stored(np.zeros(shape, dtype), kind))
                (guard,) = call.guards
                where = copy.__array_interface__["data"][0] - guard.base.__array_interface__["data"][0]
                assert (where - guard.lo * copy.itemsize, copy.strides) == stored_geometry(
                    shape, copy.itemsize, kind), (shape, dtype, kind)


@settings(max_examples=60, deadline=None)
@given(gst.problems(convention="ragged_dot_general", layouts=("plain", "lhsT"),
                    operand_alignment={"lhs": 16, "rhs": 32}))
def test_problems_draw_only_the_declared_layouts_and_alignment(problem):
    assert not problem.rhs_transposed
    assert Scope(layouts=("plain", "lhsT"), alignment={"lhs": 16, "rhs": 32}).refusal(problem) is None


@settings(max_examples=60, deadline=None)
@given(gst.problems(convention="torch.grouped_mm", operand_alignment=32))
def test_problems_draw_no_storage_that_breaks_the_alignment(problem):
    # a slice's rows are 16 bytes wider than its own: never 32-byte aligned with them (but where it has no element)
    assert "slice" not in problem.storage or 0 in (problem.m, problem.k, problem.n), problem.describe()
    assert Scope(alignment=32).refusal(problem) is None


def test_the_covering_design_has_only_the_declared_layouts_and_its_cells_are_within_the_scope():
    from property_tests.strategies.problems import covering

    scope = Scope(layouts=("rhsT", "lhsT+rhsT"), alignment={"lhs": 16})
    cov = covering(convention="ragged_dot_general", families=["ragged_m", "ragged_k"], layouts=scope.layouts,
                       operand_alignment=dict(scope.alignment))
    for design in cov.designs.values():
        assert [f.levels for f in design.factors if f.name == "layout"] == [("rhsT", "lhsT+rhsT")]
    for cell in cov.cells:
        @settings(max_examples=2, deadline=None, database=None)
        @given(cell.strategy)
        def within(problem):
            assert scope.refusal(problem) is None, problem.describe()

        within()


def test_a_kernel_refusing_a_transposed_rhs_fails_undeclared_and_passes_declared():
    pytest.importorskip("jax")
    from tests.corpus import declared_layouts as dl

    (failed,) = check_kernel(dl.ragged_dot_general_no_transposed_rhs, convention="ragged_dot_general",
                             modes=["exact"], raise_on_failure=False)
    assert failed.status is Status.FAILED and "rhs must be stored [..., K, N]" in failed.detail, failed.detail
    report = check_kernel(dl.ragged_dot_general_layouts_declared, modes=["exact", "normal"])
    assert report.ok and all(r.examples > 0 for r in report), [r.line() for r in report]
    scoped = check_kernel(dl.ragged_dot_general_no_transposed_rhs, convention="ragged_dot_general", modes=["exact"],
                          scope=Scope(layouts=("plain", "lhsT")))
    assert scoped.ok, [r.line() for r in scoped]


@pytest.mark.parametrize(("framework", "broken", "convention", "words", "declared", "modes"), [
    ("jax", "ragged_dot_lhs_rows_of_16_bytes", "ragged_dot", "lhs rows must span a multiple of 16 bytes",
     "ragged_dot_alignment_declared", ["exact", "normal", "many_groups"]),
    ("torch", "grouped_mm_strides_of_32_bytes", "torch.grouped_mm", "strides must be multiples of 32 bytes",
     "grouped_mm_alignment_declared", ["exact", "normal", "strided"]),
])
def test_a_kernel_refusing_misaligned_operands_fails_undeclared_and_passes_declared(framework, broken, convention,
                                                                                     words, declared, modes):
    pytest.importorskip(framework)
    from tests.corpus import declared_layouts as dl

    (failed,) = check_kernel(getattr(dl, broken), convention=convention, modes=["exact"], raise_on_failure=False)
    assert failed.status is Status.FAILED and words in failed.detail
    report = check_kernel(getattr(dl, declared), modes=modes)
    assert report.ok and all(r.examples > 0 for r in report), [r.line() for r in report]


def test_a_strided_cells_view_is_judged_by_the_declared_alignment():
    pytest.importorskip("torch")
    from property_tests.checks import large_strided
    from tests.corpus import declared_layouts as dl

    adapter = resolve_kernel(dl.grouped_mm_alignment_declared)
    cell = large_strided.StridedCell("ragged_m", "rhs", "groups")
    # groups 2**30 elements apart, each a [K, N] block of rows of N float32: 48 bytes, then 64
    assert large_strided.misaligned(adapter, cell, np.zeros((4, 16, 12), np.float32), 0) == (
        f"{adapter.name} declares rhs aligned to 32 bytes: the view has a stride of 48 bytes (axis 1)")
    assert large_strided.misaligned(adapter, cell, np.zeros((4, 16, 16), np.float32), 0) is None
    assert large_strided.misaligned(get("torch.grouped_mm"), cell, np.zeros((4, 16, 12), np.float32), 0) is None
