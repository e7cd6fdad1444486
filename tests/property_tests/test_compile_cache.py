"""The persistent compilation cache: where it lives, that a later process loads what an earlier one
compiled, and that the plugin and the main job turn it on (and off when asked)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from gmm_kernels.runtimes import compile_cache

# a process that checks jax.lax.ragged_dot (a built-in: its executables are kept by gmm_kernels.runtimes.executables)
# and a user's kernel (jitted by the user: jax's persistent cache keeps it) on a few problems, and prints jax's cache's
# hit and miss counts, the lowerings to MLIR and the executables loaded from the harness's cache
PROBE = textwrap.dedent('''
    import os, sys
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from gmm_kernels.runtimes import compile_cache
    print(compile_cache.enable(sys.argv[1]))
    import jax.monitoring
    from gmm_kernels.runtimes import executables
    counts = {"hits": 0, "misses": 0, "lowered": 0, "loaded": 0}
    events = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses",
              "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowered", executables.LOAD_EVENT: "loaded"}
    def listen(event, *args, **kw):
        if event in events:
            counts[events[event]] += 1
    jax.monitoring.register_event_listener(listen)
    jax.monitoring.register_event_duration_secs_listener(listen)
    from gmm_kernels import resolve_kernel
    from property_tests.checks.check import check_mode
    # in this process, where the listener counts (a kernel's own process enables the same cache)
    verdicts = [check_mode(resolve_kernel(spec, convention="ragged_dot", in_process=True), "normal",
                           max_examples=3).status.value
                for spec in ("jax.ragged_dot", "tests.gmm_kernels.test_executables:user_ragged_dot")]
    print(*verdicts, *(f"{k.upper()} {v}" for k, v in counts.items()))
''')


def _environ(**extra: str) -> dict[str, str]:
    ours = ("JAX_COMPILATION_CACHE_DIR", "JAX_COMPILATION_CACHE_MAX_SIZE", "COMPILE_FUNC_DIR", compile_cache.ENV)
    env = {k: v for k, v in os.environ.items() if k not in ours and not k.startswith("JAX_PERSISTENT_CACHE")}
    return {**env, **extra}


def _probe(directory: str, **env: str) -> str:
    # one hash seed for both processes: the draws must not differ between them
    proc = subprocess.run([sys.executable, "-c", PROBE, directory], capture_output=True, text=True, timeout=300,
                          env=_environ(PYTHONHASHSEED="0", **env))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_a_later_process_loads_what_an_earlier_one_compiled(tmp_path):
    first = _probe(str(tmp_path / "cache"))
    assert f"jax compilation cache: {tmp_path / 'cache'}" in first
    assert "pass pass" in first and "HITS 0" in first and "MISSES 0" not in first and "LOADED 0" in first, first
    entries = [p.name for p in (tmp_path / "cache").iterdir() if p.name.endswith("-cache")]
    assert entries, "the first process wrote nothing (jax's defaults skip compilations under a second)"
    assert list((tmp_path / "cache" / "executables").glob("*.exe")), "no executable was kept"
    # the second loads the user's kernel from jax's cache and the built-in's executables from the harness's
    second = _probe(str(tmp_path / "cache"))
    assert "pass pass" in second and "MISSES 0" in second and "HITS 0" not in second and "LOADED 0" not in second, \
        second


def test_off_compiles_without_a_cache(tmp_path):
    out = _probe("off")
    assert "jax compilation cache: off" in out and "HITS 0 MISSES 0" in out and "LOADED 0" in out, out


def test_a_users_own_jax_cache_directory_is_left_as_it_is(tmp_path):
    out = _probe(str(tmp_path / "ours"), JAX_COMPILATION_CACHE_DIR=str(tmp_path / "theirs"))
    assert f"{tmp_path / 'theirs'} (yours, from JAX_COMPILATION_CACHE_DIR)" in out
    assert not (tmp_path / "ours").exists()


def test_where_the_cache_lives(tmp_path, monkeypatch):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.default_dir() == tmp_path / "xdg" / "gmm-harness" / "jax"
    assert compile_cache.resolve(None) == tmp_path / "xdg" / "gmm-harness" / "jax"
    assert compile_cache.resolve(None, tmp_path / "pytest") == tmp_path / "pytest"
    assert compile_cache.resolve(str(tmp_path / "opt"), tmp_path / "pytest") == tmp_path / "opt"
    assert compile_cache.resolve("off") is None
    monkeypatch.setenv(compile_cache.ENV, "OFF")
    assert compile_cache.resolve(None, tmp_path / "pytest") is None
    assert compile_cache.resolve(str(tmp_path / "opt")) == tmp_path / "opt"  # the option wins
    with pytest.raises(ValueError, match="option: expected a directory or 'off', got ' '"):
        compile_cache.resolve(" ")
    monkeypatch.setenv(compile_cache.ENV, "")
    with pytest.raises(ValueError, match="GMM_HARNESS_COMPILE_CACHE: expected a directory or 'off'"):
        compile_cache.resolve(None)


def test_the_main_job_refuses_an_empty_directory():
    proc = subprocess.run([sys.executable, "-m", "property_tests.cli.main", "check", "--compile-cache", ""],
                          capture_output=True, text=True, timeout=120, env=_environ())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--compile-cache: expected a directory or 'off', got ''" in proc.stderr


def test_the_plugin_uses_the_main_jobs_cache_directory_and_names_it(tmp_path):
    # one cache for the main job, the plugin and check_kernel (it was under .pytest_cache, compiled twice)
    (tmp_path / "pytest.ini").write_text("[pytest]\ngmm_harness = true\n")
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    run = [sys.executable, "-m", "pytest", "-v", "-p", "no:xdist", str(tmp_path / "test_nothing.py")]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=_environ(XDG_CACHE_HOME=str(tmp_path / "xdg")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    where = tmp_path / "xdg" / "gmm-harness" / "jax"
    assert f"gmm jax compilation cache: {where}\n" in proc.stdout and where.is_dir()
    assert not (tmp_path / ".pytest_cache" / "d" / "gmm-harness-jax").exists()


def test_a_directory_that_cannot_be_written_names_the_option_and_the_path(tmp_path):
    (tmp_path / "a-file").write_text("")
    bad = tmp_path / "a-file" / "jax"
    script = textwrap.dedent('''
        import sys
        from gmm_kernels.runtimes import compile_cache
        try:
            compile_cache.enable(sys.argv[1] if len(sys.argv) > 1 else None, option_name="--opt")
        except ValueError as exc:
            print("ValueError", exc)
        else:
            print("enabled")
    ''')

    def run(*argv, **env):
        return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120,
                              env=_environ(**env)).stdout

    assert f"ValueError --opt: the compilation cache directory {bad} cannot be written" in run(str(bad))
    assert f"ValueError {compile_cache.ENV}: the compilation cache directory {bad}" in run(
        **{compile_cache.ENV: str(bad)})
    assert "enabled" in run(str(tmp_path / "fine"), **{compile_cache.ENV: str(bad)})  # the option wins
    assert "enabled" in run("off", **{compile_cache.ENV: str(bad)})


def test_prune_keeps_the_cache_bounded_least_recently_used_first(tmp_path):
    for i in range(8):
        entry = tmp_path / f"jit_f-{i}-cache"
        entry.write_bytes(b"x" * 100)
        os.utime(entry, (1000 + i, 1000 + i))
    (tmp_path / "not-an-entry").write_bytes(b"x" * 10_000)
    assert compile_cache.prune(tmp_path, max_bytes=800) == 0  # at the bound: nothing goes
    assert compile_cache.prune(tmp_path, max_bytes=700) == 3  # down to three quarters: the oldest three
    assert sorted(p.name for p in tmp_path.glob("*-cache")) == [f"jit_f-{i}-cache" for i in range(3, 8)]
    assert (tmp_path / "not-an-entry").exists()
