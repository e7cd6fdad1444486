"""Reverse-mode gradients of a kernel function, with jax.vjp or torch autograd (by its convention).

The kernel function takes its convention's arguments in its framework; the
gradients are taken w.r.t. the two operands (the first two positional
arguments) and, where the convention has one, the existing output.

jax decides whether a function has a gradient while tracing, from the
arguments' shapes and dtypes and the static arguments alone, so a signature
found without one is remembered and declined at once the next time: raising
through jax's traceback filtering costs about 20 ms an attempt, most of the
time a check of a kernel without that gradient would spend.

A built-in adapter's backward pass (``cached_in``: its module) is one jitted
function of its arrays, forward and pullback together, whose executables
``gmm_kernels.runtimes.executables`` keeps; a user's kernel runs op by op as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gmm_kernels.runtimes import executables
from gmm_kernels.sandbox.convert import device_array, jax_x64, to_framework, to_torch, uses_64bit
from gmm_ref import Mismatch
from gmm_ref.conventions import Convention
from gmm_ref.dtypes import as_numpy

__all__ = ["vjp"]

# (function, adapter, convention, signature) -> why jax has no gradient there; bounded, cleared when full
_NO_JAX_GRADIENT: dict[tuple[Any, ...], str] = {}
_MEMO_LIMIT = 4096
# (module, name, convention, static text) -> the jitted backward pass of a built-in adapter's function
_JITTED: dict[tuple[str, ...], executables.Executable] = {}


def _signature(value: Any) -> Any:
    """What jax traces ``value`` as: an array's shape and dtype, a container's items, else the value."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return ("array", tuple(value.shape), str(value.dtype))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, *map(_signature, value))
    if isinstance(value, dict):
        return ("dict", *sorted((k, _signature(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return ("unhashable", repr(value))
    return value


def vjp(fn: Callable[..., Any], convention: Convention, args: tuple, kwargs: dict, cotangent: Any, *,
        name: str, cached_in: str | None = None) -> dict[str, np.ndarray]:
    """``{"lhs", "rhs"[, "existing_out"]}``: gradients of ``fn(*args, **kwargs)`` for ``cotangent``.

    ``args``/``kwargs`` are the convention's NumPy arguments. NotImplementedError
    where ``fn`` has no gradient in its framework. ``cached_in``: the module of the
    built-in adapter ``name`` whose function ``fn`` is (the backward pass is then
    jitted and its executables cached; never for a user's kernel).
    """
    if convention.framework == "torch":
        return _torch_vjp(fn, args, kwargs, cotangent, name)
    return _jax_vjp(fn, convention, args, kwargs, cotangent, name, cached_in)


def _same_shape(out: Any, desired: tuple, name: str) -> None:
    """The backward pass needs the forward output in the cotangent's shape ``desired``: a Mismatch if it is not."""
    shape = tuple(getattr(out, "shape", ()))
    if shape != tuple(desired):
        raise Mismatch(f"kernel {name} (forward, before its backward pass)\nshape/dtype mismatch: ACTUAL {shape} "
                       f"{getattr(out, 'dtype', '?')}, DESIRED {tuple(desired)}", kind="shape")


def _jax_vjp(fn: Callable[..., Any], convention: Convention, args: tuple, kwargs: dict, cotangent: Any,
             name: str, cached_in: str | None) -> dict[str, np.ndarray]:
    import jax

    try:
        key: tuple[Any, ...] | None = (fn, name, convention.name, _signature(args), _signature(kwargs))
        hash(key)
    except TypeError:  # a function or static argument that cannot be a key: nothing is remembered
        key = None
    if key is not None and key in _NO_JAX_GRADIENT:
        raise NotImplementedError(_NO_JAX_GRADIENT[key])
    with jax_x64(uses_64bit(*args, *kwargs.values())):
        existing_argument = convention.existing_argument
        names = ["lhs", "rhs"] + (["existing_out"] if existing_argument and kwargs.get(existing_argument) is not None
                                  else [])
        try:
            jitted = None if cached_in is None else _jitted(fn, convention, args, kwargs, name, cached_in)
            if jitted is not None:
                cts = jitted(args[0], args[1], tuple(v for v in _rest(args, kwargs) if _dynamic(v)),
                             np.asarray(cotangent))
            else:
                cts = _eager(fn, existing_argument, args, kwargs, cotangent, name)
        except (NotImplementedError, jax.errors.TracerArrayConversionError,
                jax.errors.ConcretizationTypeError) as exc:  # not differentiable with jax
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            why = f"{name}: no jax gradient: {first}"
            if key is not None:
                if len(_NO_JAX_GRADIENT) >= _MEMO_LIMIT:
                    _NO_JAX_GRADIENT.clear()
                _NO_JAX_GRADIENT[key] = why
            raise NotImplementedError(why) from None
        return {n: as_numpy(c, name=f"{name} d/d{n}", strict=True) for n, c in zip(names, cts, strict=True)}


def _backward(fn: Callable[..., Any], existing_argument: str | None, a: tuple, kw: dict,
              cotangent: Callable[[Any], Any], shape: tuple, name: str) -> Any:
    """The pullback of ``fn(*a, **kw)`` (jax values) w.r.t. the operands and a given existing output, for the
    cotangent ``cotangent(dtype)`` of ``shape`` in the output's dtype."""
    import jax

    existing = kw.pop(existing_argument, None) if existing_argument else None

    def f(lhs: Any, rhs: Any, *ex: Any) -> Any:
        extra = {existing_argument: ex[0]} if ex else {}
        return fn(lhs, rhs, *a[2:], **kw, **extra)

    primals = (a[0], a[1]) + ((existing,) if existing is not None else ())
    out, pullback = jax.vjp(f, *primals)
    _same_shape(out, shape, name)
    return pullback(cotangent(out.dtype))


def _eager(fn: Callable[..., Any], existing_argument: str | None, args: tuple, kwargs: dict, cotangent: Any,
           name: str) -> Any:
    """The backward pass op by op (a user's kernel)."""
    a, kw = to_framework("jax", args, kwargs)
    ct = np.asarray(cotangent)
    return _backward(fn, existing_argument, a, kw, lambda dt: device_array(ct.astype(np.dtype(dt))), ct.shape, name)


def _dynamic(value: Any) -> bool:
    """Whether an argument is traced (an array, or a quantized operand's arrays), not baked in."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return all(isinstance(v, np.ndarray) for v in value)
    return isinstance(value, np.ndarray)


def _rest(args: tuple, kwargs: dict) -> list[Any]:
    """The arguments after the two operands, positional then keyword."""
    return [*args[2:], *kwargs.values()]


def _jitted(fn: Callable[..., Any], convention: Convention, args: tuple, kwargs: dict, name: str,
            module: str) -> executables.Executable | None:
    """The backward pass of the built-in adapter ``name`` as one jitted function of the operands, the arrays
    among the other arguments and the cotangent; the rest is baked in. None where those cannot be keyed."""
    rest = _rest(args, kwargs)
    statics = [None if _dynamic(v) else v for v in rest]
    text = executables.stable_text((convention.name, len(args), tuple(kwargs), [_dynamic(v) for v in rest], statics))
    if text is None:
        return None
    key = (module, name, text)
    if key not in _JITTED:
        baked, _ = to_framework("jax", tuple(statics), {})
        traced = [_dynamic(v) for v in rest]
        positional, keywords = len(args) - 2, tuple(kwargs)

        def backward(lhs: Any, rhs: Any, dynamic: tuple, cotangent: Any) -> Any:
            given = iter(dynamic)
            values = [next(given) if t else b for b, t in zip(baked, traced, strict=True)]
            kw = dict(zip(keywords, values[positional:], strict=True))
            return _backward(fn, convention.existing_argument, (lhs, rhs, *values[:positional]), kw,
                             cotangent.astype, tuple(cotangent.shape), name)

        if len(_JITTED) >= _MEMO_LIMIT:
            _JITTED.clear()
        _JITTED[key] = executables.cached(backward, name=f"{name}/vjp", static=text, modules=(module, __name__))
    return _JITTED[key]


def _refused_grad(fn: Callable[..., Any], a: tuple, kw: dict, exc: Exception, name: str) -> None:
    """A kernel without autograd may refuse inputs that require grad (``.numpy()`` on them, a Triton launch that
    checks): where it runs on the same inputs without, returning no autograd graph, it has no gradient to check
    (NotImplementedError, the ``grad`` mode's n/a); else it returns and ``exc`` is the failure."""
    try:
        plain = fn(*(t.detach().clone() for t in a[:2]), *a[2:], **kw)
    except Exception:  # noqa: BLE001 - it fails either way: the first exception is the report
        return
    if not getattr(plain, "requires_grad", False):
        raise NotImplementedError(f"{name}: no gradient: it raised {type(exc).__name__} on inputs that require grad "
                                  f"({' '.join(str(exc).split())[:200]}), and on others returns no autograd "
                                  "graph") from None


def _torch_vjp(fn: Callable[..., Any], args: tuple, kwargs: dict, cotangent: Any, name: str
               ) -> dict[str, np.ndarray]:
    a, kw = to_framework("torch", args, kwargs)
    lhs, rhs = (t.detach().clone().requires_grad_(True) for t in a[:2])
    try:
        out = fn(lhs, rhs, *a[2:], **kw)
    except Exception as exc:
        _refused_grad(fn, a, kw, exc, name)
        raise
    _same_shape(out, np.shape(cotangent), name)
    if not getattr(out, "requires_grad", False):
        raise NotImplementedError(f"{name}: its output carries no autograd graph")
    try:
        out.backward(to_torch(np.ascontiguousarray(cotangent)).to(out.dtype))
    except (RuntimeError, NotImplementedError) as exc:
        if "derivative" in str(exc) or "not implemented" in str(exc).lower():
            raise NotImplementedError(f"{name}: no gradient: {exc}") from None
        raise
    return {w: as_numpy(g.grad, name=f"{name} d/d{w}", strict=True) for w, g in (("lhs", lhs), ("rhs", rhs))}
