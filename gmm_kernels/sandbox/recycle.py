"""Calls in the same buffers: :func:`recycling`.

A kernel normally gets fresh guarded copies of its arguments at new addresses (``guards``, ``convert``). Inside
:func:`recycling`, every call gets the buffers the first call made, at the same addresses (on a device, the same
device copies), with its own contents written in; a buffer the harness allocates for the kernel's output keeps what
the previous call left there. So a kernel that keeps a result by its buffers' addresses, or leaves part of its
output unwritten, gets the previous call's answer back on every run, not only when an allocator happens to hand out
an address again. The graph mode makes its calls so, and its reproducers too.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

__all__ = ["pool", "recycling"]

#: while :func:`recycling`: the guarded bases made so far, by (name, dtype, length, margin), and the device copies
#: of host buffers (``convert.device_copy``), by ("device", id of the host buffer, device)
_POOL: contextvars.ContextVar[dict[Any, Any] | None] = contextvars.ContextVar("gmm_recycle_pool", default=None)


@contextlib.contextmanager
def recycling() -> Iterator[None]:
    """Calls made inside get the same buffers as the first call that made a buffer of the same name, dtype and size
    (see the module's docstring)."""
    token = _POOL.set({})
    try:
        yield
    finally:
        _POOL.reset(token)


def pool() -> dict[Any, Any] | None:
    """The buffers of the current :func:`recycling` block (None outside one)."""
    return _POOL.get()
