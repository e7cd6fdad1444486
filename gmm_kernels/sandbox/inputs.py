"""A kernel gets copies of its inputs, and writing to them is a reported failure (but for the output buffer of a
convention whose kernels write their result in place, ``Convention.out_argument``).

The harness keeps its own pristine arrays (a ``gmm_ref.Problem`` holds
read-only copies) and hands a kernel fresh, writable copies. After the call
each copy is compared bit for bit with the pristine array: a kernel that wrote
to an input, even after computing its output, is reported naming the argument
and the first changed elements. A jax kernel that donates an input (its buffer
is deleted by the call) is reported as well.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from gmm_kernels.sandbox import guards
from gmm_ref import Mismatch
from gmm_ref.conventions import Convention

__all__ = ["donated", "fresh", "modified"]

_MAX_LISTED = 4


def _copy(x: Any) -> Any:
    """A writable copy with the same memory layout: the same strides, and for a view into a wider
    buffer (a slice, a chunk of a split) a copy of that whole buffer viewed the same way. A named tuple
    of arrays (a quantized operand's codes and scales) is copied field by field."""
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_copy(v) for v in x))
    if not isinstance(x, np.ndarray):
        return x
    owner = x
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    if owner is x or x.flags.c_contiguous or x.flags.f_contiguous or x.size == 0:
        return np.array(x, copy=True, order="K")
    buf = np.array(owner, copy=True, order="K")
    offset = x.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
    return np.ndarray(x.shape, x.dtype, buffer=buf, offset=offset, strides=x.strides)


def fresh(args: tuple, kwargs: dict, *, convention: Convention | None = None,
          guard: guards.Call | None = None) -> tuple[tuple, dict]:
    """Writable copies of every array among the arguments (same layout), other values as they are. With ``guard``
    (and the ``convention`` that names the arguments) each copy sits inside a guarded base
    (``gmm_kernels.sandbox.guards``), named as the reports name it (``mat_a``, ``lhs.scale``)."""
    if guard is None or convention is None:
        return tuple(_copy(a) for a in args), {k: _copy(v) for k, v in kwargs.items()}
    params = list(inspect.signature(convention.parse).parameters)

    def one(name: str, x: Any) -> Any:
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(one(f"{name}.{f}", v) for f, v in zip(x._fields, x, strict=True)))
        return guard.copy(name, x) if isinstance(x, np.ndarray) else x

    return (tuple(one(params[i] if i < len(params) else f"argument {i}", a) for i, a in enumerate(args)),
            {k: one(k, v) for k, v in kwargs.items()})


def _names(convention: Convention, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    params = list(inspect.signature(convention.parse).parameters)
    named = [(params[i] if i < len(params) else f"argument {i}", a) for i, a in enumerate(args)]
    out = []
    for name, value in named + list(kwargs.items()):
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # e.g. lhs.qvalue, lhs.scale
            out += [(f"{name}.{f}", v) for f, v in zip(value._fields, value, strict=True)]
        else:
            out.append((name, value))
    return out


def _changed(name: str, before: np.ndarray, after: np.ndarray) -> str | None:
    if before.shape != after.shape or before.dtype != after.dtype:
        return f"{name} (now shape {after.shape} {after.dtype}, was {before.shape} {before.dtype})"
    width = before.dtype.itemsize
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(width)
    if view is None:
        diff = before.tobytes() != after.tobytes()
        return f"{name} (its bytes differ)" if diff else None
    bad = np.ascontiguousarray(before).view(view) != np.ascontiguousarray(after).view(view)
    if not bad.any():
        return None
    idx = np.argwhere(bad)[:_MAX_LISTED]
    where = ", ".join(f"{list(map(int, i))}: {after[tuple(i)].item()!r} (was {before[tuple(i)].item()!r})"
                      for i in idx)
    return f"{name}: {int(bad.sum())} of {bad.size} elements changed, first at {where}"


def modified(kernel: str, convention: Convention, pristine: tuple[tuple, dict], given: tuple[tuple, dict]) -> None:
    """Raise ``gmm_ref.Mismatch`` (kind ``"modified_input"``) if the kernel changed an array it was given."""
    __tracebackhide__ = True
    before = [(name, b) for name, b in _names(convention, *pristine) if name != convention.out_argument]
    after = dict(_names(convention, *given))
    changes = [c for name, b in before if isinstance(b, np.ndarray)
               and (c := _changed(name, b, np.asarray(after[name]))) is not None]
    if changes:
        raise Mismatch(f"kernel {kernel} modified its input in place (a kernel must not write to its inputs):\n"
                       + "\n".join("  " + c for c in changes), kind="modified_input")


def donated(kernel: str, convention: Convention, args: tuple, kwargs: dict) -> None:
    """Raise ``gmm_ref.Mismatch`` (kind ``"donated_input"``) if a call deleted a jax array it was given."""
    __tracebackhide__ = True
    gone = [name for name, a in _names(convention, args, kwargs)
            if callable(getattr(a, "is_deleted", None)) and a.is_deleted()]
    if gone:
        raise Mismatch(f"kernel {kernel} donated its input {', '.join(gone)}: the call deleted the jax buffer "
                       "it was given (a kernel checked here must leave its inputs alive)", kind="donated_input")
