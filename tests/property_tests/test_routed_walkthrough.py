"""docs/routed.md stays true: its files and commands, run as written in a throwaway kernel repository.

As ``test_walkthrough.py`` does for docs/check-your-kernel.md: each ``python`` block whose first line is
``# PATH`` is written to PATH in a temporary directory, each line of each ``bash`` block is run there with this
interpreter's scripts first on PATH, and must succeed. Every command is run a second time on a broken twin of
the page's kernels (one line edited, as the page says), and must then fail naming the token, slot and expert;
the failure report the page shows is checked against the twin's, and its reproducer script is run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_steps import FENCE, doc_steps

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "routed.md"

pytest.importorskip("torch")
if not DOC.is_file():  # an installed package has no docs/: the walk-through is this repository's own test
    pytest.skip(f"{DOC} is not here (gmm-harness installed as a package, not a checkout)", allow_module_level=True)

#: the broken twins the page describes: (file, the line as written, the line in the twin)
TWINS = (
    ("my_moe.py", "    if mul_routed_weight:\n", "    if True:\n"),
    ("my_slots.py", "    local = topk_ids.long() if expert_map is None else expert_map.long()[topk_ids.long()]\n",
     "    local = topk_ids.long()\n"),
)
#: what a failure names: the token, the slot and its expert
NAMED = re.compile(r"token \d+, slot \d+ \(expert \d+")
#: the essentials of the failure report the page shows (the `if True:` twin of my_moe.py), not its numbers
REPORT = ("token 0, slot 0 (expert ", "my_moe:fused_moe differs from the routed reference in ",
          "wrong (token, slot): [(0, 0)", "Routing: T=", "mul_routed_weight=False", "topk_ids = [[",
          "expert_map = none", "Failing test case: routed(")


def _steps() -> tuple[dict[str, str], list[str]]:
    return doc_steps(DOC)


def test_every_block_is_labelled_and_the_walkthrough_is_there():
    blocks = FENCE.findall(DOC.read_text())
    assert all(lang in ("python", "bash", "text") for lang, _ in blocks), \
        [lang for lang, _ in blocks if lang not in ("python", "bash", "text")]
    for lang, body in blocks:  # a command left in a text block would never be run
        if lang == "text":
            assert not re.match(r"(gmm-harness|pytest|python) ", body), body
    files, commands = _steps()
    assert {"my_moe.py", "my_slots.py", "tests/test_my_fused_moe.py"} <= set(files)
    assert "check_kernel(fused_moe, convention=\"vllm.fused_moe\")" in files["tests/test_my_fused_moe.py"]
    assert "@given(gst.routings(" in files["tests/test_my_fused_moe.py"]
    for command in ("gmm-harness check --kernel my_moe:fused_moe --convention vllm.fused_moe",
                    "pytest --pyargs property_tests --gmm-kernel my_moe:fused_moe --gmm-convention vllm.fused_moe",
                    "python -m pytest -q tests",
                    "gmm-harness check --kernel my_slots:moe_slots --convention torch.moe_slots"):
        assert command in commands, command
    for path, line, broken in TWINS:  # the twins are one line of the page's kernels, edited as the page says
        assert files[path].count(line) == 1, (path, line)
        assert f"`{broken.strip()}`" in DOC.read_text(), broken
    shown = next(body for lang, body in FENCE.findall(DOC.read_text())
                 if lang == "text" and body.startswith("token 0, slot 0 (expert"))
    for essential in REPORT:
        assert essential in shown, essential


def _run(tmp_path: Path, command: str, broken: bool) -> subprocess.CompletedProcess[str]:
    files, _ = _steps()
    for path, text in files.items():
        for twin, line, edited in TWINS if broken else ():
            if path == twin:
                text = text.replace(line, edited)
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    scripts = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GMM_"))}
    env.update(PATH=scripts + os.pathsep + env.get("PATH", ""), JAX_PLATFORMS="cpu", PYTHONPATH="")
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)


COMMANDS = _steps()[1]
#: "gmm-harness check my_moe", "pytest my_moe", "python -m pytest -q tests", ...
IDS = [c.split(" --")[0] + (f" {c.split(':')[0].split()[-1]}" if ":" in c else "") for c in COMMANDS]


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_the_command_passes_as_written(tmp_path, command):
    done = _run(tmp_path, command, broken=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"$ {command}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    if command.startswith("gmm-harness check"):
        assert " 0 failed" in done.stdout and "FAIL" not in done.stdout, out[-4000:]
        assert re.search(r"routed +\| cpu +\| pass \(\d+\)", done.stdout), done.stdout[-4000:]
    else:
        assert re.search(r"\d+ passed", done.stdout) and "failed" not in done.stdout, out[-4000:]
    if "python -m pytest" in command:
        assert "2 passed" in done.stdout, done.stdout[-4000:]  # the @given test and check_kernel's


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_the_command_fails_on_the_broken_twin_naming_token_slot_and_expert(tmp_path, command):
    done = _run(tmp_path, command, broken=True)
    out = done.stdout + done.stderr
    assert done.returncode == 1, f"$ {command}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert NAMED.search(done.stdout), done.stdout[-4000:]
    if "my_slots" in command:  # another rank's slot computed with a local expert
        assert re.search(r"token \d+, slot \d+ \(expert \d+, local -1, on another rank\)", done.stdout), out[-4000:]
    if command.startswith("pytest --pyargs"):  # the failing tests print the reports whole: the page's, and a script
        for essential in REPORT:
            assert essential in done.stdout, essential
        script = re.search(r"^E +```python\n(.*?)^E +```$", done.stdout, re.S | re.M)
        assert script, done.stdout[-4000:]
        source = "\n".join(line[8:] for line in script.group(1).splitlines())  # pytest's "E       " prefix
        assert source.startswith("# gmm-harness reproducer: my_moe:fused_moe (vllm.fused_moe)"), source[:200]
        (tmp_path / "repro.py").write_text(source)
        again = _run(tmp_path, "python repro.py", broken=True)
        assert again.returncode == 1 and "gmm_ref.compare.Mismatch: token " in again.stderr, again.stderr[-4000:]
        assert NAMED.search(again.stderr), again.stderr[-4000:]
