"""A lock on a golden directory, so that two regenerations never interleave their writes.

The lock is an advisory ``flock`` on ``<dir>/.golden.lock`` (the operating
system releases it when its holder dies, however it dies). The holder writes
who it is into the file: a second run waits for it (up to ``wait`` seconds)
or stops with a message naming the holder and since when.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from golden.case import GoldenError

__all__ = ["LOCK_NAME", "locked"]

LOCK_NAME = ".golden.lock"
_POLL = 0.05


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} ({info.get('command')}) since {since}"


def _try_lock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: msvcrt locks the first byte instead
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def locked(directory: Path, *, wait: float = 600.0, stream: Any = None) -> Iterator[None]:
    """Hold the directory's lock inside the block; wait up to ``wait`` seconds for another holder.

    GoldenError naming the holder if it is still held after ``wait`` seconds (0: do not wait).
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait
        told = False
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                raise GoldenError(f"{directory}: locked by {_holder(path)}; waited {wait:g} s. "
                                  "Run again when it is done (or pass --wait SECONDS)")
            if not told:
                print(f"waiting for the lock on {directory}: held by {_holder(path)}", file=stream or sys.stderr)
                told = True
            time.sleep(_POLL)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                "command": " ".join(sys.argv[:3]) or "python"}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
