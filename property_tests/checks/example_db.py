"""Hypothesis' example database for the kernel checks: a failure found anywhere replays first everywhere.

The kernel checks run derandomized by default (the ``gmm-ci`` profile: the
same examples every run), and without a database. Given one, a check saves
every failing example it found (shrunk) and, on every later run that shares
the database (another CI machine, another shard, the author's laptop under a
random profile), replays the saved examples of that check before drawing new
ones: a kernel that failed once fails again at once, on the same example.

The database is named by a spec, first match wins: the ``example_db``
argument of ``check_kernel``/``check_mode``, the option (``--example-db`` of
the main job, ``--gmm-example-db`` of the pytest plugin), then
``GMM_HARNESS_EXAMPLE_DB``. A spec is

- ``off`` (no database, the default);
- a directory (created; Hypothesis' ``DirectoryBasedExampleDatabase``), which CI
  machines share by restoring and saving it as a cache or an artifact;
- ``redis://HOST:PORT[/DB]`` (also ``rediss://``, ``unix://``): a Redis server
  (Hypothesis' ``RedisExampleDatabase``; needs the ``redis`` package:
  ``pip install "gmm-harness[redis]"``);
- several of these joined by ``,``: every one is written, all are read.

Each check saves under a key of its own: the kernel's name and convention,
the mode, the family and the covering design's cell, so an example replays
only in the check that drew it (:func:`for_cell`, a :class:`KeyedDatabase` over
the database: Hypothesis' key of the property, prefixed by the cell's digest).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase, MultiplexedDatabase

from property_tests.checks.paths import check_output_dir

__all__ = ["ENV", "KeyedDatabase", "describe", "for_cell", "open_database", "resolve"]

#: the harness's own variable: a spec (see the module's docstring)
ENV = "GMM_HARNESS_EXAMPLE_DB"
_OFF = ("off", "none", "0", "false", "no")
_REDIS = ("redis://", "rediss://", "unix://")
_opened: dict[str, ExampleDatabase | None] = {}


def open_database(spec: str, *, option_name: str = "example_db") -> ExampleDatabase | None:
    """The database a spec names (None for ``off``); ``ValueError`` naming ``option_name`` for a bad spec or a
    directory that cannot be made or written, ``ImportError`` naming the package when Redis is asked for without
    ``redis`` installed."""
    if not isinstance(spec, str):
        raise TypeError(f"{option_name}: expected a directory, redis://HOST:PORT or 'off', got {spec!r}")
    parts = [p.strip() for p in spec.split(",")]
    if not spec.strip() or not all(parts):
        raise ValueError(f"{option_name}: expected a directory, redis://HOST:PORT or 'off' (several joined by ','),"
                         f" got {spec!r}")
    if len(parts) == 1 and parts[0].lower() in _OFF:
        return None
    dbs = [_one(p, option_name) for p in parts]
    return dbs[0] if len(dbs) == 1 else MultiplexedDatabase(*dbs)


def _one(part: str, option_name: str) -> ExampleDatabase:
    if part.lower() in _OFF:
        raise ValueError(f"{option_name}: 'off' cannot be joined with other databases, got {part!r} among several")
    if part.startswith(_REDIS):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError as exc:
            raise ImportError(f"{option_name}: {part!r} needs the redis package "
                              f"(pip install \"gmm-harness[redis]\"): {exc}") from None
        try:
            client = redis.Redis.from_url(part, socket_connect_timeout=10)
        except ValueError as exc:
            raise ValueError(f"{option_name}: expected redis://HOST:PORT[/DB], got {part!r}: {exc}") from None
        try:
            client.ping()  # an unreachable server is the caller's error, named now, never a kernel's failure
        except (redis.RedisError, OSError) as exc:
            raise ValueError(f"{option_name}: cannot reach the Redis server {part!r}: {exc}") from None
        return _Guarded(RedisExampleDatabase(client, key_prefix=b"gmm-harness:"), part)
    if "://" in part:
        raise ValueError(f"{option_name}: expected a directory or redis://HOST:PORT, got the URL {part!r}")
    path = Path(part).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option_name}: expected a directory, got the file {part!r}")
    check_output_dir(path, option_name)  # a usage error naming the path, before anything is checked
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{option_name}: cannot make the directory {part!r}: {exc}") from None
    return DirectoryBasedExampleDatabase(str(path))


class _Guarded(ExampleDatabase):
    """A database whose failures (a server gone mid-run) are reported once and then skipped: the database only
    replays examples, so losing it must not turn into a kernel's failure."""

    def __init__(self, inner: ExampleDatabase, where: str) -> None:
        super().__init__()
        self.inner, self.where, self.broken = inner, where, False

    def _call(self, what: str, *args: Any) -> Any:
        if self.broken:
            return () if what == "fetch" else None
        try:
            result = getattr(self.inner, what)(*args)
            return list(result) if what == "fetch" else result
        except Exception as exc:  # noqa: BLE001 - whatever the client raises, the checks go on without it
            self.broken = True
            sys.stderr.write(f"gmm-harness: the example database {self.where} failed ({type(exc).__name__}: "
                             f"{exc}); the checks go on without it\n")
            return () if what == "fetch" else None

    def save(self, key: bytes, value: bytes) -> None:
        self._call("save", key, value)

    def fetch(self, key: bytes) -> Any:
        yield from self._call("fetch", key)

    def delete(self, key: bytes, value: bytes) -> None:
        self._call("delete", key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self._call("move", src, dest, value)

    def __repr__(self) -> str:
        return f"{self.where} ({self.inner!r})"


class KeyedDatabase(ExampleDatabase):
    """``inner`` seen through a prefix: every key Hypothesis reads or writes (its property's key and the
    sub-keys it derives from it) is stored as ``prefix + key``, so that properties Hypothesis would key
    alike (one property function run on many cells) keep their examples apart. Only Hypothesis' public
    ``ExampleDatabase`` interface is used: ``save``, ``fetch``, ``delete`` and ``move`` delegate to ``inner``."""

    def __init__(self, inner: ExampleDatabase, prefix: bytes) -> None:
        super().__init__()
        self.inner, self.prefix = inner, prefix

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(self.prefix + key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        yield from self.inner.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(self.prefix + src, self.prefix + dest, value)

    def __repr__(self) -> str:
        return f"KeyedDatabase({self.inner!r}, {self.prefix!r})"


def for_cell(database: ExampleDatabase | None, identity: str) -> ExampleDatabase | None:
    """``database`` keyed for one check's cell (``identity`` names it: kernel, convention, mode, family, cell),
    so that a saved example replays in the check that drew it; None stays None."""
    if database is None:
        return None
    return KeyedDatabase(database, hashlib.sha256(identity.encode()).hexdigest()[:24].encode() + b":")


def resolve(example_db: Any = None, *, option_name: str = "example_db") -> ExampleDatabase | None:
    """The database a check uses: ``example_db`` (an ``ExampleDatabase``, a spec, or None), else
    ``$GMM_HARNESS_EXAMPLE_DB``, else none. Opened databases are kept per spec (one Redis connection)."""
    if isinstance(example_db, ExampleDatabase):
        return example_db
    name, spec = option_name, example_db
    if spec is None:
        name, spec = ENV, os.environ.get(ENV)
        if spec is None:
            return None
    if isinstance(spec, Path):
        spec = str(spec)
    if isinstance(spec, str) and spec in _opened:
        return _opened[spec]
    db = open_database(spec, option_name=name)
    _opened[spec] = db
    return db


def describe(spec: str | None) -> str:
    """One line for a report header: where failing examples are saved and replayed from."""
    if spec is None or spec.strip().lower() in _OFF:
        return "example database: off"
    return f"example database: {spec} (failing examples are saved there and replayed first)"
