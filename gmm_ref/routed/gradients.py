"""Routed MoE gradients: the backward of one routed GEMM, each gradient a grouped problem of its own (docs/routed.md).

A :class:`RoutedBackward` is a :class:`~gmm_ref.routed.routing.Routing` (the forward) with the per-slot cotangent
``dY [T, top_k, N]`` of its per-slot output (in the output dtype) and, for a kernel that adds the experts' gradient
into one it is given, that ``existing`` gradient (the experts' shape and dtype). Of the forward
``out[t, j] = w[t, j] * W_e op x_t`` (``e`` the slot's local expert, ``w = 1`` unless ``mul_routed_weight``),
:func:`routed_gradients` gives, exactly in float64 and each rounded once to its dtype:

- the **per-slot input gradient** ``[T, top_k, K]``: ``w[t, j] * (dY[t, j] @ W_e)`` (``"enk"``: the experts'
  ``[N, K]``), what unsloth's ``grouped_gemm_dX`` returns before its sum over the slots; in the tokens' dtype;
- the **token gradient** ``[T, K]``: its sum over the slots of a token;
- the **experts' gradient** ``[E_local, N, K]`` (``"ekn"``: ``[E_local, K, N]``): ``sum_s w_s dY_s^T x_s`` over the
  slots ``s`` of each local expert (ragged K over them; 0 for an expert with no slot), plus ``existing``; in the
  experts' dtype;
- the **weights' gradient** ``[T, top_k]`` where ``mul_routed_weight``: ``dY[t, j] . (W_e op x_t)``; in the
  weights' dtype.

A slot of another rank's expert contributes nothing and reads nothing: its cotangent row, its weight, the tokens
only it routes and the experts no slot reads never reach a gradient (NaN there cannot leak). Its per-slot input
gradient follows the routing's ``foreign`` policy (zeros, or undefined), its weight's gradient is 0.

The per-slot input gradient is the routed reference of the cotangent's rows against the experts read the other way
round (a ``ragged_m`` problem per local expert: ``RoutedReference``, so its bounds are the per-slot and combined
bounds of :class:`~gmm_ref.routed.routing.RoutedNumerics`). The experts' gradient is a ``ragged_k`` problem (the slots
of one expert its contraction), whose bound is gmm_ref's grouped bound; :meth:`RoutedGradients.experts_bound` adds
where the weight and an existing gradient round (module docs in docs/routed.md, "The routed gradient model").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.checks import frozen_copy, set_field
from gmm_ref.exact import reference
from gmm_ref.numerics import U_REF, Numerics, error_bound, gamma
from gmm_ref.problem import Problem
from gmm_ref.routed.routing import RoutedNumerics, RoutedReference, Routing, ieee, routed_reference, tinies

__all__ = ["GRADIENT_OUTPUTS", "OUTPUTS", "RoutedBackward", "RoutedGradients", "routed_gradients"]

#: what a routed forward kernel returns: the per-slot output ``[T, top_k, N]``, or the combined ``[T, N]``
OUTPUTS = ("slots", "combined")
#: what a routed backward kernel returns: the per-slot input gradient ``[T, top_k, K]``, the token gradient
#: ``[T, K]``, the experts' gradient (the experts' layout), the weights' gradient ``[T, top_k]``
GRADIENT_OUTPUTS = ("d_slots", "d_tokens", "d_experts", "d_weights")


@dataclass(frozen=True, eq=False)
class RoutedBackward(Routing):
    """The backward of one routed GEMM: the forward :class:`Routing`, its per-slot ``cotangent [T, top_k, N]``
    (the output dtype; required) and ``existing``, an experts' gradient the kernel adds into (the experts' shape
    and dtype; None: none)."""

    cotangent: np.ndarray | None = None
    existing: np.ndarray | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        dy = self.cotangent
        if dy is None:
            raise ValueError("cotangent: required (the per-slot cotangent dY [T, top_k, N] of the forward's output)")
        if not isinstance(dy, np.ndarray):
            raise TypeError(f"cotangent: expected a numpy.ndarray, got {type(dy).__name__}")
        shape = (self.num_tokens, self.top_k, self.n)
        if dy.shape != shape or dy.dtype != np.dtype(self.out_dtype):
            raise ValueError(f"cotangent: expected shape {shape} and dtype {np.dtype(self.out_dtype)} (the per-slot "
                             f"output's), got shape {dy.shape} and dtype {dy.dtype}")
        set_field(self, "cotangent", frozen_copy(dy))
        ex = self.existing
        if ex is not None:
            if not isinstance(ex, np.ndarray):
                raise TypeError(f"existing: expected a numpy.ndarray, got {type(ex).__name__}")
            if ex.shape != self.experts.shape or ex.dtype != self.experts.dtype:
                raise ValueError(f"existing: expected the experts' shape {self.experts.shape} and dtype "
                                 f"{self.experts.dtype}, got shape {ex.shape} and dtype {ex.dtype}")
            set_field(self, "existing", frozen_copy(ex))

    @classmethod
    def of(cls, routing: Routing, cotangent: np.ndarray, existing: np.ndarray | None = None) -> RoutedBackward:
        """The backward of ``routing`` for ``cotangent`` (and ``existing``)."""
        if not isinstance(routing, Routing):
            raise TypeError(f"routing: expected a gmm_ref.Routing, got {type(routing).__name__}")
        fields = {f.name: getattr(routing, f.name) for f in dataclasses.fields(Routing)}
        return cls(**fields, cotangent=cotangent, existing=existing)

    @property
    def forward(self) -> Routing:
        """The forward routing alone."""
        return Routing(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Routing)})

    def describe(self) -> str:
        return (super().describe() + f", cotangent {self.cotangent.dtype}"
                + (f", existing experts' gradient {self.existing.dtype}" if self.existing is not None else ""))


def _slots_by_expert(r: Routing) -> tuple[np.ndarray, np.ndarray]:
    """The local slots' flat indices, grouped by local expert (experts in order, flat order within one), and the
    slot count of each local expert."""
    local = r.local_ids.reshape(-1)
    flat = np.flatnonzero(local >= 0)
    flat = flat[np.argsort(local[flat], kind="stable")]
    return flat, np.bincount(local[flat], minlength=r.num_local_experts).astype(np.int64)


class RoutedGradients:
    """The gradients of one :class:`RoutedBackward` (module docstring): ``inputs`` (a
    :class:`~gmm_ref.routed.routing.RoutedReference` over ``[T, top_k, K]``: ``slots`` / ``slots_exact`` /
    ``slot_bound`` the per-slot input gradient, ``combined`` / ``combined_exact`` / ``combined_bound`` the token
    gradient), the experts' gradient (``experts_exact``, ``experts``, :meth:`experts_bound`, ``experts_problem``)
    and the weights' (``weights_exact``, ``weights``, :meth:`weights_bound`)."""

    def __init__(self, backward: RoutedBackward):
        self.routing = backward
        self.flat, self.sizes = _slots_by_expert(backward)
        self.inputs = _inputs(backward, self.flat, self.sizes)
        self.experts_problem, self.abs_problems = _experts_problems(backward, self.flat, self.sizes)

    # ---------------------------------------------------------------------------------- the experts' gradient
    @cached_property
    def _sum(self) -> np.ndarray:
        """The exact ``sum_s w_s dY_s^T x_s`` per local expert (float64, the experts' layout; 0 without slots)."""
        p = self.experts_problem
        return np.zeros(self.routing.experts.shape) if p is None else reference(p).exact

    @cached_property
    def experts_exact(self) -> np.ndarray:
        """The experts' gradient in float64 (plus ``existing``)."""
        ex = self.routing.existing
        with np.errstate(invalid="ignore", over="ignore"):
            return self._sum if ex is None else self._sum + _dt.as_numpy(ex).astype(np.float64)

    @cached_property
    def experts(self) -> np.ndarray:
        """The experts' gradient rounded once to the experts' dtype."""
        return _dt.round_to(self.experts_exact, self.routing.experts.dtype)

    def _numerics(self, numerics: RoutedNumerics | Numerics | None, operands: tuple[Any, Any], out: Any
                 ) -> tuple[RoutedNumerics, Numerics]:
        """``numerics`` as a :class:`RoutedNumerics` and its product's :class:`Numerics` (the default of
        ``operands`` and ``out`` where it names none)."""
        rn = RoutedNumerics(product=numerics) if isinstance(numerics, Numerics) else (numerics or RoutedNumerics())
        if not isinstance(rn, RoutedNumerics):
            raise TypeError(f"numerics: expected a gmm_ref.RoutedNumerics, a gmm_ref.Numerics or None, got "
                            f"{type(numerics).__name__}")
        return rn, rn.product or Numerics.default_for(*operands, out)

    @ieee
    def experts_bound(self, numerics: RoutedNumerics | Numerics | None = None) -> np.ndarray:
        """Per-element bound on ``|kernel - experts_exact|``: the grouped bound of the ``ragged_k`` problem in the
        accumulator (``e_S``); weighted, the weighted cotangent rounded to the weight's dtype first
        (``RoutedNumerics.weight``: the accumulator's, or its dtype): ``(1 + u_g) e_S + u_g sum |g||x| + tiny_g
        sum |x|``; then one rounding to the experts' dtype, or, with ``existing``, its add in the accumulator after
        the reduction and then that rounding (one only where the accumulator is the experts' dtype)."""
        r = self.routing
        out = r.experts.dtype
        rn, num = self._numerics(numerics, (r.cotangent.dtype, r.tokens.dtype), out)
        p, s = self.experts_problem, self._sum
        e_s = np.zeros(s.shape) if p is None else error_bound(p, s, num)
        if p is not None and r.mul_routed_weight:
            g = rn.weight_dtype(r) or num.accumulate
            u_g, tiny_g = _dt.unit_roundoff(g), tinies(g, num.flush_subnormals)
            gx, x = (reference(q).exact for q in self.abs_problems)  # sum |g||x| and sum |x| per element
            e_s = (1 + u_g) * e_s + u_g * gx + tiny_g * x
        u_out, tiny_out = _dt.unit_roundoff(out), tinies(out, num.flush_subnormals)
        total = self.experts_exact
        if r.existing is None:
            return e_s + u_out * (np.abs(total) + e_s) + tiny_out
        acc = num.accumulate
        e_q = e_s + _dt.unit_roundoff(acc) * (np.abs(total) + e_s) + tinies(acc, num.flush_subnormals)
        return e_q if np.dtype(acc) == np.dtype(out) else e_q + u_out * (np.abs(total) + e_q) + tiny_out

    # ---------------------------------------------------------------------------------- the weights' gradient
    @cached_property
    def forward(self) -> RoutedReference:
        """The forward's reference (its products: what the weights' gradient reads)."""
        return routed_reference(self.routing.forward)

    @cached_property
    def weights_exact(self) -> np.ndarray:
        """``[T, top_k]`` float64: ``dY[t, j] . (W_e op x_t)`` for a local slot of a weighted routing, else 0."""
        r = self.routing
        if not r.mul_routed_weight:
            return np.zeros(r.topk_ids.shape)
        dy = np.where(self.inputs.local[:, :, None], _dt.as_numpy(r.cotangent).astype(np.float64), 0.0)
        with np.errstate(invalid="ignore", over="ignore"):
            return (dy * self.forward.products).sum(axis=2)

    @cached_property
    def weights(self) -> np.ndarray:
        """The weights' gradient rounded once to the weights' dtype (None without ``mul_routed_weight``)."""
        r = self.routing
        return None if not r.mul_routed_weight else _dt.round_to(self.weights_exact, r.topk_weights.dtype)

    @ieee
    def weights_bound(self, numerics: RoutedNumerics | Numerics | None = None) -> np.ndarray:
        """``[T, top_k]``: bound on ``|kernel - weights_exact|``: the product as the forward left it (in the
        accumulator, ``e_p``; rounded to the output dtype where the weight multiplies a rounded product, ``e_y``),
        its dot with the cotangent over ``N`` in the accumulator, one rounding to the weights' dtype."""
        r = self.routing
        rn, num = self._numerics(numerics, (r.tokens.dtype, r.experts.dtype), r.out_dtype)
        ref = self.forward
        p, e = ref.products, ref.product_error(num)
        if rn.weight != "accumulator":
            e = e + _dt.unit_roundoff(r.out_dtype) * (np.abs(p) + e) + tinies(r.out_dtype, num.flush_subnormals)
        a = np.abs(_dt.as_numpy(r.cotangent).astype(np.float64))
        a = np.where(self.inputs.local[:, :, None], a, 0.0)
        n = r.n
        tiny_acc = tinies(num.accumulate, num.flush_subnormals)
        err = ((a * e).sum(axis=2) + gamma(n + 1, num.u_acc) * (a * (np.abs(p) + e)).sum(axis=2) + n * tiny_acc
               + gamma(n + 1, U_REF) * (a * np.abs(p)).sum(axis=2))
        w = r.topk_weights.dtype if r.topk_weights is not None else np.dtype(np.float32)
        bound = err + _dt.unit_roundoff(w) * (np.abs(self.weights_exact) + err) + tinies(w, num.flush_subnormals)
        return np.where(self.inputs.local & bool(r.mul_routed_weight), bound, 0.0)

    def slots_of_expert(self, e: int) -> np.ndarray:
        """The flat slot indices of local expert ``e``."""
        start = int(self.sizes[:e].sum())
        return self.flat[start:start + int(self.sizes[e])]


def _inputs(b: RoutedBackward, flat: np.ndarray, sizes: np.ndarray) -> RoutedReference:
    """The per-slot input gradient as the routed reference of the cotangent's rows, each slot's row against its
    expert read the other way round (``dY @ W_e``), output in the tokens' dtype."""
    view = dataclasses.replace(b.forward, out_dtype=b.tokens.dtype)
    shape = (b.num_tokens, b.top_k, b.k)
    products = np.zeros(shape)
    rows = _dt.as_numpy(b.cotangent).reshape(-1, b.n)

    def product_of(t: int, j: int, e: int) -> np.ndarray:
        wt = _dt.as_numpy(b.experts[e]).astype(np.float64)
        dy = rows[t * b.top_k + j].astype(np.float64)
        return dy @ wt if b.expert_layout == "enk" else wt @ dy

    operands = (b.cotangent.dtype, b.experts.dtype)
    if flat.size == 0:
        return RoutedReference(view, products, lambda numerics: np.zeros(shape), operands=operands,
                               product_of=product_of)
    problem = Problem(family="ragged_m", lhs=b.cotangent.reshape(-1, b.n)[flat], rhs=b.experts, group_sizes=sizes,
                      rhs_transposed=b.expert_layout == "ekn", out_dtype=np.float64)
    ref = reference(problem)
    products.reshape(-1, b.k)[flat] = ref.exact

    def product_error(numerics: Numerics) -> np.ndarray:
        out = np.zeros(shape)
        out.reshape(-1, b.k)[flat] = error_bound(problem, ref.exact, numerics)
        return out

    return RoutedReference(view, products, product_error, operands=operands, product_of=product_of)


def _experts_problems(b: RoutedBackward, flat: np.ndarray, sizes: np.ndarray
                      ) -> tuple[Problem | None, tuple[Problem, Problem] | None]:
    """The experts' gradient as a ``ragged_k`` problem (the slots of each local expert its contraction: lhs
    ``[M, slots]`` and rhs ``[slots, N']`` as the experts' layout orders M and N'), float64 out, and where the
    routing is weighted the problems of ``|g| x |x|`` and ``1 x |x|`` (``sum |g||x|`` and ``sum |x|`` per element)
    for its bound; None where no slot is local."""
    if flat.size == 0:
        return None, None
    dy = b.cotangent.reshape(-1, b.n)[flat]
    x = b.tokens[flat // b.top_k]
    g = dy
    if b.mul_routed_weight:  # the weighted cotangent, exact in float64 (a product of two float32 or narrower)
        with np.errstate(invalid="ignore", over="ignore"):
            g = dy.astype(np.float64) * b.weights64().reshape(-1)[flat][:, None]
    enk = b.expert_layout == "enk"

    def problem(g: np.ndarray, x: np.ndarray) -> Problem:
        lhs, rhs = (g, x) if enk else (x, g)
        return Problem(family="ragged_k", lhs=lhs, rhs=rhs, group_sizes=sizes, lhs_transposed=True,
                       out_dtype=np.float64, empty="zero")

    p = problem(g, x)
    if not b.mul_routed_weight:
        return p, None
    ax = np.abs(_dt.as_numpy(x).astype(np.float64))
    ag = np.abs(_dt.as_numpy(g).astype(np.float64))
    return p, (problem(ag, ax), problem(np.ones_like(ag), ax))


def routed_gradients(backward: RoutedBackward) -> RoutedGradients:
    """The gradients of ``backward`` (module docstring)."""
    if not isinstance(backward, RoutedBackward):
        raise TypeError(f"backward: expected a gmm_ref.RoutedBackward (a Routing with its cotangent), got "
                        f"{type(backward).__name__}")
    return RoutedGradients(backward)
