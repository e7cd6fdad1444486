"""Reverse-mode gradients of a kernel function, with jax.vjp or torch autograd (by its convention).

The kernel function takes its convention's arguments in its framework; the
gradients are taken w.r.t. the two operands (the first two positional
arguments) and, where the convention has one, the existing output.

jax decides whether a function has a gradient while tracing, from the
arguments' shapes and dtypes and the static arguments alone, so a signature
found without one is remembered and declined at once the next time: raising
through jax's traceback filtering costs about 20 ms an attempt, most of the
time a check of a kernel without that gradient would spend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gmm_kernels.convert import device_array, jax_x64, to_framework, to_torch, uses_64bit
from gmm_ref import Mismatch
from gmm_ref.conventions import Convention
from gmm_ref.dtypes import as_numpy

__all__ = ["vjp"]

# (function, adapter, convention, signature) -> why jax has no gradient there; bounded, cleared when full
_NO_JAX_GRADIENT: dict[tuple[Any, ...], str] = {}
_MEMO_LIMIT = 4096


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
        name: str) -> dict[str, np.ndarray]:
    """``{"lhs", "rhs"[, "existing_out"]}``: gradients of ``fn(*args, **kwargs)`` for ``cotangent``.

    ``args``/``kwargs`` are the convention's NumPy arguments. NotImplementedError
    where ``fn`` has no gradient in its framework.
    """
    if convention.framework == "torch":
        return _torch_vjp(fn, args, kwargs, cotangent, name)
    return _jax_vjp(fn, convention, args, kwargs, cotangent, name)


def _same_shape(out: Any, cotangent: Any, name: str) -> None:
    """The backward pass needs the forward output in the cotangent's shape: a Mismatch if it is not."""
    shape = tuple(getattr(out, "shape", ()))
    if shape != tuple(np.shape(cotangent)):
        raise Mismatch(f"kernel {name} (forward, before its backward pass)\nshape/dtype mismatch: ACTUAL {shape} "
                       f"{getattr(out, 'dtype', '?')}, DESIRED {tuple(np.shape(cotangent))}", kind="shape")


def _jax_vjp(fn: Callable[..., Any], convention: Convention, args: tuple, kwargs: dict, cotangent: Any,
             name: str) -> dict[str, np.ndarray]:
    import jax

    try:
        key: tuple[Any, ...] | None = (fn, name, convention.name, _signature(args), _signature(kwargs))
        hash(key)
    except TypeError:  # a function or static argument that cannot be a key: nothing is remembered
        key = None
    if key is not None and key in _NO_JAX_GRADIENT:
        raise NotImplementedError(_NO_JAX_GRADIENT[key])
    with jax_x64(uses_64bit(*args, *kwargs.values())):
        a, kw = to_framework("jax", args, kwargs)
        existing = kw.pop(convention.existing_argument, None) if convention.existing_argument else None
        names = ["lhs", "rhs"] + (["existing_out"] if existing is not None else [])

        def f(lhs: Any, rhs: Any, *ex: Any) -> Any:
            extra = {convention.existing_argument: ex[0]} if ex else {}
            return fn(lhs, rhs, *a[2:], **kw, **extra)

        primals = (a[0], a[1]) + ((existing,) if existing is not None else ())
        try:
            out, pullback = jax.vjp(f, *primals)
            _same_shape(out, cotangent, name)
            cts = pullback(device_array(np.asarray(cotangent).astype(np.dtype(out.dtype))))
        except (NotImplementedError, jax.errors.TracerArrayConversionError,
                jax.errors.ConcretizationTypeError) as exc:  # not differentiable with jax
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            why = f"{name}: no jax gradient: {first}"
            if key is not None:
                if len(_NO_JAX_GRADIENT) >= _MEMO_LIMIT:
                    _NO_JAX_GRADIENT.clear()
                _NO_JAX_GRADIENT[key] = why
            raise NotImplementedError(why) from None
        return {n: as_numpy(c) for n, c in zip(names, cts, strict=True)}


def _torch_vjp(fn: Callable[..., Any], args: tuple, kwargs: dict, cotangent: Any, name: str
               ) -> dict[str, np.ndarray]:
    a, kw = to_framework("torch", args, kwargs)
    lhs, rhs = (t.detach().clone().requires_grad_(True) for t in a[:2])
    out = fn(lhs, rhs, *a[2:], **kw)
    _same_shape(out, cotangent, name)
    if not getattr(out, "requires_grad", False):
        raise NotImplementedError(f"{name}: its output carries no autograd graph")
    try:
        out.backward(to_torch(np.ascontiguousarray(cotangent)).to(out.dtype))
    except (RuntimeError, NotImplementedError) as exc:
        if "derivative" in str(exc) or "not implemented" in str(exc).lower():
            raise NotImplementedError(f"{name}: no gradient: {exc}") from None
        raise
    return {"lhs": as_numpy(lhs.grad), "rhs": as_numpy(rhs.grad)}
