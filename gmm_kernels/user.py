"""Wrap an arbitrary user kernel function as an adapter for a convention.

The function receives the convention's arguments converted to the
convention's framework (``gmm_ref.conventions.get(name).framework``): jax
arrays for the jax conventions, torch tensors for ``torch.grouped_mm``
(``out_dtype`` as a torch dtype); dimension numbers become
``jax.lax.RaggedDotDimensionNumbers``. Whatever it returns (jax array, torch
tensor, NumPy) comes back as NumPy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from gmm_kernels.base import KernelAdapter, RoutedKernelAdapter
from gmm_kernels.sandbox import inputs
from gmm_kernels.sandbox.convert import jax_primitives, jax_x64, to_framework, uses_64bit
from gmm_kernels.sandbox.host import HostedFunction
from gmm_kernels.scope import Scope
from gmm_ref import Numerics, Problem, RoutedNumerics, conventions
from gmm_ref.conventions.base import RoutedConvention

__all__ = ["FunctionAdapter", "RoutedFunctionAdapter", "wrap"]


def _interpreted_user_kernel(adapter: KernelAdapter, fn: Any) -> str | None:
    """The ``large_refusal`` of a user's function that launches Triton kernels where Triton's interpreter is in use
    (told by its own process for a hosted one): it runs interpreted, and is checked as such (fewer ``scale`` and
    ``real_k`` cells, no full-size ``large`` cell); else None."""
    from gmm_kernels.runtimes import triton_interpreter

    if isinstance(fn, HostedFunction):
        interpreted = fn.__gmm_interpreted__
    else:
        interpreted = triton_interpreter.in_use() and triton_interpreter.reaches_triton_kernels(fn)
    return adapter._runs_interpreted("Triton's interpreter", takes="days") if interpreted else None


def _tf32_default(adapter: Any, numerics: Numerics, dtype: Any) -> Numerics:
    """``numerics`` with float32 products as TF32 ones (declared as bfloat16: a sound, slightly looser bound) for
    an undeclared kernel that runs Triton: ``tl.dot``'s default input precision for float32, on a GPU as in the
    harness's interpreter (``triton_interpreter``: ``tf32_dot``). A kernel that asks for ``"ieee"`` declares its
    numerics to be held to exact products."""
    if str(dtype) != "float32" or numerics.multiply is not None or "Triton" not in (adapter.interpreted() or ""):
        return numerics
    return dataclasses.replace(numerics, multiply="bfloat16")


class FunctionAdapter(KernelAdapter):
    """An adapter around a user function ``fn`` taking ``convention``'s arguments.

    Unless ``numerics`` is given, the kernel is held to the lenient default for
    an unknown kernel: exact products (bfloat16 passes on TPU and GPU for jax
    conventions, as jax's DEFAULT precision does), the widest accumulator
    involved, subnormals possibly flushed (as XLA, GPUs and TPUs do).
    """

    flush_subnormals = True

    def __init__(self, fn: Callable[..., Any], convention: str, *, name: str | None = None,
                 numerics: Numerics | None = None, deterministic: bool = True, scope: Scope | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
        if numerics is not None and not isinstance(numerics, Numerics):
            raise TypeError(f"numerics: expected a gmm_ref.Numerics, got {type(numerics).__name__}")
        if scope is not None and not isinstance(scope, Scope):
            raise TypeError(f"scope: expected a gmm_kernels.Scope, got {type(scope).__name__}")
        self.convention = conventions.get(convention).name  # type: ignore[misc]
        self.scope = None if scope is None else scope.bind(self.convention_facts)
        self.fn = fn
        if isinstance(fn, HostedFunction):
            fn.host.convention = self.convention
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"  # type: ignore[misc]
        self.numerics = numerics
        self.deterministic = deterministic  # type: ignore[misc]
        self.default_precision = self.convention_facts.framework == "jax"  # type: ignore[misc]

    def large_refusal(self) -> str | None:
        return _interpreted_user_kernel(self, self.fn)

    def numerics_for(self, problem: Problem) -> Numerics:
        """The declared numerics, else the lenient default (see the class docstring); a Triton kernel's float32
        products are Triton's default TF32 ones (:func:`_tf32_default`)."""
        if self.numerics is not None:
            return self.numerics
        numerics = super().numerics_for(problem)
        declared = self.scope is not None and self.scope.numerics is not None
        return numerics if declared else _tf32_default(self, numerics, problem.lhs.dtype)

    def primitives(self, problem: Problem) -> frozenset[str]:
        """For a jax kernel, the primitives its jaxpr binds on ``problem``'s arguments; for a torch kernel, the
        torch operators it calls on them (``aten._grouped_mm``; ``KernelAdapter.primitives``)."""
        if isinstance(self.fn, HostedFunction):
            return self.fn.host.primitives(*inputs.fresh(*self.convention_facts.arguments(self._own(problem))))
        if self.convention_facts.framework != "jax":
            return super().primitives(problem)
        args, kwargs = self.convention_facts.arguments(self._own(problem))
        with jax_x64(uses_64bit(*args, *kwargs.values())):
            a, kw = to_framework("jax", args, kwargs)
            return jax_primitives(self.fn, a, kw)

    def differentiable_fn(self) -> Any:
        return self.fn

    def vjp(self, problem: Problem, cotangent: Any) -> dict[str, Any]:
        """``KernelAdapter.vjp``; a kernel in its own process computes its gradients there, on the guarded copies
        sent to it (``gmm_kernels.sandbox.host``)."""
        if not isinstance(self.fn, HostedFunction):
            return super().vjp(problem, cotangent)
        with self.arguments(problem) as (args, kwargs):
            return self.fn.host.vjp(args, kwargs, cotangent)

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        """``KernelAdapter.invoke``; a kernel in its own process is watched there, where it runs."""
        if isinstance(self.fn, HostedFunction):
            return self.fn.host.call(args, kwargs)
        return super().invoke(*args, **kwargs)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self.fn, HostedFunction):  # the guarded copies travel; the output comes back as NumPy
            return self.fn.host.call(args, kwargs)
        framework = self.convention_facts.framework
        if framework == "torch":
            a, kw = to_framework(framework, args, kwargs)
            out = self.fn(*a, **kw)
            # a kernel that writes its output buffer in place (DeepGEMM's d) returns nothing: the buffer it got
            conv = self.convention_facts
            return conv.out_value(a, kw) if out is None and conv.out_argument is not None else out
        with jax_x64(uses_64bit(*args, *kwargs.values())):
            a, kw = to_framework(framework, args, kwargs)
            out = self.fn(*a, **kw)
        inputs.donated(self.name, self.convention_facts, a, kw)
        return out


class RoutedFunctionAdapter(RoutedKernelAdapter):
    """An adapter around a user function ``fn`` taking a routed convention's arguments (``vllm.fused_moe``:
    torch tensors), returning the per-slot output or writing the convention's output buffer in place. Unless
    ``numerics`` (a :class:`gmm_ref.RoutedNumerics`) is given, the kernel is held to the default: exact products
    accumulated in float32 (or the widest dtype involved), the routed weight multiplied into the accumulator,
    subnormals possibly flushed (``--numerics``, ``configure(numerics=...)``: a :class:`gmm_ref.RoutedNumerics`, or
    the :class:`gmm_ref.Numerics` of its product). Its ``scope`` (:func:`routed_scope`) declares the dtypes it takes
    (``--dtypes``, ``--out-dtypes``) and its known issues; the rest of a scope is a grouped problem's."""

    flush_subnormals = True

    def __init__(self, fn: Callable[..., Any], convention: str, *, name: str | None = None,
                 numerics: RoutedNumerics | Numerics | None = None, deterministic: bool = True,
                 scope: Scope | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
        if isinstance(numerics, Numerics):  # its product's
            numerics = RoutedNumerics(product=numerics)
        if numerics is not None and not isinstance(numerics, RoutedNumerics):
            raise TypeError(f"numerics: expected a gmm_ref.RoutedNumerics (or the product's Numerics) for the routed "
                            f"convention {convention!r}, got {type(numerics).__name__}")
        self.convention = conventions.get(convention).name  # type: ignore[misc]
        self.scope = None if scope is None else routed_scope(scope, self.convention_facts)
        self.fn = fn
        if isinstance(fn, HostedFunction):
            fn.host.convention = self.convention
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"  # type: ignore[misc]
        self.numerics = numerics
        self.deterministic = deterministic  # type: ignore[misc]

    def large_refusal(self) -> str | None:
        return super().large_refusal() or _interpreted_user_kernel(self, self.fn)

    def dtype_refusal(self, lhs: Any, rhs: Any, out: Any) -> str | None:
        """The convention's refusal, else the declared scope's (tokens ``lhs``, experts ``rhs``, output ``out``)."""
        return (self.scope.dtype_refusal(lhs, rhs, out) if self.scope is not None else None) \
            or super().dtype_refusal(lhs, rhs, out)

    def numerics_for(self, routing: Any) -> RoutedNumerics:
        """The declared numerics (a product left None: the default's, subnormals possibly flushed), else the
        default (see the class docstring)."""
        if self.numerics is None:
            rn = super().numerics_for(routing)
            return dataclasses.replace(rn, product=_tf32_default(self, rn.product, routing.tokens.dtype))
        if self.numerics.product is None:
            return dataclasses.replace(self.numerics, product=super().numerics_for(routing).product)
        return self.numerics

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        """``KernelAdapter.invoke``; a kernel in its own process is watched there, where it runs."""
        if isinstance(self.fn, HostedFunction):
            return self.fn.host.call(args, kwargs)
        return super().invoke(*args, **kwargs)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self.fn, HostedFunction):
            return self.fn.host.call(args, kwargs)
        conv = self.convention_facts
        a, kw = to_framework(conv.framework, args, kwargs)
        out = self.fn(*a, **kw)
        return conv.out_value(a, kw) if out is None and conv.out_argument is not None else out


#: the fields of a :class:`Scope` a routed kernel declares; the others (families, multiples, a tail, zero extents,
#: numerics, quantizes) describe a grouped problem
ROUTED_SCOPE_FIELDS = ("dtypes", "out_dtypes", "known_issues")


def routed_scope(scope: Any, convention: Any) -> Scope:
    """``scope`` checked for the routed ``convention``: only :data:`ROUTED_SCOPE_FIELDS` set (numerics are a
    :class:`gmm_ref.RoutedNumerics`, given apart), and some of the convention's dtype pairs left; ValueError
    naming the field otherwise."""
    if not isinstance(scope, Scope):
        raise TypeError(f"scope: expected a gmm_kernels.Scope, got {type(scope).__name__}")
    default = Scope()
    for f in dataclasses.fields(Scope):
        if f.name not in ROUTED_SCOPE_FIELDS and getattr(scope, f.name) != getattr(default, f.name):
            raise ValueError(f"{f.name}: the routed convention {convention.name!r} takes a declared scope of "
                             f"dtypes, out_dtypes and known_issues only"
                             + (" (its numerics: a gmm_ref.RoutedNumerics, numerics=)" if f.name == "numerics"
                                else ""))
    scope.require_dtypes(convention)
    return scope


def wrap(fn: Callable[..., Any], convention: str, **options: Any) -> KernelAdapter:
    """``fn`` as an adapter for ``convention`` (options: name, numerics, deterministic, scope); a routed
    convention's (``vllm.fused_moe``) is a :class:`RoutedFunctionAdapter`."""
    if isinstance(conventions.get(convention), RoutedConvention):
        return RoutedFunctionAdapter(fn, convention, **options)
    return FunctionAdapter(fn, convention, **options)
