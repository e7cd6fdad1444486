"""The adapter interface: one object per real grouped-GEMM kernel.

An adapter takes a kernel's *convention arguments* (NumPy arrays and Python
values in the order and names of the kernel's public API, as
``gmm_ref.Problem.arguments()`` produces them), runs the kernel and returns a
NumPy array (bfloat16 as ``ml_dtypes.bfloat16``). It also says whether the
kernel can run on this machine (:meth:`KernelAdapter.available`), whether it
can take a given problem (:meth:`KernelAdapter.supports`), and what arithmetic
it does (:attr:`KernelAdapter.numerics`).

Nothing here imports jax or torch; subclasses import them lazily.
"""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

import numpy as np

from gmm_ref import Numerics

__all__ = ["KernelAdapter", "missing_module", "dtype_name"]


def missing_module(*modules: str) -> str | None:
    """The reason the first of ``modules`` that cannot be found is missing, else None."""
    for mod in modules:
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{mod.split('.')[0]} is not installed"
    return None


def dtype_name(dt: Any) -> str:
    """A dtype's short name (``float32``, ``bfloat16``)."""
    return str(np.dtype(dt))


class KernelAdapter:
    """Base class of the built-in adapters.

    Class attributes (override in subclasses): ``name``, ``convention``,
    ``numerics`` (for float32 / bfloat16 inputs; see :meth:`numerics_for`),
    ``deterministic``, ``known_issues`` (mode name, a key of
    ``property_tests.checking.MODES``, -> the upstream bug that makes the
    kernel fail that mode, verified on this machine) and ``max_examples``
    (a per-mode example budget for slow kernels; None: the profile's).
    """

    name: ClassVar[str] = "abstract"
    convention: ClassVar[str] = ""
    numerics: ClassVar[Numerics] = Numerics(multiply=None, accumulate=np.float32)
    deterministic: ClassVar[bool] = True
    known_issues: ClassVar[dict[str, str]] = {}
    max_examples: ClassVar[int | None] = None

    # ------------------------------------------------------------- capability
    def available(self) -> str | None:
        """None when the kernel can run here, else the reason it cannot."""
        return None

    def supports(self, problem: Any) -> str | None:
        """None when the kernel can take ``problem``, else the reason it cannot."""
        if problem.convention not in (None, self.convention):
            return f"{self.name} takes the {self.convention!r} convention, not {problem.convention!r}"
        return None

    def numerics_for(self, problem: Any) -> Numerics:
        """The arithmetic used for ``problem`` (float64 inputs widen the accumulator)."""
        return self.numerics

    def strategy_options(self) -> dict[str, Any]:
        """Keyword options for ``property_tests.strategies.problems`` that encode hard
        constraints of this kernel beyond its convention (dtypes, shapes, tiling, group
        counts), so strategies draw only problems it takes instead of filtering."""
        return {}

    # ------------------------------------------------------------------ running
    def call(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """Run the kernel on convention arguments; return NumPy."""
        raise NotImplementedError

    def run(self, problem: Any) -> np.ndarray:
        """Run the kernel on ``problem`` in this adapter's convention."""
        if problem.convention != self.convention:
            problem = problem.replace(convention=self.convention)
        args, kwargs = problem.arguments()
        return self.call(*args, **kwargs)

    def differentiable_fn(self) -> Any:
        """The kernel as a function of its convention's (jax or torch) arguments that
        ``jax.vjp`` / torch autograd can differentiate, or None."""
        return None

    def vjp(self, problem: Any, cotangent: Any) -> dict[str, np.ndarray]:
        """Reverse-mode gradients of ``run(problem)`` for ``cotangent``:
        ``{"lhs", "rhs"}`` (and ``"existing_out"`` when the problem has one), stored
        like the inputs; compare with ``gmm_ref.gradients``. Raises NotImplementedError
        where the kernel (or this adapter) has no gradient."""
        fn = self.differentiable_fn()
        if fn is None:
            raise NotImplementedError(f"{self.name}: no reverse-mode gradient in this adapter")
        from gmm_kernels.user import FunctionAdapter

        return FunctionAdapter(fn, self.convention, name=self.name).vjp(problem, cotangent)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.convention})>"
