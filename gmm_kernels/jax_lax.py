"""``jax.lax.ragged_dot`` and ``jax.lax.ragged_dot_general`` on the default (CPU) backend.

Each distinct (shapes, dtypes, dimension numbers) compiles once: the group
sizes are a traced argument. Problems with a 64-bit array or output dtype run
under ``jax.enable_x64(True)`` (without it jax silently computes float64
inputs in float32).
"""

from __future__ import annotations

import dataclasses

import functools
from typing import Any

import numpy as np

from gmm_ref import Numerics

from gmm_kernels.base import KernelAdapter, missing_module
from gmm_kernels.convert import jax_x64, uses_64bit

__all__ = ["JaxRaggedDot", "JaxRaggedDotGeneral", "XLA_CPU_NAN_LEAK", "jax_numerics", "lax_dimension_numbers",
           "xla_nan_leak_issues"]


XLA_CPU_NAN_LEAK = (
    "upstream bug, XLA CPU ragged_dot (jax 0.10.2): a NaN/Inf anywhere in one group's rhs reaches the "
    "rows of every other group and the tail, also when that group is empty (the CPU lowering forms "
    "every group's product over all rows and masks by multiplying with 0, and 0*NaN = NaN). Repro: "
    "lax.ragged_dot(ones((4, 2)), stack([ones((2, 2)), full((2, 2), nan)]), group_sizes=[4, 0]) is all NaN"
)


def xla_nan_leak_issues(via: str = "") -> dict[str, str]:
    """``known_issues`` of a kernel computed by XLA's ragged_dot (``via``: how it gets there).

    Empty unless jax runs on CPU (the only backend the bug was seen on).
    """
    if missing_module("jax"):
        return {}
    import jax

    if jax.default_backend() != "cpu":
        return {}
    return {"poisoned": XLA_CPU_NAN_LEAK + (f"; {via}" if via else "")}


def jax_numerics(problem: Any) -> Numerics:
    """Exact products; accumulate in float32, float64 for 64-bit, int32 for integers.

    XLA flushes subnormals (FTZ/DAZ on CPU; GPU and TPU do too): a bf16 input of
    2**-130 times 2**10 gives 0, not 2**-120.
    """
    base = Numerics.default_for(problem.lhs.dtype, problem.rhs.dtype, problem.out_dtype)
    return on_accelerator(dataclasses.replace(base, flush_subnormals=True), problem)


#: what XLA-compiled kernels (Pallas interpret included) declare for float32 accumulation
XLA_F32 = Numerics(multiply=None, accumulate=np.float32, flush_subnormals=True)


def on_accelerator(numerics: Numerics, problem: Any) -> Numerics:
    """``numerics`` as jax's DEFAULT precision makes them on the backend in use: on TPU float32
    operands pass through bfloat16, on recent GPUs through TF32 (declared as bfloat16, whose
    shorter significand gives a sound, slightly looser bound). CPU multiplies them exactly."""
    if numerics.multiply is not None or np.issubdtype(problem.lhs.dtype, np.integer):
        return numerics
    import jax

    if jax.default_backend() == "cpu":
        return numerics
    return dataclasses.replace(numerics, multiply="bfloat16")


def lax_dimension_numbers(dn: Any) -> Any:
    """A ``gmm_ref.RaggedDotDimensionNumbers`` (or any 3-field tuple) as the lax type."""
    from jax import lax

    if isinstance(dn, lax.RaggedDotDimensionNumbers):
        return dn
    (lc, rc), (lb, rb) = dn[0]
    fix = lambda xs: tuple(int(x) for x in xs)  # noqa: E731
    return lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=((fix(lc), fix(rc)), (fix(lb), fix(rb))),
        lhs_ragged_dimensions=fix(dn[1]),
        rhs_group_dimensions=fix(dn[2]),
    )


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
    t = lambda xs: tuple(int(x) for x in xs)  # noqa: E731
    return (((t(lc), t(rc)), (t(lb), t(rb))), t(dn[1]), t(dn[2]))


def _ped(x: Any) -> Any:
    return None if x is None else np.dtype(x)


class _JaxBase(KernelAdapter):
    @property
    def known_issues(self) -> dict[str, str]:  # type: ignore[override]
        return xla_nan_leak_issues()

    def available(self) -> str | None:
        return missing_module("jax")

    def numerics_for(self, problem: Any) -> Numerics:
        return jax_numerics(problem)

    def supports(self, problem: Any) -> str | None:
        reason = super().supports(problem)
        if reason:
            return reason
        if problem.group_offset != 0 or problem.num_local_groups != problem.num_groups:
            return "lax ragged_dot has no group_offset (NotImplementedError in jax 0.10.2)"
        if problem.existing_out is not None:
            return "lax ragged_dot takes no existing output"
        return None


class JaxRaggedDot(_JaxBase):
    """``jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=...)``."""

    name = "jax.ragged_dot"
    convention = "ragged_dot"

    def supports(self, problem: Any) -> str | None:
        reason = super().supports(problem)
        if reason:
            return reason
        if problem.family != "ragged_m" or problem.batch_ndim:
            return "lax.ragged_dot is ragged M only (use jax.ragged_dot_general)"
        return None

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None,
             preferred_element_type: Any = None) -> np.ndarray:
        if precision is not None:
            raise ValueError("this adapter runs the default precision only")
        ped = _ped(preferred_element_type)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            out = _jitted_ragged_dot(ped)(lhs, rhs, np.asarray(group_sizes, np.int32))
            return np.asarray(out)


    def vjp(self, problem: Any, cotangent: Any) -> dict[str, np.ndarray]:
        """``jax.vjp`` of ``lax.ragged_dot`` (mode 1) w.r.t. lhs and rhs, jitted, sizes traced."""
        if problem.convention != self.convention:
            problem = problem.replace(convention=self.convention)
        (lhs, rhs, gs), kw = problem.arguments()
        ped = _ped(kw.get("preferred_element_type"))
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            dl, dr = _jitted_ragged_dot_vjp(ped)(lhs, rhs, np.asarray(gs, np.int32),
                                                np.asarray(cotangent))
            return {"lhs": np.asarray(dl), "rhs": np.asarray(dr)}


class JaxRaggedDotGeneral(_JaxBase):
    """``jax.lax.ragged_dot_general`` (modes 1, 2, 3, with batch dims)."""

    name = "jax.ragged_dot_general"
    convention = "ragged_dot_general"

    def supports(self, problem: Any) -> str | None:
        reason = super().supports(problem)
        if reason:
            return reason
        if problem.family == "ragged_n":
            return "ragged_dot_general has no ragged N mode"
        if problem.packed:
            return "ragged_dot_general has no packed layout"
        return None

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
