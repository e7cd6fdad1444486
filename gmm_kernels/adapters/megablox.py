"""The adapters in the ``megablox.gmm`` and ``megablox.tgmm`` conventions (``gmm_ref.conventions.megablox``).

megablox ``gmm`` / ``tgmm`` (Pallas TPU kernels) run with ``interpret=True`` on CPU.

The kernels live in ``jax.experimental.pallas.ops.tpu.megablox.gmm``, a module
the package ``__init__`` shadows with the custom-VJP function of the same
name, so it is imported with importlib. One compile per shape and static set
(about 0.5-1.2 s here). Each call, forward or backward, is one jitted function
of its arrays (the static arguments baked in), run through
``gmm_kernels.runtimes.executables``: a shape compiled by an earlier process is loaded,
not traced, lowered or compiled again. The backward pass (:func:`gmm_grads`)
is jitted as a whole, one executable (run op by op, it compiled 23 programs).

Arithmetic here: the interpreter runs ``lax.dot_general(..., float32)`` on
CPU, so float32 and bfloat16 products are exact and accumulate in float32
(on a TPU, DEFAULT precision would pass float32 through bfloat16).

Also here: ejkernel's ``grouped_matmul`` (:class:`EjkernelGroupedMatmul`), in the ``megablox.gmm``
convention.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, ClassVar

import numpy as np

from gmm_kernels.base import KernelAdapter, VariantAdapter
from gmm_kernels.known_issues import MEGABLOX_EXISTING_OUT_GRAD
from gmm_kernels.runtimes import executables
from gmm_kernels.sandbox.convert import device_array, jax_group_offset, jax_x64, uses_64bit
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


def _arrays(lhs: Any, rhs: Any, group_sizes: Any, group_offset: Any, existing_out: Any) -> tuple:
    """The array arguments gmm and tgmm share, as megablox takes them (None where absent)."""
    return (device_array(np.asarray(lhs)), device_array(np.asarray(rhs)),
            device_array(np.asarray(group_sizes, np.int32)), jax_group_offset(group_offset),
            _jax_or_none(existing_out))


def _statics(preferred_element_type: Any, tiling: Any) -> tuple:
    return np.dtype(preferred_element_type), tuple(int(t) for t in tiling)


def _cached(fn: Any, name: str, *static: Any, libraries: tuple[str, ...] = ()) -> Any:
    return executables.cached(fn, name=name, static=static, modules=(__name__,), libraries=libraries)


@functools.cache
def _jitted_gmm(ped: Any, tiling: tuple, transpose_rhs: bool) -> Any:
    gmm = backend_module().gmm
    return _cached(lambda a, b, g, go, ex: gmm(a, b, g, ped, tiling, go, ex, transpose_rhs=transpose_rhs,
                                                interpret=True), "gmm", ped, tiling, transpose_rhs)


@functools.cache
def _jitted_tgmm(ped: Any, tiling: tuple, num_actual_groups: int | None) -> Any:
    tgmm = backend_module().tgmm
    return _cached(lambda a, b, g, go, ex: tgmm(a, b, g, ped, tiling, go, num_actual_groups, ex, interpret=True),
                   "tgmm", ped, tiling, num_actual_groups)


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
        fn = _jitted_gmm(*_statics(preferred_element_type, tiling), bool(transpose_rhs))
        return np.asarray(fn(*_arrays(lhs, rhs, group_sizes, group_offset, existing_out)))

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
        nag = None if num_actual_groups is None else int(num_actual_groups)
        fn = _jitted_tgmm(*_statics(preferred_element_type, tiling), nag)
        return np.asarray(fn(*_arrays(lhs, rhs, group_sizes, group_offset, existing_out)))


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
    0 (upstream bug, see :attr:`MegabloxGmm.known_gradient_issues`). The
    forward pass and the backward pass are one jitted function.
    """
    fn = _jitted_gmm_grads(*_statics(preferred_element_type, tiling), bool(transpose_rhs))
    out, *grads = fn(*_arrays(lhs, rhs, group_sizes, group_offset, existing_out), np.asarray(cotangent))
    result = {"out": np.asarray(out), "lhs": np.asarray(grads[0]), "rhs": np.asarray(grads[1])}
    if existing_out is not None:
        result["existing_out"] = np.asarray(grads[2])
    return result


@functools.cache
def _jitted_gmm_grads(ped: Any, tiling: tuple, transpose_rhs: bool) -> Any:
    import jax

    ops = ops_module()

    def f(lhs: Any, rhs: Any, gs: Any, go: Any, existing: Any, cotangent: Any) -> Any:
        def forward(a: Any, b: Any, *ex: Any) -> Any:
            # ops.gmm = custom_vjp(backend.gmm, nondiff_argnums=(3, 4, 7, 8)): positional call.
            return ops.gmm(a, b, gs, ped, tiling, go, ex[0] if ex else None, transpose_rhs, True)

        primals = (lhs, rhs) if existing is None else (lhs, rhs, existing)
        out, pullback = jax.vjp(forward, *primals)
        return (out, *pullback(cotangent.astype(out.dtype)))

    return _cached(f, "gmm_grads", ped, tiling, transpose_rhs)


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
# Each is called inside one jitted function of its arrays, through ``gmm_kernels.runtimes.executables`` (as a model
# calls it inside its step; the XLA implementation, not jitted itself, ran op by op before).
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
        ped, tl = _statics(preferred_element_type, tiling)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            fn = _jitted_ejkernel(self.implementation, ped, tl, bool(transpose_rhs))
            return np.asarray(fn(*_arrays(lhs, rhs, group_sizes, group_offset, existing_out)))


@functools.cache
def _jitted_ejkernel(implementation: str, ped: Any, tiling: tuple, transpose_rhs: bool) -> Any:
    kernel = _kernel(implementation)
    interpret = {} if implementation == "xla" else {"interpret": True}

    def f(a: Any, b: Any, g: Any, go: Any, ex: Any) -> Any:
        return kernel(a, b, g, preferred_element_type=ped, tiling=tiling, group_offset=go, existing_out=ex,
                      transpose_rhs=transpose_rhs, **interpret)

    return _cached(f, f"ejkernel.grouped_matmul[{implementation}]", ped, tiling, transpose_rhs,
                   libraries=("ejkernel",))
