"""Goldens as a kernel author's repository uses them: a corpus and kernels of its own, a golden directory made
in a temporary directory (outside this tree, the working directory of every command), ``python -m golden``.

- a goldens command that checked nothing is an error (exit 2) saying what the directory holds;
- after a case changes, the commands that ``verify`` (and ``regenerate``, and ``check``) suggest remake every
  golden of the case, the kernels' included; a kernel golden made from the old case fails ``check`` and keeps
  ``regenerate`` from saying "up to date";
- the drift table judges an old golden against the bound it states (and says "-" where none applies);
- the main job's goldens cell counts, and the note / JSON lists, the cases out of the kernel's scope.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gmm_kernels import resolve_kernel
from golden.cli import main as golden_main
from golden.store import MANIFEST, REFERENCE, GoldenStore, array_sha256

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m golden"
KERNELS = textwrap.dedent('''
    import numpy as np

    import gmm_kernels
    import gmm_ref


    def _rd(lhs, rhs, group_sizes, preferred_element_type):
        return gmm_ref.ragged_dot(np.asarray(lhs), np.asarray(rhs), np.asarray(group_sizes),
                                  preferred_element_type=preferred_element_type)


    def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        return _rd(lhs, rhs, group_sizes, preferred_element_type)


    @gmm_kernels.declare("ragged_dot", dtypes=["float32"], tail=False)
    def f32_only(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        return _rd(lhs, rhs, group_sizes, preferred_element_type)


    @gmm_kernels.declare("ragged_dot", dtypes=["float16"])
    def f16_only(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        return _rd(lhs, rhs, group_sizes, preferred_element_type)


    def gmm(lhs, rhs, group_sizes, preferred_element_type=None, tiling=None, group_offset=None,
            existing_out=None, transpose_rhs=False):
        raise AssertionError("never run: the directory holds no golden of its convention")
''')
CASES = textwrap.dedent('''
    from golden import Case


    def _cases(seed):
        return [Case("rd-a", "ragged_dot", "ragged_m", m=16, k=8, n=8, group_sizes=[3, 0, 10], seed=seed),
                Case("rd-b", "ragged_dot", "ragged_m", m=16, k=8, n=8, group_sizes=[5, 5, 6], seed=2),
                Case("rd-c", "ragged_dot", "ragged_m", m=16, k=8, n=8, group_sizes=[8, 8], dtype="bfloat16", seed=3),
                Case("rd-d", "ragged_dot", "ragged_m", m=16, k=8, n=8, group_sizes=[4, 12], dtype="bfloat16",
                     seed=4)]


    CASES = _cases(1)
    CHANGED = _cases(7)  # rd-a's seed changed
''')
GOLDENS = "tests/goldens"
CORPUS = "mk_gold.golden_cases:CASES"
CHANGED = "mk_gold.golden_cases:CHANGED"
KERNEL = ["--kernel", "mk_gold.gmm:ragged_dot", "--convention", "ragged_dot"]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A kernel repository in a temporary directory, its working directory, with the reference's goldens of
    its corpus in tests/goldens (made by the command docs/goldens.md gives)."""
    (tmp_path / "mk_gold").mkdir()
    (tmp_path / "mk_gold" / "__init__.py").write_text("")
    (tmp_path / "mk_gold" / "gmm.py").write_text(KERNELS)
    (tmp_path / "mk_gold" / "golden_cases.py").write_text(CASES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "mk_gold" or m.startswith("mk_gold.")]:
        monkeypatch.delitem(sys.modules, name)
    rc, out = _golden("regenerate", "--dir", GOLDENS, "--corpus", CORPUS)
    assert rc == 0, out
    return tmp_path


def _golden(*argv: str) -> tuple[int, str]:
    """``python -m golden ARGV`` in this process, from the current (temporary) directory: (exit status, output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = golden_main(list(argv), prog=PROG)
        except SystemExit as exc:  # argparse
            rc = exc.code
    return rc, out.getvalue()


def _golden_process(cwd: Path, *argv: str) -> tuple[int, str]:
    """The same as a separate process (``python -m golden``), as a user's shell runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "golden", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def _commands(text: str) -> list[list[str]]:
    """Every ``python -m golden ...`` command a report suggests running (not the ones that drop goldens), in order,
    as argument lists without ``python -m golden``."""
    found = re.findall(r"run(?: on \S+)?: (python -m golden [^;\n]+?)(?:;|, then|\n|$)", text)
    return [shlex.split(c)[3:] for c in found]


# --------------------------------------------------------------------------- checking nothing is an error
def test_check_with_no_golden_of_the_kernels_convention_is_an_error(repo):
    """Was: ``0 passed, 0 failed``, exit 0."""
    rc, out = _golden_process(repo, "check", "--dir", GOLDENS, "--kernel", "mk_gold.gmm:gmm",
                              "--convention", "megablox.gmm")
    assert rc == 2, out
    assert "nothing checked: tests/goldens holds 4 case(s): 4 ragged_dot; none of mk_gold.gmm:gmm's convention, " \
           "megablox.gmm" in out, out


NOTHING = [
    (["check", "--dir", GOLDENS, *KERNEL, "--cases", "zz-*"], "nothing checked: tests/goldens holds 4 case(s)"),
    (["check", "--dir", GOLDENS, "--kernel", "mk_gold.gmm:f16_only"],
     "nothing checked: all 4 golden case(s) in tests/goldens are out of mk_gold.gmm:f16_only's scope: 2 x "),
    (["check", "--dir", "empty", *KERNEL], "nothing checked: empty has no manifest.json"),
    (["verify", "--dir", "empty"], "nothing verified: empty/manifest.json is missing"),
    (["verify", "--dir", GOLDENS, "--cases", "zz-*"], "nothing verified: --cases zz-* matches no case"),
    (["regenerate", "--dir", GOLDENS, "--cases", "zz-*"], "nothing regenerated: --cases zz-* matches no case"),
    (["regenerate", "--dir", GOLDENS, "--kernel", "mk_gold.gmm:gmm", "--convention", "megablox.gmm"],
     "nothing regenerated: no case of mk_gold.gmm:gmm's convention megablox.gmm (the corpus holds 4 case(s): "
     "4 ragged_dot)"),
    (["regenerate", "--dir", GOLDENS, "--kernel", "mk_gold.gmm:f16_only"],
     "nothing regenerated: every case of convention ragged_dot is unsupported by mk_gold.gmm:f16_only"),
    (["regenerate", "--dir", "empty"], "nothing regenerated: no corpus: empty/manifest.json is missing"),
    (["list", "--dir", GOLDENS, "--cases", "zz-*"], "--cases zz-* matches no case"),
    (["list", "--dir", "empty"], "--dir empty: no such directory"),
]


@pytest.mark.parametrize(("argv", "text"), NOTHING, ids=[" ".join(a) for a, _ in NOTHING])
def test_every_golden_command_that_would_check_nothing_is_an_error(repo, argv, text):
    """Was: exit 0 (``0 passed``, ``ok: 0 case(s)``, ``0 golden(s) up to date``, an empty list) or, for
    ``regenerate --cases``, exit 1 as if a golden had failed."""
    rc, out = _golden(*argv)
    assert rc == 2 and text in out, out
    assert not (repo / "empty").exists(), "a command that did nothing made the directory"


# ------------------------------------------------------------------------------ a case that changed
def test_the_suggested_fix_for_a_changed_case_fixes_every_golden_of_it(repo):
    """The issue's steps: goldens of a kernel at 1.0 beside the reference's, then a case changes."""
    rc, out = _golden_process(repo, "regenerate", "--dir", GOLDENS, *KERNEL, "--kernel-version", "1.0")
    assert rc == 0, out
    rc, out = _golden_process(repo, "check", "--dir", GOLDENS, *KERNEL, "--kernel-version", "1.0")
    # its own goldens, found again by a separate process (the platform recorded no longer depends on whether
    # something had imported the kernel's framework before the producer was read)
    assert rc == 0 and out.count("(bit-for-bit)") == 4, out

    rc, out = _golden_process(repo, "verify", "--dir", GOLDENS, "--corpus", CHANGED)
    assert rc == 1, out
    fixes = _commands(out)
    kernel_line = next(line for line in out.splitlines() if "[golden by mk_gold.gmm:ragged_dot | 1.0 |" in line)
    assert "rd-a" in kernel_line and "seed 1 -> 7" in kernel_line, out
    assert len(fixes) == 2 and fixes[0][:3] == ["regenerate", "--cases", "rd-a"], out  # the reference's first
    assert fixes[1][:5] == ["regenerate", "--kernel", "mk_gold.gmm:ragged_dot", "--convention", "ragged_dot"], out
    assert fixes[1][5:7] == ["--kernel-version", "1.0"], out

    rc, out = _golden_process(repo, *fixes[0])  # the reference's command alone: not the whole fix
    assert rc == 1 and "wrote 1 golden(s)" in out and "Not up to date" in out, out
    assert shlex.join(["python", "-m", "golden", *fixes[1]]) in out, out  # it names the kernel's command
    rc, out = _golden_process(repo, *fixes[0])  # was: "1 golden(s) up to date", exit 0
    assert rc == 1 and "golden(s) up to date" not in out and "Not up to date" in out, out

    rc, out = _golden_process(repo, "check", "--dir", GOLDENS, *KERNEL, "--kernel-version", "1.0")
    assert rc == 1, out  # was: 4 passed bit-for-bit, rd-a against the old case
    stale = next(line for line in out.splitlines() if line.startswith("FAILED") and ":: rd-a" in line)
    assert "stale: made from another version of the case (seed 1 -> 7" in stale, stale
    assert f"--kernel-version 1.0 --cases rd-a --update --dir {GOLDENS}" in stale, stale
    assert out.count("(bit-for-bit)") == 3, out

    rc, out = _golden_process(repo, *fixes[1])  # the kernel's command, as verify printed it
    assert rc == 0, out
    rc, out = _golden_process(repo, "verify", "--dir", GOLDENS, "--corpus", CHANGED)
    assert rc == 0 and "4 case(s) (and 4 kernel golden(s))" in out, out
    rc, out = _golden_process(repo, "check", "--dir", GOLDENS, *KERNEL, "--kernel-version", "1.0")
    assert rc == 0 and out.count("(bit-for-bit)") == 4, out
    rc, out = _golden_process(repo, "regenerate", "--dir", GOLDENS, "--corpus", CHANGED)
    assert rc == 0 and "4 golden(s) up to date" in out, out


def test_a_refused_change_names_every_command_and_stale_goldens_can_be_dropped(repo):
    assert _golden("regenerate", "--dir", GOLDENS, *KERNEL, "--kernel-version", "1.0")[0] == 0
    rc, out = _golden("regenerate", "--dir", GOLDENS, "--corpus", CHANGED)  # without --update: refused
    assert rc == 1 and "nothing was written" in out, out
    fixes = _commands(out)
    assert [f[:2] for f in fixes] == [["regenerate", "--cases"], ["regenerate", "--kernel"]], out
    assert "rd-a [mk_gold.gmm:ragged_dot | 1.0 |" in out and "Once it is applied" in out, out

    rc, out = _golden("regenerate", "--dir", GOLDENS, "--corpus", CHANGED, *KERNEL, "--kernel-version", "1.0")
    assert rc == 1 and "nothing was written" in out, out  # the kernel's refused change: its command keeps its version
    assert ("run: python -m golden regenerate --kernel mk_gold.gmm:ragged_dot --convention ragged_dot "
            "--kernel-version 1.0 --cases rd-a --update") in out, out  # (was: no --kernel-version, another golden)
    assert "rd-a [reference] (seed 1 -> 7): run: python -m golden regenerate --cases rd-a --update" in out, out

    assert _golden(*fixes[0])[0] == 1  # the reference updated; the kernel's golden left stale
    rc, out = _golden("regenerate", "--dir", GOLDENS, "--corpus", CHANGED, "--cases", "rd-a", "--drop-stale")
    assert rc == 0 and "dropped 1 stale kernel golden(s) (rd-a [mk_gold.gmm:ragged_dot | 1.0 |" in out, out
    goldens = GoldenStore(repo / GOLDENS).manifest()["cases"]
    assert list(goldens["rd-a"]) == [REFERENCE] and len(goldens["rd-b"]) == 2  # only the stale one went
    rc, out = _golden("verify", "--dir", GOLDENS, "--corpus", CHANGED)
    assert rc == 0, out


# --------------------------------------------------------------------------------------- the drift table
def _replace_reference(directory: Path, case: str, change) -> None:
    """Store another output as ``case``'s reference golden, hashes and manifest updated (the same spec)."""
    store = GoldenStore(directory)
    man = store.manifest()
    entry = man["cases"][case][REFERENCE]
    g = store.load(case, entry)
    out = g.out.copy()
    change(out)
    data = GoldenStore.encode(out, g.mask)
    sha = hashlib.sha256(data).hexdigest()
    (directory / f"{case}-{sha[:10]}.npz").write_bytes(data)
    man["cases"][case][REFERENCE] = dict(entry, file=f"{case}-{sha[:10]}.npz", file_sha256=sha,
                                         output_sha256=array_sha256(out))
    (directory / MANIFEST).write_text(json.dumps(man))


def _row(text: str, case: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(case + " "))


def test_the_drift_table_judges_the_old_golden_against_a_stated_bound(repo):
    """Was: "within bound: yes" for every change (a constant), beside a column of ulps that read as a bound."""
    def far(out):  # 6.7 off: far outside any bound of a K=8 float32 sum of values in [-1, 1)
        out[0, 0] += np.float32(6.7)

    def near(out):  # one float32 ulp: within the bound
        out[0, 0] = np.nextafter(out[0, 0], np.float32(np.inf))

    _replace_reference(repo / GOLDENS, "rd-b", far)
    _replace_reference(repo / GOLDENS, "rd-a", near)
    rc, out = _golden("regenerate", "--dir", GOLDENS, "--update")
    assert rc == 0, out
    assert re.search(r"NO \(\d[\d.e+]* x bound, max bound [\d.e-]+\)$", _row(out, "rd-b")), out
    assert re.search(r"yes \(0\.\d+ x bound, max bound [\d.e-]+\)$", _row(out, "rd-a")), out
    assert "an absolute bound from K, the input, accumulate and output dtypes" in out, out  # the legend
    rc, out = _golden("regenerate", "--dir", GOLDENS, "--corpus", CHANGED, "--update")
    assert rc == 0, out
    assert _row(out, "rd-a").endswith("  -"), out  # new inputs: the old golden is another problem's output


# ------------------------------------------------------------------------------- the main job's goldens cell
def test_every_goldens_count_says_what_was_out_of_scope(repo):
    from property_tests.cli.cells import run_cell
    from property_tests.cli.request import WorkRequest
    from property_tests.cli.table import TableCell, render

    kernel = resolve_kernel("mk_gold.gmm:f32_only")
    outcome = run_cell(kernel, TableCell(kernel.name, None, "goldens"), WorkRequest(golden_dir=GOLDENS))
    text = outcome.text
    dtype_why = "the declared scope takes dtypes ('float32',) / out_dtypes None, not bfloat16 x bfloat16 -> bfloat16"
    assert text == (f"pass (1/4; 3 out of scope: 2 x {dtype_why}; 1 x the declared scope has no rows past the last "
                    "group (no tail))"), text  # was: "pass (1/4)"
    table = render([{"kernel": kernel.name, "family": "ragged_m", "goldens": outcome}], ["goldens"])
    assert "| pass (1/4; 3 out of scope) [1]" in table and f"[1] {text}" in table, table
    f16_only = resolve_kernel("mk_gold.gmm:f16_only")
    none = run_cell(f16_only, TableCell(f16_only.name, None, "goldens"), WorkRequest(golden_dir=GOLDENS)).text
    assert none.startswith("n/a: all 4 golden cases out of scope: 2 x the declared scope takes dtypes ('float16',)")
    assert none.count(" x the declared scope") == 2, none  # every reason, each with its count


def test_the_main_jobs_json_and_notes_list_the_cases_out_of_scope(repo):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "property_tests.cli.main", "check", "--kernel", "mk_gold.gmm:f32_only",
                           "--golden-dir", GOLDENS, "--modes", "exact", "--max-examples", "4", "--json", "out.json",
                           "-v"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (cell,) = [c for c in json.loads((repo / "out.json").read_text())["cells"] if c["check"] == "goldens"]
    assert cell["status"] == "pass" and cell["text"].startswith("pass (1/4; 3 out of scope: 2 x "), cell
    assert "pass (1/4; 3 out of scope) [1]" in proc.stdout and f"[1] {cell['text']}" in proc.stdout, proc.stdout
