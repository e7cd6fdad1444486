"""A persistent compilation cache for the JAX kernels, shared by processes and by later runs.

Every new shape costs a compilation: about 0.1 s for ``lax.ragged_dot`` and
about 1 s for an interpreted Pallas kernel on CPU. Without a persistent cache
each xdist worker, each main-job worker and each later run compiles every
shape again. :func:`enable` points JAX's persistent compilation cache at a
directory the harness owns, with no minimum compile time or entry size (jax's
defaults skip everything under a second, which is most of ours). Beside jax's
entries, ``executables/`` holds the built-in adapters' compiled executables
(``gmm_kernels.runtimes.executables``: loaded without tracing or lowering). The cache
(both) is bounded at :data:`MAX_BYTES` by :func:`prune`, least recently used first,
once when a run starts. (jax's own bound, ``jax_compilation_cache_max_size``,
rescans the whole directory under one lock at every write: with the few
thousand entries of a test suite that made a cold run slower than no cache.)
Writes are not atomic: a process that reads an entry another is still writing
gets an error, which jax reports as a warning and answers by compiling; a
verdict never depends on the cache.

Where the cache lives, first match wins; the CLI, the pytest plugin and
``check_kernel`` share one cache by default, so a shape compiled by one is loaded by the others:

1. ``JAX_COMPILATION_CACHE_DIR`` in the environment (or ``jax_compilation_cache_dir``
   already set), or jax's cache turned off (``JAX_ENABLE_COMPILATION_CACHE=false``,
   ``jax_enable_compilation_cache``): the user's own choice, left as it is;
2. the option (``--compile-cache DIR|off`` of the main job, ``--gmm-compile-cache``
   of the pytest plugin), then ``GMM_HARNESS_COMPILE_CACHE=DIR|off``;
3. the default: ``$XDG_CACHE_HOME/gmm-harness/jax`` (``~/.cache/gmm-harness/jax``
   without it), for every front end.

A directory named by 2. that cannot be created or written is a ``ValueError``
naming the option (or the variable) and the directory, raised before anything
compiles (the front ends make it a usage error); the default directory that
cannot be written turns the cache off, saying why (nobody asked for it).

Enabling exports ``GMM_HARNESS_COMPILE_CACHE`` and jax's variables, so the
processes the run starts (main-job workers, nested pytest runs) share the
directory, and ``COMPILE_FUNC_DIR`` (where ejkernel, once imported, points
jax's cache) unless the user set it. The torch adapters run eagerly (``torch._grouped_mm`` compiles
nothing), so there is no torch cache to keep. :func:`ensure` is :func:`enable`
once per process, for library entry points (``check_kernel``) that a front end
may already have enabled it for.

Imports jax only if something already did.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from gmm_kernels.runtimes import executables

__all__ = ["ENV", "MAX_BYTES", "default_dir", "enable", "ensure", "prune", "resolve"]

#: the harness's own variable: a directory, or ``off`` (``gmm_kernels.runtimes.executables`` reads it too)
ENV = executables.ENV
#: the cache's size bound; least recently used entries go first past it
MAX_BYTES = 2 * 2**30
_OFF = ("off", "none", "0", "false", "no")
#: what this process's :func:`enable` said, once it ran (:func:`ensure` does not enable twice)
_enabled: list[str] = []


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/gmm-harness/jax``, or ``~/.cache/gmm-harness/jax``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gmm-harness" / "jax"


def _user_dir() -> str | None:
    """The cache directory the user set for jax themselves, if any (not one a harness process exported)."""
    user = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    jax = sys.modules.get("jax")
    if not user and jax is not None:
        user = getattr(jax.config, "jax_compilation_cache_dir", None)
    return user if user and user != os.environ.get(ENV) else None


def _user_disabled() -> bool:
    """Whether the user turned jax's persistent cache off themselves."""
    jax = sys.modules.get("jax")
    if jax is not None:
        return getattr(jax.config, "jax_enable_compilation_cache", True) is False
    return os.environ.get("JAX_ENABLE_COMPILATION_CACHE", "").strip().lower() in _OFF


def resolve(option: str | None, fallback: Path | None = None, *, option_name: str = "option") -> Path | None:
    """The directory the harness would use (None: off), from ``option``, ``$GMM_HARNESS_COMPILE_CACHE``
    and ``fallback`` (default: :func:`default_dir`). ``ValueError`` naming ``option_name`` (or the
    variable) for an empty value."""
    return _resolve(option, fallback, option_name)[0]


def _resolve(option: str | None, fallback: Path | None, option_name: str) -> tuple[Path | None, str | None]:
    """:func:`resolve`, and the option or variable that named the directory (None: the default)."""
    for name, value in ((option_name, option), (ENV, os.environ.get(ENV))):
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name}: expected a directory or 'off', got {value!r}")
        return (None if value.strip().lower() in _OFF else Path(value).expanduser()), name
    return (fallback if fallback is not None else default_dir()), None


def _unwritable(directory: Path) -> str | None:
    """Why ``directory`` cannot be created or written (None: it can)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def enable(option: str | None = None, fallback: Path | None = None, *, option_name: str = "option") -> str:
    """Turn the persistent cache on (or leave it off) before the first compilation; returns a line
    saying where it is. ``option``, ``fallback`` and ``option_name`` as in :func:`resolve`; a directory
    that the option or ``$GMM_HARNESS_COMPILE_CACHE`` names and that cannot be created or written is a
    ``ValueError`` naming them and the directory."""
    line = _enable(option, fallback, option_name)
    _enabled[:] = [line]
    return line


def ensure() -> str:
    """:func:`enable` with no option, unless this process enabled (or declined) the cache already: for
    library entry points such as ``check_kernel``, which a front end (the CLI, the plugin) may call."""
    return _enabled[0] if _enabled else enable(option_name=ENV)


def _enable(option: str | None, fallback: Path | None, option_name: str) -> str:
    inherited = os.environ.get(ENV)  # a harness process above this one set it
    user = _user_dir()
    if user:
        return f"jax compilation cache: {user} (yours, from JAX_COMPILATION_CACHE_DIR)"
    if _user_disabled():
        return "jax compilation cache: off (yours: jax_enable_compilation_cache is off)"
    directory, named_by = _resolve(option, fallback, option_name)
    if directory is None:
        os.environ[ENV] = "off"
        return "jax compilation cache: off"
    why = _unwritable(directory)
    if why is not None:
        if named_by is not None:
            raise ValueError(f"{named_by}: the compilation cache directory {directory} cannot be written: {why}")
        os.environ[ENV] = "off"  # the default, which nobody asked for: no cache rather than no run
        return f"jax compilation cache: off ({directory} cannot be written: {why}; {ENV}=DIR picks another)"
    directory = directory.resolve()
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # once per run: the workers start after this
        prune(directory)
    settings = {
        "jax_compilation_cache_dir": str(directory),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": -1,
        "jax_compilation_cache_max_size": -1,  # unbounded for jax: prune() bounds it, once a run
    }
    os.environ[ENV] = str(directory)
    for name, value in settings.items():
        os.environ[name.upper()] = str(value)
    # ejkernel points jax's cache at its own directory when imported (ejkernel.callib._ejit), unless told
    # where by COMPILE_FUNC_DIR: the same directory keeps one cache
    if os.environ.get("COMPILE_FUNC_DIR") in (None, "", inherited):
        os.environ["COMPILE_FUNC_DIR"] = str(directory)
    jax = sys.modules.get("jax")
    if jax is not None:  # imported already: its config read the environment before we set it
        for name, value in settings.items():
            jax.config.update(name, value)
    return f"jax compilation cache: {directory}"


def prune(directory: Path, max_bytes: int = MAX_BYTES) -> int:
    """Delete the least recently used entries (jax's and the executables') until the cache holds at most
    ``max_bytes`` (three quarters of it, so that this is rare); returns the number deleted. Run once when a
    run starts, not by jax at every write (jax's own bound rescans the whole directory under a lock at every
    write). A temporary file an executable was being written to, a day old, goes too (its writer died)."""
    for tmp in (directory / executables.SUBDIR).glob(".tmp-*"):
        try:
            if tmp.stat().st_mtime < time.time() - 86400:
                tmp.unlink()
        except OSError:
            continue
    entries = []
    for path in [*directory.glob("*-cache"), *executables.entries(directory)]:
        try:
            st = path.stat()
        except OSError:
            continue
        entries.append((max(st.st_atime, st.st_mtime), st.st_size, path))
    total = sum(size for _, size, _ in entries)
    if total <= max_bytes:
        return 0
    deleted = 0
    for _, size, path in sorted(entries):
        if total <= max_bytes * 3 // 4:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        deleted += 1
    return deleted
