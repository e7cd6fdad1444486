"""One resolver for kernel specs: a built-in name, ``pkg.module:attr``, a function or an adapter.

Used by the pytest plugin (``--gmm-kernel``), the main job (``--kernel``), the
goldens (``--kernel``) and ``check_kernel``. A function is wrapped for its
convention (:func:`gmm_kernels.user.wrap`); an import path may also name an
adapter instance or class.

A resolved kernel's run state (:data:`RUN_STATE`: where it was resolved from, its tiling, its declared
scope, its version) is set in one place, :func:`configure`, which validates it and returns a configured
copy: the adapter it was given (a registry's, a user's instance) is never changed.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any

from gmm_kernels.base import KernelAdapter
from gmm_kernels.registry import registry
from gmm_kernels.runtimes import triton_interpreter
from gmm_kernels.sandbox.host import HostedFunction
from gmm_kernels.scope import Scope
from gmm_kernels.user import RoutedFunctionAdapter, routed_scope, wrap
from gmm_ref import Numerics, RoutedNumerics, as_tiling, conventions
from gmm_ref.names import did_you_mean

__all__ = ["RUN_STATE", "configure", "declared_scope_refusal", "load_object", "resolve_kernel", "resolve_kernels"]

#: the adapter fields a run sets after construction, only through :func:`configure`
RUN_STATE = ("origin", "tiling", "scope", "version")


def load_object(spec: str, *, option: str = "--kernel") -> Any:
    """Import ``pkg.module:attr.path`` and return the object (errors name ``option``)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{option}: expected pkg.module:fn, got {spec!r}")
    triton_interpreter.use_if_no_gpu()  # before the module's @triton.jit runs, where there is no GPU
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"{option} {spec!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{option} {spec!r}: {module_name!r} has no attribute {attr!r}") from None
    return obj


def declared_scope_refusal(adapter: KernelAdapter, option: str) -> str | None:
    """Why ``adapter`` takes no declared scope or numerics (``option`` names what declared one: ``scope``,
    ``--dtypes``, ...), the message beginning with it: a built-in routed MoE adapter states its own; None for any
    other kernel."""
    if not adapter.routed or isinstance(adapter, RoutedFunctionAdapter):
        return None
    return (f"{option}: {adapter.name} is a routed MoE kernel whose adapter says what it takes and its numerics; a "
            "declared scope or numerics is a routed function's (gmm_kernels.wrap), or subclass the adapter "
            "(docs/routed.md)")


def configure(adapter: KernelAdapter, *, origin: str | None = None, tiling: Any = None, scope: Scope | None = None,
              version: str | None = None, numerics: Numerics | RoutedNumerics | None = None,
              option: str = "--kernel") -> KernelAdapter:
    """A copy of ``adapter`` with the run state given (None: left as it is): ``origin`` (the spec it was
    resolved from), ``tiling`` (three ints or ``"TM,TK,TN"``), ``scope`` (a ``gmm_kernels.Scope``, checked
    against the adapter's convention), ``version`` (recorded with its goldens) and ``numerics`` (the declared
    scope's arithmetic; a routed function's :class:`~gmm_ref.RoutedNumerics`, or the :class:`~gmm_ref.Numerics`
    of its product). ``adapter`` itself is not changed; nothing given: ``adapter`` itself. Errors are
    ValueError / TypeError naming ``option``'s tiling option or the scope's field."""
    changes: dict[str, Any] = {}
    if origin is not None:
        changes["origin"] = str(origin)
    if adapter.routed and tiling is not None:
        raise ValueError(f"{option.replace('kernel', 'tiling')}: {adapter.name} is a routed MoE kernel: its launch "
                         "config is its convention's (docs/routed.md), not a tiling")
    if adapter.routed and (scope is not None or numerics is not None):
        why = declared_scope_refusal(adapter, "scope" if scope is not None else "numerics")
        if why:
            raise ValueError(why)
        if scope is not None:
            changes["scope"] = routed_scope(scope, adapter.convention_facts)
        if numerics is not None:
            changes["numerics"] = _routed_numerics(adapter, numerics)
        scope = numerics = None
    elif isinstance(numerics, RoutedNumerics):
        raise ValueError(f"numerics: weight= and combine= are a routed MoE kernel's; {adapter.name} is a grouped "
                         f"GEMM ({adapter.convention}): expected a gmm_ref.Numerics")
    if tiling is not None:
        changes["tiling"] = as_tiling(tiling, name=option.replace("kernel", "tiling"))
    if scope is not None and not isinstance(scope, Scope):
        raise TypeError(f"scope: expected a gmm_kernels.Scope, got {type(scope).__name__}")
    if scope is not None or numerics is not None:
        declared = scope if scope is not None else adapter.scope or Scope()
        if numerics is not None:
            declared = dataclasses.replace(declared, numerics=numerics)
        changes["scope"] = declared.bind(adapter.convention_facts)
    if version is not None:
        changes["version"] = str(version)
    if not changes:
        return adapter
    configured = copy.copy(adapter)
    for field, value in changes.items():  # the one place run state is set on an adapter
        setattr(configured, field, value)
    return configured


def _routed_numerics(adapter: KernelAdapter, numerics: Any) -> RoutedNumerics:
    """``numerics`` as the routed ``adapter`` declares them (a :class:`~gmm_ref.Numerics` is its product's)."""
    if isinstance(numerics, Numerics):
        numerics = RoutedNumerics(product=numerics)
    if not isinstance(numerics, RoutedNumerics):
        raise TypeError(f"numerics: expected a gmm_ref.RoutedNumerics or Numerics for the routed MoE kernel "
                        f"{adapter.name}, got {type(numerics).__name__}")
    return numerics


def _adapter(obj: Any) -> KernelAdapter | None:
    if isinstance(obj, KernelAdapter):
        return copy.copy(obj)
    if isinstance(obj, type) and issubclass(obj, KernelAdapter):
        return obj()
    return None


def _from_callable(fn: Callable[..., Any], convention: str | None, name: str | None, numerics: Numerics | None,
                   option: str, convention_option: str, spec: str) -> KernelAdapter:
    """A function as an adapter; a function decorated with ``gmm_kernels.declare`` brings its
    convention and scope. An explicit ``convention`` may repeat the declared one, never contradict it:
    the kernel would be called with another convention's arguments and fail every check."""
    if not callable(fn):
        raise TypeError(f"{option} {spec!r}: expected a function or a KernelAdapter, got {type(fn).__name__}")
    declared = getattr(fn, "__gmm_convention__", None)
    if convention is not None and declared is not None and convention != declared:
        raise ValueError(f"{convention_option}: {convention!r} contradicts {option} {spec!r}, which declares the "
                         f"convention {declared!r} (gmm_kernels.declare): drop {convention_option}, or fix the "
                         "declaration")
    convention = convention or declared
    if convention is None:
        raise ValueError(f"{convention_option}: required with {option} {spec!r}; expected one of "
                         f"{conventions.names()} or, for a routed MoE kernel, {conventions.routed_names()}")
    return wrap(fn, convention, name=name, numerics=numerics or getattr(fn, "__gmm_numerics__", None),
                scope=getattr(fn, "__gmm_scope__", None))


def _hosted(spec: str, option: str) -> Any:
    """The function ``spec`` names, loaded in a process of its own (``gmm_kernels.sandbox.host``) and stood in for
    here by a ``HostedFunction``; None where ``spec`` names an adapter (its code decides what it takes: it runs in
    this process)."""
    from gmm_kernels.sandbox.host import HostedFunction, KernelHost

    host = KernelHost(spec)
    try:
        loaded = host.load_as(option)
    except BaseException:
        host.close()
        raise
    if loaded.get("kind") == "adapter":
        host.close()
        return None
    if loaded.get("kind") != "function":
        host.close()
        raise TypeError(f"{option} {spec!r}: expected a function or a KernelAdapter, got {loaded.get('kind')}")
    return HostedFunction(host, loaded)


def resolve_kernel(spec: Any, *, convention: str | None = None, tiling: Any = None, numerics: Numerics | None = None,
                   name: str | None = None, scope: Scope | None = None, option: str = "--kernel",
                   convention_option: str = "--convention", in_process: bool = False) -> KernelAdapter:
    """The adapter ``spec`` names, configured (:func:`configure`) with ``tiling`` (three ints or ``"TM,TK,TN"``),
    ``scope`` and, for a string spec, its origin.

    A ``pkg.module:fn`` naming a function runs in a process of its own, which this one never imports
    (``gmm_kernels.sandbox.host``: the verdict is out of the kernel's reach); ``in_process`` imports and calls it
    here instead (for a debugger; not tamper-proof). A function object, an adapter, and an import path naming an
    adapter run in this process. ``convention``, ``numerics`` and ``name`` apply to plain functions. Errors are
    ValueError / TypeError / ImportError naming ``option`` / ``convention_option``.
    """
    adapter = _adapter(spec)
    if adapter is None and isinstance(spec, str):
        if ":" in spec:
            hosted = None if in_process else _hosted(spec, option)
            obj = hosted if hosted is not None else load_object(spec, option=option)
            adapter = _adapter(obj) or _from_callable(obj, convention, name or spec, numerics, option,
                                                      convention_option, spec)
        else:
            builtin = {a.name: a for a in registry()}
            if spec not in builtin:
                raise ValueError(f"{option}: {spec!r} is neither a built-in adapter nor an import path "
                                 f"pkg.module:fn{did_you_mean(spec, builtin)} (built-in: {sorted(builtin)})")
            adapter = builtin[spec]
    elif adapter is None:
        triton_interpreter.use_if_no_gpu()
        adapter = _from_callable(spec, convention, name, numerics, option, convention_option, repr(spec))
    if not isinstance(getattr(adapter, "fn", None), HostedFunction):  # (a hosted one's process does it)
        triton_interpreter.ready(getattr(adapter, "fn", None))  # Triton's interpreter fixed; a stale kernel refused
    return configure(adapter, origin=spec if isinstance(spec, str) else None, tiling=tiling, scope=scope,
                     option=option)


def resolve_kernels(specs: Sequence[Any], *, convention: str | None = None, tiling: Any = None,
                    scope: Scope | None = None, numerics: Numerics | None = None, option: str = "--kernel",
                    convention_option: str = "--convention", in_process: bool = False) -> list[KernelAdapter]:
    """Adapters for ``specs``; every known adapter when ``specs`` is empty."""
    if not specs:
        if scope is not None or numerics is not None:
            raise ValueError(f"{option}: a declared scope or numerics needs the kernel(s) it applies to")
        return registry()
    return [resolve_kernel(s, convention=convention, tiling=tiling, scope=scope, numerics=numerics, option=option,
                           convention_option=convention_option, in_process=in_process) for s in specs]
