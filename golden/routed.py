"""Routed golden cases: a case of a routed MoE convention describes a :class:`gmm_ref.Routing`, not a grouped
``Problem`` (docs/goldens.md, "Routed cases").

Its extents are ``m = T`` (tokens), ``k = K``, ``n = N``; ``groups`` is the global expert count, ``top_k`` the
slots per token, ``expert_map`` (global -> local, -1 for another rank's expert) and ``mul_routed_weight`` as in
``gmm_ref.Routing``. The inputs come from the generator like a grouped case's: ``tokens [T, K]``, ``experts`` in
the convention's first expert layout, ``topk_weights [T, top_k]`` float32, and ``topk_ids``: token ``t`` routes to
the ``top_k`` experts of smallest ``raw_bits(seed, "topk_ids")[t * E : (t + 1) * E]`` (distinct experts, as
vLLM's routers give), except that each token of ``repeat_tokens`` lists its slot 0's expert in every slot.
``router="peaked"`` makes the weights a peaked router's (``gmm_ref.routed.routing.peaked_weights`` of the generated
weights, the signs ``+-1`` from bit 0 of ``raw_bits(seed, "router_signs")`` (1: negative), the tails 1.5 or 1.75
from bit 0 of ``raw_bits(seed, "router_tails")`` (1: 1.75)). ``poison`` puts NaN in every token row, expert and
weight no local slot reads.

The golden is what the convention's kernels return (:attr:`gmm_ref.conventions.base.RoutedConvention.output`;
:class:`RoutedGoldenReference`): the per-slot output ``[T, top_k, N]``, its mask the elements the convention
defines, judged within ``slot_bound``; or the combined output ``[T, N]``, every element defined, judged within
``combined_bound``; either the reference rounded once, a kernel judged by the bound of its ``RoutedNumerics``
(``gmm_ref.assert_routed_matches``), a failure naming the token, slot and expert (a combined row: the token, the
column and every slot feeding it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

import gmm_ref
from gmm_ref import conventions, families
from gmm_ref import dtypes as _dt
from gmm_ref.routed.compare import combined_feeds, output_target, output_wrong, routed_element
from gmm_ref.routed.gradients import GRADIENT_OUTPUTS
from gmm_ref.routed.routing import peaked_weights
from golden.generator import raw_bits, values

__all__ = ["ROUTERS", "RoutedGoldenReference", "build_routing", "check", "check_of", "describe_bad", "inputs",
           "is_routed", "output_of", "record", "record_of", "reference", "reference_of", "refuse_routed_fields"]

#: a routed case's ``router``: None, the generator's weights; ``"peaked"``, a peaked router's
ROUTERS = (None, "peaked")
#: the fields of a routed case a grouped case leaves at their defaults
_ROUTED_ONLY = {"top_k": None, "expert_map": None, "mul_routed_weight": False, "router": None, "repeat_tokens": ()}

#: the fields of a grouped case a routed case leaves at their defaults (its own meaning: the module docstring)
_GROUPED_ONLY = {"group_sizes": None, "batch_shape": (), "lhs_transposed": False, "rhs_transposed": False,
                 "packed": False, "existing": False, "group_offset": 0, "num_local_groups": None, "tiling": None,
                 "quant": 0, "alignment": None}


def is_routed(case: Any) -> bool:
    """Whether a case's family is the routed one (``gmm_ref.families.ROUTED``)."""
    return families.get(case.family).groups == families.ROUTING


def refuse_routed_fields(case: Any) -> None:
    """A ValueError naming the case and field where a grouped case sets a routed case's field."""
    for name, default in _ROUTED_ONLY.items():
        if getattr(case, name) != default:
            raise ValueError(f"case {case.name}: {name}={getattr(case, name)!r} is a routed case's field; a "
                             f"{case.family} case leaves it out")


def output_of(case: Any) -> str | None:
    """What a routed case's golden holds, its convention's ``output`` (``"slots"``, ``"combined"``, or a backward
    kernel's gradient: ``"d_slots"``, ``"d_experts"``, ...); None for a grouped case."""
    return conventions.get(case.convention).output if is_routed(case) else None


def _ids(case: Any, num_experts: int) -> np.ndarray:
    """``[T, top_k]`` int32: each token's ``top_k`` distinct experts, by the order of its seeded bits; a token of
    ``repeat_tokens`` lists its slot 0's expert in every slot."""
    bits = raw_bits(case.seed, "topk_ids", case.m * num_experts).reshape(case.m, num_experts)
    ids = np.argsort(bits, axis=1, kind="stable")[:, :case.top_k].astype(np.int32)
    for t in case.repeat_tokens:
        ids[t] = ids[t, 0]
    return ids


def _router_fields(case: Any) -> None:
    """ValueErrors naming the case for a ``router`` or ``repeat_tokens`` it cannot have."""
    if case.router not in ROUTERS:
        raise ValueError(f"case {case.name}: router={case.router!r}: expected one of {list(ROUTERS)}")
    if case.router == "peaked" and (case.top_k < 2 or not case.mul_routed_weight):
        raise ValueError(f"case {case.name}: router='peaked' needs top_k >= 2 and mul_routed_weight=True (a dominant "
                         f"weight and a tail), got top_k={case.top_k}, mul_routed_weight={case.mul_routed_weight}")
    if case.repeat_tokens and case.top_k < 2:
        raise ValueError(f"case {case.name}: repeat_tokens={list(case.repeat_tokens)} needs top_k >= 2 (a repeat "
                         "is one expert in two slots)")
    for t in case.repeat_tokens:
        if not 0 <= t < case.m:
            raise ValueError(f"case {case.name}: repeat_tokens holds {t}: expected a token in [0, {case.m})")
    if len(set(case.repeat_tokens)) != len(case.repeat_tokens):
        raise ValueError(f"case {case.name}: repeat_tokens={list(case.repeat_tokens)} lists a token twice")


def _peaked(case: Any, r: gmm_ref.Routing) -> np.ndarray:
    """The routing's weights as a peaked router's (module docstring)."""
    t, top_k = r.topk_ids.shape
    signs = 1.0 - 2.0 * (raw_bits(case.seed, "router_signs", t) & np.uint64(1)).astype(np.float64)
    tails = 1.5 + 0.25 * (raw_bits(case.seed, "router_tails", t * (top_k - 1)) & np.uint64(1)).astype(np.float64)
    return peaked_weights(r.topk_weights, signs, tails.reshape(t, top_k - 1), r.out_dtype)


def _poisoned(r: gmm_ref.Routing) -> dict[str, np.ndarray]:
    """The routing's tokens, experts and weights with NaN wherever no local slot reads."""
    local = r.local_ids >= 0
    tokens, experts = r.tokens.copy(), r.experts.copy()
    tokens[~local.any(axis=1)] = np.nan
    used = np.zeros(r.num_local_experts, bool)
    used[r.local_ids[local]] = True
    experts[~used] = np.nan
    weights = r.topk_weights.copy()
    weights[~local if r.mul_routed_weight else np.ones_like(local)] = np.nan
    return {"tokens": tokens, "experts": experts, "topk_weights": weights}


def build_routing(case: Any, convention: Any) -> gmm_ref.Routing:
    """The routing a routed case describes, in its convention (ValueError naming the case where it cannot)."""
    for name, default in _GROUPED_ONLY.items():
        if getattr(case, name) != default:
            raise ValueError(f"case {case.name}: {name}={getattr(case, name)!r} is a grouped case's field; a routed "
                             "case leaves it out")
    if not case.top_k or not case.groups:
        raise ValueError(f"case {case.name}: a routed case needs top_k >= 1 and groups (the global experts) >= 1, "
                         f"got top_k={case.top_k!r}, groups={case.groups!r}")
    if case.top_k > case.groups:
        raise ValueError(f"case {case.name}: top_k={case.top_k} distinct experts of {case.groups}")
    _router_fields(case)
    emap = None if case.expert_map is None else np.asarray(case.expert_map, np.int32)
    local = case.groups if emap is None else int((emap >= 0).sum())
    dt = _dt.as_dtype(case.dtype, name="dtype")
    layout = convention.expert_layouts[0]
    kw = {"kind": case.kind, "int_range": case.int_range}
    shape = (local, case.n, case.k) if layout == "enk" else (local, case.k, case.n)
    try:
        r = gmm_ref.Routing(values(case.seed, "tokens", (case.m, case.k), dt, **kw),
                            values(case.seed, "experts", shape, dt, **kw), _ids(case, case.groups),
                            values(case.seed, "topk_weights", (case.m, case.top_k), np.float32, **kw),
                            expert_layout=layout, expert_map=emap, mul_routed_weight=case.mul_routed_weight,
                            out_dtype=case.out_dtype, foreign=convention.foreign)
        if case.router == "peaked":
            r = gmm_ref.Routing(**{**_fields(r), "topk_weights": _peaked(case, r)})
        if case.poison:
            r = gmm_ref.Routing(**{**_fields(r), **_poisoned(r)})
        if convention.backward:
            r = _backward(case, r, convention.accumulates, kw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"case {case.name}: {exc}") from None
    reason = convention.refusal(r)
    if reason:
        raise ValueError(f"case {case.name}: {reason}")
    return r


def _backward(case: Any, r: gmm_ref.Routing, accumulates: bool, kw: dict[str, Any]) -> gmm_ref.RoutedBackward:
    """The routing with its cotangent ``dY [T, top_k, N]`` (the output dtype) and, for a convention that
    accumulates, an existing experts' gradient (the experts' shape and dtype); a ``poison`` case puts NaN in the
    cotangent of every slot of another rank's expert (no gradient reads it)."""
    dy = values(case.seed, "cotangent", (r.num_tokens, r.top_k, r.n), np.dtype(r.out_dtype), **kw)
    if case.poison:
        dy[r.local_ids < 0] = np.nan
    existing = values(case.seed, "existing", r.experts.shape, r.experts.dtype, **kw) if accumulates else None
    return gmm_ref.RoutedBackward.of(r, dy, existing)


def _fields(r: gmm_ref.Routing) -> dict[str, Any]:
    return {f: getattr(r, f) for f in ("tokens", "experts", "topk_ids", "topk_weights", "expert_layout", "expert_map",
                                       "mul_routed_weight", "out_dtype", "foreign")}


def inputs(r: gmm_ref.Routing) -> dict[str, np.ndarray]:
    """The arrays a routing is made of (what ``golden.store.inputs_sha256`` hashes)."""
    d = {"tokens": r.tokens, "experts": r.experts, "topk_ids": r.topk_ids, "topk_weights": r.topk_weights}
    if r.expert_map is not None:
        d["expert_map"] = r.expert_map
    if isinstance(r, gmm_ref.RoutedBackward):
        d["cotangent"] = r.cotangent
        if r.existing is not None:
            d["existing"] = r.existing
    return d


def record(r: gmm_ref.Routing, output: str = "slots") -> tuple[tuple[int, ...], dict[str, str]]:
    """(the golden's shape, ``[T, top_k, N]`` per slot or ``[T, N]`` combined, a gradient's its own; the manifest's
    dtypes: tokens as ``lhs``, experts as ``rhs``, the golden's as ``out``)."""
    t, top_k, n, k = r.num_tokens, r.top_k, r.n, r.k
    shape, dtype = {"slots": ((t, top_k, n), r.out_dtype), "combined": ((t, n), r.out_dtype),
                    "d_slots": ((t, top_k, k), r.tokens.dtype), "d_tokens": ((t, k), r.tokens.dtype),
                    "d_experts": (r.experts.shape, r.experts.dtype),
                    "d_weights": ((t, top_k), r.topk_weights.dtype)}[output]
    return tuple(shape), {"lhs": str(r.tokens.dtype), "rhs": str(r.experts.dtype), "out": str(np.dtype(dtype))}


@dataclass(frozen=True)
class RoutedGoldenReference:
    """The routed reference as a golden reads it (``values``, ``exact``, ``mask``, :meth:`bound`, as
    ``gmm_ref.Reference`` is a grouped case's): the per-slot output (``output="slots"``), the combined output
    (``"combined"``, every element defined), or a backward kernel's gradient (``"d_slots"``, ``"d_experts"``, ...:
    ``routed`` is then a ``gmm_ref.RoutedGradients``)."""

    routed: Any  # gmm_ref.RoutedReference, or gmm_ref.RoutedGradients for a gradient
    output: str = "slots"

    def __post_init__(self) -> None:
        outputs = ("slots", "combined", *GRADIENT_OUTPUTS)
        if self.output not in outputs:
            raise ValueError(f"output: expected one of {list(outputs)}, got {self.output!r}")

    @property
    def combined(self) -> bool:
        return self.output == "combined"

    @property
    def routing(self) -> gmm_ref.Routing:
        """The routing (a backward kernel's: with its cotangent) the reference is of."""
        return self.routed.routing

    @cached_property
    def _target(self) -> tuple[np.ndarray, np.ndarray, Any, np.ndarray]:
        return output_target(self.routed, self.output)

    @property
    def values(self) -> np.ndarray:
        return self._target[0]

    @property
    def exact(self) -> np.ndarray:
        return self._target[1]

    @property
    def mask(self) -> np.ndarray:
        return self._target[3]

    def bound(self, numerics: Any = None) -> np.ndarray:
        return self._target[2](numerics)


def reference(r: gmm_ref.Routing, output: str = "slots") -> RoutedGoldenReference:
    """The reference of what a routed kernel returns for ``r``: its forward's (``r`` a ``gmm_ref.Routing``) or,
    for a gradient ``output``, the routed gradients of ``r`` (a ``gmm_ref.RoutedBackward``)."""
    if output in GRADIENT_OUTPUTS:
        if not isinstance(r, gmm_ref.RoutedBackward):
            raise TypeError(f"r: output={output!r} is a gradient: expected a gmm_ref.RoutedBackward, got "
                            f"{type(r).__name__}")
        return RoutedGoldenReference(gmm_ref.routed_gradients(r), output)
    return RoutedGoldenReference(gmm_ref.routed_reference(r), output)


@dataclass(frozen=True)
class Outcome:
    """What :func:`check` found: ``ok``, the wrong elements ``bad`` (None for a wrong shape) and the report."""

    ok: bool
    bad: np.ndarray | None = None
    message: str = ""


def check(out: Any, ref: RoutedGoldenReference, *, numerics: Any = None, kernel: str = "kernel") -> Outcome:
    """A routed kernel's output (per slot, combined or a gradient) against the routed reference
    (``gmm_ref.assert_routed_matches``), without raising."""
    try:
        gmm_ref.assert_routed_matches(out, ref.routed, numerics=numerics, kernel=kernel, output=ref.output)
    except gmm_ref.Mismatch as exc:
        a = np.asarray(out)
        if a.shape != ref.values.shape:
            return Outcome(False, None, str(exc))
        bad = output_wrong(_dt.as_numpy(a, name="output").astype(np.float64), ref.routed, ref.output,
                           ref.bound(numerics))
        return Outcome(False, bad, str(exc))
    return Outcome(True)


def describe_bad(r: gmm_ref.Routing, bad: np.ndarray, mask: np.ndarray, actual: np.ndarray,
                 desired: np.ndarray, output: str = "slots") -> str:
    """One line: how many defined elements are wrong, in which slots, and the first one's token, slot, expert (a
    combined ``[T, N]`` output: in which tokens, and the first one's token, column and the slots feeding its row;
    the experts' gradient: in which experts, and the first one's expert and element)."""
    idx = np.argwhere(bad)
    first = tuple(int(i) for i in idx[0])
    values = f"{float(actual[first])!r} vs {float(desired[first])!r}"
    head = f"{len(idx)} / {int(mask.sum())} defined elements wrong in "
    if output in ("combined", "d_tokens"):
        t = first[0]
        tokens = sorted({int(x) for x in idx[:, 0]})
        row = "combined row" if output == "combined" else "gradient"
        summed = "the weighted sum" if output == "combined" else "the sum"
        return (f"{head}{len(tokens)} token(s) {tokens[:8]}{' ...' if len(tokens) > 8 else ''}; first at "
                f"{routed_element(r, output, first)}: {values} (the {row} of token {t}: {summed} of "
                f"{combined_feeds(r, t)})")
    if output == "d_experts":
        experts = sorted({int(x) for x in idx[:, 0]})
        return (f"{head}{len(experts)} local expert(s) {experts[:8]}{' ...' if len(experts) > 8 else ''}; first at "
                f"{routed_element(r, output, first)}: {values}")
    slots = sorted({(int(x), int(y)) for x, y in idx[:, :2]})
    return (f"{head}{len(slots)} (token, slot)s {slots[:6]}{' ...' if len(slots) > 6 else ''}; first at "
            f"{routed_element(r, output, first)}: {values}")


# ---------------------------------------------- what the golden modules call: a grouped problem or a routing
def reference_of(p: Any, case: Any) -> Any:
    """``gmm_ref.reference(p)``, or a routing's :func:`reference` of what its case's convention returns."""
    return reference(p, output_of(case)) if isinstance(p, gmm_ref.Routing) else gmm_ref.reference(p)


def check_of(out: Any, ref: Any, *, numerics: Any = None, kernel: str | None = None) -> Any:
    """``gmm_ref.check``, or a routing's :func:`check` (each with ``ok``, ``bad`` and ``message``)."""
    if isinstance(ref, RoutedGoldenReference):
        return check(out, ref, numerics=numerics, kernel=kernel or "kernel")
    return gmm_ref.check(out, ref, numerics=numerics, kernel=kernel)


def record_of(p: Any, case: Any) -> tuple[tuple[int, ...], dict[str, str]]:
    """(output shape, the manifest's dtypes) of a problem or a routing (:func:`record`, of what its case's
    convention returns)."""
    if isinstance(p, gmm_ref.Routing):
        return record(p, output_of(case))
    return tuple(p.out_shape), {"lhs": str(p.lhs.dtype), "rhs": str(p.rhs.dtype), "out": str(p.out_dtype)}
