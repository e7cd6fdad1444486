"""gmm_kernels: one adapter per real grouped-GEMM kernel, and the resolver that finds them.

Each adapter runs a kernel on its convention's arguments (as
``gmm_ref.arguments(problem)`` gives them) and returns NumPy, says whether it
can run here (:meth:`~gmm_kernels.base.KernelAdapter.available`) and whether it
takes a problem (:meth:`~gmm_kernels.base.KernelAdapter.supports`).
``import gmm_kernels`` imports neither jax nor torch.

>>> import gmm_kernels
>>> [a.name for a in gmm_kernels.registry()]  # doctest: +SKIP
>>> gmm_kernels.get("megablox.gmm").run(problem)  # doctest: +SKIP
>>> gmm_kernels.resolve_kernel("my_pkg.moe:gmm", convention="megablox.gmm")  # doctest: +SKIP
"""

from __future__ import annotations

from gmm_kernels.base import KernelAdapter, KernelExit
from gmm_kernels.registry import get, names, registry
from gmm_kernels.resolve import configure, load_object, resolve_kernel, resolve_kernels
from gmm_kernels.results import Report, Result, Status
from gmm_kernels.scope import KnownIssue, Limits, Scope, declare
from gmm_kernels.user import FunctionAdapter, wrap

__all__ = [
    "FunctionAdapter",
    "KernelAdapter",
    "KernelExit",
    "KnownIssue",
    "Limits",
    "Report",
    "Result",
    "Scope",
    "Status",
    "configure",
    "declare",
    "get",
    "load_object",
    "names",
    "registry",
    "resolve_kernel",
    "resolve_kernels",
    "wrap",
]
