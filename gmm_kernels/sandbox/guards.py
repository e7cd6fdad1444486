"""Guard regions: every buffer the harness gives a kernel sits inside a larger allocation with poisoned margins.

A kernel's operands (``gmm_kernels.sandbox.inputs.fresh``), the output buffer of a convention whose kernels write in
place (``Convention.out_argument``) and the outputs an adapter allocates itself (:func:`torch_empty`) are plain NumPy
views into the middle of a larger 1-d base array (torch tensors made from them share that memory, strides kept).
Its margins, :func:`margin_elements` elements before and after the buffer, hold

- NaN for a float dtype (bfloat16 and the float8 dtypes through ml_dtypes: their NaN code), so a read past an
  operand poisons what it reaches;
- the byte pattern ``0xA5`` (:data:`SENTINEL`) for integers, booleans and the float formats with no NaN
  (float4/float6): int32 ``-1515870811``.

After the call the margins are compared bit for bit with what was written there: a change is a write out of bounds,
reported naming the buffer (``wrote 16 elements past the end of C``; :meth:`Call.check`). A read past an operand is
told by the result: ``KernelAdapter.guarded_reads`` reruns a failing example with one operand's margins made
neutral (zeros) and blames the operand whose margins changed the failing elements. The margins travel with the base:
a copy of a view's whole base buffer to a device (viewed the same way there) keeps them.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gmm_kernels.sandbox import recycle
from gmm_ref import Mismatch

__all__ = ["MARGIN_MAX_BYTES", "MARGIN_MIN_BYTES", "MARGIN_ROWS", "SENTINEL", "Call", "Guard", "call", "current",
           "margin_elements", "neutral", "torch_empty"]

#: at least 16 KiB of margin on each side ...
MARGIN_MIN_BYTES = 16 * 1024
#: ... and 128 rows (of a matrix: its largest stride; of a stack of matrices: its second largest) beyond one whole
#: matrix of a stack (its largest stride): a whole tile read or written past the end, or a whole group past the
#: last and a tile of the next, e.g. ``mat_a[G]`` ...
MARGIN_ROWS = 128
#: ... but no more than 8 MiB a side (the large mode's operands)
MARGIN_MAX_BYTES = 8 * 1024 * 1024
#: the byte the margins of integer (and NaN-less) buffers hold
SENTINEL = 0xA5
_ALIGN = 512  # the buffer starts as aligned as the base allocation (torch, Triton and vector loads want 16 bytes)


def margin_elements(x: np.ndarray) -> int:
    """The margin on each side of a guarded copy of ``x``, in elements of its dtype: ``MARGIN_ROWS`` of its largest
    stride (a vector's elements, a matrix's rows), and for a stack of matrices (three dimensions or more) its largest
    stride (one whole matrix) plus ``MARGIN_ROWS`` of its second largest (rows); at least ``MARGIN_MIN_BYTES`` and at
    most ``MARGIN_MAX_BYTES``, rounded up to 512 bytes. (128 whole matrices of a stack, as before, gave a few
    hundred KiB of groups 8 MiB a side, and filling and comparing them was half of such a check's time.)"""
    item = max(x.dtype.itemsize, 1)
    strides = sorted((abs(s) for s in x.strides if abs(s) > 0), reverse=True) or [item]
    if x.ndim >= 3 and len(strides) >= 2:
        want = strides[0] + MARGIN_ROWS * strides[1]
    else:
        want = MARGIN_ROWS * strides[0]
    want = min(max(want, MARGIN_MIN_BYTES), MARGIN_MAX_BYTES)
    want = -(-want // _ALIGN) * _ALIGN
    return -(-want // item)


def _fill(dtype: np.dtype) -> tuple[np.ndarray, str]:
    """One element of ``dtype``'s margin and how the report calls it ("NaN" or "sentinel")."""
    if dtype.kind in "fV" and dtype.fields is None:
        with contextlib.suppress(TypeError, ValueError), np.errstate(invalid="ignore"):
            nan = np.array(np.nan, np.float32).astype(dtype)
            if np.isnan(nan.astype(np.float32)):
                return nan.reshape(1), "NaN"
    return np.frombuffer(bytes([SENTINEL]) * dtype.itemsize, dtype=dtype)[:1].copy(), "sentinel"


@dataclass
class Guard:
    """One guarded buffer: ``base[lo:hi]`` holds the buffer (a view's whole owner), the rest are margins."""

    name: str
    base: np.ndarray
    lo: int
    hi: int
    fill: np.ndarray
    poison: str  # "NaN" or "sentinel"
    neutral: tuple[str, ...] = ()  # the margins ("before", "after") filled with zeros instead


    def changes(self) -> list[str]:
        """The report's lines for margins that no longer hold their fill: before the start, past the end."""
        width = self.base.dtype.itemsize
        view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(width)
        base = self.base.view(view) if view is not None else self.base
        fill = self.fill.view(view) if view is not None else self.fill
        lines = []
        zero = np.zeros(1, base.dtype)
        before = np.flatnonzero(base[:self.lo] != (zero if "before" in self.neutral else fill)[0])
        if before.size:
            far = self.lo - int(before[0])
            lines.append(f"wrote {far} element{'s' * (far != 1)} before the start of {self.name}"
                         + (f" ({before.size} of them changed)" if before.size != far else ""))
        after = np.flatnonzero(base[self.hi:] != (zero if "after" in self.neutral else fill)[0])
        if after.size:
            far = int(after[-1]) + 1
            lines.append(f"wrote {far} element{'s' * (far != 1)} past the end of {self.name}"
                         + (f" ({after.size} of them changed)" if after.size != far else ""))
        return lines


#: the buffers whose margins (``"before"``, ``"after"``) guarded calls fill with zeros (``KernelAdapter.guarded_reads``)
_NEUTRAL: contextvars.ContextVar[dict[str, tuple[str, ...]] | None] = contextvars.ContextVar("gmm_guards_neutral",
                                                                                             default=None)
_CURRENT: contextvars.ContextVar[Call | None] = contextvars.ContextVar("gmm_guards_call", default=None)


@dataclass
class Call:
    """The guarded buffers of one kernel call."""

    kernel: str
    guards: list[Guard] = field(default_factory=list)

    def copy(self, name: str, x: np.ndarray) -> np.ndarray:
        """A writable copy of ``x`` with the same memory layout (a view into a wider buffer: a copy of that whole
        buffer viewed the same way, as ``gmm_kernels.sandbox.inputs`` copies) inside a guarded base."""
        owner = x
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        if x.size == 0:
            return np.array(x, copy=True, order="K")
        src = x if owner is x or x.flags.c_contiguous or x.flags.f_contiguous else owner
        if not (src.flags.c_contiguous or src.flags.f_contiguous):  # an odd owner (negative strides, ...)
            src = x = np.array(x, copy=True, order="K")
        base, lo, _ = self._base(name, src.size, src.dtype, src)
        body = base[lo:lo + src.size]  # src copied straight in, in its own memory order (no second copy of it)
        inner = body.reshape(src.shape) if src.flags.c_contiguous else body.reshape(src.shape[::-1]).T
        inner[...] = src
        if src is x:
            return inner
        offset = x.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
        return np.ndarray(x.shape, x.dtype, buffer=base, offset=lo * x.itemsize + offset, strides=x.strides)

    def empty(self, name: str, shape: tuple[int, ...], dtype: Any,
              strides: tuple[int, ...] | None = None) -> np.ndarray:
        """A buffer of ``shape`` (zeros; ``strides`` in elements, else C-contiguous) inside a guarded base."""
        dtype = np.dtype(dtype)
        if strides is None:
            strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))
        n = 0 if 0 in shape else 1 + sum((d - 1) * st for d, st in zip(shape, strides, strict=True))
        probe = np.lib.stride_tricks.as_strided(np.empty(1, dtype), (1,) * len(shape),
                                                tuple(st * dtype.itemsize for st in strides))
        base, lo, reused = self._base(name, n, dtype, probe)
        if not reused:  # a recycled buffer keeps what the previous call left in it
            base[lo:lo + n] = np.zeros((), dtype)
        return np.ndarray(shape, dtype, buffer=base, offset=lo * dtype.itemsize,
                          strides=tuple(st * dtype.itemsize for st in strides))

    def _base(self, name: str, n: int, dtype: np.dtype, like: np.ndarray) -> tuple[np.ndarray, int, bool]:
        """(the guarded base of a buffer of ``n`` elements, where the buffer starts in it, whether it is an earlier
        call's, ``recycle.recycling``), its margins filled."""
        margin = margin_elements(like)
        fill, poison = _fill(dtype)
        sides = (_NEUTRAL.get() or {}).get(name, ())
        zero = np.zeros((), dtype)
        pool = recycle.pool()
        key = (name, dtype.str, n, margin)
        base = pool.get(key) if pool is not None else None
        reused = base is not None
        if base is None:
            base = np.empty(2 * margin + n, dtype)
            if pool is not None:
                pool[key] = base
        base[:margin] = zero if "before" in sides else fill[0]
        base[margin + n:] = zero if "after" in sides else fill[0]
        self.guards.append(Guard(name, base, margin, margin + n, fill, poison, sides))
        return base, margin, reused

    def names(self) -> list[str]:
        return [g.name for g in self.guards]

    def check(self) -> None:
        """Raise ``gmm_ref.Mismatch`` (kind ``"wrote_out_of_bounds"``) if a margin changed."""
        __tracebackhide__ = True
        lines = [line for g in self.guards for line in g.changes()]
        if lines:
            raise Mismatch(f"kernel {self.kernel} wrote out of bounds (into the guard region around a buffer the "
                           "harness gave it):\n" + "\n".join("  " + ln for ln in lines), kind="wrote_out_of_bounds")


@contextlib.contextmanager
def call(kernel: str) -> Iterator[Call]:
    """The guarded buffers of one call of ``kernel``; outputs an adapter allocates with :func:`torch_empty` inside
    it join them."""
    c = Call(kernel)
    token = _CURRENT.set(c)
    try:
        yield c
    finally:
        _CURRENT.reset(token)


def current() -> Call | None:
    """The call being made, else None."""
    return _CURRENT.get()


@contextlib.contextmanager
def neutral(sides: dict[str, tuple[str, ...]]) -> Iterator[None]:
    """Calls made inside fill these margins (``{"mat_a": ("before", "after")}``) with zeros instead of their poison."""
    token = _NEUTRAL.set(dict(sides))
    try:
        yield
    finally:
        _NEUTRAL.reset(token)


def torch_empty(name: str, shape: Any, dtype: Any, strides: Any = None) -> Any:
    """A CPU torch tensor of ``shape``, torch ``dtype`` and ``strides`` (zeros) inside a guarded base while a guarded
    call is being made (its margins are checked after the call, named ``name``); else ``torch.empty_strided``."""
    import torch

    from gmm_kernels.sandbox.convert import to_torch
    from gmm_ref.dtypes import as_numpy

    shape = tuple(int(s) for s in shape)
    strides = None if strides is None else tuple(int(s) for s in strides)
    c = current()
    if c is None:
        return torch.empty(shape, dtype=dtype) if strides is None else torch.empty_strided(shape, strides, dtype=dtype)
    return to_torch(c.empty(name, shape, as_numpy(torch.empty(0, dtype=dtype)).dtype, strides))
