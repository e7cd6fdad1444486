"""Routed MoE: tokens gathered per expert, one GEMM per expert, the result scattered back (docs/routed.md).

The model (:class:`Routing`), as vLLM's and SGLang's ``fused_moe_kernel`` and unsloth's grouped GEMM take it:

- ``tokens [T, K]``: the tokens in their own (unpermuted) order; ``T = 0`` is allowed;
- ``topk_ids [T, top_k]`` (int32 or int64, ``top_k >= 1``): slot ``(t, j)`` routes token ``t`` to the
  *global* expert ``topk_ids[t, j]`` in ``[0, num_experts)``; its flat index is ``t * top_k + j``;
- ``topk_weights [T, top_k]`` (float32, float16 or bfloat16), multiplied in where ``mul_routed_weight``;
- ``experts``: the weights of the experts of this rank, ``[E_local, N, K]`` (``expert_layout="enk"``, vLLM,
  SGLang, unsloth) or ``[E_local, K, N]`` (``"ekn"``);
- ``expert_map [num_experts]`` (expert parallelism): global -> local expert, -1 for an expert on another rank;
  without it every expert is local (``num_experts = E_local``).

The output per slot is ``out[t, j] = w[t, j] * (tokens[t] @ W[local(topk_ids[t, j])])`` (``w = 1`` unless
``mul_routed_weight``), ``[T, top_k, N]``; a slot routed to a non-local expert holds zeros (``foreign="zero"``:
vLLM's ``fused_moe_kernel`` writes zeros for a block whose ``expert_ids`` entry is -1) or anything
(``"undefined"``: a kernel that skips the slot, as vLLM does under ``ignore_invalid_experts``). The combined
output ``[T, N]`` is the sum over slots (non-local slots add nothing).

A token may list one expert in two slots: the model allows it. Each slot is computed on its own (its flat index
is distinct even when the expert repeats), so the value is well defined, and vLLM's ``moe_align_block_size``
counts and places slots, not tokens. vLLM's routers (``torch.topk``) never produce a repeat; a convention whose
kernel relies on that refuses a routing with :attr:`Routing.repeats_an_expert`.

The reference gathers the local slots per expert into a ``ragged_m`` :class:`~gmm_ref.problem.Problem` and runs
the exact reference on it (:func:`routed_reference`); each per-slot value and each combined value is rounded
once to the output dtype. The bounds of the kernels' rounding choices are :class:`RoutedNumerics`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.checks import choice, frozen_copy, output_dtype, set_field
from gmm_ref.exact import reference
from gmm_ref.numerics import U_REF, Numerics, error_bound, gamma, min_normal, parse_numerics
from gmm_ref.problem import Problem

__all__ = ["EXPERT_LAYOUTS", "ID_DTYPES", "ROUTED_NUMERICS_KEYS", "WEIGHT_DTYPES", "RoutedNumerics", "RoutedReference",
           "Routing", "parse_declared_numerics", "parse_routed_numerics", "peaked_weights", "routed_reference"]

#: how the experts' weights are stored: ``[E, N, K]`` (vLLM, SGLang, unsloth) or ``[E, K, N]``
EXPERT_LAYOUTS = ("enk", "ekn")
#: the dtypes of ``topk_ids`` and ``expert_map``
ID_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
#: the dtypes of ``topk_weights``: every value exact in a float32 accumulator
WEIGHT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), _dt.as_dtype("bfloat16"))
FOREIGN_POLICIES = ("zero", "undefined")


def _array(name: str, value: Any, ndim: int) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(value).__name__}")
    if value.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {value.shape}")
    return value


def check_ids(name: str, ids: Any, num_experts: int, ndim: int = 2) -> np.ndarray:
    """``ids`` as an int32/int64 array of ``ndim`` dimensions whose every value is an expert in
    ``[0, num_experts)``; a ValueError names the first index out of range."""
    ids = _array(name, ids, ndim)
    if ids.dtype not in ID_DTYPES:
        raise TypeError(f"{name}: expected int32 or int64 expert ids, got {ids.dtype}")
    bad = np.argwhere((ids < 0) | (ids >= num_experts))
    if len(bad):
        at = tuple(int(i) for i in bad[0])
        raise ValueError(f"{name}[{', '.join(map(str, at))}] = {int(ids[at])}: expected an expert id in "
                         f"[0, {num_experts}) ({len(bad)} out of range; a non-local expert is expressed by "
                         f"expert_map, not by an id of -1)")
    return ids


def check_expert_map(expert_map: Any, num_local: int | None) -> np.ndarray:
    """``expert_map`` as a 1-D int32/int64 array of local experts (-1: elsewhere), each local expert once;
    ``num_local``: the local experts' count (None: not known, only the -1 / distinctness rules apply)."""
    m = _array("expert_map", expert_map, 1)
    if m.dtype not in ID_DTYPES:
        raise TypeError(f"expert_map: expected int32 or int64 local expert ids, got {m.dtype}")
    hi = num_local if num_local is not None else np.iinfo(np.int64).max
    bad = np.flatnonzero((m < -1) | (m >= hi))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"expert_map[{i}] = {int(m[i])}: expected -1 (another rank's expert) or a local expert "
                         f"in [0, {num_local})")
    local = m[m >= 0]
    uniq, counts = np.unique(local, return_counts=True)
    if (counts > 1).any():
        e = int(uniq[counts > 1][0])
        where = np.flatnonzero(m == e)
        raise ValueError(f"expert_map[{int(where[0])}] and expert_map[{int(where[1])}] both map to local expert "
                         f"{e}: each local expert is one global expert")
    return m


@dataclass(frozen=True, eq=False)
class Routing:
    """One routed MoE GEMM: tokens, routing, the experts of this rank (module docstring, docs/routed.md)."""

    tokens: np.ndarray
    experts: np.ndarray
    topk_ids: np.ndarray
    topk_weights: np.ndarray | None = None
    expert_layout: str = "enk"
    expert_map: np.ndarray | None = None
    mul_routed_weight: bool = False
    out_dtype: Any = None
    foreign: str = "zero"

    def __post_init__(self) -> None:
        choice("expert_layout", self.expert_layout, EXPERT_LAYOUTS)
        choice("foreign", self.foreign, FOREIGN_POLICIES)
        if not isinstance(self.mul_routed_weight, (bool, np.bool_)):
            raise TypeError(f"mul_routed_weight: expected a bool, got {self.mul_routed_weight!r}")
        for name in ("tokens", "experts"):
            arr = _array(name, getattr(self, name), 2 if name == "tokens" else 3)
            if arr.dtype not in _dt.INPUT_DTYPES or _dt.is_integer(arr.dtype):
                raise TypeError(f"{name}: expected a float dtype of {[str(d) for d in _dt.INPUT_DTYPES[:-1]]}, "
                                f"got {arr.dtype} (integer and scaled routed MoE are not modelled yet)")
            set_field(self, name, frozen_copy(arr))
        k_at = 2 if self.expert_layout == "enk" else 1
        if self.experts.shape[k_at] != self.tokens.shape[1]:
            raise ValueError(f"experts: expected K = {self.tokens.shape[1]} (tokens' last axis) on axis {k_at} of "
                             f"its {self.expert_layout!r} layout, got shape {self.experts.shape}")
        set_field(self, "out_dtype", output_dtype(self.tokens.dtype, self.experts.dtype, self.out_dtype))
        if self.expert_map is not None:
            set_field(self, "expert_map", frozen_copy(check_expert_map(self.expert_map, self.num_local_experts)))
        ids = check_ids("topk_ids", self.topk_ids, self.num_experts)
        if ids.shape[0] != self.num_tokens or ids.shape[1] < 1:
            raise ValueError(f"topk_ids: expected shape [T={self.num_tokens}, top_k >= 1], got {ids.shape}")
        set_field(self, "topk_ids", frozen_copy(ids))
        self._check_weights()

    def _check_weights(self) -> None:
        w = self.topk_weights
        if w is None:
            if self.mul_routed_weight:
                raise ValueError("topk_weights: required with mul_routed_weight=True")
            return
        w = _array("topk_weights", w, 2)
        if w.shape != self.topk_ids.shape:
            raise ValueError(f"topk_weights: expected the shape of topk_ids {self.topk_ids.shape}, got {w.shape}")
        if w.dtype not in WEIGHT_DTYPES:
            raise TypeError(f"topk_weights: expected one of {[str(d) for d in WEIGHT_DTYPES]}, got {w.dtype}")
        set_field(self, "topk_weights", frozen_copy(w))

    # ------------------------------------------------------------------ facts
    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.topk_ids.shape[1])

    @property
    def num_local_experts(self) -> int:
        return int(self.experts.shape[0])

    @property
    def num_experts(self) -> int:
        """The global experts' count: ``expert_map``'s length, else the local experts'."""
        return int(self.expert_map.shape[0]) if self.expert_map is not None else self.num_local_experts

    @property
    def n(self) -> int:
        return int(self.experts.shape[1 if self.expert_layout == "enk" else 2])

    @property
    def k(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def local_ids(self) -> np.ndarray:
        """``[T, top_k]`` int64: each slot's local expert, -1 for one on another rank."""
        ids = self.topk_ids.astype(np.int64)
        return ids if self.expert_map is None else self.expert_map.astype(np.int64)[ids]

    @property
    def repeats_an_expert(self) -> bool:
        """Whether some token lists one expert in two of its slots (allowed; docs/routed.md)."""
        if self.top_k < 2 or self.num_tokens == 0:
            return False
        s = np.sort(self.topk_ids, axis=1)
        return bool((s[:, 1:] == s[:, :-1]).any())

    def describe(self) -> str:
        """One line: the routing's static facts (extents, expert counts, top_k, dtypes, flags)."""
        return (f"Routing: T={self.num_tokens}, K={self.k}, N={self.n}, {self.num_experts} experts "
                f"({self.num_local_experts} local), top_k={self.top_k}, {self.tokens.dtype} -> "
                f"{np.dtype(self.out_dtype)}, {self.expert_layout}, mul_routed_weight={bool(self.mul_routed_weight)}, "
                f"foreign={self.foreign!r}")

    def weights64(self) -> np.ndarray:
        """``[T, top_k]`` float64: the weight each slot is multiplied by (1 without ``mul_routed_weight``)."""
        if not self.mul_routed_weight:
            return np.ones(self.topk_ids.shape, np.float64)
        return self.topk_weights.astype(np.float64)

    def grouped_problem(self) -> tuple[Problem, np.ndarray] | None:
        """The local slots as a ``ragged_m`` problem (rows gathered per local expert, experts in order, slots in
        flat order within one) and the flat slot index of each of its rows; None when no slot is local."""
        local = self.local_ids.reshape(-1)
        flat = np.flatnonzero(local >= 0)
        if flat.size == 0:
            return None
        flat = flat[np.argsort(local[flat], kind="stable")]
        sizes = np.bincount(local[flat], minlength=self.num_local_experts).astype(np.int64)
        lhs = self.tokens[flat // self.top_k]
        # float64 out: the exact values do not depend on it, and its bound is the product's error alone
        problem = Problem(family="ragged_m", lhs=lhs, rhs=self.experts, group_sizes=sizes,
                          rhs_transposed=self.expert_layout == "enk", out_dtype=np.float64)
        return problem, flat


def peaked_weights(weights: np.ndarray, signs: np.ndarray, tails: np.ndarray, out_dtype: Any) -> np.ndarray:
    """A peaked router's weights (docs/routed.md), a new ``[T, top_k]`` array of ``weights``' dtype: slot 0 holds
    the largest (``torch.topk`` sorts them), ``|weights[:, 0]|`` clamped to [1, 2] where it is an integer, else to
    [0.5, 1 - 2**-8], times ``signs [T]`` (+-1); every other slot a tail of its sign, ``tails [T, top_k - 1]`` (1.5
    or 1.75) times ``2**-(m + 3)`` times slot 0's weight, ``m`` the output dtype's fraction bits (never below the
    weight dtype's normal range; every weight exact). A token whose slots share one expert then adds a dominant
    slot and ``top_k - 1`` small ones of its sign, each between a quarter and a half of a unit in the last place
    of the dominant one in the output dtype: a combine rounding every add to the output dtype drops each."""
    w = np.asarray(weights)
    w0 = np.abs(w[:, 0].astype(np.float64))
    w0 = np.where(w0 == np.round(w0), np.clip(w0, 1, 2), np.clip(w0, 0.5, 1.0 - 2 ** -8))
    e = min(_dt.float_format(np.dtype(out_dtype)).mant + 3, -_dt.float_format(w.dtype).emin - 1)
    sign = np.asarray(signs, np.float64)
    out = np.empty_like(w)
    out[:, 0] = _dt.round_to(sign * w0, w.dtype)
    out[:, 1:] = _dt.round_to(sign[:, None] * w0[:, None] * np.asarray(tails, np.float64) * 2.0 ** -e, w.dtype)
    return out


# ---------------------------------------------------------------------------------------------- numerics
@dataclass(frozen=True)
class RoutedNumerics:
    """How a routed kernel rounds between the product, the weight and the sum (docs/routed.md).

    ``product``: the GEMM's own :class:`~gmm_ref.numerics.Numerics` (None: the default for the dtypes).
    ``weight``: where the routed weight multiplies in: ``"accumulator"`` (vLLM's ``MUL_ROUTED_WEIGHT``: the
    accumulator times the weight, then one rounding to the output dtype), ``"output"`` (unsloth's
    ``FUSE_MUL_POST``: the product rounded to the output dtype, the weight rounded to it, their product rounded
    to it) or a dtype ``D`` (torch MoE layers: the product rounded to the output dtype by the GEMM, the weight
    rounded to ``D`` (exact where it fits), their product rounded to ``D``; ``"output"`` is ``D`` = the output
    dtype). ``combine``: how the combined ``[T, N]`` sums the slots: ``"accumulator"`` (the weighted slots, as
    the weight step left them, summed in the accumulator, one rounding) or a dtype: every slot rounded to the
    output dtype, then summed in that dtype (vLLM's ``moe_sum`` sums in the output dtype for top_k 2 to 4,
    torch's sum in float32 for the others; transformers' ``index_add_`` into the hidden states' dtype), then
    rounded once to the output dtype.
    """

    product: Numerics | None = None
    weight: str = "accumulator"
    combine: Any = "accumulator"

    def __post_init__(self) -> None:
        if self.product is not None and not isinstance(self.product, Numerics):
            raise TypeError(f"product: expected a gmm_ref.Numerics or None, got {type(self.product).__name__}")
        if not (isinstance(self.weight, str) and self.weight in ("accumulator", "output")):
            try:
                dtype = _dt.as_dtype(self.weight, name="weight")
            except TypeError:
                raise ValueError(f"weight: expected one of ('accumulator', 'output') or a float dtype, got "
                                 f"{self.weight!r}") from None
            if _dt.is_integer(dtype):
                raise TypeError(f"weight: expected 'accumulator', 'output' or a float dtype, got {dtype}")
            object.__setattr__(self, "weight", dtype)
        if not (isinstance(self.combine, str) and self.combine == "accumulator"):
            dtype = _dt.as_dtype(self.combine, name="combine")
            if _dt.is_integer(dtype):
                raise TypeError(f"combine: expected 'accumulator' or a float dtype, got {dtype}")
            object.__setattr__(self, "combine", dtype)
        elif self.weight == "output":
            raise ValueError("combine: 'accumulator' sums the weighted products in the accumulator, but "
                             "weight='output' rounds them to the output dtype first: give combine the dtype the "
                             "rounded slots are summed in")

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON: the product's :meth:`Numerics.to_json` (None: the default), weight and combine as
        text."""
        return {"product": None if self.product is None else self.product.to_json(), "weight": str(self.weight),
                "combine": str(self.combine)}

    def describe(self) -> str:
        """One line: the product's numerics, where the weight multiplies in, how the slots are combined."""
        product = ("the default for the dtypes" if self.product is None
                   else ", ".join(f"{k}={v}" for k, v in self.product.to_json().items()))
        return f"product {product}; weight {self.weight}; combine {self.combine}"

    def weight_dtype(self, r: Routing) -> np.dtype | None:
        """The dtype the weight multiplies the rounded product in (None: in the accumulator)."""
        if isinstance(self.weight, str):
            return None if self.weight == "accumulator" else np.dtype(r.out_dtype)
        return self.weight

    def product_numerics(self, r: Routing) -> Numerics:
        return self.product or Numerics.default_for(r.tokens.dtype, r.experts.dtype, r.out_dtype)


#: the keys of ``--numerics`` that only a routed kernel's :class:`RoutedNumerics` has
ROUTED_NUMERICS_KEYS = ("weight", "combine")


def _routed_items(text: str) -> tuple[list[str], dict[str, str]]:
    """``text``'s items split into the product's (``parse_numerics``'s) and the routed keys' values."""
    product, routed = [], {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        key, eq, value = item.partition("=")
        if key.strip() in ROUTED_NUMERICS_KEYS:
            routed[key.strip()] = value.strip() if eq else ""
        else:
            product.append(item)
    return product, routed


def parse_routed_numerics(text: str | None, *, option: str = "--numerics") -> RoutedNumerics | None:
    """``"accumulate=float32,flush,weight=output,combine=bfloat16"`` -> :class:`RoutedNumerics`; ValueError naming
    ``option``.

    ``weight=accumulator|output|DTYPE`` and ``combine=accumulator|DTYPE`` are its fields (default
    ``accumulator`` each); the other items are :func:`gmm_ref.numerics.parse_numerics`'s, the product's
    :class:`Numerics` (none of them: ``product`` None, the kernel's default for the dtypes)."""
    if text is None:
        return None
    product_items, routed = _routed_items(text)
    for key, value in routed.items():
        if not value:
            forms = "accumulator|output|DTYPE" if key == "weight" else "accumulator|DTYPE"
            raise ValueError(f"{option}: expected {key}={forms}, got {key!r}")
    product = parse_numerics(",".join(product_items), option=option) if product_items else None
    try:
        return RoutedNumerics(product=product, **routed)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{option}: {exc}") from None


def parse_declared_numerics(text: str | None, *, option: str = "--numerics") -> Numerics | RoutedNumerics | None:
    """The command lines' ``--numerics``: a :class:`RoutedNumerics` where ``text`` names ``weight=`` or
    ``combine=`` (:func:`parse_routed_numerics`), else a :class:`Numerics` (``parse_numerics``); a routed kernel
    takes either (a :class:`Numerics` is its product's), a grouped GEMM only the second
    (``gmm_kernels.configure`` says so)."""
    if text is None:
        return None
    if _routed_items(text)[1]:
        return parse_routed_numerics(text, option=option)
    return parse_numerics(text, option=option)


def _routed_numerics(numerics: Any) -> RoutedNumerics:
    if numerics is None:
        return RoutedNumerics()
    if not isinstance(numerics, RoutedNumerics):
        raise TypeError(f"numerics: expected a gmm_ref.RoutedNumerics or None, got {type(numerics).__name__}"
                        + (" (wrap it: RoutedNumerics(product=...))" if isinstance(numerics, Numerics) else ""))
    return numerics


def ieee(fn: Any) -> Any:
    """``fn`` with NaN / Inf propagating silently, as IEEE says (a NaN weight or input makes a NaN bound)."""
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(invalid="ignore", over="ignore"):
            return fn(*args, **kwargs)
    return wrapped


def tinies(dtype: Any, flush: bool) -> float:
    """The absolute error one rounding into ``dtype`` may add below its normal range."""
    fmt = _dt.float_format(dtype)
    return fmt.tiny + (min_normal(dtype) if flush else 0.0)


@ieee
def _weighted_error(p: np.ndarray, e_p: np.ndarray, w: np.ndarray, rn: RoutedNumerics, r: Routing,
                    num: Numerics) -> np.ndarray:
    """Bound on ``|q - w * p|`` for the weighted slot value ``q`` before the final rounding to the output dtype
    (``"accumulator"``, a dtype) or after it (``"output"``), given ``|p_kernel - p| <= e_p``."""
    aw, d = np.abs(w), rn.weight_dtype(r)
    if d is None:
        u, tiny = num.u_acc, tinies(num.accumulate, num.flush_subnormals)
        return aw * e_p + u * aw * (np.abs(p) + e_p) + tiny
    u_o, tiny_o = _dt.unit_roundoff(r.out_dtype), tinies(r.out_dtype, num.flush_subnormals)
    u, tiny = _dt.unit_roundoff(d), tinies(d, num.flush_subnormals)
    e_y = e_p + u_o * (np.abs(p) + e_p) + tiny_o  # the product rounded to the output dtype
    w_hi = aw * (1 + u) + tiny  # the weight rounded to d
    return w_hi * e_y + (u * aw + tiny) * np.abs(p) + u * w_hi * (np.abs(p) + e_y) + tiny


class RoutedReference:
    """The reference of one :class:`Routing`: per-slot and combined exact values (float64), each rounded once
    (``slots``, ``combined``), the per-slot mask and the bounds of :class:`RoutedNumerics`."""

    def __init__(self, routing: Routing, products: np.ndarray, product_error: Any, *,
                 operands: tuple[Any, Any] | None = None, product_of: Any = None):
        self.routing = routing
        #: ``[T, top_k, N]`` float64: ``tokens[t] @ W[e]`` of every local slot, 0 elsewhere (unweighted)
        self.products = products
        self._product_error = product_error
        #: the GEMM's operand dtypes (the default product numerics'): the tokens' and the experts' unless given
        self.operands = operands or (routing.tokens.dtype, routing.experts.dtype)
        self._product_of = product_of
        self._errors: dict[Numerics, np.ndarray] = {}
        #: ``[T, top_k]``: whether the slot's expert is on this rank
        self.local = routing.local_ids >= 0
        #: ``[T, top_k, N]`` float64: the exact per-slot output (weighted where the routing says)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN / Inf propagate as IEEE says
            weighted = products * routing.weights64()[:, :, None]
        # a non-local slot is zero whatever its weight (a NaN weight there must not leak into the sum)
        self.slots_exact = np.where(self.local[:, :, None], weighted, 0.0)
        #: ``[T, N]`` float64: the exact combined output, the sum of the slots (their float64 sum)
        self.combined_exact = self.slots_exact.sum(axis=1)
        mask = np.ones(products.shape, bool)
        if routing.foreign == "undefined":
            mask &= self.local[:, :, None]
        #: ``[T, top_k, N]``: the per-slot elements the contract defines (the combined output: all)
        self.slots_mask = mask

    @cached_property
    def slots(self) -> np.ndarray:
        """The per-slot output, each element rounded once to the output dtype."""
        return _dt.round_to(self.slots_exact, self.routing.out_dtype)

    @cached_property
    def combined(self) -> np.ndarray:
        """The combined output, the exact sum of the weighted products rounded once to the output dtype."""
        return _dt.round_to(self.combined_exact, self.routing.out_dtype)

    def product_of(self, t: int, j: int, e: int) -> np.ndarray:
        """Slot ``(t, j)``'s unweighted product computed with local expert ``e`` (float64; a report's "what if")."""
        if self._product_of is not None:
            return self._product_of(t, j, e)
        r = self.routing
        x = _dt.as_numpy(r.tokens[t]).astype(np.float64)
        wt = _dt.as_numpy(r.experts[e]).astype(np.float64)
        return wt @ x if r.expert_layout == "enk" else x @ wt

    def routed_numerics(self, numerics: RoutedNumerics | None) -> tuple[RoutedNumerics, Numerics]:
        """``numerics`` (None: the default) and its product's :class:`Numerics` (None: the default for
        :attr:`operands` and the output dtype)."""
        rn = _routed_numerics(numerics)
        r = self.routing
        return rn, rn.product or Numerics.default_for(*self.operands, r.out_dtype)

    def product_error(self, numerics: Numerics) -> np.ndarray:
        """``[T, top_k, N]``: bound on the error of a kernel's accumulator value of each local slot's product
        (gmm_ref.numerics' bound of the grouped problem, before any rounding to the output dtype); 0 elsewhere."""
        if not isinstance(numerics, Numerics):
            raise TypeError(f"numerics: expected a gmm_ref.Numerics, got {type(numerics).__name__}")
        if numerics not in self._errors:  # the costly part of every bound: once per numerics
            err = self._product_error(numerics)
            err.flags.writeable = False
            self._errors[numerics] = err
        return self._errors[numerics]

    @ieee
    def slot_bound(self, numerics: RoutedNumerics | None = None) -> np.ndarray:
        """``[T, top_k, N]``: per-element bound on ``|kernel slot - slots_exact|``."""
        r, (rn, num) = self.routing, self.routed_numerics(numerics)
        p, e_p = self.products, self.product_error(num)
        u_out, tiny_out = _dt.unit_roundoff(r.out_dtype), tinies(r.out_dtype, num.flush_subnormals)
        ref = gamma(2, U_REF) * np.abs(self.slots_exact)  # the float64 weight product
        if not r.mul_routed_weight:
            bound = e_p + u_out * (np.abs(p) + e_p) + tiny_out
        elif rn.weight_dtype(r) == np.dtype(r.out_dtype):  # the weighted product already in the output dtype
            bound = _weighted_error(p, e_p, r.weights64()[:, :, None], rn, r, num) + ref
        else:
            e_q = _weighted_error(p, e_p, r.weights64()[:, :, None], rn, r, num) + ref
            bound = e_q + u_out * (np.abs(self.slots_exact) + e_q) + tiny_out
        return np.where(self.local[:, :, None], bound, 0.0)

    @ieee
    def combined_bound(self, numerics: RoutedNumerics | None = None) -> np.ndarray:
        """``[T, N]``: per-element bound on ``|kernel combined - combined_exact|`` (``top_k`` terms a row)."""
        r, (rn, num) = self.routing, self.routed_numerics(numerics)
        u_out, tiny_out = _dt.unit_roundoff(r.out_dtype), tinies(r.out_dtype, num.flush_subnormals)
        adds, mag = r.top_k - 1, np.abs(self.slots_exact)
        local = self.local[:, :, None]
        if isinstance(rn.combine, str):  # summed in the accumulator, one rounding
            u, tiny = num.u_acc, tinies(num.accumulate, num.flush_subnormals)
            e = _weighted_error(self.products, self.product_error(num), r.weights64()[:, :, None], rn, r, num)
            e = np.where(local, e, 0.0)
            err = e.sum(axis=1) + gamma(adds, u) * (mag + e).sum(axis=1) + adds * tiny
        else:  # every slot rounded to the output dtype, then summed in rn.combine
            b = self.slot_bound(rn)
            u, tiny = _dt.unit_roundoff(rn.combine), tinies(rn.combine, num.flush_subnormals)
            err = b.sum(axis=1) + gamma(adds, u) * (mag + b).sum(axis=1) + adds * tiny
            if rn.combine == r.out_dtype:  # every add already rounded to the output dtype
                return err + gamma(r.top_k + 1, U_REF) * mag.sum(axis=1)
        err = err + gamma(r.top_k + 1, U_REF) * mag.sum(axis=1)  # the reference's own float64 sum
        return err + u_out * (np.abs(self.combined_exact) + err) + tiny_out


def routed_reference(routing: Routing) -> RoutedReference:
    """The exact reference of ``routing``: the local slots gathered per expert into a ``ragged_m`` problem, its
    exact reference (:func:`gmm_ref.reference`), scattered back to ``[T, top_k, N]``."""
    if not isinstance(routing, Routing):
        raise TypeError(f"routing: expected a gmm_ref.Routing, got {type(routing).__name__}")
    shape = (routing.num_tokens, routing.top_k, routing.n)
    products = np.zeros(shape, np.float64)
    grouped = routing.grouped_problem()
    if grouped is None:
        return RoutedReference(routing, products, lambda numerics: np.zeros(shape, np.float64))
    problem, flat = grouped
    ref = reference(problem)
    products.reshape(-1, routing.n)[flat] = ref.exact

    def product_error(numerics: Numerics) -> np.ndarray:
        out = np.zeros(shape, np.float64)
        out.reshape(-1, routing.n)[flat] = error_bound(problem, ref.exact, numerics)
        return out

    return RoutedReference(routing, products, product_error)
