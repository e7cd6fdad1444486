"""Compiled executables of the built-in jax adapters, kept on disk: a warm run neither traces nor lowers.

jax's persistent compilation cache (``gmm_kernels.runtimes.compile_cache``) saves the compiling, but jax computes
its cache key from the lowered program, so every process still traces and lowers each shape it meets (about
half of a disk-warm megablox check). :func:`cached` wraps a function the way ``jax.jit`` does and keeps what
``jax.experimental.serialize_executable`` makes of its compiled executables, under a key computed from the
call alone, without tracing:

1. in this process (a dict, like jit's own cache);
2. on disk, in ``executables/`` under the harness's compile-cache directory (``$GMM_HARNESS_COMPILE_CACHE``,
   which ``gmm_kernels.runtimes.compile_cache.enable`` exports; ``off`` or unset: no disk, the function is jitted
   as it is), pruned with it;
3. else lowered, compiled (past jax's persistent cache: an executable jax loaded from its cache serializes
   without its code on CPU, so one it served anyway is not stored) and stored (a temporary file renamed into
   place, so a reader never sees half an entry).

The key holds everything the executable depends on, so that a stale hit is impossible: the function (its
module and name), its static arguments, every dynamic argument's shape, dtype, weak type, sharding and the
pytree structure, jax and jaxlib versions and those of the kernel's library, the source of the modules whose
code is traced (the adapter's and this one), jax's trace-affecting settings (x64 and the others jax itself
keys on), ``XLA_FLAGS``, the platform, device kind and platform version and, on CPU, the host's CPU features
(an executable compiled for other ISA extensions can die of SIGILL). An entry holds its whole key and a
SHA-256 of its body: an entry that is unreadable, corrupt, another key's or not loadable, or a loaded
executable whose first call raises, is compiled again and rewritten (a kernel's own error is raised by the
fresh executable too), never an error, so a verdict never depends on the cache. Loading one is announced with the
jax.monitoring event :data:`LOAD_EVENT` (compiling with :data:`COMPILE_EVENT`), which
``gmm_kernels.sandbox.compilation.CompileCounter`` counts: a kernel that needs a new executable for each group-size
vector is still caught when the executables come from disk.

Only the built-in adapters use it. A user's kernel (``pkg.module:fn``, ``gmm_kernels.user``) changes between
runs without a version that says so, and is never cached here. Entries are trusted as jax's own cache is:
loading one runs code compiled on this machine, from a directory the user owns.

Imports jax only when called.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
import pickle
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["COMPILE_EVENT", "ENV", "LOAD_EVENT", "SUBDIR", "UNUSABLE_EVENT", "Executable", "cached", "clear_memory",
           "directory", "entries", "stable_text"]

#: the harness's compile-cache variable: a directory, or ``off`` (``gmm_kernels.runtimes.compile_cache`` sets it)
ENV = "GMM_HARNESS_COMPILE_CACHE"
#: where the entries live under that directory
SUBDIR = "executables"
SUFFIX = ".exe"
#: the jax.monitoring duration events: an executable loaded from disk, one lowered and compiled here
LOAD_EVENT = "/gmm_harness/executables/load"
COMPILE_EVENT = "/gmm_harness/executables/compile"
#: an entry that could not be used (unreadable, corrupt, another key's, not loadable): compiled instead
UNUSABLE_EVENT = "/gmm_harness/executables/unusable"
_MAGIC = b"gmm-harness executable 1\n"
_OFF = ("off", "none", "0", "false", "no")
_MEMO_LIMIT = 4096
#: key text -> the loaded (or compiled) executable, in this process
_memory: dict[str, Any] = {}


def directory() -> Path | None:
    """Where the entries live (``$GMM_HARNESS_COMPILE_CACHE/executables``), or None: no disk cache."""
    value = os.environ.get(ENV, "").strip()
    if not value or value.lower() in _OFF:
        return None
    return Path(value).expanduser() / SUBDIR


def entries(root: Path) -> list[Path]:
    """The entries under a compile-cache directory ``root`` (for its pruning)."""
    return list((root / SUBDIR).glob("*" + SUFFIX))


def clear_memory() -> None:
    """Forget the executables this process holds (the disk entries stay)."""
    _memory.clear()


def cached(fn: Callable[..., Any], *, name: str, static: Any = (), modules: tuple[str, ...] = (),
           libraries: tuple[str, ...] = ()) -> Executable:
    """``fn`` (a function of its dynamic arguments only: arrays, pytrees of them, None) as a jitted function
    whose executables are cached (see the module docstring). ``name`` names it among its module's functions,
    ``static`` holds every value baked into it (dtypes, tilings, flags), ``modules`` the modules whose code it
    traces (the adapter's ``__name__``), ``libraries`` the distributions whose versions it depends on beyond
    jax and jaxlib (``tokamax``, ``ejkernel``, ``qwix``)."""
    return Executable(fn, name=name, static=static, modules=modules, libraries=libraries)


class Executable:
    """A jitted function that loads its compiled executables from the harness's cache (:func:`cached`)."""

    def __init__(self, fn: Callable[..., Any], *, name: str, static: Any, modules: tuple[str, ...],
                 libraries: tuple[str, ...]) -> None:
        self.fn = fn
        self.name = name
        self.modules = tuple(modules)
        self.libraries = tuple(libraries)
        self._static = stable_text(static)  # None: a value without a stable text; never cached on disk
        self._jitted: Any = None

    @property
    def jitted(self) -> Any:
        """``jax.jit(fn)``: what runs where nothing is cached."""
        if self._jitted is None:
            import jax

            self._jitted = jax.jit(self.fn)
        return self._jitted

    def __call__(self, *args: Any) -> Any:
        where = directory()
        key = None if where is None or self._static is None else self.key(args)
        if key is None:
            return self.jitted(*args)
        compiled = _memory.get(key)
        if compiled is not None:
            return compiled(*args)
        loaded = _load(where, key)
        if loaded is not None:
            try:
                out = loaded(*args)
            except Exception:  # noqa: BLE001 - a loaded executable that fails its first call is compiled afresh
                _unusable()
            else:
                _remember(key, loaded)
                return out
        compiled = self._compile(where, key, args)
        _remember(key, compiled)
        return compiled(*args)  # the kernel's own error, if any, is raised here

    def key(self, args: tuple) -> str | None:
        """The text every part of the key is spelled in, for ``args``; None where they cannot be keyed (a
        tracer: called inside a transformation; jit disabled; a leaf that is no array)."""
        import jax

        if jax.config.jax_disable_jit:
            return None
        leaves, tree = jax.tree.flatten(args)
        signature = []
        for leaf in leaves:
            spelled = _leaf(leaf)
            if spelled is None:
                return None
            signature.append(spelled)
        return "\n".join((
            f"function {'/'.join(self.modules)}:{self.name}",
            f"static {self._static}",
            f"arguments {tree} {' '.join(signature)}",
            f"code {_sources(self.modules)}",
            f"versions {_versions(self.libraries)}",
            f"jax {_trace_context()}",
            f"host {_host()}",
        ))

    def _compile(self, where: Path, key: str, args: tuple) -> Any:
        import jax.monitoring

        start = time.perf_counter()
        with _fresh() as served_by_jax:
            compiled = self.jitted.lower(*args).compile()
        jax.monitoring.record_event_duration_secs(COMPILE_EVENT, time.perf_counter() - start)
        if not served_by_jax:
            _store(where, key, compiled)
        return compiled


@contextlib.contextmanager
def _fresh() -> Any:
    """Compile past jax's persistent cache, and say whether it served the executable anyway (a list, true when
    it did). An executable jax loaded from its cache serializes without its code on CPU (jax 0.10.2: the copy
    raises ``NOT_FOUND: Function ... not found`` when a call reaches it), so such a one is never stored; jax's
    cache is skipped (its private switch, where there is one) so that none is served."""
    import jax.monitoring

    served: list[bool] = []

    def listen(event: str, **kwargs: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            served.append(True)

    try:
        from jax._src import compilation_cache
        used = compilation_cache.is_cache_used
    except (ImportError, AttributeError):
        compilation_cache, used = None, None
    jax.monitoring.register_event_listener(listen)
    if compilation_cache is not None:
        compilation_cache.is_cache_used = lambda backend: False
    try:
        yield served
    finally:
        if compilation_cache is not None:
            compilation_cache.is_cache_used = used
        jax.monitoring.unregister_event_listener(listen)


def _remember(key: str, compiled: Any) -> None:
    if len(_memory) >= _MEMO_LIMIT:
        _memory.pop(next(iter(_memory)))
    _memory[key] = compiled


def _leaf(leaf: Any) -> str | None:
    """How one dynamic argument is traced: shape, dtype, weak type and, for a jax array, its sharding."""
    import jax

    if isinstance(leaf, jax.core.Tracer):
        return None
    if isinstance(leaf, (bool, int, float, complex)):
        return f"py:{type(leaf).__name__}"  # weakly typed; its value is dynamic
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        return None
    spelled = f"{dtype}{list(shape)}"
    if isinstance(leaf, jax.Array):
        spelled += f"{'~weak' if leaf.weak_type else ''}@{leaf.sharding}"
    return spelled.replace(" ", "")


def stable_text(value: Any) -> str | None:
    """A text for a static value that is the same in every process, or None where there is none (a repr
    holding an address)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        parts = [stable_text(v) for v in value]
        if any(p is None for p in parts):
            return None
        fields = getattr(value, "_fields", None)
        head = type(value).__qualname__ if fields else type(value).__name__
        return f"{head}({', '.join(parts)})"
    dtype = _as_dtype(value)
    if dtype is not None:
        return f"dtype:{dtype}"
    text = repr(value)
    return None if " at 0x" in text or "object at" in text else f"{type(value).__module__}.{text}"


def _as_dtype(value: Any) -> str | None:
    import numpy as np

    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return str(np.dtype(value))
    return None


@functools.cache
def _source_hash(module: str) -> str:
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None)
    if not path:
        return "unknown"
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:20]
    except OSError:
        return "unreadable"


def _sources(modules: tuple[str, ...]) -> str:
    return " ".join(f"{m}={_source_hash(m)}" for m in (*modules, __name__))


@functools.cache
def _versions(libraries: tuple[str, ...]) -> str:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "absent"

    return " ".join(f"{d}={version(d)}" for d in ("jax", "jaxlib", *libraries))


def _trace_context() -> str:
    """jax's settings that change what a trace produces (the same jax keys its own caches on), spelled stably."""
    from jax._src import config

    try:
        names: Any = config.trace_context_names()
    except (AttributeError, NotImplementedError):
        names = None
    values = config.trace_context()
    if names is None or len(names) != len(values):
        names = range(len(values))
    return ";".join(f"{n}={_context_value(v)}" for n, v in zip(names, values, strict=True))


def _context_value(value: Any) -> str:
    text = stable_text(value)
    if text is not None:
        return text
    return f"{type(value).__qualname__}{getattr(value, 'axis_sizes', '')}"  # an axis environment, a mesh


@functools.cache
def _host() -> str:
    """The backend, its device and, on CPU, the host's instruction-set extensions."""
    import jax

    device = jax.devices()[0]
    parts = [f"platform={device.platform}", f"kind={device.device_kind}",
             f"version={getattr(device.client, 'platform_version', '?')}", f"devices={jax.device_count()}",
             f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}"]
    if device.platform == "cpu":
        parts.append(f"cpu={platform.machine()}:{_cpu_features()}")
    return " ".join(parts)


def _cpu_features() -> str:
    """A hash of the CPU's feature flags (``/proc/cpuinfo``), or of what the platform module says without it."""
    flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            field, _, value = line.partition(":")
            if field.strip() in ("flags", "Features"):
                flags = " ".join(sorted(value.split()))
                break
    if not flags:
        flags = f"{platform.processor()} {platform.platform()}"
    return hashlib.sha256(flags.encode()).hexdigest()[:20]


def _path(where: Path, key: str) -> Path:
    return where / (hashlib.sha256(key.encode()).hexdigest() + SUFFIX)


def _load(where: Path, key: str) -> Any:
    """The executable stored under ``key``, or None (absent; unusable: announced, then compiled instead)."""
    import jax.monitoring

    path = _path(where, key)
    start = time.perf_counter()
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    try:
        compiled = _deserialize(blob, key)
    except Exception:  # noqa: BLE001 - any failure to use an entry means compiling instead
        _unusable()
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: pruned last
    jax.monitoring.record_event_duration_secs(LOAD_EVENT, time.perf_counter() - start)
    return compiled


def _unusable() -> None:
    import jax.monitoring

    jax.monitoring.record_event(UNUSABLE_EVENT)


def _deserialize(blob: bytes, key: str) -> Any:
    from jax.experimental import serialize_executable

    head = len(_MAGIC)
    if not blob.startswith(_MAGIC) or blob[head:head + 64].decode("ascii") != hashlib.sha256(
            blob[head + 65:]).hexdigest():
        raise ValueError("not an entry, or a corrupt one")
    stored_key, payload, in_tree, out_tree, device_ids = pickle.loads(blob[head + 65:])
    if stored_key != key:
        raise ValueError("another key's entry")
    import jax

    by_id = {d.id: d for d in jax.devices()}
    # the devices it was compiled for (jax's default, all of the backend's, would expect a shard on each)
    return serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                     execution_devices=[by_id[i] for i in device_ids])


def _store(where: Path, key: str, compiled: Any) -> None:
    """Write ``compiled`` under ``key`` (temporary file, then rename); one that cannot be serialized or written
    is not stored."""
    from jax.experimental import serialize_executable

    try:
        payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        device_ids = [d.id for d in compiled.runtime_executable().local_devices()]
        body = pickle.dumps((key, payload, in_tree, out_tree, device_ids), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - e.g. host callbacks, constants: such executables stay in memory
        return
    blob = _MAGIC + hashlib.sha256(body).hexdigest().encode("ascii") + b"\n" + body
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".tmp-", suffix=SUFFIX + ".part")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, _path(where, key))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        return
