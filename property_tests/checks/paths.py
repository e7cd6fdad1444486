"""Output paths checked before a run: a file or directory the run will write, found unwritable before any kernel
runs (a usage error naming the option and the path), not after the whole run as a crash.

The checks write nothing that stays: they look at the path's nearest existing ancestor, and make and drop an
unnamed temporary file in the directory that will hold the output (which also finds a read-only file system).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["check_output_dir", "check_output_file"]


def _existing_ancestor(path: Path) -> Path:
    """``path`` itself or its nearest ancestor that exists (a file, for a path that runs through one)."""
    while not os.path.lexists(path) and path.parent != path:
        path = path.parent
    return path


def _directory_problem(directory: Path) -> str | None:
    """Why files cannot be made in ``directory`` (made with its parents if missing), or None."""
    found = _existing_ancestor(directory)
    if not found.is_dir():
        return f"{str(found)!r} is not a directory"
    if not os.access(found, os.W_OK | os.X_OK):
        return f"the directory {str(found)!r} is not writable"
    try:
        with tempfile.TemporaryFile(dir=found):
            pass
    except OSError as exc:
        return f"cannot write in the directory {str(found)!r}: {exc.strerror or exc}"
    return None


def check_output_dir(path: str | os.PathLike[str], option: str) -> None:
    """``ValueError`` naming ``option`` and ``path`` when ``path`` cannot be (made and) written as a directory."""
    p = Path(path).expanduser()
    why = _directory_problem(p)
    if why is not None:
        raise ValueError(f"{option}: cannot write the directory {os.fspath(path)!r}: {why}")


def check_output_file(path: str | os.PathLike[str], option: str) -> None:
    """``ValueError`` naming ``option`` and ``path`` when the file ``path`` cannot be written (its directory is
    made if missing)."""
    p = Path(path).expanduser()
    if p.is_dir():
        why: str | None = "it is a directory"
    elif p.exists() and not os.access(p, os.W_OK):
        why = "it is not writable"
    else:
        why = _directory_problem(p.parent)
    if why is not None:
        raise ValueError(f"{option}: cannot write {os.fspath(path)!r}: {why}")
