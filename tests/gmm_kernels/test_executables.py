"""The harness's cache of compiled executables (``gmm_kernels.runtimes.executables``): a later process loads what an
earlier one compiled and lowers nothing; every part of the key misses when it changes; a corrupt entry is
compiled again with the same verdict; ``off`` writes nothing; a user's kernel is never served from it; and a
broken kernel, or one that recompiles for each group-size vector, is caught when its executables come from it."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gmm_kernels import KernelAdapter
from gmm_kernels.resolve import resolve_kernel
from gmm_kernels.results import Status
from gmm_kernels.runtimes import executables
from gmm_kernels.sandbox.compilation import Recompiled, assert_compiles_once
from property_tests.checks.check import check_mode

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax

LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"


@contextlib.contextmanager
def events():
    """Counts of the executables' events and of jax's traces and lowerings while active."""
    import jax.monitoring

    counts = {"compiled": 0, "loaded": 0, "unusable": 0, "lowered": 0, "traced": 0}
    names = {executables.COMPILE_EVENT: "compiled", executables.LOAD_EVENT: "loaded",
             executables.UNUSABLE_EVENT: "unusable", LOWER_EVENT: "lowered", TRACE_EVENT: "traced"}

    def listen(event, *args, **kwargs):
        if event in names:
            counts[names[event]] += 1

    jax.monitoring.register_event_listener(listen)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_listener(listen)
        jax.monitoring.unregister_event_duration_listener(listen)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh compile-cache directory for this test, nothing held in memory."""
    monkeypatch.setenv(executables.ENV, str(tmp_path / "cache"))
    executables.clear_memory()
    yield tmp_path / "cache" / executables.SUBDIR
    executables.clear_memory()


def _entries(where: Path) -> list[Path]:
    return sorted(where.glob("*" + executables.SUFFIX)) if where.is_dir() else []


# ---- a second process


SCRIPT = textwrap.dedent('''
    import os, sys
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from gmm_kernels.runtimes import compile_cache
    compile_cache.enable(sys.argv[1])
    import jax.monitoring
    from gmm_kernels import resolve_kernel
    from gmm_kernels.runtimes import executables
    from property_tests.checks.check import check_mode
    counts = dict.fromkeys(("compiled", "loaded", "lowered", "compiled_by_jax"), 0)
    names = {executables.COMPILE_EVENT: "compiled", executables.LOAD_EVENT: "loaded",
             "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowered",
             "/jax/core/compile/backend_compile_duration": "compiled_by_jax"}
    def listen(event, *args, **kwargs):
        if event in names:
            counts[names[event]] += 1
    jax.monitoring.register_event_duration_secs_listener(listen)
    for kernel, mode in (("jax.ragged_dot", "normal"), ("jax.ragged_dot", "grad"), ("megablox.gmm", "normal"),
                         ("megablox.gmm", "grad"), ("jax.ragged_dot_general", "grad")):
        print(kernel, mode, check_mode(resolve_kernel(kernel), mode, max_examples=3).status.value)
    print(*(f"{k}={v}" for k, v in counts.items()))
''')


def _run(directory: Path) -> tuple[list[str], dict[str, int]]:
    env = {k: v for k, v in os.environ.items() if k not in (executables.ENV, "JAX_COMPILATION_CACHE_DIR",
                                                            "COMPILE_FUNC_DIR")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(directory)], capture_output=True, text=True,
                          timeout=600, env={**env, "PYTHONHASHSEED": "0"})  # the same draws in both processes
    assert proc.returncode == 0, proc.stdout + proc.stderr
    *verdicts, last = proc.stdout.strip().splitlines()
    return verdicts, {k: int(v) for k, v in (item.split("=") for item in last.split())}


def test_a_second_process_loads_every_executable_and_lowers_nothing(tmp_path):
    verdicts, first = _run(tmp_path / "cache")
    assert all(v.endswith(" pass") for v in verdicts), verdicts
    assert first["compiled"] > 0 and first["loaded"] == 0, first
    assert len(_entries(tmp_path / "cache" / executables.SUBDIR)) == first["compiled"]
    again, second = _run(tmp_path / "cache")
    assert again == verdicts
    # megablox's backward pass is one executable; nothing is traced, lowered or compiled again
    assert second == {"compiled": 0, "loaded": first["compiled"], "lowered": 0, "compiled_by_jax": 0}, second


JAX_CACHED = textwrap.dedent('''
    import sys
    import jax, jax.monitoring, numpy as np
    from gmm_kernels.runtimes import compile_cache
    compile_cache.enable(sys.argv[1])  # jax's persistent cache and the executables, in one directory
    from gmm_kernels.runtimes import executables
    counts = dict.fromkeys(("loaded", "unusable"), 0)
    names = {executables.LOAD_EVENT: "loaded", executables.UNUSABLE_EVENT: "unusable"}
    def listen(event, *args, **kwargs):
        if event in names:
            counts[names[event]] += 1
    jax.monitoring.register_event_listener(listen)
    jax.monitoring.register_event_duration_secs_listener(listen)
    def f(x, g):
        return jax.lax.ragged_dot(x.reshape(6, 2), x.reshape(2, 2, 3), g).T.reshape(18)
    x, g = np.arange(12, dtype=np.float32), np.array([2, 4], np.int32)
    out = jax.jit(f)(x, g) if sys.argv[2] == "jit" else executables.cached(f, name="f", modules=("__main__",))(x, g)
    print(np.asarray(out).tolist(), counts["loaded"], counts["unusable"])
''')


def test_an_executable_jaxs_own_cache_holds_is_compiled_afresh_before_it_is_stored(tmp_path):
    """jax 0.10.2 on CPU: an executable loaded from jax's persistent cache serializes without its code (its copy
    raises NOT_FOUND: Function ... not found). The harness compiles past jax's cache, so what it stores runs."""
    def run(how):
        proc = subprocess.run([sys.executable, "-c", JAX_CACHED, str(tmp_path / "cache"), how], capture_output=True,
                              text=True, timeout=300, env={k: v for k, v in os.environ.items()
                                                           if k not in (executables.ENV, "JAX_COMPILATION_CACHE_DIR")})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout.split("]")[0], proc.stdout.split("]")[1].split()

    expected, _ = run("jit")  # jax's cache now holds the program
    assert run("cached") == (expected, ["0", "0"])  # compiled and stored
    assert run("cached") == (expected, ["1", "0"])  # loaded, and it runs


# ---- the key


def _double(a, b):
    return a * 2 + b


def _call(fn, *args, name="double", static=(), modules=(__name__,), libraries=()):
    return np.asarray(executables.cached(fn, name=name, static=static, modules=modules, libraries=libraries)(*args))


def test_a_hit_loads_the_same_executable(cache):
    a, b = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    with events() as cold:
        out = _call(_double, a, b)
    assert cold["compiled"] == 1 and len(_entries(cache)) == 1
    executables.clear_memory()
    with events() as warm:
        again = _call(_double, a, b)
        _call(_double, a + 1, b)  # new values, same signature: the executable in memory
    assert warm == {"compiled": 0, "loaded": 1, "unusable": 0, "lowered": 0, "traced": 0}
    np.testing.assert_array_equal(again, out)


@pytest.mark.parametrize("change", ["static", "dtype", "shape", "structure", "x64", "name"])
def test_a_changed_key_part_misses(cache, change):
    a, b = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    _call(_double, a, b)
    executables.clear_memory()
    call = {
        "static": lambda: _call(_double, a, b, static=(2,)),
        "dtype": lambda: _call(_double, a.astype(np.int32), b),
        "shape": lambda: _call(_double, a[:5], b[:5]),
        "structure": lambda: _call(lambda x, y: _double(*x) + y, (a, b), b),
        "x64": lambda: _with_x64(lambda: _call(_double, a, b)),
        "name": lambda: _call(_double, a, b, name="double_again"),
    }[change]
    with events() as counts:
        call()
    assert (counts["compiled"], counts["loaded"]) == (1, 0), counts
    assert len(_entries(cache)) == 2


def test_a_weakly_typed_argument_misses(cache):
    strong = jax.device_put(np.arange(6, dtype=np.float32))
    weak = jnp.arange(6) * 1.0  # float32, weakly typed
    assert weak.dtype == strong.dtype and weak.weak_type and not strong.weak_type
    _call(_double, strong, strong)
    with events() as counts:
        _call(_double, weak, strong)
    assert (counts["compiled"], counts["loaded"]) == (1, 0), counts


def _with_x64(fn):
    with jax.enable_x64(True):
        return fn()


def test_a_changed_library_version_or_cpu_misses(cache, monkeypatch):
    a = np.arange(4, dtype=np.float32)
    _call(_double, a, a, libraries=("numpy",))
    real = importlib.metadata.version
    for patch, undo in (
        # (a dotted target: this is importlib's function, not an adapter's run state, which test_architecture guards)
        (lambda: monkeypatch.setattr("importlib.metadata.version",
                                     lambda d: "0.0.0-other" if d == "numpy" else real(d)),
         lambda: monkeypatch.setattr("importlib.metadata.version", real)),
        (lambda: monkeypatch.setattr(executables, "_cpu_features", lambda: "other-isa"), lambda: None),
    ):
        executables.clear_memory()
        executables._versions.cache_clear()
        executables._host.cache_clear()
        patch()
        try:
            with events() as counts:
                _call(_double, a, a, libraries=("numpy",))
        finally:
            undo()
            executables._versions.cache_clear()
            executables._host.cache_clear()
        assert (counts["compiled"], counts["loaded"]) == (1, 0), counts


def test_a_changed_adapter_source_misses_and_is_never_served_stale(cache, tmp_path, monkeypatch):
    (tmp_path / "mods").mkdir()
    source = tmp_path / "mods" / "gmm_test_adapter_source.py"
    source.write_text("def kernel(a):\n    return a * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    module = importlib.import_module("gmm_test_adapter_source")
    a = np.arange(4, dtype=np.float32)

    def run():
        return _call(lambda x: module.kernel(x), a, name="kernel", modules=(module.__name__,))

    np.testing.assert_array_equal(run(), a * 2)
    source.write_text("def kernel(a):\n    return a * 3\n")  # the next run's code
    importlib.reload(module)
    executables.clear_memory()
    executables._source_hash.cache_clear()  # as in a new process
    with events() as counts:
        np.testing.assert_array_equal(run(), a * 3)
    assert (counts["compiled"], counts["loaded"]) == (1, 0), counts
    sys.modules.pop(module.__name__, None)


# ---- entries that cannot be used


def _corrupt(path: Path, how: str) -> None:
    blob = path.read_bytes()
    path.write_bytes({"truncated": blob[: len(blob) // 2], "flipped": blob[:-7] + bytes([blob[-7] ^ 1]) + blob[-6:],
                      "garbage": b"not an executable", "empty": b""}[how])


@pytest.mark.parametrize("how", ["truncated", "flipped", "garbage", "empty"])
def test_a_corrupt_entry_is_compiled_again_and_rewritten(cache, how):
    a, b = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    out = _call(_double, a, b)
    (entry,) = _entries(cache)
    _corrupt(entry, how)
    executables.clear_memory()
    with events() as counts:
        np.testing.assert_array_equal(_call(_double, a, b), out)
    assert (counts["unusable"], counts["compiled"], counts["loaded"]) == (1, 1, 0), counts
    executables.clear_memory()
    with events() as counts:  # rewritten: loadable again
        _call(_double, a, b)
    assert (counts["loaded"], counts["compiled"]) == (1, 0), counts


def test_a_loaded_executable_that_fails_its_first_call_is_compiled_afresh(cache, monkeypatch):
    a, b = np.arange(6, dtype=np.float32), np.ones(6, np.float32)
    out = _call(_double, a, b)
    executables.clear_memory()

    def broken(*args):
        raise RuntimeError("INVALID_ARGUMENT: a deserialized executable that does not run")

    monkeypatch.setattr(executables, "_deserialize", lambda blob, key: broken)
    with events() as counts:
        np.testing.assert_array_equal(_call(_double, a, b), out)
    assert (counts["unusable"], counts["compiled"]) == (1, 1), counts


def test_the_verdict_is_the_same_with_corrupt_entries(cache):
    adapter = resolve_kernel("jax.ragged_dot")
    first = check_mode(adapter, "normal", max_examples=3)
    assert first.status is Status.PASSED, first.detail
    stored = _entries(cache)
    assert stored
    for entry in stored:
        _corrupt(entry, "flipped")
    executables.clear_memory()
    with events() as counts:
        again = check_mode(adapter, "normal", max_examples=3)
    assert again.status is Status.PASSED and again.examples == first.examples, again.detail
    assert counts["unusable"] == len(stored) and counts["loaded"] == 0, counts


def test_prune_bounds_jax_entries_and_executables_together(tmp_path):
    from gmm_kernels.runtimes import compile_cache

    exe = tmp_path / executables.SUBDIR
    exe.mkdir()
    for i in range(8):  # oldest first, alternating jax's entries and executables
        entry = tmp_path / f"jit_f-{i}-cache" if i % 2 else exe / f"{i:064x}{executables.SUFFIX}"
        entry.write_bytes(b"x" * 100)
        os.utime(entry, (1000 + i, 1000 + i))
    stale, fresh = exe / ".tmp-dead.exe.part", exe / ".tmp-writing.exe.part"
    for tmp in (stale, fresh):
        tmp.write_bytes(b"x")
    os.utime(stale, (1000, 1000))
    assert compile_cache.prune(tmp_path, max_bytes=700) == 3
    left = sorted(p.name for p in [*tmp_path.glob("*-cache"), *exe.glob("*" + executables.SUFFIX)])
    assert left == sorted([f"jit_f-{i}-cache" for i in (3, 5, 7)] + [f"{i:064x}.exe" for i in (4, 6)])
    assert not stale.exists() and fresh.exists()  # a writer's file is left to it; a dead one's goes


# ---- off, and user kernels


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(executables.ENV, "off")
    executables.clear_memory()
    assert executables.directory() is None
    with events() as counts:
        _call(_double, np.arange(3, dtype=np.float32), np.ones(3, np.float32))
    assert counts["compiled"] == counts["loaded"] == 0 and counts["lowered"] == 1
    env = {k: v for k, v in os.environ.items() if k not in (executables.ENV, "JAX_COMPILATION_CACHE_DIR",
                                                            "COMPILE_FUNC_DIR")}
    proc = subprocess.run([sys.executable, "-m", "property_tests.cli.main", "check", "--kernel", "jax.ragged_dot",
                           "--modes", "normal,grad", "--max-examples", "2", "--no-goldens", "--compile-cache", "off"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**env, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed, 0 failed" in proc.stdout, proc.stdout
    # Hypothesis keeps its own constants under .hypothesis; nothing else is written anywhere
    written = [p for p in tmp_path.rglob("*") if p.is_file() and ".hypothesis" not in p.relative_to(tmp_path).parts]
    assert not written, written


def user_ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """A user's kernel (``pkg.module:fn``): jax's own ragged_dot, jitted by the user."""
    return _user_jitted(lhs, rhs, group_sizes, preferred_element_type)


@jax.jit
def _user_jitted_fn(lhs, rhs, group_sizes):
    return lax.ragged_dot(lhs, rhs, group_sizes)


def _user_jitted(lhs, rhs, group_sizes, preferred_element_type):
    out = _user_jitted_fn(lhs, rhs, group_sizes)
    return out if preferred_element_type is None else out.astype(preferred_element_type)


def test_a_user_kernel_is_never_served_from_the_cache(cache):
    adapter = resolve_kernel(f"{__name__}:user_ragged_dot", convention="ragged_dot")
    for mode in ("normal", "grad"):
        with events() as counts:
            result = check_mode(adapter, mode, max_examples=2)
        assert result.status is Status.PASSED, result.detail
        assert counts["compiled"] == counts["loaded"] == 0, (mode, counts)
    assert not _entries(cache)


# ---- broken kernels whose executables come from the cache


class CachedRaggedDot(KernelAdapter):
    """A built-in-like adapter: ``lax.ragged_dot`` jitted through ``gmm_kernels.runtimes.executables``, as the built-in
    adapters run; ``broken`` zeroes group 0's rows (a kernel that skips its first group)."""

    convention = "ragged_dot"
    requires = ("jax",)
    flush_subnormals = True
    default_precision = True

    def __init__(self, broken: bool) -> None:
        self.broken = broken
        self.name = f"test.cached_ragged_dot[{'broken' if broken else 'correct'}]"  # type: ignore[misc]

    def call(self, lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        ped = None if preferred_element_type is None else np.dtype(preferred_element_type)
        broken = self.broken

        def f(a, b, g):
            out = lax.ragged_dot(a, b, g, preferred_element_type=ped)
            if broken:
                out = jnp.where((jnp.arange(out.shape[0]) < g[0])[:, None], jnp.zeros_like(out), out)
            return out

        fn = executables.cached(f, name=self.name, static=(ped,), modules=(__name__,))
        return np.asarray(fn(lhs, rhs, np.asarray(group_sizes, np.int32)))


def test_a_broken_kernel_is_caught_when_its_executables_come_from_the_cache(cache):
    correct, broken = CachedRaggedDot(broken=False), CachedRaggedDot(broken=True)
    assert check_mode(correct, "normal", max_examples=4).status is Status.PASSED
    first = check_mode(broken, "normal", max_examples=4)
    assert first.status is Status.FAILED and "group 0" in str(first.error), first.detail
    executables.clear_memory()
    with events() as counts:
        again = check_mode(broken, "normal", max_examples=4)
        assert check_mode(correct, "normal", max_examples=4).status is Status.PASSED
    assert counts["loaded"] > 0 and counts["compiled"] == counts["lowered"] == 0, counts
    assert again.status is Status.FAILED and "group 0" in str(again.error), again.detail


SIZE_VECTORS = [[8, 8, 8, 8], [0, 32, 0, 0], [3, 0, 9, 20]]


def _graph_args(sizes):
    rng = np.random.default_rng(0)
    return (rng.integers(-3, 4, (32, 16)).astype(np.float32), rng.integers(-3, 4, (4, 16, 24)).astype(np.float32),
            np.asarray(sizes, np.int32))


def _baked(a, b, g):
    """Group sizes baked in as static values: one executable per size vector, each kept in the cache."""
    sizes = tuple(int(v) for v in g)
    return executables.cached(lambda x, y: lax.ragged_dot(x, y, jnp.asarray(sizes, jnp.int32)), name="baked",
                              static=sizes, modules=(__name__,))(a, b)


def _traced(a, b, g):
    return executables.cached(lax.ragged_dot, name="traced", modules=(__name__,))(a, b, g)


def test_graph_safety_still_catches_a_kernel_whose_executables_come_from_the_cache(cache):
    for attempt in ("compiled", "loaded"):  # the second time every executable is loaded from disk
        executables.clear_memory()
        with pytest.raises(Recompiled) as info:
            assert_compiles_once(_baked, _graph_args, SIZE_VECTORS, name="baked-sizes kernel")
        msg = str(info.value)
        assert "baked-sizes kernel is not graph-safe" in msg and "group_sizes=[0, 32, 0, 0]" in msg, msg
        if attempt == "loaded":
            assert "1 executable(s) loaded from the harness's cache" in msg, msg
        executables.clear_memory()
        assert_compiles_once(_traced, _graph_args, SIZE_VECTORS, name="traced kernel")
