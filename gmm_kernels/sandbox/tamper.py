"""Tamper evidence: what a kernel's call changed outside its own arguments (:func:`watched`).

The harness judges a kernel in the process that runs it, with functions the kernel could reach: gmm_ref's
comparison, NumPy, torch's tensor methods. A call that replaces one of them (``numpy.allclose = lambda *a: True``,
``gmm_ref.assert_matches_reference`` patched, ``torch.Tensor.cpu`` swapped), or that leaves a thread or a child
process running when it returns (an output finished behind the harness's back, a result written later), is
reported as a failure naming what it changed, kind ``"tampered"``; the replaced functions are put back, so the
checks after it judge with the harness's own.

What is watched: every callable and class bound in the modules that judge (gmm_ref, ``property_tests.checks``,
``gmm_kernels.sandbox``, ``gmm_kernels.base`` and ``.results``, golden), and in ``builtins``, ``math``, ``numpy``
(with ``numpy.testing``), ``torch`` (with ``torch.testing`` and the methods of ``torch.Tensor``), ``jax`` and
``jax.numpy``, as the call found them; names the call adds (a submodule imported) are not changes. What is not: a
change made before the first call (at the kernel module's import), state that is not a module's callable (a
setting, a cache), and anything in native code. docs/threat-model.md says what this leaves open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from gmm_ref import Mismatch

__all__ = ["sealed", "watched"]

#: the harness's modules that judge (the reference and comparison, the checks, the call sandbox, the results)
_PREFIXES = ("gmm_ref", "property_tests.checks", "gmm_kernels.sandbox", "golden")
_MODULES = ("gmm_kernels.base", "gmm_kernels.results", "builtins", "math", "numpy", "numpy.testing", "torch",
            "torch.testing", "jax", "jax.numpy")
_MAX_LISTED = 6
_STATE = threading.local()  # depth: inside a watched call
_CACHE: dict[str, Any] = {"modules": -1, "spaces": []}


def _namespaces() -> list[tuple[str, Any]]:
    """(name, namespace) of everything watched that is loaded now: module dicts and ``torch.Tensor``'s (found
    again only when a module was imported since)."""
    if _CACHE["modules"] != len(sys.modules):
        out = [(n, m.__dict__) for n, m in list(sys.modules.items())
               if m is not None and (n in _MODULES or n.startswith(_PREFIXES))]
        torch = sys.modules.get("torch")
        tensor = getattr(torch, "Tensor", None)
        if isinstance(tensor, type):
            out.append(("torch.Tensor", tensor.__dict__))
        _CACHE.update(modules=len(sys.modules), spaces=out)
    return _CACHE["spaces"]


def _children() -> set[int]:
    """The pids of this process's children (Linux ``/proc``; empty elsewhere)."""
    pids: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
    except OSError:
        pass
    return pids


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120] or "?"
    except OSError:
        return "?"


def _replaced(before: dict[str, Any], now: Any) -> list[str]:
    """The callables and classes of ``before`` that ``now`` (the same namespace after the call) binds to another
    object or no longer has."""
    with contextlib.suppress(Exception):  # a value compared elementwise (an array rebound) takes the slow path
        if before == now:
            return []
    missing = object()
    return [k for k, v in before.items() if (callable(v) or isinstance(v, type)) and now.get(k, missing) is not v]


@contextlib.contextmanager
def watched(kernel: str) -> Iterator[None]:
    """One call of ``kernel``: on leaving, ``gmm_ref.Mismatch`` (kind ``"tampered"``) naming every watched function
    it replaced (each put back) and every thread or child process it started that is still running (a process is
    killed). Nested calls are watched by the outermost."""
    if getattr(_STATE, "depth", 0):
        yield
        return
    spaces = _namespaces()
    before = [(name, ns, dict(ns)) for name, ns in spaces]
    threads = set(threading.enumerate())
    children = _children()
    _STATE.depth = 1
    try:
        yield
    finally:
        _STATE.depth = 0
        _check(kernel, before, threads, children)


def _check(kernel: str, before: list[tuple[str, Any, dict[str, Any]]], threads: set[threading.Thread],
           children: set[int]) -> None:
    __tracebackhide__ = True
    lines = []
    for name, ns, was in before:
        changed = _replaced(was, ns)
        for attr in changed:
            owner = sys.modules.get(name)
            target = owner if owner is not None and owner.__dict__ is ns else sys.modules["torch"].Tensor
            with contextlib.suppress(Exception):  # put the harness's own back
                setattr(target, attr, was[attr])
        lines += [f"replaced {name}.{attr} (put back)" for attr in changed]
    lines += [f"started thread {t.name!r} ({'daemon' if t.daemon else 'not daemon'}), still running after the call"
              for t in threading.enumerate() if t not in threads and t.is_alive()]
    for pid in sorted(_children() - children):
        lines.append(f"started process {pid} ({_command(pid)}), still running after the call (killed)")
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
    if lines:
        shown = lines[:_MAX_LISTED] + ([f"... and {len(lines) - _MAX_LISTED} more"] if len(lines) > _MAX_LISTED else [])
        raise Mismatch(f"kernel {kernel} tampered with the harness during its call: " + "; ".join(shown)
                       + "\n(a kernel must change nothing but its output; docs/threat-model.md)", kind="tampered")


def _digest(obj: Any) -> str:
    """A digest of every array among ``obj``'s dataclass fields (a problem, a routing; nested ones too)."""
    h = hashlib.blake2b(digest_size=16)

    def add(value: Any) -> None:
        if isinstance(value, np.ndarray):
            h.update(str((value.shape, value.dtype.str)).encode())
            h.update(np.ascontiguousarray(value).view(np.uint8).reshape(-1).data if value.size else b"")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                add(getattr(value, f.name, None))
        elif isinstance(value, (tuple, list)):
            for v in value:
                add(v)

    add(obj)
    return h.hexdigest()


@contextlib.contextmanager
def sealed(problem: Any, kernel: str) -> Iterator[None]:
    """The harness's own ``problem`` (or routing), from which the expected answer is computed once the kernel has
    returned, must come out of the block as it went in: ``gmm_ref.Mismatch`` (kind ``"tampered"``) if the kernel
    reached it (through the caller's frames, say) and changed it, so that a reference computed from it would agree
    with a wrong output."""
    __tracebackhide__ = True
    before = _digest(problem)
    yield
    if _digest(problem) != before:
        raise Mismatch(f"kernel {kernel} tampered with the harness during its call: changed the harness's own copy "
                       "of the problem (from which the expected answer is computed after the call)\n"
                       "(a kernel must change nothing but its output; docs/threat-model.md)", kind="tampered")
