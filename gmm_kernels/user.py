"""Wrap an arbitrary user kernel function as an adapter for a convention.

The function receives the convention's arguments converted to its framework:
jax arrays for the jax conventions (``ragged_dot``, ``ragged_dot_general``,
``megablox.gmm``, ``megablox.tgmm``, ``te.grouped_gemm``), torch tensors for
``torch.grouped_mm`` (``out_dtype`` as a torch dtype, ``offs`` an int32
tensor). Dimension numbers become ``jax.lax.RaggedDotDimensionNumbers``.
Whatever it returns (jax array, torch tensor, NumPy) comes back as NumPy.
"""

from __future__ import annotations

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
        if self._explicit_numerics:
            return self.numerics
        return Numerics.default_for(problem.lhs.dtype, problem.rhs.dtype, problem.out_dtype)

    def call(self, *args: Any, **kwargs: Any) -> np.ndarray:
        if self.convention == "torch.grouped_mm":
            a, kw = _to_torch_args(args, kwargs)
            return to_numpy(self.fn(*a, **kw))
        with jax_x64(uses_64bit(*args, *kwargs.values())):
            a, kw = _to_jax_args(self.convention, args, kwargs)
            return to_numpy(self.fn(*a, **kw))


def wrap(fn: Callable[..., Any], convention: str, **options: Any) -> FunctionAdapter:
    """``fn`` as an adapter for ``convention`` (options: name, numerics, deterministic)."""
    return FunctionAdapter(fn, convention, **options)
