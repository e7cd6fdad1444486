"""The pytest plugin: profiles selectable from the command line, ci by default, bad options refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = '''
from hypothesis import settings

def test_profile():
    print("PROFILE", settings().max_examples, settings().derandomize)
'''


def _run(tmp_path, *args):
    (tmp_path / "test_probe.py").write_text(PROBE)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path / "test_probe.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize(("args", "expected"), [
    ((), "PROFILE 50 True"),
    (("--hypothesis-profile=dev",), "PROFILE 15 False"),
    (("--hypothesis-profile=thorough",), "PROFILE 400 False"),
])
def test_profiles_are_selectable(tmp_path, args, expected):
    proc = _run(tmp_path, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert expected in proc.stdout


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
