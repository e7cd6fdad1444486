"""A kernel declares its scope and the harness checks exactly that, all of it.

The kernels here support part of ``ragged_dot`` only (float32, K a multiple of
32, every row in a group); without a declaration they fail on inputs they
never claimed, with one they pass, and a bug inside the declared scope is
still caught.
"""

from __future__ import annotations

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
