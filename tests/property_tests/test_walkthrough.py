"""docs/check-your-kernel.md stays true: its files and commands, run verbatim in a throwaway kernel repository.

Each ``python`` block whose first line is ``# PATH`` is written to PATH in a
temporary directory; each line of each ``bash`` block is run there, in order,
and must succeed. ``pip install`` lines are the one exception: the package
under test is already installed in this environment (the test runs the
commands with this interpreter's scripts first on PATH).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_steps import doc_steps

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "check-your-kernel.md"

pytest.importorskip("jax")
if not DOC.is_file():  # an installed package has no docs/: the walk-through is this repository's own test
    pytest.skip(f"{DOC} is not here (gmm-harness installed as a package, not a checkout)", allow_module_level=True)


def _steps() -> tuple[dict[str, str], list[str]]:
    return doc_steps(DOC)


def test_the_walkthrough_has_what_the_issue_asks_for():
    files, commands = _steps()
    assert {"my_kernels/gmm.py", "tests/test_my_kernel.py", "my_kernels/golden_cases.py"} <= set(files)
    text = " ".join(commands)
    for step in ("tests --pyargs property_tests --gmm-kernel", "gmm-harness check", "--json",
                 "python -m golden regenerate", "python -m golden check", "--golden-dir"):
        assert step in text, step


def _parts() -> list[list[str]]:
    """The commands in independent parts (each runs in a fresh repository, so xdist spreads them): the
    goldens steps in order, as one part; every other command a part of its own."""
    _, commands = _steps()
    chain = [c for c in commands if "golden" in c]
    return [[c] for c in commands if c not in chain] + [chain]


PARTS = _parts()


@pytest.mark.slow
@pytest.mark.parametrize("part", PARTS, ids=[p[0].split(" --")[0][:40] + ("..." if len(p) > 1 else "") for p in PARTS])
def test_the_walkthrough_runs_verbatim_in_a_fresh_repository(tmp_path, part):
    files, _ = _steps()
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    scripts = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GMM_"))}
    env.update(PATH=scripts + os.pathsep + env.get("PATH", ""), JAX_PLATFORMS="cpu", PYTHONPATH="")
    for command in part:
        argv = shlex.split(command)
        if argv[0] == "python":
            argv[0] = sys.executable
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"$ {command}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        if "--gmm-kernel" in command:
            assert "declared scope: dtypes float32,bfloat16" in done.stdout and " passed" in done.stdout
            # the user's own tests run beside the kernel checks
            assert "tests/test_my_kernel.py .." in done.stdout, done.stdout
        if "--json" in command:
            results = json.loads((tmp_path / "results.json").read_text())
            assert results["failed"] == 0 and results["passed"] >= 7
            assert {c["status"] for c in results["cells"]} == {"pass", "n/a"}
    if "golden" in part[0]:
        goldens = json.loads((tmp_path / "tests" / "goldens" / "manifest.json").read_text())
        assert all(len(entries) == 2 for entries in goldens["cases"].values())  # the reference's and the kernel's
