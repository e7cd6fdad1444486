"""Graph safety: one compiled program must serve every group-size vector of a shape.

Group sizes are device data in an MoE layer (the router computes them inside
the step), so a kernel that bakes them in as static values recompiles, or
syncs to the host, at every step. :class:`CompileCounter` counts XLA backend
compilations, jaxpr traces and executables loaded from the harness's cache
(``gmm_kernels.runtimes.executables``, which neither traces nor compiles) through jax's
public monitoring events; :func:`assert_compiles_once` calls a function on
several size vectors and raises :class:`Recompiled` if any call after the first
compiled, traced or loaded anything.

Imports jax only when used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gmm_kernels.runtimes.executables import LOAD_EVENT as EXECUTABLE_LOAD_EVENT

__all__ = ["BACKEND_COMPILE_EVENT", "EXECUTABLE_LOAD_EVENT", "JAXPR_TRACE_EVENT", "CompileCounter", "Recompiled",
           "assert_compiles_once"]

# the event names jax 0.10.2 records (jax/_src/dispatch.py) through jax.monitoring
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
JAXPR_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"


class Recompiled(AssertionError):
    """A function compiled again for a new group-size vector of the same shape."""


class CompileCounter:
    """Context manager counting backend compilations, jaxpr traces and executables loaded from the harness's
    cache while active.

    >>> with CompileCounter() as c:  # doctest: +SKIP
    ...     f(x)
    >>> c.compiles, c.traces, c.loads  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self.compiles = 0
        self.traces = 0
        self.loads = 0

    def _listener(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == BACKEND_COMPILE_EVENT:
            self.compiles += 1
        elif event == JAXPR_TRACE_EVENT:
            self.traces += 1
        elif event == EXECUTABLE_LOAD_EVENT:
            self.loads += 1

    def __enter__(self) -> CompileCounter:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc: Any) -> None:
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self._listener)


def assert_compiles_once(fn: Callable[..., Any], make_args: Callable[[np.ndarray], tuple],
                         size_vectors: Sequence[Any], *, name: str = "kernel",
                         check: Callable[[np.ndarray, Any, Any], None] | None = None) -> list[Any]:
    """Call ``fn(*make_args(sizes))`` for each size vector; only the first call may compile (or trace, or load
    an executable from the harness's cache).

    ``make_args`` builds the arguments (group sizes as a device array) outside
    the counted region. ``check(sizes, output, args)``, if given, checks each
    output. Returns the outputs; raises :class:`Recompiled` naming the size
    vectors whose call compiled (or traced) again.
    """
    __tracebackhide__ = True
    import jax

    if len(size_vectors) < 2:
        raise ValueError("size_vectors: need at least two to show that a compilation is reused")
    outs, offenders = [], []
    for i, sizes in enumerate(size_vectors):
        args = make_args(np.asarray(sizes))
        jax.block_until_ready(args)
        with CompileCounter() as c:
            out = jax.block_until_ready(fn(*args))
        if i and (c.compiles or c.traces or c.loads):
            offenders.append((np.asarray(sizes).tolist(), c.compiles, c.traces, c.loads))
        if check is not None:
            check(np.asarray(sizes), out, args)
        outs.append(out)
    if offenders:
        lines = [f"{name} is not graph-safe: group sizes are baked into the compiled program.",
                 f"The first call compiled for group sizes {np.asarray(size_vectors[0]).tolist()}; "
                 "later calls with the same shapes compiled again:"]
        lines += [f"  group_sizes={s}: {nc} backend compilation(s), {nt} jaxpr trace(s)"
                  + (f", {nl} executable(s) loaded from the harness's cache" if nl else "")
                  for s, nc, nt, nl in offenders]
        raise Recompiled("\n".join(lines))
    return outs
