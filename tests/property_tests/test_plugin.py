"""The pytest plugin: opt-in, profiles of its own selectable from the command line, bad options refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = '''
from hypothesis import settings

def test_profile():
    print("PROFILE", settings().max_examples, settings().derandomize)
'''
USER_CI = '''
from hypothesis import settings

settings.register_profile("ci", max_examples=7, derandomize=False)
settings.load_profile("ci")
'''


def _run(tmp_path, *args, conftest=None, env=None):
    (tmp_path / "test_probe.py").write_text(PROBE)
    if conftest is not None:
        (tmp_path / "conftest.py").write_text(conftest)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path / "test_probe.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("args", "expected"), [
    (("--hypothesis-profile=gmm-ci",), "PROFILE 50 True"),
    (("--hypothesis-profile=gmm-dev",), "PROFILE 15 False"),
    (("--hypothesis-profile=gmm-thorough",), "PROFILE 400 False"),
])
def test_profiles_are_selectable(tmp_path, args, expected):
    proc = _run(tmp_path, *args)
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr
    assert expected in proc.stdout


@pytest.mark.parametrize("ci", ["", "true"])
def test_installing_the_plugin_changes_nothing_for_a_run_that_does_not_use_it(tmp_path, ci):
    env = {"CI": ci} if ci else {}
    without = _run(tmp_path, "-p", "no:gmm_harness", env=env)
    with_it = _run(tmp_path, env=env)
    assert with_it.returncode == without.returncode == 0, with_it.stdout + with_it.stderr
    profile = [line for line in with_it.stdout.splitlines() if line.startswith("PROFILE")]
    assert profile == [line for line in without.stdout.splitlines() if line.startswith("PROFILE")]
    assert "gmm kernel" not in _run(tmp_path, "-v", env=env).stdout  # no header
    # a project's own profile named ci survives
    own = _run(tmp_path, conftest=USER_CI, env=env)
    assert "PROFILE 7 False" in own.stdout, own.stdout + own.stderr


LIBRARIES = ("jax", "torch", "triton", "tokamax", "ejkernel", "qwix", "torchao")
IMPORTED = f'''
import sys

def pytest_sessionfinish(session):
    print("IMPORTED", sorted(m for m in {LIBRARIES!r} if m in sys.modules))
'''


def test_a_project_opts_in_with_its_configuration(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\ngmm_harness = true\n")
    proc = _run(tmp_path, "-v", conftest=IMPORTED)  # (-q hides the header)
    assert "PROFILE 50 True" in proc.stdout, proc.stdout + proc.stderr
    # the header names every built-in kernel without probing them: probing imports every kernel library (8-16 s)
    header = [line for line in proc.stdout.splitlines() if line.startswith("gmm kernels: ")]
    assert len(header) == 1 and "not probed" in header[0] and "jax.ragged_dot," in header[0], proc.stdout
    assert "IMPORTED []" in proc.stdout, proc.stdout


def test_a_named_kernel_is_probed_and_no_other_kernel_library_is_imported(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\ngmm_harness = true\n")
    (tmp_path / "test_mine.py").write_text("def test_mine(gmm_kernel):\n"
                                           "    assert gmm_kernel.name == 'torch.grouped_mm'\n")
    proc = _run(tmp_path, "-v", "--gmm-kernel=torch.grouped_mm", str(tmp_path / "test_mine.py"), conftest=IMPORTED)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gmm kernel torch.grouped_mm (torch.grouped_mm) on cpu: " in proc.stdout, proc.stdout
    import importlib.util

    # its own library only (where torch is not installed, the probe finds none to import and says so)
    imported = ["torch"] if importlib.util.find_spec("torch") is not None else []
    assert f"IMPORTED {imported}" in proc.stdout, proc.stdout
    if not imported:
        assert "SKIPPED: torch is not installed" in proc.stdout, proc.stdout


def test_the_kernel_checks_live_in_the_product_not_in_the_suite():
    # the suite (tests/) is not in the wheel: a kernel check defined there instead of in
    # property_tests.kernel_checks would silently drop out of every user's run
    from pathlib import Path

    suite = Path(__file__).resolve().parents[1]
    modules = [p for p in suite.rglob("test_*.py") if p.name != Path(__file__).name]
    defining = {p.name for p in modules if "pytest.mark.kernel\n" in p.read_text()}
    assert not defining, defining
    importing = {p.name for p in modules if "from property_tests.kernel_checks import test_" in p.read_text()}
    # this repository's suite runs the goldens check; every kernel in every mode is the main job's (CI runs it on
    # both legs), not repeated by the suite
    assert importing == {"test_goldens.py"}


def test_with_gmm_kernel_a_run_that_checks_nothing_is_a_usage_error(tmp_path):
    # the probe is a user's test without the gmm_kernel fixture: it is kept, and the run says nothing checks the kernel
    proc = _run(tmp_path, "--gmm-kernel=jax.ragged_dot")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "--gmm-kernel jax.ragged_dot: no collected test checks it" in proc.stderr
    assert "--pyargs property_tests" in proc.stderr


def test_bad_tiling_is_a_usage_error(tmp_path):
    proc = _run(tmp_path, "--gmm-tiling=128,x", "--gmm-kernel=jax.ragged_dot")
    assert proc.returncode != 0
    assert "--gmm-tiling: expected three positive ints TM,TK,TN" in proc.stdout + proc.stderr


def test_unknown_kernel_is_a_usage_error(tmp_path):
    proc = _run(tmp_path, "--gmm-kernel=no_such_kernel")
    assert proc.returncode != 0
    assert "is neither a built-in adapter" in proc.stdout + proc.stderr


def test_import_path_needs_a_convention(tmp_path):
    proc = _run(tmp_path, "--gmm-kernel=numpy:matmul")
    assert proc.returncode != 0
    assert "--gmm-convention: required" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_installed_package_ships_no_tests_and_collects_its_kernel_checks(tmp_path):
    # users run `pytest --pyargs property_tests --gmm-kernel=...` against an installed (not editable) package: no
    # docs/, no repository beside it; it holds the kernel checks and none of this repository's suite
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    target, cwd = tmp_path / "site", tmp_path / "user-repo"
    cwd.mkdir()
    import importlib.util

    # without setuptools here (a Python 3.12 venv has none), pip builds in an isolated environment of its own
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    built = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation, "--target",
                            str(target), str(root)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    shipped = sorted(p.relative_to(target).as_posix() for p in target.rglob("test_*.py"))
    assert not shipped and not (target / "tests").exists(), shipped  # the suite is not the product
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "property_tests", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-p", "no:randomly", "--gmm-kernel=jax.ragged_dot"],
                          capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and " error" not in out and "tests collected" in out, out[-3000:]
    collected = [line for line in out.splitlines() if "::" in line]
    assert collected and all("kernel_checks.py::" in line for line in collected), collected
    where = subprocess.run([sys.executable, "-c", "import property_tests; print(property_tests.__file__)"],
                           capture_output=True, text=True, env=env, cwd=cwd).stdout
    assert str(target) in where  # the installed copy was the one collected


def test_the_libraries_own_deprecations_are_not_shown_but_yours_are(tmp_path):
    # a warning attributed to torch's own module (torch.jit.script_method warns without a stacklevel) is noise
    # in a kernel's run; one attributed to the test's module is its author's concern and stays
    pytest.importorskip("torch")
    (tmp_path / "test_warns.py").write_text(
        "import warnings\nimport torch\n\n"
        "def test_library():\n    try:\n        torch.jit.script_method(None)\n    except Exception:\n        pass\n\n"
        "def test_own():\n    warnings.warn('mine is deprecated', DeprecationWarning)\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-o", "gmm_harness=true", str(tmp_path / "test_warns.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mine is deprecated" in proc.stdout, proc.stdout
    assert "script_method" not in proc.stdout, proc.stdout
    # without the plugin in use the same library warning shows: the test could fail
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path / "test_warns.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "script_method" in proc.stdout, proc.stdout
