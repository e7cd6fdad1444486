"""A persistent compilation cache for the JAX kernels, shared by processes and by later runs.

Every new shape costs a compilation: about 0.1 s for ``lax.ragged_dot`` and
about 1 s for an interpreted Pallas kernel on CPU. Without a persistent cache
each xdist worker, each main-job worker and each later run compiles every
shape again. :func:`enable` points JAX's persistent compilation cache at a
directory the harness owns, with no minimum compile time or entry size (jax's
defaults skip everything under a second, which is most of ours). The cache
is bounded at :data:`MAX_BYTES` by :func:`prune`, least recently used first,
once when a run starts. (jax's own bound, ``jax_compilation_cache_max_size``,
rescans the whole directory under one lock at every write: with the few
thousand entries of a test suite that made a cold run slower than no cache.)
Writes are not atomic: a process that reads an entry another is still writing
gets an error, which jax reports as a warning and answers by compiling; a
verdict never depends on the cache.

Where the cache lives, first match wins:

1. ``JAX_COMPILATION_CACHE_DIR`` in the environment (or ``jax_compilation_cache_dir``
   already set): the user's own cache, left as it is;
2. the option (``--compile-cache DIR|off`` of the main job, ``--gmm-compile-cache``
   of the pytest plugin), then ``GMM_HARNESS_COMPILE_CACHE=DIR|off``;
3. the default: under pytest's cache directory for a pytest run
   (``.pytest_cache/d/gmm-harness-jax``), else ``$XDG_CACHE_HOME/gmm-harness/jax``
   (``~/.cache/gmm-harness/jax`` without it).

Enabling exports ``GMM_HARNESS_COMPILE_CACHE`` and jax's variables, so the
processes the run starts (main-job workers, nested pytest runs) share the
directory, and ``COMPILE_FUNC_DIR`` (where ejkernel, once imported, points
jax's cache) unless the user set it. The torch adapters run eagerly (``torch._grouped_mm`` compiles
nothing), so there is no torch cache to keep.

Imports jax only if something already did.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["ENV", "MAX_BYTES", "default_dir", "enable", "prune", "resolve"]

#: the harness's own variable: a directory, or ``off``
ENV = "GMM_HARNESS_COMPILE_CACHE"
#: the cache's size bound; least recently used entries go first past it
MAX_BYTES = 2 * 2**30
_OFF = ("off", "none", "0", "false", "no")


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


def resolve(option: str | None, fallback: Path | None = None, *, option_name: str = "option") -> Path | None:
    """The directory the harness would use (None: off), from ``option``, ``$GMM_HARNESS_COMPILE_CACHE``
    and ``fallback`` (default: :func:`default_dir`). ``ValueError`` naming ``option_name`` (or the
    variable) for an empty value."""
    for name, value in ((option_name, option), (ENV, os.environ.get(ENV))):
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name}: expected a directory or 'off', got {value!r}")
        return None if value.strip().lower() in _OFF else Path(value).expanduser()
    return fallback if fallback is not None else default_dir()


def enable(option: str | None = None, fallback: Path | None = None, *, option_name: str = "option") -> str:
    """Turn the persistent cache on (or leave it off) before the first compilation; returns a line
    saying where it is. ``option``, ``fallback`` and ``option_name`` as in :func:`resolve`."""
    inherited = os.environ.get(ENV)  # a harness process above this one set it
    user = _user_dir()
    if user:
        return f"jax compilation cache: {user} (yours, from JAX_COMPILATION_CACHE_DIR)"
    directory = resolve(option, fallback, option_name=option_name)
    if directory is None:
        os.environ[ENV] = "off"
        return "jax compilation cache: off"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        os.environ[ENV] = "off"
        return f"jax compilation cache: off ({directory} cannot be created: {exc.strerror})"
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
    """Delete the least recently used entries until the cache holds at most ``max_bytes`` (three
    quarters of it, so that this is rare); returns the number deleted. Run once when a run starts, not
    by jax at every write (jax's own bound rescans the whole directory under a lock at every write)."""
    entries = []
    for path in directory.glob("*-cache"):
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
