"""A kernel author's run from a repository of their own, each run from outside this tree.

A temporary directory holds the author's kernel package and tests; the commands run there with this
interpreter, as docs/check-your-kernel.md has them: the plugin never drops the author's tests, a
convention that contradicts the kernel's declaration is a usage error, a mistyped convention gets a
suggestion, one compilation cache serves the CLI, the plugin and ``check_kernel``, and a user's run
shows nothing of the harness's own tests or of torchao's import.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = "my_kernels.gmm:ragged_dot"

pytest.importorskip("jax")

KERNEL = textwrap.dedent('''
    import jax.numpy as jnp

    import gmm_kernels


    @gmm_kernels.declare("ragged_dot", dtypes=["float32"])
    def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        out_dtype = preferred_element_type or lhs.dtype
        lhs, rhs = jnp.asarray(lhs, jnp.float32), jnp.asarray(rhs, jnp.float32)
        ends = jnp.cumsum(jnp.asarray(group_sizes))
        group = jnp.searchsorted(ends, jnp.arange(lhs.shape[0]), side="right")
        weights = rhs[jnp.minimum(group, rhs.shape[0] - 1)]
        out = jnp.einsum("mk,mkn->mn", lhs, weights, precision="highest")
        out = jnp.where((group < rhs.shape[0])[:, None], out, 0.0)
        return out.astype(out_dtype)
''')
PLAIN_TESTS = textwrap.dedent('''
    def test_mine_plain():
        assert 1 + 1 == 2


    def test_mine_too():
        assert "kernel"
''')
FIXTURE_TESTS = textwrap.dedent('''
    def test_mine_with_the_fixture(gmm_kernel):
        assert gmm_kernel.convention == "ragged_dot"
''')
# check_kernel from a script, counting jax's persistent-cache hits and misses
CHECK = textwrap.dedent('''
    import sys

    import jax
    import jax.monitoring

    if len(sys.argv) > 1:  # the user's own jax cache, set before the harness is called
        jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    counts = {"hits": 0, "misses": 0}


    def listen(event, **kw):
        for name in counts:
            if event == "/jax/compilation_cache/cache_" + name:
                counts[name] += 1


    jax.monitoring.register_event_listener(listen)
    from my_kernels.gmm import ragged_dot
    from property_tests.checks.check import check_kernel

    report = check_kernel(ragged_dot, modes=["exact"], max_examples=3)
    print("OK", report.ok, "HITS", counts["hits"], "MISSES", counts["misses"])
    print("JAX DIR", jax.config.jax_compilation_cache_dir)
''')


def _repo(where: Path) -> Path:
    """The author's repository: a declared kernel, tests of their own with and without the fixture."""
    for path, text in {"my_kernels/__init__.py": "", "my_kernels/gmm.py": KERNEL, "tests/test_plain.py": PLAIN_TESTS,
                       "tests/test_fixture.py": FIXTURE_TESTS}.items():
        (where / path).parent.mkdir(parents=True, exist_ok=True)
        (where / path).write_text(text)
    return where


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A user's environment: none of this run's harness or jax cache settings, a cache home of its own."""
    ours = ("PYTEST_", "GMM_", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "JAX_ENABLE_COMPILATION_CACHE",
            "COMPILE_FUNC_DIR")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    return {**env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": "", "XDG_CACHE_HOME": str(tmp_path / "xdg"), **extra}


def _run(tmp_path: Path, *argv: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=cwd or tmp_path, env=_env(tmp_path, **env),
                          capture_output=True, text=True, timeout=600, check=False)


def _pytest(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return _run(tmp_path, "-m", "pytest", *args, **env)


# -- the plugin never drops a user's tests


def test_a_run_that_collects_no_check_of_the_kernel_is_a_usage_error_not_a_silent_deselection(tmp_path):
    _repo(tmp_path)
    proc = _pytest(tmp_path, "tests/test_plain.py", "--gmm-kernel", SPEC, "-p", "no:xdist")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out  # was 5: "2 deselected", the user's tests never ran, nothing said why
    assert f"--gmm-kernel {SPEC}: no collected test checks it" in out and "--pyargs property_tests" in out
    assert "deselected" not in out


def test_under_xdist_the_same_message_is_a_failure_and_the_users_tests_run(tmp_path):
    _repo(tmp_path)
    proc = _pytest(tmp_path, "-q", "tests/test_plain.py", "--gmm-kernel", SPEC, "-n", "2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "no collected test checks it" in out and "2 passed" in out and "1 failed" in out


def test_a_users_test_of_the_gmm_kernel_fixture_is_a_check_of_its_own(tmp_path):
    _repo(tmp_path)
    proc = _pytest(tmp_path, "-v", "tests/test_fixture.py", "--gmm-kernel", SPEC, "-p", "no:xdist")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"test_mine_with_the_fixture[{SPEC}] PASSED" in out


@pytest.mark.slow
def test_with_pyargs_the_users_tests_run_beside_the_kernel_checks_and_nothing_else(tmp_path):
    _repo(tmp_path)
    proc = _pytest(tmp_path, "-v", "-rs", "tests", "--pyargs", "property_tests", "--gmm-kernel", SPEC,
                   "-k", "exact or mine", "-p", "no:xdist")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for ran in ("test_plain.py::test_mine_plain PASSED", "test_plain.py::test_mine_too PASSED",
                f"test_fixture.py::test_mine_with_the_fixture[{SPEC}] PASSED",
                f"test_kernel_matches_reference[{SPEC}-exact] PASSED"):
        assert ran in out, ran
    ran = {line.split("::")[0].rsplit("/", 1)[-1] for line in out.splitlines() if " PASSED" in line}
    assert ran == {"test_plain.py", "test_fixture.py", "kernel_checks.py"}, ran  # the harness ships no tests
    assert "skipped" not in out.lower()


# -- a user's run shows only what concerns the user's kernel


@pytest.mark.slow
def test_an_installed_harness_shows_none_of_its_own_tests_in_a_users_run(tmp_path):
    # installed as a package (no docs/, no repository beside it): the harness's tests that cannot run
    # there (the walk-through) or do not concern the kernel are not collected, so none shows as a skip
    site, user = tmp_path / "site", _repo(tmp_path / "user")
    for package in ("gmm_ref", "gmm_kernels", "property_tests", "golden"):
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    proc = _pytest(tmp_path, "-v", "-rs", "--pyargs", "property_tests", "--gmm-kernel", SPEC, "-k", "exact",
                   "-p", "no:xdist", cwd=user, PYTHONPATH=str(site))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "skip" not in out.lower() and "is not here" not in out, out[-4000:]
    ran = [line.split("::")[0] for line in out.splitlines() if "::" in line and " PASSED" in line]
    assert ran and all(path.endswith("kernel_checks.py") for path in ran), ran  # property_tests.kernel_checks
    where = _run(tmp_path, "-c", "import property_tests; print(property_tests.__file__)", cwd=user,
                 PYTHONPATH=str(site)).stdout
    assert str(site) in where  # the installed copy was the one collected


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_the_harness_imports_torchao_quietly_and_leaves_a_users_messages_alone(tmp_path):
    script = textwrap.dedent('''
        import logging

        import gmm_kernels
        from property_tests.checks.check import check_mode

        for name in ("torchao.mxfp8_grouped_mm[emulated]", "torchao.nvfp4_grouped_mm[emulated]"):
            adapter = gmm_kernels.get(name)
            print(name, adapter.available(), check_mode(adapter, "exact", max_examples=2).status.value)
        logging.getLogger("torchao").warning("a warning of the user's own torchao code")
        logging.getLogger("torch.utils._pytree").warning(
            "%s: register_constant() on Enum subclasses is deprecated", "the user's own Enum")
    ''')
    proc = _run(tmp_path, "-c", script)
    assert proc.returncode == 0 and proc.stdout.count("None pass") == 2, proc.stdout + proc.stderr
    # torchao's import on a machine without its CUDA extensions: not the kernel's business
    assert "Failed to load" not in proc.stderr and "KernelPreference" not in proc.stderr, proc.stderr
    # what the user's code logs later still shows (the harness once silenced torchao's logger for good)
    assert "a warning of the user's own torchao code" in proc.stderr, proc.stderr
    assert "the user's own Enum" in proc.stderr, proc.stderr


# -- a convention that contradicts the declaration; a mistyped one


def test_a_convention_that_contradicts_the_declaration_is_a_usage_error_of_the_cli_and_the_plugin(tmp_path):
    _repo(tmp_path)
    cli = _run(tmp_path, "-m", "property_tests.cli.main", "check", "--kernel", SPEC, "--convention", "megablox.gmm",
               "--modes", "exact", "--no-goldens")
    assert cli.returncode == 2, cli.stdout + cli.stderr  # was 1: every cell a TypeError
    assert (f"--convention: 'megablox.gmm' contradicts --kernel '{SPEC}', which declares the convention "
            "'ragged_dot'") in cli.stderr, cli.stderr
    plugin = _pytest(tmp_path, "--co", "tests/test_fixture.py", "--gmm-kernel", SPEC, "--gmm-convention",
                     "megablox.gmm", "-p", "no:xdist")
    out = plugin.stdout + plugin.stderr
    assert plugin.returncode == 4, out
    assert "--gmm-convention: 'megablox.gmm' contradicts --gmm-kernel" in out and "'ragged_dot'" in out
    same = _pytest(tmp_path, "--co", "tests/test_fixture.py", "--gmm-kernel", SPEC, "--gmm-convention",
                   "ragged_dot", "-p", "no:xdist")
    assert same.returncode == 0, same.stdout + same.stderr  # repeating the declared convention is fine


def test_check_kernel_refuses_a_convention_that_contradicts_the_declaration():
    import jax

    from gmm_kernels import declare, resolve_kernel
    from property_tests.checks.check import check_kernel

    @declare("ragged_dot", dtypes=["float32"])
    def kernel(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        return jax.lax.ragged_dot(lhs, rhs, group_sizes, precision=precision,
                                  preferred_element_type=preferred_element_type)

    with pytest.raises(ValueError, match=r"^convention: 'megablox.gmm' contradicts kernel .*, which declares the "
                                         r"convention 'ragged_dot'"):
        check_kernel(kernel, convention="megablox.gmm", modes=["exact"], max_examples=2)
    assert resolve_kernel(kernel, convention="ragged_dot").convention == "ragged_dot"
    assert check_kernel(kernel, convention="ragged_dot", modes=["exact"], max_examples=2).ok


def test_a_mistyped_plugin_convention_gets_a_suggestion(tmp_path):
    _repo(tmp_path)
    proc = _pytest(tmp_path, "--co", "tests/test_fixture.py", "--gmm-kernel", SPEC, "--gmm-convention", "ragged-dot",
                   "-p", "no:xdist")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4 and "got 'ragged-dot'; did you mean ragged_dot" in out, out


# -- one compilation cache for the CLI, the plugin and check_kernel


def test_check_kernel_the_plugin_and_the_cli_share_one_compilation_cache(tmp_path):
    _repo(tmp_path)
    shared = tmp_path / "xdg" / "gmm-harness" / "jax"
    first = _run(tmp_path, "-c", CHECK)
    assert first.returncode == 0 and "OK True" in first.stdout, first.stdout + first.stderr
    assert "HITS 0" in first.stdout and f"JAX DIR {shared}" in first.stdout, first.stdout
    assert any(p.name.endswith("-cache") for p in shared.iterdir())  # was: no cache at all from Python
    second = _run(tmp_path, "-c", CHECK)
    assert "OK True" in second.stdout and "MISSES 0" in second.stdout and "HITS 0" not in second.stdout, second.stdout
    plugin = _pytest(tmp_path, "-v", "tests/test_fixture.py", "--gmm-kernel", SPEC, "-p", "no:xdist")
    assert plugin.returncode == 0 and f"gmm jax compilation cache: {shared}\n" in plugin.stdout, plugin.stdout
    cli = _run(tmp_path, "-m", "property_tests.cli.main", "check", "--kernel", SPEC, "--modes", "exact", "--no-goldens",
               "--max-examples", "2", "-v")
    assert cli.returncode == 0 and f"jax compilation cache: {shared}\n" in cli.stdout, cli.stdout + cli.stderr


def test_check_kernel_leaves_a_users_own_jax_cache_as_it_is(tmp_path):
    _repo(tmp_path)
    shared = tmp_path / "xdg" / "gmm-harness" / "jax"
    theirs = _run(tmp_path, "-c", CHECK, str(tmp_path / "theirs"))
    assert "OK True" in theirs.stdout and f"JAX DIR {tmp_path / 'theirs'}" in theirs.stdout, theirs.stdout
    for env in ({"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "env")}, {"JAX_ENABLE_COMPILATION_CACHE": "false"},
                {"GMM_HARNESS_COMPILE_CACHE": "off"}):
        proc = _run(tmp_path, "-c", CHECK, **env)
        assert "OK True" in proc.stdout and "HITS 0" in proc.stdout, (env, proc.stdout + proc.stderr)
    assert not shared.exists()


def test_a_cache_directory_that_cannot_be_written_is_a_usage_error_before_any_kernel_runs(tmp_path):
    _repo(tmp_path)
    (tmp_path / "a-file").write_text("not a directory")
    bad = tmp_path / "a-file" / "cache"
    plugin = _pytest(tmp_path, "-q", "tests/test_fixture.py", "--gmm-kernel", SPEC, f"--gmm-compile-cache={bad}",
                     "-p", "no:xdist")
    out = plugin.stdout + plugin.stderr
    assert plugin.returncode == 4 and "passed" not in out, out  # was: the cache off, the run went on
    assert f"--gmm-compile-cache: the compilation cache directory {bad} cannot be written" in out, out
    cli = _run(tmp_path, "-m", "property_tests.cli.main", "check", "--kernel", SPEC, "--compile-cache", str(bad),
               "--modes", "exact", "--no-goldens")
    assert cli.returncode == 2, cli.stdout + cli.stderr
    assert f"--compile-cache: the compilation cache directory {bad} cannot be written" in cli.stderr, cli.stderr
    from_python = _run(tmp_path, "-c", CHECK, GMM_HARNESS_COMPILE_CACHE=str(bad))
    assert from_python.returncode != 0, from_python.stdout
    assert f"ValueError: GMM_HARNESS_COMPILE_CACHE: the compilation cache directory {bad}" in from_python.stderr
    # the default directory, which nobody asked for: no cache, said so, and the run goes on
    default = _pytest(tmp_path, "-v", "tests/test_fixture.py", "--gmm-kernel", SPEC, "-p", "no:xdist",
                      XDG_CACHE_HOME=str(tmp_path / "a-file"))
    assert default.returncode == 0, default.stdout + default.stderr
    assert "gmm jax compilation cache: off (" in default.stdout and "cannot be written" in default.stdout
