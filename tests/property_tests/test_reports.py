"""Reports that say what failed: the printed reproducer reproduces, each cell shows its mismatch line,
a gradient failure names its gradient, the same exception is reported once, a failure matching a
known upstream bug of a primitive the kernel calls says so, and check_kernel raises Mismatch.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import gmm_kernels
import gmm_ref
from gmm_kernels import Status, resolve_kernel
from gmm_kernels.known_issues import XLA_CPU_NAN_LEAK, xla_nan_leak_issues
from gmm_kernels.repro import kernel_reproducer, locate
from property_tests.checks import failures
from property_tests.checks.check import check_kernel, check_mode
from property_tests.checks.engine import mode_order
from tests.corpus import broken_kernels as bk

pytest.importorskip("jax")

SCRIPT = re.compile(r"```python\n(.*?)\n```", re.S)


def _script(exc: BaseException) -> str:
    notes = "\n".join(getattr(exc, "__notes__", []))
    found = SCRIPT.findall(notes)
    assert len(found) == 1, notes
    return found[0]


def _run(script: str, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "repro.py"
    path.write_text(script)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def _report(text: str) -> str:
    """The mismatch report: from its first line to the notes."""
    body = text[text.index("kernel "):]
    return body.split("\nReproduce with:")[0].strip()


@pytest.mark.parametrize(("fn", "modes", "wrt"), [
    (bk.ragged_dot_boundary_off_by_one, ["exact"], None),
    (bk.ragged_dot_weight_grad_misrouted, ["grad"], "rhs"),
], ids=["forward", "gradient"])
def test_the_printed_script_raises_the_same_mismatch(fn, modes, wrt, tmp_path):
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(fn, convention="ragged_dot", modes=modes)
    script = _script(info.value)
    assert f"resolve_kernel('tests.corpus.broken_kernels:{fn.__name__}'" in script
    assert "numerics = gmm_ref.Numerics(" in script
    if wrt:
        assert "kernel.vjp(problem, cotangent)" in script and f"d/d{wrt}" in script
    done = _run(script, tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "gmm_ref.compare.Mismatch: " in done.stderr
    assert _report(done.stderr) == _report(str(info.value)), done.stderr[-3000:]


def test_a_large_problem_travels_in_an_npz_beside_the_script(tmp_path, monkeypatch):
    monkeypatch.setenv("GMM_REPRO_DIR", str(tmp_path / "data"))
    rng = np.random.default_rng(0)
    p = gmm_ref.Problem("ragged_m", rng.standard_normal((64, 32)).astype(np.float32),
                        rng.standard_normal((3, 32, 16)).astype(np.float32), np.array([20, 0, 30]),
                        convention="ragged_dot")
    adapter = resolve_kernel(bk.ragged_dot_boundary_off_by_one, convention="ragged_dot")
    numerics = adapter.numerics_for(p)
    with pytest.raises(gmm_ref.Mismatch) as info:
        gmm_ref.assert_matches_reference(adapter.run(p), p, numerics=numerics, kernel=adapter.name)
    script = kernel_reproducer(adapter, p, numerics=numerics)
    assert len(script.splitlines()) < 15 and "gmm_ref.load_problem(DATA)" in script
    (data,) = (tmp_path / "data").iterdir()
    assert data.suffix == ".npz" and str(data) in script
    done = _run(script, tmp_path)
    assert _report(done.stderr) == _report(str(info.value)), done.stderr[-3000:]


def test_a_kernel_that_raises_is_reproduced_raising(tmp_path):
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(bk.ragged_dot_always_raises, convention="ragged_dot", modes=["normal"])
    assert info.value.kind == "raised" and isinstance(info.value.__cause__, TypeError)
    assert "TypeError: always_raises: unsupported argument combination" in str(info.value)
    done = _run(_script(info.value), tmp_path)
    assert "TypeError: always_raises: unsupported argument combination" in done.stderr


def test_a_kernel_defined_in_a_function_gets_a_placeholder():
    def local(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        return bk.ragged_dot_boundary_off_by_one(lhs, rhs, group_sizes, precision, preferred_element_type)

    adapter = resolve_kernel(local, convention="ragged_dot")
    assert locate(adapter) is None
    with pytest.raises(gmm_ref.Mismatch) as info:
        check_kernel(local, convention="ragged_dot", modes=["exact"])
    assert "resolve_kernel(YOUR_KERNEL, convention='ragged_dot')" in _script(info.value)
    assert locate(resolve_kernel("megablox.gmm")) == "megablox.gmm"


def test_each_cell_shows_its_mismatch_line():
    adapter = resolve_kernel(bk.ragged_dot_one_row_short, convention="ragged_dot")
    result = check_mode(adapter, "normal", profile="gmm-ci")
    assert result.status is Status.FAILED and result.detail.startswith("shape/dtype mismatch: ACTUAL ("), result
    result = check_mode(adapter, "grad", profile="gmm-ci")
    assert "shape/dtype mismatch" in result.detail, result.detail


def test_a_gradient_failure_names_the_gradient():
    adapter = resolve_kernel(bk.ragged_dot_weight_grad_misrouted, convention="ragged_dot")
    result = check_mode(adapter, "grad", profile="gmm-ci")
    assert result.status is Status.FAILED and result.detail.startswith("d/drhs: group "), result.detail


def _counting(fn):
    calls = []

    def kernel(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    return kernel, calls


def test_the_same_exception_is_reported_once_and_the_run_moves_on():
    # "not shrunk again" is counted in kernel calls, not seconds: a mode that only repeats a reported
    # exception calls the kernel once per example it names, with no shrinking calls on top
    modes = ["exact", "normal", "wide", "all_empty"]
    order = mode_order(modes)  # the order the run checks them in: the first one reports the exception
    alone, alone_calls = _counting(bk.ragged_dot_always_raises)
    check_kernel(alone, convention="ragged_dot", raise_on_failure=False, modes=order[:1])
    kernel, calls = _counting(bk.ragged_dot_always_raises)
    report = {r.check: r for r in check_kernel(kernel, convention="ragged_dot", raise_on_failure=False, modes=modes)}
    first, *rest = (report[m] for m in order)
    assert first.detail.startswith("TypeError: always_raises: unsupported argument combination [on ragged_m ")
    assert "group_sizes=[" in first.detail  # the problem that provoked it
    examples = 0
    for r in rest:
        found = re.match(rf"raised again in (\d+) of \1 examples, as in {order[0]}", r.detail)
        assert r.status is Status.FAILED and found, r
        examples += int(found.group(1))
    assert len(alone_calls) > 1  # the first report was shrunk (the derandomized mode calls alike)
    assert len(calls) - len(alone_calls) == examples  # the other modes: one call per example, none shrinking
    assert "always_raises: unsupported" in rest[0].detail


def test_what_a_run_remembers_is_the_run_s_not_the_kernel_s():
    adapter = resolve_kernel(bk.ragged_dot_always_raises, convention="ragged_dot")
    before = dict(vars(adapter))
    run = failures.CheckRun()
    first = check_mode(adapter, "exact", profile="gmm-ci", run=run)
    assert first.detail.startswith("TypeError: always_raises"), first.detail
    assert vars(adapter) == before  # the kernel carries nothing from one run into the next
    again = check_mode(adapter, "all_empty", profile="gmm-ci", run=run)
    assert again.detail.startswith("raised again in ") and "as in exact" in again.detail, again.detail
    alone = check_mode(adapter, "all_empty", profile="gmm-ci")  # a run of its own: reported in full
    assert alone.detail.startswith("TypeError: always_raises"), alone.detail
    other = resolve_kernel(bk.ragged_dot_always_raises, convention="ragged_dot", name="another kernel")
    assert check_mode(other, "all_empty", profile="gmm-ci", run=run).detail.startswith("TypeError: always_raises")


def test_the_report_s_notes_are_the_harness_s_own_whatever_hypothesis_adds():
    class P:
        def __repr__(self) -> str:
            return "Problem(ragged_m group_sizes=[1])"

    exc = gmm_ref.Mismatch("kernel k vs gmm_ref\nWrong groups:\n  group 0 (rows [0, 1), size 1): 1 wrong")
    exc.add_note("the checked code's note")
    failures.left_property(exc, P())  # the exception leaves the property; what comes next is not the kernel's
    exc.add_note("Falsifying example in any wording Hypothesis chooses")
    exc.add_note("You can reproduce this test case by adding @reproduce_failure(...)")
    failures.note(exc, "the harness's note")
    assert failures.finish(exc, None, "exact") == []
    assert exc.__notes__ == ["the checked code's note", "Failing example: Problem(ragged_m group_sizes=[1])",
                             "the harness's note"]


def test_distinct_failures_are_one_failure_and_a_count():
    a = gmm_ref.Mismatch("kernel k vs gmm_ref\nWrong groups:\n  group 2 (rows [4, 6), size 2): 3 wrong")
    b = IndexError("index 9 is out of bounds")
    exc, n = failures.primary(ExceptionGroup("two", [b, a]))
    assert exc is a and n == 2
    assert failures.one_line(exc) == "group 2 (rows [4, 6), size 2): 3 wrong"
    assert "IndexError: index 9 is out of bounds" in exc.__notes__[-1]


def test_xla_cpus_bf16_transposed_dot_shows_exactly_on_the_versions_it_is_known_on():
    """jaxlib 0.12's bfloat16 accumulation of a transposed ragged_dot_general on CPU (the d/dlhs jax.vjp makes of
    a transposed lhs): its reproducer shows it on the versions the known issue names and not outside them, so
    an upstream fix (or the bug on a newer jax) fails here, to move the versions; jax.ragged_dot_general's grad
    mode is a known bug exactly where it shows."""
    jax = pytest.importorskip("jax")
    if jax.default_backend() != "cpu":
        pytest.skip(f"jax runs on {jax.default_backend()}: the bug was seen on its CPU backend")
    from importlib import metadata

    from packaging.specifiers import SpecifierSet

    from gmm_kernels import get
    from gmm_kernels.known_issues import XLA_CPU_BF16_TRANSPOSED, xla_cpu_bf16_transposed_dot

    known = metadata.version("jax") in SpecifierSet(XLA_CPU_BF16_TRANSPOSED.versions["jax"])
    assert xla_cpu_bf16_transposed_dot() == known, (metadata.version("jax"), XLA_CPU_BF16_TRANSPOSED.versions)
    issue = get("jax.ragged_dot_general").known_issue("grad")
    assert (issue is not None and issue.startswith(XLA_CPU_BF16_TRANSPOSED.text)) == known, issue


@pytest.mark.skipif(not any(k.applies() for k in xla_nan_leak_issues()),
                    reason=f"XLA's ragged_dot NaN leak is known only for jax on CPU at {XLA_CPU_NAN_LEAK.versions}")
def test_a_failure_matching_a_known_upstream_bug_of_a_called_primitive_cites_it():
    cited = check_mode(resolve_kernel(bk.ragged_dot_via_lax, convention="ragged_dot"), "poisoned", profile="gmm-ci")
    assert cited.status is Status.FAILED
    assert "matches a known upstream bug of ragged_dot_general" in cited.detail
    assert XLA_CPU_NAN_LEAK.text in "\n".join(cited.error.__notes__)
    own = check_mode(resolve_kernel(bk.ragged_dot_nan_leak_masking, convention="ragged_dot"), "poisoned",
                     profile="gmm-ci")
    assert own.status is Status.FAILED and "upstream" not in own.detail  # a NumPy kernel calls no jax primitive


def test_a_kernel_calling_sys_exit_is_a_failure_of_its_example_in_check_kernel_too():
    # every caller of a kernel goes through KernelAdapter.invoke: a sys.exit in the kernel ends neither a
    # check_kernel (nor a pytest run of the plugin's checks) nor the main job's worker; it is the example's failure
    import sys

    def exits(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        sys.exit(0)

    (result,) = check_kernel(exits, convention="ragged_dot", modes=["exact"], raise_on_failure=False)
    assert result.status is Status.FAILED, result
    assert result.detail.startswith("KernelExit: the kernel raised SystemExit(0) (sys.exit) [on ragged_m "), result


def _asserts_k_multiple_of_16(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    assert lhs.shape[1] % 16 == 0, "K must be a multiple of 16"
    return bk.ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)


def test_a_kernels_own_assertion_error_is_its_exception_reported_once():
    """An ``AssertionError`` the kernel raises is the kernel's exception (named, reported once, the run goes on to
    the examples that do not raise it), never taken for the harness's own mismatch."""
    run = failures.CheckRun()
    adapter = resolve_kernel(_asserts_k_multiple_of_16, convention="ragged_dot")
    first = check_mode(adapter, "exact", profile="gmm-ci", run=run)
    assert first.detail.startswith("AssertionError: K must be a multiple of 16 [on ragged_m"), first.detail
    again = check_mode(adapter, "normal", profile="gmm-ci", run=run)
    assert again.detail.startswith("raised again in ") and "as in exact" in again.detail, again.detail


def test_a_hosted_kernels_exception_shows_its_own_frames_and_not_the_harnesses():
    result = check_mode(resolve_kernel("tests.property_tests.test_reports:_asserts_k_multiple_of_16",
                                       convention="ragged_dot"), "exact", profile="gmm-ci")
    text = result.full_report()
    assert "AssertionError: K must be a multiple of 16" in result.detail, result.detail
    frames = text.split("Traceback (the kernel's frames, the harness's left out):")[1]
    assert "in _asserts_k_multiple_of_16" in frames and "gmm_kernels" not in frames.split("AssertionError")[0], text


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed: a torch kernel")
def test_a_kernel_without_autograd_that_refuses_inputs_requiring_grad_is_n_a_under_grad():
    def numpy_inside(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        import torch

        a, b = mat_a.float().numpy(), mat_b.float().numpy()  # raises on a tensor that requires grad
        ends, start, out = offs.numpy(), 0, np.zeros((a.shape[0], b.shape[-1]), np.float32)
        for g, end in enumerate(ends):
            out[start:end] = a[start:end] @ b[g]
            start = end
        return torch.from_numpy(out).to(out_dtype or mat_a.dtype)

    result = check_mode(resolve_kernel(numpy_inside, convention="torch.grouped_mm",
                                       scope=gmm_kernels.Scope(families=["ragged_m"])), "grad", profile="gmm-ci")
    assert result.status is Status.UNSUPPORTED, result
    assert "no gradient: it raised RuntimeError on inputs that require grad" in result.detail, result.detail


def test_a_design_without_pairs_of_relations_does_not_count_them(monkeypatch):
    """A routed kernel's covering design has cells and no pairs of relations yet: '0 of 0 pairs' says nothing."""
    from gmm_kernels import Result
    from property_tests.cli import main
    from property_tests.cli.table import Table

    table = Table()
    monkeypatch.setattr(table, "reached", lambda: ((11, 11), (0, 0)))
    assert main._reached_line(table, "gmm-ci") == ("tier gmm-ci reached 11 of 11 cells of the covering designs "
                                                    "(docs/coverage.md)")
    monkeypatch.setattr(table, "reached", lambda: ((3, 4), (5, 6)))
    assert main._reached_line(table, "gmm-ci").endswith("cells of the covering designs and 5 of 6 pairs of "
                                                         "relations (docs/coverage.md)")
    monkeypatch.setattr(table, "reached", lambda: ((0, 0), (0, 0)))
    assert main._reached_line(table, "gmm-ci") == ""  # nothing of a design to report: no line
    result = Result("k", "exact", Status.PASSED, examples=7, cells=(2, 2), pairs=(0, 0))
    assert result.coverage_report().splitlines()[0] == "7 examples in 2 of 2 cells"


def test_a_one_line_note_is_cut_at_a_words_end():
    from property_tests.checks.engine import LINE_WIDTH, shorten

    text = "group 1 (rows [31, 62), size 31): 1984 wrong " + "because a word of some length " * 6
    cut = shorten(text)
    assert len(cut) <= LINE_WIDTH and cut.endswith("...")
    assert text.startswith(cut[:-3]) and text[len(cut) - 3] == " ", cut  # the next character was a space
    assert shorten("x" * 200) == "x" * (LINE_WIDTH - 3) + "..."  # no space to cut at: mid-word
    assert shorten("short") == "short"


def test_the_tier_line_says_the_examples_a_run_asked_for():
    from property_tests.checks.tiers import tier_of

    assert "the gmm-ci profile's 50 examples a mode" in tier_of("gmm-ci").describe()
    asked = tier_of("gmm-ci").describe(7)
    assert "at most 7 examples a mode (--max-examples)" in asked and "50" not in asked


_RECIPE = dict(problem=gmm_ref.Problem("ragged_m", np.ones((4, 2), np.float32), np.ones((2, 2, 2), np.float32),
                                       np.array([2, 2], np.int32)), numerics=gmm_ref.Numerics())


def _failing(line: str, fails, before=(), again_before=None) -> gmm_ref.Mismatch:
    """A failure as it leaves the property: ``fails(i)`` says whether its example's i-th check again fails;
    ``before``: the group sizes of the calls of its example before the failing one (``again_before``: before
    the one that fails when checked again, default the same)."""
    exc = gmm_ref.Mismatch(f"kernel k vs gmm_ref\nWrong groups:\n  {line}")
    failures.attach(exc, **_RECIPE, **failures.replayed(before))
    calls = iter(range(10 ** 6))

    def again() -> None:
        if fails(next(calls)):
            other = gmm_ref.Mismatch(line)
            failures.attach(other, **_RECIPE, **failures.replayed(before if again_before is None else again_before))
            raise other

    failures.left_property(exc, "Problem(...)")
    failures.attach_again(exc, again)
    return exc


def _judged(shrunk: BaseException, first: BaseException) -> gmm_kernels.Result:
    adapter = resolve_kernel(bk.ragged_dot_always_raises, convention="ragged_dot")
    run = failures.CheckRun(announce=lambda *args: None)
    run.found(adapter, "graph", "graph", first)  # the first failing example, before Hypothesis shrank it
    common = dict(kernel=adapter.name, check="graph", family=None, setting="test")
    return failures.failed_result(adapter, "graph", shrunk, run, common, 0.0)


def test_an_intermittent_smallest_example_gives_way_to_a_first_example_that_always_fails():
    """A kernel's state from earlier examples can make Hypothesis shrink to an example that failed once; the
    example it started from, failing every call, is the report then."""
    first = _failing("group 1 (rows [3, 9), size 6): 6 wrong", lambda i: True)
    shrunk = _failing("group 0 (rows [0, 1), size 1): 1 wrong", lambda i: False)
    result = _judged(shrunk, first)
    assert result.status is Status.FAILED and result.error is first, result
    assert result.detail == "group 1 (rows [3, 9), size 6): 6 wrong"
    assert "smallest failing example failed 1 of 21 calls" in "\n".join(first.__notes__)


def test_an_intermittent_first_example_leaves_the_smallest_one_reported():
    first = _failing("group 1 (rows [3, 9), size 6): 6 wrong", lambda i: i % 2 == 0)
    shrunk = _failing("group 0 (rows [0, 1), size 1): 1 wrong", lambda i: i % 3 == 0)
    result = _judged(shrunk, first)
    assert result.status is Status.INTERMITTENT and result.error is shrunk, result
    # Hypothesis' call of the shrunk example failed too: 7 of the 20 checks again, and that one
    assert result.detail.startswith("failed 8 of 21 calls of the same problem: group 0"), result.detail


def test_a_steady_smallest_example_is_the_report_without_checking_the_first_again():
    first = _failing("group 1 (rows [3, 9), size 6): 6 wrong", lambda i: pytest.fail("checked again"))
    shrunk = _failing("group 0 (rows [0, 1), size 1): 1 wrong", lambda i: True)
    result = _judged(shrunk, first)
    assert result.status is Status.FAILED and result.error is shrunk, result


def test_a_first_example_failing_again_only_in_another_call_is_not_steady():
    """Its example checked again fails every time, but in a later call than the report's: the report's call
    itself passed, so the first example is no steadier than the smallest."""
    first = _failing("group 1 (rows [3, 9), size 6): 6 wrong", lambda i: True, before=(), again_before=([1, 2],))
    shrunk = _failing("group 0 (rows [0, 1), size 1): 1 wrong", lambda i: False)
    result = _judged(shrunk, first)
    assert result.status is Status.INTERMITTENT and result.error is shrunk, result
    steady = _failing("group 1 (rows [3, 9), size 6): 6 wrong", lambda i: True, before=([1, 2],))
    assert _judged(_failing("group 0 (rows [0, 1), size 1): 1 wrong", lambda i: False), steady).error is steady
