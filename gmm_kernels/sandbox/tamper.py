"""Tamper evidence: what a kernel's call changed outside its own arguments (:func:`watched`).

The harness judges a kernel in the process that runs it, with functions the kernel could reach: gmm_ref's
comparison, NumPy, torch's tensor methods. A call that replaces one of them (``numpy.allclose = lambda *a: True``,
``gmm_ref.assert_matches_reference`` patched, ``torch.Tensor.cpu`` swapped), or that leaves a thread or a child
process running when it returns (an output finished behind the harness's back, a result written later), is
reported as a failure naming what it changed, kind ``"tampered"``; the replaced functions are put back, so the
checks after it judge with the harness's own.

What is watched: every callable and class bound in the modules that judge (gmm_ref, ``property_tests.checks``,
``gmm_kernels.sandbox``, ``gmm_kernels.base`` and ``.results``, golden), the contents of the classes they define
(a name added to one too), the code and defaults of their functions (a function whose ``__code__`` was swapped
is still the same object), and the callables of ``builtins``, ``math``, ``numpy`` (with ``numpy.testing``),
``torch`` (with ``torch.testing`` and the methods of ``torch.Tensor``), ``jax`` and ``jax.numpy``, as the call found
them; names the call adds to a module (a submodule imported) are not changes, nor is a change to the watch's own
list of what it watches left unnoticed. What is not: a change made before the first call (at the kernel module's
import), state that is not a callable (a setting, a cache), anything in native code, and a kernel that rewrites
this module's own code. docs/threat-model.md says what this leaves open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

from gmm_ref import Mismatch

__all__ = ["sealed", "watched"]

#: the harness's modules that judge (the reference and comparison, the checks, the call sandbox, the results)
_PREFIXES = ("gmm_ref", "property_tests.checks", "gmm_kernels.sandbox", "golden")
_MODULES = ("gmm_kernels.base", "gmm_kernels.results", "builtins", "math", "numpy", "numpy.testing", "torch",
            "torch.testing", "jax", "jax.numpy")
#: namespaces the watch cannot do without: a cached list that lacks one was emptied from inside
_ANCHORS = ("gmm_ref", "gmm_ref.compare", "gmm_kernels.sandbox.tamper", "numpy")
_MAX_LISTED = 6
_STATE = threading.local()  # depth: inside a watched call


@dataclasses.dataclass
class _Watch:
    """What is watched, found again only when a module was imported since: (label, owner, namespace) of the
    modules and of the classes the harness's modules define (and ``torch.Tensor``), and (label, function) of the
    functions among them, whose code and defaults must stay theirs."""

    modules: int = -1
    spaces: list[tuple[str, Any, Any]] = dataclasses.field(default_factory=list)
    functions: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
    most: int = 0


_WATCH = _Watch()


def _ours(name: str) -> bool:
    return name.startswith(_PREFIXES) or name in ("gmm_kernels.base", "gmm_kernels.results")


def _find() -> None:
    spaces: list[tuple[str, Any, Any]] = []
    functions: list[tuple[str, Any]] = []
    for n, m in list(sys.modules.items()):
        if m is None or not (n in _MODULES or _ours(n)):
            continue
        spaces.append((n, m, m.__dict__))
        if not _ours(n):
            continue
        for attr, v in list(m.__dict__.items()):
            if isinstance(v, types.FunctionType) and v.__module__ == n:
                functions.append((f"{n}.{attr}", v))
            elif isinstance(v, type) and v.__module__ == n:
                spaces.append((f"{n}.{attr}", v, v.__dict__))
                functions += [(f"{n}.{attr}.{k}", f) for k, f in list(v.__dict__.items())
                              if isinstance(f, types.FunctionType)]
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    if isinstance(tensor, type):
        spaces.append(("torch.Tensor", tensor, tensor.__dict__))
    _WATCH.modules, _WATCH.spaces, _WATCH.functions = len(sys.modules), spaces, functions
    _WATCH.most = max(_WATCH.most, len(spaces))


def _watch() -> tuple[list[tuple[str, Any, Any]], list[tuple[str, Any]]]:
    """(namespaces, functions) watched now: found again where a module was imported since, or where the list
    lacks what it cannot do without (emptied from outside a watched call)."""
    held = {id(ns) for _, _, ns in _WATCH.spaces}
    if _WATCH.modules != len(sys.modules) or len(_WATCH.spaces) < _WATCH.most or any(
            id(sys.modules[a].__dict__) not in held for a in _ANCHORS if a in sys.modules):
        _find()
    return list(_WATCH.spaces), list(_WATCH.functions)


def _code(fn: Any) -> tuple[Any, Any, Any]:
    return fn.__code__, fn.__defaults__, fn.__kwdefaults__


#: the pids of the harness's own child processes (kernel hosts), which a call may start or leave behind
_EXEMPT: set[int] = set()


def exempt(pid: int) -> None:
    """Count the child process ``pid`` as the harness's own (a kernel's host process, started again during a call
    after a crash): never as one the kernel started."""
    _EXEMPT.add(pid)


def _children() -> set[int]:
    """The pids of this process's children (Linux ``/proc``; empty elsewhere), but for the harness's own kernel
    hosts (``gmm_kernels.sandbox.host``: one started again during a call is the harness's, not the kernel's)."""
    pids: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
    except OSError:
        pass
    return pids - _EXEMPT


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


_READY: set[str] = set()


def _runtimes_ready() -> None:
    """Start what the harness's own conversions start on first use, before a call is watched: jax's backends (their
    first use starts a timer thread, which would count as the kernel's)."""
    if "jax" in sys.modules and "jax" not in _READY:
        _READY.add("jax")
        with contextlib.suppress(Exception):  # no backend: the call's own error says so
            sys.modules["jax"].devices()


@contextlib.contextmanager
def watched(kernel: str) -> Iterator[None]:
    """One call of ``kernel``: on leaving, ``gmm_ref.Mismatch`` (kind ``"tampered"``) naming every watched function
    it replaced or rewrote (each put back) and every thread or child process it started that is still running (a
    process is killed). Nested calls are watched by the outermost."""
    if getattr(_STATE, "depth", 0):
        yield
        return
    _runtimes_ready()
    spaces, functions = _watch()
    before = [(name, owner, ns, dict(ns)) for name, owner, ns in spaces]
    watch = (_WATCH.spaces, _WATCH.functions)
    codes = [_code(f) for _, f in functions]
    threads = set(threading.enumerate())
    children = _children()
    _STATE.depth = 1
    try:
        yield
    finally:
        _STATE.depth = 0
        lines = []
        if _WATCH.spaces is not watch[0] or _WATCH.functions is not watch[1] or \
                (len(_WATCH.spaces), len(_WATCH.functions)) != (len(spaces), len(functions)):  # put them back
            _WATCH.spaces, _WATCH.functions = spaces, functions
            lines.append("changed the harness's own list of what it watches (put back)")
        _check(kernel, before, functions, codes, threads, children, lines)


def _check(kernel: str, before: list[tuple[str, Any, Any, dict[str, Any]]], functions: list[tuple[str, Any]],
           codes: list[tuple[Any, Any, Any]], threads: set[threading.Thread], children: set[int],
           lines: list[str]) -> None:
    __tracebackhide__ = True
    for name, owner, ns, was in before:
        changed = _replaced(was, ns)
        for attr in changed:
            with contextlib.suppress(Exception):  # put the harness's own back
                setattr(owner, attr, was[attr])
        lines += [f"replaced {name}.{attr} (put back)" for attr in changed]
        if isinstance(owner, type):  # a name added to a class shadows what its instances hold
            added = [attr for attr in list(ns) if attr not in was]
            for attr in added:
                with contextlib.suppress(Exception):
                    delattr(owner, attr)
            lines += [f"added {name}.{attr} (taken away)" for attr in added]
    for (label, fn), code in zip(functions, codes, strict=True):
        if any(now is not then for now, then in zip(_code(fn), code, strict=True)):
            fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code
            lines.append(f"rewrote the code of {label} (put back)")
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
