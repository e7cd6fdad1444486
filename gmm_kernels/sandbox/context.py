"""The one guarded-call context every caller of a kernel runs it in: :func:`guarded_arguments`.

Fresh copies of the arguments, each inside a guarded base (``guards``: poisoned margins), so that the kernel can
neither change the pristine arguments the reference was computed from nor write past a buffer unseen; device
copies written back into the host copies after the call (``convert.written_back``); then the guard regions and the
inputs checked (``inputs.modified``). A grouped call (``KernelAdapter.arguments``), a routed one
(``RoutedKernelAdapter.run``) and a gradient (``KernelAdapter.vjp``) all take their arguments from it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from gmm_kernels.sandbox import convert, guards, inputs

__all__ = ["guarded_arguments"]


@contextlib.contextmanager
def guarded_arguments(name: str, convention: Any, pristine: tuple[tuple, dict],
                      before: Callable[[], None] = lambda: None) -> Iterator[tuple[tuple, dict]]:
    """Guarded fresh copies ``(args, kwargs)`` of ``pristine`` (a convention's arguments) for one call of the kernel
    ``name``; ``before()`` runs once they are made, before the call. On leaving, ``gmm_ref.Mismatch`` if the kernel
    wrote past a buffer into its guard region or changed any of its inputs; where they were given to the kernel as
    device tensors (``convert.device_copy``: a view's whole guarded base travels), what those hold after the call is
    copied back into the host copies first, and both checks look there."""
    with guards.call(name) as call:
        given = inputs.fresh(*pristine, convention=convention, guard=call)
        before()
        with convert.written_back():
            yield given
    call.check()
    inputs.modified(name, convention, pristine, given)
