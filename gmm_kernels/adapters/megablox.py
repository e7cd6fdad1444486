"""The adapters in the ``megablox.gmm`` and ``megablox.tgmm`` conventions (``gmm_ref.conventions.megablox``).

megablox ``gmm`` / ``tgmm`` (Pallas TPU kernels) run with ``interpret=True`` on CPU.

The kernels live in ``jax.experimental.pallas.ops.tpu.megablox.gmm``, a module
the package ``__init__`` shadows with the custom-VJP function of the same
name, so it is imported with importlib. One compile per shape and static set
(about 0.5-1.2 s here).

Arithmetic here: the interpreter runs ``lax.dot_general(..., float32)`` on
CPU, so float32 and bfloat16 products are exact and accumulate in float32
(on a TPU, DEFAULT precision would pass float32 through bfloat16).

Also here: ejkernel's ``grouped_matmul`` (:class:`EjkernelGroupedMatmul`), in the ``megablox.gmm``
convention.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

import numpy as np

from gmm_kernels.base import KernelAdapter, VariantAdapter
from gmm_kernels.convert import device_array, jax_group_offset, jax_x64, uses_64bit
from gmm_kernels.known_issues import MEGABLOX_EXISTING_OUT_GRAD
from gmm_kernels.scope import KnownIssue, Limits
from gmm_ref import Problem
from gmm_ref.conventions.megablox import DEFAULT_TILING

__all__ = ["EjkernelGroupedMatmul", "MegabloxGmm", "MegabloxTgmm", "backend_module", "gmm_grads", "ops_module"]


def backend_module() -> Any:
    """``jax.experimental.pallas.ops.tpu.megablox.gmm`` (the module, not the function)."""
    return importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")


def ops_module() -> Any:
    """``jax.experimental.pallas.ops.tpu.megablox.ops`` (``ops.gmm`` has a custom VJP)."""
    return importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.ops")


def _jax_or_none(x: Any) -> Any:
    return None if x is None else device_array(np.asarray(x))


def _static_args(lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any, tiling: Any,
                 group_offset: Any) -> tuple:
    """The leading arguments gmm and tgmm share, as megablox takes them."""
    return (device_array(np.asarray(lhs)), device_array(np.asarray(rhs)),
            device_array(np.asarray(group_sizes, np.int32)),
            np.dtype(preferred_element_type), tuple(int(t) for t in tiling), jax_group_offset(group_offset))


class _Megablox(KernelAdapter):
    requires = ("jax",)
    input_dtypes = ("float32", "bfloat16")
    output_dtypes = ("float32", "bfloat16", "float16")
    flush_subnormals = True
    default_precision = True

    def large_refusal(self) -> str | None:
        return self._runs_interpreted()

    def _unavailable(self) -> str | None:
        try:
            backend_module()
        except Exception as e:  # noqa: BLE001 - any import failure is the reason
            return f"cannot import megablox: {type(e).__name__}: {e}"
        return None


class MegabloxGmm(_Megablox):
    """``gmm(lhs [M,K], rhs [L,K,N] or [L,N,K], group_sizes [G], ...)`` -> ``[M, N]``."""

    name = "megablox.gmm"
    convention = "megablox.gmm"
    known_gradient_issues: ClassVar[dict[str, KnownIssue]] = {"existing_out": MEGABLOX_EXISTING_OUT_GRAD}

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = np.float32,
             tiling: Any = DEFAULT_TILING, group_offset: Any = None, existing_out: Any = None,
             transpose_rhs: bool = False) -> np.ndarray:
        lead = _static_args(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset)
        out = backend_module().gmm(*lead, _jax_or_none(existing_out), transpose_rhs=bool(transpose_rhs),
                                   interpret=True)
        return np.asarray(out)

    def vjp(self, problem: Problem, cotangent: Any) -> dict[str, np.ndarray]:
        """Gradients through megablox ``ops.gmm``'s custom VJP (see :func:`gmm_grads`)."""
        with self.arguments(problem) as ((lhs, rhs, gs), kw):
            grads = gmm_grads(lhs, rhs, gs, cotangent, **kw)
        del grads["out"]
        return grads


class MegabloxTgmm(_Megablox):
    """``tgmm(lhs [M, ΣK], rhs [ΣK, N], group_sizes [G], ...)`` -> ``[num_actual_groups or G, M, N]``.

    megablox names the operands ``lhs [k, m]`` and ``rhs [m, n]`` (its ``m`` is
    the ragged, contracted axis).
    """

    name = "megablox.tgmm"
    convention = "megablox.tgmm"

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = np.float32,
             tiling: Any = DEFAULT_TILING, group_offset: Any = None, num_actual_groups: Any = None,
             existing_out: Any = None) -> np.ndarray:
        lead = _static_args(lhs, rhs, group_sizes, preferred_element_type, tiling, group_offset)
        nag = None if num_actual_groups is None else int(num_actual_groups)
        out = backend_module().tgmm(*lead, nag, _jax_or_none(existing_out), interpret=True)
        return np.asarray(out)


def gmm_grads(lhs: Any, rhs: Any, group_sizes: Any, cotangent: Any, *,
              preferred_element_type: Any = np.float32, tiling: Any = DEFAULT_TILING,
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

    ops = ops_module()
    gs = device_array(np.asarray(group_sizes, np.int32))
    go = jax_group_offset(group_offset)
    ped = np.dtype(preferred_element_type)
    tl = tuple(int(t) for t in tiling)
    tr = bool(transpose_rhs)
    primals = [device_array(np.asarray(lhs)), device_array(np.asarray(rhs))]
    if existing_out is not None:
        primals.append(device_array(np.asarray(existing_out)))

    def f(a: Any, b: Any, ex: Any = None) -> Any:
        # ops.gmm = custom_vjp(backend.gmm, nondiff_argnums=(3, 4, 7, 8)): positional call.
        return ops.gmm(a, b, gs, ped, tl, go, ex, tr, True)

    out, pullback = jax.vjp(f, *primals)
    grads = pullback(device_array(np.asarray(cotangent).astype(np.dtype(out.dtype))))
    result = {"out": np.asarray(out), "lhs": np.asarray(grads[0]), "rhs": np.asarray(grads[1])}
    if existing_out is not None:
        result["existing_out"] = np.asarray(grads[2])
    return result


# ---- ejkernel grouped_matmul
# ejkernel ``grouped_matmul``: its XLA and Pallas TPU (interpret) implementations.
#
# The public ``ejkernel.modules.grouped_matmul`` autotunes on first use (about
# 3 s per shape here, printing tracebacks for configs it cannot time) and
# dispatches by ``(platform, jax backend)``: ``platform="pallas"`` finds no
# implementation for backend ``cpu``. These adapters therefore call the
# registered implementations directly:
#
# - ``ejkernel.grouped_matmul[xla]``: ``ejkernel.kernels._xla.grouped_matmul``,
#   i.e. ``lax.ragged_dot_general`` (+ ``existing_out`` added: it *accumulates*,
#   where megablox overwrites); ``group_offset`` fails (TypeError: unhashable
#   jax array); ``tiling`` and ``interpret`` are ignored.
# - ``ejkernel.grouped_matmul[pallas]``: ``ejkernel.kernels._pallas.tpu.grouped_matmul``
#   (v1), a megablox ``gmm`` copy, run with ``interpret=True``: same semantics
#   and constraints as ``megablox.gmm``.
# - ``[pallas_v2]`` / ``[pallas_v3]``: call ``pltpu.get_tpu_info()`` which raises
#   ``Unsupported TPU device kind: cpu``; v2 also refuses ``existing_out``.

# implementation -> problem feature (gmm_kernels.scope.FEATURES) -> why that implementation takes none of the
# problems that have it
_OPTIONS_REFUSED = {
    "xla": {"sharding": "ejkernel XLA grouped_matmul fails with group_offset (TypeError: unhashable jax array)",
            "existing_out": ("ejkernel XLA grouped_matmul adds existing_out (out = result + existing_out); "
                             "the megablox convention overwrites")},
    "pallas_v2": {"existing_out": "ejkernel grouped_matmulv2 raises NotImplementedError for existing_out"},
}

_KERNELS = {
    "xla": ("ejkernel.kernels._xla.grouped_matmul", "grouped_matmul"),
    "pallas": ("ejkernel.kernels._pallas.tpu.grouped_matmul", "grouped_matmul"),
    "pallas_v2": ("ejkernel.kernels._pallas.tpu.grouped_matmulv2", "grouped_matmulv2"),
    "pallas_v3": ("ejkernel.kernels._pallas.tpu.grouped_matmulv3", "grouped_matmulv3"),
}


def _kernel(impl: str) -> Any:
    mod, fn = _KERNELS[impl]
    return getattr(importlib.import_module(mod), fn)


class EjkernelGroupedMatmul(VariantAdapter):
    """ejkernel grouped matmul in the ``megablox.gmm`` convention."""

    op = "ejkernel.grouped_matmul"
    implementations = tuple(_KERNELS)
    xla_via = "ejkernel 0.0.80.3's XLA grouped_matmul calls lax.ragged_dot_general"
    convention = "megablox.gmm"
    requires = ("jax", "ejkernel")
    flush_subnormals = True
    default_precision = True

    def __init__(self, implementation: str = "xla") -> None:
        super().__init__(implementation)
        if implementation != "xla":  # megablox gmm copies: megablox's dtype rules
            self.input_dtypes = ("float32", "bfloat16")  # type: ignore[misc]
            self.output_dtypes = ("float32", "bfloat16", "float16")  # type: ignore[misc]
        else:
            self.input_dtypes = ("float64", "float32", "bfloat16", "float16")  # type: ignore[misc]  # jaxtyping Float

    def large_refusal(self) -> str | None:
        if self.implementation == "xla":
            return None
        return self._runs_interpreted()

    def _unavailable(self) -> str | None:
        if self.implementation.startswith("pallas_v"):
            import jax

            if jax.default_backend() != "tpu":
                return (f"ejkernel {self.implementation} needs a TPU: pltpu.get_tpu_info() raises "
                        "'Unsupported TPU device kind: cpu' even with interpret=True")
        try:
            _kernel(self.implementation)
        except Exception as e:  # noqa: BLE001
            return f"cannot import ejkernel {self.implementation}: {type(e).__name__}: {e}"
        return None

    def _refusal(self, problem: Problem) -> str | None:
        sharded = problem.group_offset != 0 or problem.num_local_groups != problem.num_groups
        for option, drawn in (("sharding", sharded), ("existing_out", problem.existing_out is not None)):
            why = self.option_refusal(option) if drawn else None
            if why is not None:
                return why
        return None

    def option_refusal(self, option: str) -> str | None:
        return _OPTIONS_REFUSED.get(self.implementation, {}).get(option)

    def _limits(self) -> Limits:
        """What :meth:`_refusal` declines, left out of the designs (so no draw is spent on it, and the
        modes that need it say why they do not apply)."""
        return Limits(refuses=tuple(_OPTIONS_REFUSED.get(self.implementation, {})))

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = np.float32,
             tiling: Any = DEFAULT_TILING, group_offset: Any = None, existing_out: Any = None,
             transpose_rhs: bool = False) -> np.ndarray:
        ped = np.dtype(preferred_element_type)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            kw: dict[str, Any] = dict(
                preferred_element_type=ped, tiling=tuple(int(t) for t in tiling),
                group_offset=jax_group_offset(group_offset),
                existing_out=None if existing_out is None else device_array(np.asarray(existing_out)),
                transpose_rhs=bool(transpose_rhs),
            )
            if self.implementation != "xla":
                kw["interpret"] = True
            out = _kernel(self.implementation)(
                device_array(np.asarray(lhs)), device_array(np.asarray(rhs)),
                device_array(np.asarray(group_sizes, np.int32)), **kw)
            return np.asarray(out)
