"""Wrap an arbitrary user kernel function as an adapter for a convention.

The function receives the convention's arguments converted to its framework:
jax arrays for the jax conventions (``ragged_dot``, ``ragged_dot_general``,
``megablox.gmm``, ``megablox.tgmm``, ``te.grouped_gemm``), torch tensors for
``torch.grouped_mm`` (``out_dtype`` as a torch dtype, ``offs`` an int32
tensor). Dimension numbers become ``jax.lax.RaggedDotDimensionNumbers``.
Whatever it returns (jax array, torch tensor, NumPy) comes back as NumPy.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Callable
from typing import Any

import numpy as np

from gmm_ref import Numerics

from gmm_kernels.base import KernelAdapter
from gmm_kernels.convert import jax_x64, to_jax, to_numpy, to_torch, torch_dtype, uses_64bit

__all__ = ["FunctionAdapter", "wrap", "CONVENTIONS", "JAX_CONVENTIONS"]

JAX_CONVENTIONS = ("ragged_dot", "ragged_dot_general", "megablox.gmm", "megablox.tgmm", "te.grouped_gemm")
CONVENTIONS = JAX_CONVENTIONS + ("torch.grouped_mm",)


def _to_jax_args(convention: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    args = tuple(to_jax(a) for a in args)
    kwargs = {k: to_jax(v) for k, v in kwargs.items()}
    if convention == "ragged_dot_general":
        from gmm_kernels.jax_lax import lax_dimension_numbers

        if len(args) >= 4:
            args = (*args[:3], lax_dimension_numbers(args[3]), *args[4:])
        elif "ragged_dot_dimension_numbers" in kwargs:
            kwargs["ragged_dot_dimension_numbers"] = lax_dimension_numbers(kwargs["ragged_dot_dimension_numbers"])
    return args, kwargs


def _to_torch_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    import torch

    args = tuple(to_torch(a) for a in args)
    kw = dict(kwargs)
    if kw.get("offs") is not None:
        kw["offs"] = torch.from_numpy(np.ascontiguousarray(kw["offs"], np.int32))
    if "out_dtype" in kw:
        kw["out_dtype"] = torch_dtype(kw["out_dtype"])
    if kw.get("bias") is not None:
        kw["bias"] = to_torch(kw["bias"])
    return args, kw


class FunctionAdapter(KernelAdapter):
    """An adapter around a user function ``fn`` taking ``convention``'s arguments."""

    def __init__(self, fn: Callable[..., Any], convention: str, *, name: str | None = None,
                 numerics: Numerics | None = None, deterministic: bool = True) -> None:
        if convention not in CONVENTIONS:
            raise ValueError(f"convention: expected one of {CONVENTIONS}, got {convention!r}")
        self.fn = fn
        self.convention = convention  # type: ignore[misc]
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"  # type: ignore[misc]
        self.numerics = numerics or Numerics(multiply=None, accumulate=np.float32)  # type: ignore[misc]
        self.deterministic = deterministic  # type: ignore[misc]
        self._explicit_numerics = numerics is not None

    def numerics_for(self, problem: Any) -> Numerics:
        """The declared numerics, else the lenient default for an unknown kernel: exact
        products (bfloat16 passes on TPU and GPU, where jax's DEFAULT precision multiplies float32
        in bfloat16 or TF32),
        the widest accumulator involved, subnormals possibly flushed (as XLA, GPUs and TPUs
        do). Declare ``numerics=`` to be held to more."""
        if self._explicit_numerics:
            return self.numerics
        base = Numerics.default_for(problem.lhs.dtype, problem.rhs.dtype, problem.out_dtype)
        multiply = base.multiply
        if self.convention != "torch.grouped_mm" and _jax_backend() not in (None, "cpu") and not _is_int(problem):
            multiply = "bfloat16"  # DEFAULT precision: bfloat16 passes on TPU, TF32 on GPU (bounded by it)
        return dataclasses.replace(base, multiply=multiply, flush_subnormals=not _is_int(problem))

    def vjp(self, problem: Any, cotangent: Any) -> dict[str, np.ndarray]:
        """Reverse-mode gradients of ``fn`` w.r.t. lhs, rhs (and ``existing_out`` when given):
        ``jax.vjp`` for the jax conventions, autograd for ``torch.grouped_mm``. Raises
        NotImplementedError where the function has no gradient."""
        if problem.convention != self.convention:
            problem = problem.replace(convention=self.convention)
        args, kwargs = problem.arguments()
        if self.convention == "torch.grouped_mm":
            return self._torch_vjp(args, kwargs, cotangent)
        import jax
        import jax.numpy as jnp

        with jax_x64(uses_64bit(*args, *kwargs.values())):
            a, kw = _to_jax_args(self.convention, args, kwargs)
            existing = kw.pop("existing_out", None)
            names = ["lhs", "rhs"] + (["existing_out"] if existing is not None else [])

            def f(lhs: Any, rhs: Any, *ex: Any) -> Any:
                extra = {"existing_out": ex[0]} if ex else {}
                return self.fn(lhs, rhs, *a[2:], **kw, **extra)

            primals = (a[0], a[1]) + ((existing,) if existing is not None else ())
            try:
                out, pullback = jax.vjp(f, *primals)
                cts = pullback(jnp.asarray(np.asarray(cotangent)).astype(out.dtype))
            except (NotImplementedError, jax.errors.TracerArrayConversionError,
                    jax.errors.ConcretizationTypeError) as exc:  # not differentiable with jax
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise NotImplementedError(f"{self.name}: no jax gradient: {first}") from None
            return {n: to_numpy(c) for n, c in zip(names, cts)}

    def _torch_vjp(self, args: tuple, kwargs: dict, cotangent: Any) -> dict[str, np.ndarray]:
        a, kw = _to_torch_args(args, kwargs)
        lhs, rhs = (t.detach().clone().requires_grad_(True) for t in a[:2])
        out = self.fn(lhs, rhs, *a[2:], **kw)
        if not getattr(out, "requires_grad", False):
            raise NotImplementedError(f"{self.name}: its output carries no autograd graph")
        try:
            out.backward(to_torch(np.ascontiguousarray(cotangent)).to(out.dtype))
        except (RuntimeError, NotImplementedError) as exc:
            if "derivative" in str(exc) or "not implemented" in str(exc).lower():
                raise NotImplementedError(f"{self.name}: no gradient: {exc}") from None
            raise
        return {"lhs": to_numpy(lhs.grad), "rhs": to_numpy(rhs.grad)}

    def call(self, *args: Any, **kwargs: Any) -> np.ndarray:
        if self.convention == "torch.grouped_mm":
            a, kw = _to_torch_args(args, kwargs)
            return to_numpy(self.fn(*a, **kw))
        with jax_x64(uses_64bit(*args, *kwargs.values())):
            a, kw = _to_jax_args(self.convention, args, kwargs)
            return to_numpy(self.fn(*a, **kw))


def _is_int(problem: Any) -> bool:
    return np.issubdtype(problem.lhs.dtype, np.integer)


def _jax_backend() -> str | None:
    """jax's default backend if jax is already imported (never imports it)."""
    import sys

    jax = sys.modules.get("jax")
    try:
        return jax.default_backend() if jax is not None else None
    except Exception:  # noqa: BLE001 - no backend at all
        return None


def wrap(fn: Callable[..., Any], convention: str, **options: Any) -> FunctionAdapter:
    """``fn`` as an adapter for ``convention`` (options: name, numerics, deterministic)."""
    return FunctionAdapter(fn, convention, **options)
