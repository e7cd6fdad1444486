"""``jax.lax.ragged_dot`` and ``jax.lax.ragged_dot_general`` on the default (CPU) backend.

Each distinct (shapes, dtypes, dimension numbers) compiles once: the group
sizes are a traced argument. Problems with a 64-bit array or output dtype run
under ``jax.enable_x64(True)`` (without it jax silently computes float64
inputs in float32). XLA flushes subnormals (FTZ/DAZ on CPU; GPU and TPU do
too): a bf16 input of 2**-130 times 2**10 gives 0, not 2**-120.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from gmm_kernels.base import KernelAdapter
from gmm_kernels.convert import jax_x64, lax_dimension_numbers, uses_64bit
from gmm_kernels.known_issues import xla_nan_leak_issues
from gmm_kernels.scope import KnownIssue
from gmm_ref import Problem

__all__ = ["JaxRaggedDot", "JaxRaggedDotGeneral"]


@functools.cache
def _jitted_ragged_dot(preferred_element_type: Any) -> Any:
    import jax
    from jax import lax

    return jax.jit(lambda a, b, g: lax.ragged_dot(a, b, g, preferred_element_type=preferred_element_type))


@functools.cache
def _jitted_ragged_dot_general(dn_key: Any, preferred_element_type: Any) -> Any:
    import jax
    from jax import lax

    dn = lax_dimension_numbers(dn_key)
    return jax.jit(
        lambda a, b, g: lax.ragged_dot_general(a, b, g, dn, preferred_element_type=preferred_element_type)
    )


@functools.cache
def _jitted_ragged_dot_vjp(preferred_element_type: Any) -> Any:
    import jax
    from jax import lax

    def f(a: Any, b: Any, g: Any, ct: Any) -> Any:
        _, pullback = jax.vjp(lambda x, y: lax.ragged_dot(x, y, g, preferred_element_type=preferred_element_type),
                              a, b)
        return pullback(ct)

    return jax.jit(f)


def _dn_key(dn: Any) -> tuple:
    (lc, rc), (lb, rb) = dn[0]

    def ints(xs: Any) -> tuple[int, ...]:
        return tuple(int(x) for x in xs)

    return (((ints(lc), ints(rc)), (ints(lb), ints(rb))), ints(dn[1]), ints(dn[2]))


def _ped(x: Any) -> Any:
    return None if x is None else np.dtype(x)


class _JaxLax(KernelAdapter):
    requires = ("jax",)
    flush_subnormals = True
    default_precision = True

    @property
    def known_issues(self) -> tuple[KnownIssue, ...]:  # type: ignore[override]
        return xla_nan_leak_issues()


class JaxRaggedDot(_JaxLax):
    """``jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=...)``."""

    name = "jax.ragged_dot"
    convention = "ragged_dot"

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None,
             preferred_element_type: Any = None) -> np.ndarray:
        if precision is not None:
            raise ValueError("this adapter runs the default precision only")
        ped = _ped(preferred_element_type)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            return np.asarray(_jitted_ragged_dot(ped)(lhs, rhs, np.asarray(group_sizes, np.int32)))

    def vjp(self, problem: Problem, cotangent: Any) -> dict[str, np.ndarray]:
        """``jax.vjp`` of ``lax.ragged_dot`` (mode 1) w.r.t. lhs and rhs, jitted, sizes traced."""
        with self.arguments(problem) as ((lhs, rhs, gs), kw):
            ped = _ped(kw.get("preferred_element_type"))
            with jax_x64(uses_64bit(lhs, rhs, ped)):
                dl, dr = _jitted_ragged_dot_vjp(ped)(lhs, rhs, np.asarray(gs, np.int32), np.asarray(cotangent))
                return {"lhs": np.asarray(dl), "rhs": np.asarray(dr)}


class JaxRaggedDotGeneral(_JaxLax):
    """``jax.lax.ragged_dot_general`` (modes 1, 2, 3, with batch dims)."""

    name = "jax.ragged_dot_general"
    convention = "ragged_dot_general"

    def differentiable_fn(self) -> Any:
        from jax import lax

        return lax.ragged_dot_general  # jax differentiates mode 1 only; modes 2 and 3 decline

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, ragged_dot_dimension_numbers: Any,
             precision: Any = None, preferred_element_type: Any = None) -> np.ndarray:
        if precision is not None:
            raise ValueError("this adapter runs the default precision only")
        ped = _ped(preferred_element_type)
        fn = _jitted_ragged_dot_general(_dn_key(ragged_dot_dimension_numbers), ped)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            return np.asarray(fn(lhs, rhs, np.asarray(group_sizes, np.int32)))
