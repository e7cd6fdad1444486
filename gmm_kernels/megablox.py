"""megablox ``gmm`` / ``tgmm`` (Pallas TPU kernels) run with ``interpret=True`` on CPU.

The kernels live in ``jax.experimental.pallas.ops.tpu.megablox.gmm``, a module
the package ``__init__`` shadows with the custom-VJP function of the same
name, so it is imported with importlib. Both are ``jax.jit``-ed with static
``preferred_element_type``, ``tiling``, ``transpose_rhs`` / ``num_actual_groups``
and ``interpret``: one compile per shape and static set (about 0.5-1.2 s here).

Arithmetic here: the interpreter runs ``lax.dot_general(..., float32)`` on
CPU, so float32 and bfloat16 products are exact and accumulate in float32
(on a TPU, DEFAULT precision would pass float32 through bfloat16).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from gmm_ref import Numerics


from gmm_kernels.base import KernelAdapter, dtype_name, missing_module
from gmm_kernels.jax_lax import XLA_F32, on_accelerator

__all__ = ["MegabloxGmm", "MegabloxTgmm", "gmm_grads", "gmm_vjp", "backend_module", "ops_module"]

_DTYPES = ("float32", "bfloat16")
_DEFAULT_TILING = (128, 128, 128)


def backend_module() -> Any:
    """``jax.experimental.pallas.ops.tpu.megablox.gmm`` (the module, not the function)."""
    return importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")


def ops_module() -> Any:
    """``jax.experimental.pallas.ops.tpu.megablox.ops`` (``ops.gmm`` has a custom VJP)."""
    return importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.ops")


def _group_offset(go: Any) -> Any:
    """As megablox needs it: a ()-shaped int32 jax array (or None).

    ``gmm`` raises for any other shape, and ``tgmm`` fails inside its index
    maps for a (1,)-shaped one; ``gmm_ref`` hands out shape (1,).
    """
    import jax.numpy as jnp

    if go is None:
        return None
    return jnp.asarray(np.asarray(go, np.int32).reshape(()))


def _jax_or_none(x: Any) -> Any:
    import jax.numpy as jnp

    return None if x is None else jnp.asarray(x)


def _common_reasons(problem: Any, adapter: str, ragged_extent: int) -> str | None:
    for name in ("lhs", "rhs"):
        dt = dtype_name(getattr(problem, name).dtype)
        if dt not in _DTYPES:
            return f"{adapter} takes float32 or bfloat16 inputs, not {name} {dt}"
    if dtype_name(problem.out_dtype) not in ("float32", "bfloat16", "float16"):
        return f"{adapter}: output dtype {dtype_name(problem.out_dtype)} not supported"
    tm = (problem.tiling or _DEFAULT_TILING)[0]
    if ragged_extent % tm:
        return f"{adapter} needs the ragged extent ({ragged_extent}) divisible by tm={tm} (ValueError)"
    if problem.batch_ndim:
        return f"{adapter} takes no batch dims"
    return None


class MegabloxGmm(KernelAdapter):
    """``gmm(lhs [M,K], rhs [L,K,N] or [L,N,K], group_sizes [G], ...)`` -> ``[M, N]``."""

    name = "megablox.gmm"
    convention = "megablox.gmm"
    numerics = XLA_F32

    def numerics_for(self, problem: Any) -> Numerics:
        return on_accelerator(self.numerics, problem)
    #: input of :meth:`vjp` -> upstream bug in its gradient (see property_tests/tests/test_gradients.py)
    known_gradient_issues = {
        "existing_out": (
            "upstream bug, jax 0.10.2 jax/experimental/pallas/ops/tpu/megablox/ops.py _gmm_bwd returns "
            "the whole cotangent as the gradient of existing_out, also for the rows gmm overwrote "
            "(their true gradient is 0)"),
    }

    def available(self) -> str | None:
        reason = missing_module("jax")
        if reason:
            return reason
        try:
            backend_module()
        except Exception as e:  # noqa: BLE001 - any import failure is the reason
            return f"cannot import megablox: {type(e).__name__}: {e}"
        return None

    def supports(self, problem: Any) -> str | None:
        reason = super().supports(problem)
        if reason:
            return reason
        if problem.family != "ragged_m" or problem.lhs_transposed:
            return "megablox gmm is ragged M only, lhs [M, K]"
        return _common_reasons(problem, self.name, problem.m)

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = np.float32,
             tiling: Any = _DEFAULT_TILING, group_offset: Any = None, existing_out: Any = None,
             transpose_rhs: bool = False) -> np.ndarray:
        import jax.numpy as jnp

        out = backend_module().gmm(
            jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(np.asarray(group_sizes, np.int32)),
            np.dtype(preferred_element_type), tuple(int(t) for t in tiling),
            _group_offset(group_offset), _jax_or_none(existing_out),
            transpose_rhs=bool(transpose_rhs), interpret=True,
        )
        return np.asarray(out)

    def vjp(self, problem: Any, cotangent: Any) -> dict[str, np.ndarray]:
        """Gradients through megablox ``ops.gmm``'s custom VJP (see :func:`gmm_grads`)."""
        if problem.convention != self.convention:
            problem = problem.replace(convention=self.convention)
        (lhs, rhs, gs), kw = problem.arguments()
        grads = gmm_grads(lhs, rhs, gs, cotangent, **kw)
        del grads["out"]
        return grads


class MegabloxTgmm(KernelAdapter):
    """``tgmm(lhs [M, ΣK], rhs [ΣK, N], group_sizes [G], ...)`` -> ``[num_actual_groups or G, M, N]``.

    megablox names the operands ``lhs [k, m]`` and ``rhs [m, n]`` (its ``m`` is
    the ragged, contracted axis).
    """

    name = "megablox.tgmm"
    convention = "megablox.tgmm"
    numerics = XLA_F32

    def numerics_for(self, problem: Any) -> Numerics:
        return on_accelerator(self.numerics, problem)

    available = MegabloxGmm.available

    def supports(self, problem: Any) -> str | None:
        reason = super().supports(problem)
        if reason:
            return reason
        if problem.family != "ragged_k" or problem.lhs_transposed or problem.rhs_transposed or problem.packed:
            return "megablox tgmm is ragged K only, lhs [M, ΣK] strided, rhs [ΣK, N]"
        return _common_reasons(problem, self.name, problem.k)

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = np.float32,
             tiling: Any = _DEFAULT_TILING, group_offset: Any = None, num_actual_groups: Any = None,
             existing_out: Any = None) -> np.ndarray:
        import jax.numpy as jnp

        out = backend_module().tgmm(
            jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(np.asarray(group_sizes, np.int32)),
            np.dtype(preferred_element_type), tuple(int(t) for t in tiling),
            _group_offset(group_offset),
            None if num_actual_groups is None else int(num_actual_groups),
            _jax_or_none(existing_out), interpret=True,
        )
        return np.asarray(out)


def gmm_grads(lhs: Any, rhs: Any, group_sizes: Any, cotangent: Any, *,
              preferred_element_type: Any = np.float32, tiling: Any = _DEFAULT_TILING,
              group_offset: Any = None, existing_out: Any = None, transpose_rhs: bool = False
              ) -> dict[str, np.ndarray]:
    """Output and gradients of megablox ``ops.gmm`` (its custom VJP) for ``cotangent``.

    Returns ``{"out", "lhs", "rhs"}`` and ``"existing_out"`` when one is
    given. The VJP computes ``dlhs = gmm(cotangent, rhs, transpose_rhs=not
    transpose_rhs)`` (so rows past ``sum(sizes)`` are unwritten, NaN under
    interpret, like the forward), ``drhs = tgmm(lhs.T, cotangent,
    num_actual_groups=rhs.shape[0])`` and, for ``existing_out``, the whole
    cotangent: also for the rows the kernel overwrote, whose true gradient is
    0 (upstream bug, see :attr:`MegabloxGmm.known_gradient_issues`).
    """
    import jax
    import jax.numpy as jnp

    ops = ops_module()
    gs = jnp.asarray(np.asarray(group_sizes, np.int32))
    go = _group_offset(group_offset)
    ped = np.dtype(preferred_element_type)
    tl = tuple(int(t) for t in tiling)
    tr = bool(transpose_rhs)
    primals = [jnp.asarray(lhs), jnp.asarray(rhs)]
    if existing_out is not None:
        primals.append(jnp.asarray(existing_out))

    def f(a: Any, b: Any, ex: Any = None) -> Any:
        # ops.gmm = custom_vjp(backend.gmm, nondiff_argnums=(3, 4, 7, 8)): positional call.
        return ops.gmm(a, b, gs, ped, tl, go, ex, tr, True)

    out, pullback = jax.vjp(f, *primals)
    grads = pullback(jnp.asarray(cotangent, dtype=out.dtype))
    result = {"out": np.asarray(out), "lhs": np.asarray(grads[0]), "rhs": np.asarray(grads[1])}
    if existing_out is not None:
        result["existing_out"] = np.asarray(grads[2])
    return result


def gmm_vjp(lhs: Any, rhs: Any, group_sizes: Any, cotangent: Any, *,
            preferred_element_type: Any = np.float32, tiling: Any = _DEFAULT_TILING,
            group_offset: Any = None, transpose_rhs: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(out, dlhs, drhs)`` of megablox ``ops.gmm`` (its custom VJP); see :func:`gmm_grads`."""
    r = gmm_grads(lhs, rhs, group_sizes, cotangent, preferred_element_type=preferred_element_type,
                  tiling=tiling, group_offset=group_offset, transpose_rhs=transpose_rhs)
    return r["out"], r["lhs"], r["rhs"]
