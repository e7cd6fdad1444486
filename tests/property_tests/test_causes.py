"""Every distinct cause in one run: a check goes on after the kernel's own exception, the run sums the causes, and a
refusal of a problem the kernel may simply not take comes with the declaration that scopes it out (which, applied,
leaves only the real bug; the honest twins pass)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings

import gmm_ref
from gmm_kernels import Scope, Status
from property_tests.checks import causes
from property_tests.checks.check import check_kernel, check_mode
from property_tests.cli.options import scope_fields
from property_tests.strategies import problems
from tests.corpus import several_causes as sc


def _keys(report):
    return {c["key"].split(":", 1)[0] + ":" + c["line"].split(" [on ")[0] for c in report.causes}


def test_one_check_of_a_torch_kernel_reports_its_three_causes():
    pytest.importorskip("torch")
    report = check_kernel(sc.grouped_mm_three_causes, convention="torch.grouped_mm", modes=["poisoned"],
                          raise_on_failure=False)
    by = {c["line"].split(":")[0]: c for c in report.causes}
    assert set(by) == {"ValueError", "RuntimeError", "NaN or Inf where the reference has none (or the reverse)"}, \
        report.causes
    assert by["ValueError"]["declaration"]["cli"] == "--zero-extents m,k"
    assert by["ValueError"]["declaration"]["plugin"] == "--gmm-zero-extents m,k"
    assert "zero_extents=('m', 'k')" in by["ValueError"]["declaration"]["declare"]
    assert by["RuntimeError"]["declaration"]["cli"] == "--unit-stride rhs"
    assert "N = 0" in by["ValueError"]["traits"][0]
    assert "transposed view" in by["RuntimeError"]["traits"][0]
    for c in by.values():  # each with its frame in the kernel's code, its smallest problem and a reproducer
        assert c["problem"] and c["reproducer"].startswith("```python"), c
    assert by["ValueError"]["frame"].startswith("tests/corpus/several_causes.py:")
    wrong = by["NaN or Inf where the reference has none (or the reverse)"]
    assert wrong["declaration"] is None  # a wrong output is never scoped out
    (result,) = report.results
    assert result.status is Status.FAILED and "(+2 other causes in this check" in result.detail, result.detail
    assert result.full_report().count("Another cause this check found") == 2


def test_the_declarations_printed_leave_only_the_real_bug_and_the_honest_twin_passes():
    pytest.importorskip("torch")
    scope = Scope(zero_extents=("m", "k"), unit_stride=("rhs",))
    report = check_kernel(sc.grouped_mm_three_causes, convention="torch.grouped_mm", modes=["poisoned", "strided"],
                          scope=scope, raise_on_failure=False)
    assert [c["key"] for c in report.causes] == ["wrong:nonfinite"], report.causes
    twin = check_kernel(sc.grouped_mm_refusals_declared, modes=["poisoned", "exact", "strided"],
                        raise_on_failure=False)
    assert twin.ok and not twin.causes, [r.line() for r in twin]
    strided = twin.by_check()["strided"]
    assert "declares it takes rhs with a last stride of 1 only" in strided.detail, strided.detail


def test_one_check_of_a_jax_kernel_reports_its_assertion_and_its_wrong_rows():
    pytest.importorskip("jax")
    report = check_kernel(sc.ragged_dot_two_causes, convention="ragged_dot", modes=["exact"], raise_on_failure=False)
    by = {c["key"].split(":")[0]: c for c in report.causes}
    assert set(by) == {"raised", "wrong"}, report.causes
    assert by["raised"]["line"] == "AssertionError: K must be positive"
    assert by["raised"]["declaration"]["cli"] == "--zero-extents m,n", by["raised"]
    assert by["wrong"]["declaration"] is None
    twin = check_kernel(sc.ragged_dot_refusal_declared, modes=["exact", "normal"], raise_on_failure=False)
    assert twin.ok, [r.line() for r in twin]


def test_a_cause_seen_in_few_examples_names_no_trait_and_a_shared_trait_is_no_cause():
    def record(key, n, traits, passed, passed_traits):
        return ("exact", [{"key": key, "line": "ValueError: x", "where": "exact", "problem": "p", "frame": "",
                           "reproducer": ""}],
                {key: {causes.TOTAL: n, **dict.fromkeys(traits, n)},
                 "": {causes.TOTAL: passed, **passed_traits}})

    few = causes.summarize(None, [record("raised:ValueError: x", 3, ["zero:n"], 50, {})])
    assert few[0]["traits"] == [] and few[0]["declaration"] is None
    # every example had it, failing or not: it says nothing of the cause
    shared = causes.summarize(None, [record("raised:ValueError: x", 20, ["family:ragged_m"], 50,
                                            {"family:ragged_m": 50})])
    assert shared[0]["traits"] == []
    told = causes.summarize(None, [record("raised:ValueError: x", 20, ["zero:n", "family:ragged_m"], 50,
                                          {"family:ragged_m": 50})],
                            {"zero:n": ["zero-extents m,k", "zero_extents=('m', 'k')"]}, "ragged_dot")
    assert told[0]["traits"] == ["N = 0"] and told[0]["declaration"]["cli"] == "--zero-extents m,k"
    text = "\n".join(causes.summary_lines(told, "k"))
    assert "every example of it had N = 0" in text and "declare it: gmm-harness check --zero-extents m,k" in text


def test_the_layout_declarations_are_spelled_one_way_everywhere():
    assert Scope(unit_stride="none").unit_stride == Scope(unit_stride=[]).unit_stride == () == Scope().contiguous
    assert Scope(contiguous="rhs,lhs").contiguous == ("lhs", "rhs")
    with pytest.raises(ValueError, match="unit_stride: expected some of the operands"):
        Scope(unit_stride=("out",))
    assert scope_fields({"unit-stride": "rhs", "contiguous": "none"}) == {"unit_stride": ("rhs",), "contiguous": ()}
    with pytest.raises(ValueError, match="--gmm-contiguous: expected some of the operands"):
        scope_fields({"contiguous": "mat_b"}, prefix="--gmm-")
    with pytest.raises(ValueError, match=r"^--unit-stride: expected some of the operands"):
        scope_fields({"unit-stride": "out"})
    scope = Scope(contiguous=("lhs",), unit_stride=("rhs",))
    assert Scope.from_json(json.loads(json.dumps(scope.to_json()))) == scope
    assert "contiguous lhs; unit stride rhs" in scope.describe()


@settings(max_examples=40, deadline=None)
@given(p=problems(convention="torch.grouped_mm", storages={"lhs": ("contiguous",), "rhs": ("contiguous", "slice")}))
def test_problems_draw_only_the_storages_asked_for(p):
    assert p.storage[0] == "contiguous" and p.storage[1] in ("contiguous", "slice")


def test_a_declared_layout_refuses_the_problems_outside_it():
    pytest.importorskip("torch")
    rng = __import__("numpy").random.default_rng(0)
    a = rng.standard_normal((4, 8)).astype("float32")
    b = rng.standard_normal((2, 8, 8)).astype("float32")
    p = gmm_ref.Problem("ragged_m", a, b, [2, 2], convention="torch.grouped_mm", storage=("contiguous", "transposed"))
    assert "last stride of 1" in Scope(unit_stride=("rhs",)).refusal(p)
    assert "contiguous only" in Scope(contiguous=("rhs",)).refusal(p)
    assert Scope(contiguous=("lhs",)).refusal(p) is None


def test_the_main_job_lists_the_causes_in_its_text_and_json(capsys, tmp_path):
    pytest.importorskip("torch")
    from property_tests.cli.main import main

    argv = ["check", "--in-process", "--kernel", "tests.corpus.several_causes:grouped_mm_three_causes",
            "--convention", "torch.grouped_mm", "--modes", "poisoned", "--no-goldens", "--families", "ragged_m",
            "--json", str(tmp_path / "run.json")]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "grouped_mm_three_causes: 3 distinct causes of failure" in out, out
    assert "declare it: gmm-harness check --unit-stride rhs; pytest --gmm-unit-stride rhs" in out
    doc = json.loads((tmp_path / "run.json").read_text())
    (found,) = doc["causes"].values()
    assert len(found) == 3 and all(c["reproducer"] for c in found), found


def test_a_check_goes_on_only_after_the_kernels_own_exception():
    pytest.importorskip("jax")
    from gmm_kernels import resolve_kernel
    from tests.corpus.broken_kernels import ragged_dot_last_row_next_expert

    # a wrong output ends the check: one cause
    adapter = resolve_kernel(ragged_dot_last_row_next_expert, convention="ragged_dot")
    result = check_mode(adapter, "exact", profile="gmm-ci")
    assert result.status is Status.FAILED and len(result.causes) == 1 and "other cause" not in result.detail


def test_a_poisoned_failure_names_the_region_its_nan_came_from():
    pytest.importorskip("torch")
    # the next expert's weights, read in the K loop: an expert with no rows poisons its neighbour's rows
    report = check_kernel(sc.grouped_mm_three_causes, convention="torch.grouped_mm", modes=["poisoned"],
                          scope=Scope(zero_extents=("m", "k"), unit_stride=("rhs",)), raise_on_failure=False)
    (result,) = report.results
    assert "(NaN/Inf from rhs of group " in result.detail, result.detail
    note = next(n for n in result.error.__notes__ if n.startswith("Where the NaN/Inf came from"))
    assert "an expert with no rows" in note and "alone, they make" in note, note


def test_the_rows_of_no_group_are_named_where_a_mask_multiplies_them():
    pytest.importorskip("jax")
    from tests.corpus.broken_kernels import ragged_dot_nan_leak_masking

    report = check_kernel(ragged_dot_nan_leak_masking, convention="ragged_dot", modes=["poisoned"],
                          raise_on_failure=False)
    (result,) = report.results
    assert result.status is Status.FAILED
    assert "(NaN/Inf from rhs of group " in result.detail and "an expert with no rows)" in result.detail, \
        result.detail


def test_a_kernel_that_makes_its_nan_itself_is_given_no_source():
    import numpy as np

    from gmm_kernels import resolve_kernel
    from property_tests.checks.explain import name_poison_source

    pytest.importorskip("jax")
    rng = np.random.default_rng(0)
    lhs = rng.standard_normal((6, 4)).astype(np.float32)
    lhs[5] = np.nan  # a row of no group
    p = gmm_ref.Problem("ragged_m", lhs, rng.standard_normal((2, 4, 3)).astype(np.float32), [2, 3],
                        convention="ragged_dot")
    out = np.zeros((6, 3), np.float32)
    out[0, 0] = np.nan
    bad = np.zeros(out.shape, bool)
    bad[0, 0] = True
    exc = gmm_ref.Mismatch("group 0: got nan", comparison=gmm_ref.compare.Comparison(False, "nonfinite", "", bad=bad),
                           output=out)
    from property_tests.checks import failures

    failures.attach(exc, problem=p)
    name_poison_source(resolve_kernel(sc.ragged_dot_refusal_declared), exc, "poisoned", run=lambda q: out)
    assert not failures.poison_source(exc) and not any("came from" in n for n in getattr(exc, "__notes__", ()))
    # the same output, made NaN by the row of no group: named
    name_poison_source(resolve_kernel(sc.ragged_dot_refusal_declared), exc, "poisoned",
                       run=lambda q: np.where(np.isfinite(q.lhs).all(), 0.0, out))
    assert failures.poison_source(exc) == ["lhs where no group reads (past the last group, or padding)"]


def test_a_routed_failure_has_a_reproducer_that_raises_the_same_report(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    report = check_kernel(sc.moe_experts_two_causes, convention="torch.moe_experts", modes=["normal"],
                          raise_on_failure=False)
    lines = {c["line"].split(":")[0]: c for c in report.causes}
    assert "NotImplementedError" in lines and len(report.causes) == 2, report.causes
    wrong = next(c for c in report.causes if c["key"].startswith("wrong:"))
    script = wrong["reproducer"].removeprefix("```python\n").removesuffix("\n```")
    assert "problem = gmm_ref.Routing(" in script and "gmm_ref.assert_routed_matches(" in script, script
    monkeypatch.chdir(tmp_path)
    with pytest.raises(gmm_ref.Mismatch) as info:
        exec(compile(script, "reproducer.py", "exec"), {})
    assert wrong["line"].split(": ", 1)[1].split(" (")[0] in str(info.value), (wrong["line"], str(info.value))


def _decoded(path):
    """(width, height, [h, w, 3] pixels) of a PNG this harness wrote (filter 0 rows, one IDAT)."""
    import struct
    import zlib
    from pathlib import Path

    import numpy as np

    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    at = data.index(b"IDAT")
    size = struct.unpack(">I", data[at - 4:at])[0]
    raw = np.frombuffer(zlib.decompress(data[at + 4:at + 4 + size]), np.uint8).reshape(h, 1 + 3 * w)
    assert (raw[:, 0] == 0).all()
    return w, h, raw[:, 1:].reshape(h, w, 3)


def test_a_wrong_output_gets_a_picture_with_its_wrong_rows_red_and_the_group_edges_blue(tmp_path, monkeypatch):
    pytest.importorskip("jax")
    from property_tests.checks import picture
    from tests.corpus.broken_kernels import ragged_dot_boundary_off_by_one

    monkeypatch.setenv("GMM_REPRO_DIR", str(tmp_path))
    report = check_kernel(ragged_dot_boundary_off_by_one, convention="ragged_dot", modes=["exact"],
                          raise_on_failure=False)
    (result,) = report.results
    note = next(n for n in result.error.__notes__ if n.startswith(picture.NOTE))
    path = note.rsplit(": ", 1)[-1]
    assert path.startswith(str(tmp_path)) and report.causes[0]["picture"] == path
    w, h, pixels = _decoded(path)
    problem = causes.failures.recipe_problem(result.error, None)
    rows, cols = problem.m, problem.n
    side = w // cols
    assert h == rows * side and side >= 3
    red = (pixels[..., 0] > 100) & (pixels[..., 1] < 200) & (pixels[..., 2] < 60)
    wrong_rows = sorted({r // side for r in np.flatnonzero(red.any(axis=1))})
    bad_rows = sorted(np.flatnonzero(result.error.comparison.bad.any(axis=1)).tolist())
    assert wrong_rows == bad_rows, (wrong_rows, bad_rows)  # exactly the rows the comparison found wrong
    blue = (pixels[..., 2] > 200) & (pixels[..., 0] < 60)
    assert blue.any(), "the group boundaries are drawn"


def test_a_picture_of_a_nan_is_purple_and_an_undefined_element_gray():
    from property_tests.checks import picture

    lhs = np.ones((4, 2), np.float32)
    p = gmm_ref.Problem("ragged_m", lhs, np.ones((1, 2, 3), np.float32), [3], convention="ragged_dot")
    ref = gmm_ref.reference(p)
    out = np.array(ref.values, np.float32)
    out[0, 0] = np.nan
    out[1, 1] = 1000.0
    bad = np.zeros(out.shape, bool)
    bad[0, 0] = bad[1, 1] = True
    img = picture.image(out, ref, gmm_ref.Numerics(), bad)
    side = img.shape[1] // 3
    at = lambda r, c: tuple(img[r * side + side // 2, c * side + side // 2])  # noqa: E731
    assert at(0, 0) == (128, 0, 170) and at(1, 1)[2] < 60 and at(1, 1)[0] >= 140
    assert at(2, 2) == (255, 255, 255)
    assert at(3, 0) == (225, 225, 225) if not ref.mask[3, 0] else True  # the row past the groups: undefined


def test_a_fresh_process_first_call_is_not_blamed_for_jaxs_own_start(tmp_path):
    """jax starts a timer thread the first time its backend is used; where that first use is the harness's own
    conversion inside the first watched call, the thread was the kernel's: a false 'tampered'."""
    import subprocess
    import sys

    pytest.importorskip("jax")
    script = ("from property_tests.checks.check import check_kernel\n"
              "from tests.corpus.broken_kernels import ragged_dot_correct\n"
              "r = check_kernel(ragged_dot_correct, convention='ragged_dot', modes=['normal'], max_examples=5)\n"
              "print('STATUS', r.results[0].status.name)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**__import__("os").environ,
                               "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[2])})
    assert "STATUS PASSED" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
