"""Compare a routed MoE kernel's output (forward or backward) with the routed reference and name where it is wrong.

:func:`assert_routed_matches` judges one output of a routed kernel (docs/routed.md): the forward's per-slot
``[T, top_k, N]`` or combined ``[T, N]`` output against :func:`gmm_ref.routed_reference`, or a gradient against
:func:`gmm_ref.routed_gradients` (the per-slot input gradient ``[T, top_k, K]``, the token gradient ``[T, K]``, the
experts' gradient, the weights' gradient ``[T, top_k]``). Each element passes when it equals the once-rounded
value or lies within its bound of the exact one (NaN where that is NaN); a failure names the token, the slot and
its expert (the experts' gradient: the expert, the element and the slots feeding it), counts the wrong ones and,
where one explains the difference, names the culprit. Like the grouped comparison's, its :class:`Mismatch` carries the
mask of the wrong elements (``exc.comparison.bad``) and, for the report's picture, the kernel's output
(``exc.output``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.compare import Comparison, Mismatch, ranges
from gmm_ref.routed.gradients import GRADIENT_OUTPUTS, OUTPUTS, RoutedGradients

__all__ = ["assert_routed_matches", "combined_feeds", "output_target", "output_wrong", "routed_element"]

#: what each output is called in a report, and its shape in words
_WORDS = {"slots": ("the routed reference", "[T, top_k, N]", "column"),
          "combined": ("the routed reference's combined output", "[T, N]", "column"),
          "d_slots": ("the routed reference's per-slot input gradient", "[T, top_k, K]", "k"),
          "d_tokens": ("the routed reference's token gradient", "[T, K]", "k"),
          "d_experts": ("the routed reference's experts' gradient", "the experts' shape", ""),
          "d_weights": ("the routed reference's weights' gradient", "[T, top_k]", "")}


def routed_element(r: Any, output: str, index: Any) -> str:
    """Words for the element at ``index`` of a routed kernel's ``output`` for the routing ``r`` (its token, slot
    and expert; the experts' gradient: its expert and element)."""
    at = [int(i) for i in index]
    if output == "d_experts":
        n, k = at[1:] if r.expert_layout == "enk" else at[:0:-1]
        return f"expert {_global(r, at[0])} (local {at[0]}), n {n}, k {k}"
    if output in ("combined", "d_tokens"):
        return f"token {at[0]}, {_WORDS[output][2]} {at[1]}"
    where = f"token {at[0]}, slot {at[1]} ({_expert(r, at[0], at[1])})"
    return where if output == "d_weights" else f"{where}, {_WORDS[output][2]} {at[2]}"


def combined_feeds(r: Any, t: int) -> str:
    """The slots feeding token ``t``'s combined row, each with its global and local expert and its weight:
    ``slot 0 (expert 3, local 1, weight 0.5); slot 1 (expert 6, local -1, on another rank, weight 0.25)``."""
    return "; ".join(f"slot {j} ({_expert(r, t, j)}, weight {float(r.weights64()[t, j]):.6g})" for j in range(r.top_k))


def _wrong(actual: np.ndarray, rounded: np.ndarray, exact: np.ndarray, bound: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        ok = (actual == rounded.astype(np.float64)) | (np.abs(actual - exact) <= bound)
        ok |= np.isnan(actual) & np.isnan(exact)
    return ~ok


def output_target(ref: Any, output: str) -> tuple[np.ndarray, np.ndarray, Any, np.ndarray]:
    """(the once-rounded values, the exact values, the bound function of a numerics, the defined elements) that a
    routed kernel's ``output`` is judged against (``ref``: a :class:`gmm_ref.RoutedReference` for ``"slots"`` and
    ``"combined"``, a :class:`gmm_ref.RoutedGradients` for a gradient)."""
    if output in ("slots", "d_slots"):
        r = ref if output == "slots" else ref.inputs
        return r.slots, r.slots_exact, r.slot_bound, r.slots_mask
    if output in ("combined", "d_tokens"):
        r = ref if output == "combined" else ref.inputs
        return r.combined, r.combined_exact, r.combined_bound, np.ones(r.combined.shape, bool)
    if output == "d_experts":
        return ref.experts, ref.experts_exact, ref.experts_bound, np.ones(ref.experts.shape, bool)
    return ref.weights, ref.weights_exact, ref.weights_bound, np.ones(ref.weights.shape, bool)


def output_wrong(actual: np.ndarray, ref: Any, output: str, bound: np.ndarray) -> np.ndarray:
    """The defined elements of a routed kernel's ``output`` (float64, of the reference's shape) that are neither
    the once-rounded value nor within ``bound`` of the exact one (NaN where it is NaN)."""
    rounded, exact, _, mask = output_target(ref, output)
    return _wrong(actual, rounded, exact, bound) & mask


def assert_routed_matches(actual: Any, ref: Any, *, numerics: Any = None, kernel: str = "kernel",
                          output: str = "slots") -> None:
    """Raise :class:`Mismatch` unless ``actual`` matches ``ref``: a :class:`gmm_ref.RoutedReference` for the
    forward's ``output="slots"`` (per slot ``[T, top_k, N]``) or ``"combined"`` (the weighted sum over slots,
    ``[T, N]``); a :class:`gmm_ref.RoutedGradients` for a gradient: ``"d_slots"`` (per-slot input gradient
    ``[T, top_k, K]``), ``"d_tokens"`` (``[T, K]``), ``"d_experts"`` (the experts' layout), ``"d_weights"``
    (``[T, top_k]``). Each element equal to the once-rounded value or within its bound (``numerics``: the kernel's
    :class:`gmm_ref.RoutedNumerics`) of the exact one (NaN where the exact value is NaN). The report names the
    token, the slot, its global and local expert and the column of the first wrong element (a combined row: the
    token, every slot and expert that feeds it, and the slot whose contribution explains the difference where one
    does; the experts' gradient: the expert, the element, the slots feeding it and the culprit where one explains
    it), and counts the wrong ones."""
    __tracebackhide__ = True
    if output not in OUTPUTS + GRADIENT_OUTPUTS:
        raise ValueError(f"output: expected one of {OUTPUTS + GRADIENT_OUTPUTS}, got {output!r}")
    if (output in GRADIENT_OUTPUTS) != isinstance(ref, RoutedGradients):
        want = "a gmm_ref.RoutedGradients" if output in GRADIENT_OUTPUTS else "a gmm_ref.RoutedReference"
        raise TypeError(f"ref: output={output!r} is judged against {want}, got {type(ref).__name__}")
    if output == "d_weights" and not ref.routing.mul_routed_weight:
        raise ValueError("output: 'd_weights' needs a routing with mul_routed_weight (no weight, no gradient)")
    rounded, exact, bound_of, mask = output_target(ref, output)
    a = np.asarray(actual)
    words, shape_words, axis = _WORDS[output]
    if a.shape != rounded.shape or a.dtype != rounded.dtype:
        raise Mismatch(f"shape/dtype: {kernel} returned {a.dtype} {a.shape}, expected {rounded.dtype} "
                       f"{rounded.shape} ({shape_words})", kind="shape")
    a64 = _dt.as_numpy(a, name="actual").astype(np.float64) if a.size else np.zeros(a.shape)
    bound = bound_of(numerics)
    wrong = _wrong(a64, rounded, exact, bound) & mask
    bad = np.argwhere(wrong)
    if not bad.size:
        return
    if output in ("combined", "d_tokens"):
        message = _combined_report(a64, ref if output == "combined" else ref.inputs, bound, bad, kernel, words, axis)
    elif output == "d_experts":
        message = _experts_report(a64, ref, bound, bad, kernel)
    else:
        message = _slots_report(a64, ref.routing, rounded, bound, bad, kernel, words, axis)
    found = Comparison(False, "values", message, mismatched=len(bad), defined=int(np.count_nonzero(mask)), bad=wrong)
    raise Mismatch(message, comparison=found, output=a)


def _slots_report(a64: np.ndarray, r: Any, rounded: np.ndarray, bound: np.ndarray, bad: np.ndarray, kernel: str,
                  words: str, axis: str) -> str:
    at = tuple(int(i) for i in bad[0])
    t, j = at[:2]
    where = f", {axis} {at[2]}" if axis else ""
    slots = {(int(b[0]), int(b[1])) for b in bad}
    return (f"token {t}, slot {j} ({_expert(r, t, j)}){where}: got {float(a64[at])!r}, expected "
            f"{float(rounded[at])!r} within {float(bound[at]):.3g}\n"
            f"{kernel} differs from {words} in {len(bad)} elements of {len(slots)} slots "
            f"(of {r.num_tokens * r.top_k}); wrong (token, slot): {sorted(slots)[:8]}"
            f"{' ...' if len(slots) > 8 else ''}")


def _expert(r: Any, t: int, j: int) -> str:
    local = int(r.local_ids[t, j])
    return f"expert {int(r.topk_ids[t, j])}, local {local}{', on another rank' if local < 0 else ''}"


def _combined_report(a64: np.ndarray, ref: Any, bound: np.ndarray, bad: np.ndarray, kernel: str, words: str,
                     axis: str) -> str:
    r = ref.routing
    t, c = (int(i) for i in bad[0])
    tokens = sorted({int(x) for x, _ in bad})
    feeds = combined_feeds(r, t)
    culprit = _combined_culprit(a64[t] - ref.combined_exact[t], ref, t, bound[t])
    return (f"token {t}, {axis} {c}: got {float(a64[t, c])!r}, expected {float(ref.combined[t, c])!r} within "
            f"{float(bound[t, c]):.3g} (the combined row of token {t}: the weighted sum of {feeds})\n"
            + (f"likely culprit: {culprit}\n" if culprit else "")
            + f"{kernel} differs from {words} in {len(bad)} elements of "
            f"{len(tokens)} tokens (of {r.num_tokens}); wrong tokens: {tokens[:8]}{' ...' if len(tokens) > 8 else ''}")


def _combined_culprit(d: np.ndarray, ref: Any, t: int, b: np.ndarray) -> str:
    """The slot of token ``t`` whose contribution explains the row's difference ``d`` (kernel - exact) in every
    column, within the bound ``b`` plus four roundings of the contribution to the output dtype: dropped, the only
    one kept, added twice, its product times another weight (another slot's of the row, or any slot's of the
    routing: weights applied in the wrong order), or, on another rank, computed with a local expert; "" if none
    does."""
    r = ref.routing
    s, p, w = ref.slots_exact[t], ref.products[t], r.weights64()
    u = _dt.unit_roundoff(r.out_dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        def fits(x: np.ndarray) -> bool:
            return bool(np.any(x != 0) and np.all(np.abs(d - x) <= b + 4 * u * np.abs(x)))
        foreign = [j for j in range(r.top_k) if not ref.local[t, j]]
        for e in range(r.num_local_experts if foreign else 0):  # another rank's slots computed with a local expert
            for js in [[j] for j in foreign] + ([foreign] if len(foreign) > 1 else []):
                if fits(sum(w[t, j] * ref.product_of(t, j, e) for j in js)):
                    return (f"slot{'s' if len(js) > 1 else ''} {', '.join(map(str, js))} "
                            f"({'; '.join(_expert(r, t, j) for j in js)}) computed anyway, with local expert {e}")
        for j in range(r.top_k):
            name = f"slot {j} ({_expert(r, t, j)})"
            if fits(-s[j]):
                return f"{name} is missing from the sum (dropped, or overwritten by another slot's add)"
            if r.top_k > 2 and fits(s[j] - s.sum(axis=0)):
                return f"{name} is the only one in the sum (the others overwritten by its add, or dropped)"
            if fits(s[j]):
                return f"{name} is added twice"
            if not r.mul_routed_weight or not ref.local[t, j]:
                continue
            for i in range(r.top_k):
                if i != j and fits((w[t, j] - w[t, i]) * (p[i] - p[j])):
                    return f"slots {i} and {j} of token {t} exchanged their weights ({name})"
            for tt, jj in np.argwhere(w != w[t, j]):
                if fits((w[tt, jj] - w[t, j]) * p[j]):
                    return (f"{name} is weighted by {float(w[tt, jj]):.6g} (the weight of token {int(tt)}, slot "
                            f"{int(jj)}) instead of its own {float(w[t, j]):.6g}")
    return ""


# ------------------------------------------------------------------------------------- the experts' gradient
def _global(r: Any, e: int) -> int:
    """The global id of local expert ``e``."""
    return e if r.expert_map is None else int(np.flatnonzero(np.asarray(r.expert_map) == e)[0])


def _slot_names(r: Any, flat: np.ndarray, most: int = 6) -> str:
    names = [f"token {int(f) // r.top_k} slot {int(f) % r.top_k}" for f in flat[:most]]
    return ", ".join(names) + (", ..." if len(flat) > most else "")


def _experts_report(a64: np.ndarray, g: RoutedGradients, bound: np.ndarray, bad: np.ndarray, kernel: str) -> str:
    r = g.routing
    enk = r.expert_layout == "enk"
    e, i0, i1 = (int(i) for i in bad[0])
    n, k = (i0, i1) if enk else (i1, i0)
    flat = g.slots_of_expert(e)
    feeds = (f"the sum over its {len(flat)} slot{'s' * (len(flat) != 1)}: {_slot_names(r, flat)}" if len(flat)
             else "no slot routes to it")
    if r.existing is not None:
        feeds += ", plus the existing gradient"
    wrong_e = sorted({int(x) for x in bad[:, 0]})
    ns, ks = (bad[:, 1], bad[:, 2]) if enk else (bad[:, 2], bad[:, 1])
    culprit = _experts_culprit(a64[e], g, e, bound[e])
    return (f"expert {_global(r, e)} (local {e}), n {n}, k {k}: got {float(a64[e, i0, i1])!r}, expected "
            f"{float(g.experts[e, i0, i1])!r} within {float(bound[e, i0, i1]):.3g} ({feeds})\n"
            + (f"likely culprit: {culprit}\n" if culprit else "")
            + f"{kernel} differs from the routed reference's experts' gradient in {len(bad)} elements of "
            f"{len(wrong_e)} experts (of {r.num_local_experts} local); wrong local experts: {wrong_e[:8]}"
            f"{' ...' if len(wrong_e) > 8 else ''}; wrong n: {ranges(ns.tolist())}; wrong k: {ranges(ks.tolist())} "
            f"(N = {r.n}, K = {r.k})")


def _experts_culprit(a: np.ndarray, g: RoutedGradients, e: int, b: np.ndarray) -> str:
    """What explains expert ``e``'s block ``a`` (the kernel's, float64, the experts' layout), within the bound ``b``
    plus four roundings: an expert without slots left unwritten, one slot dropped or added twice, the existing
    gradient lost, or slots that read another token's row or another slot's cotangent row; "" if nothing does."""
    r = g.routing
    enk = r.expert_layout == "enk"
    exact = g.experts_exact[e]
    d = a - exact
    u = _dt.unit_roundoff(r.experts.dtype)
    flat = g.slots_of_expert(e)
    if not np.isfinite(a).all() and np.isfinite(exact).all():
        if not len(flat):
            return (f"no slot routes to expert {_global(r, e)} (local {e}): its gradient is "
                    f"{'the existing one' if r.existing is not None else 'zero'}, but the kernel left NaN or Inf "
                    "there (an expert without slots never written?)")
        return "NaN or Inf where the exact gradient is finite (a read past an operand, or an element never written)"
    with np.errstate(invalid="ignore", over="ignore"):
        def fits(x: np.ndarray) -> bool:
            return bool(np.any(x != 0) and np.all(np.abs(d - x) <= b + 4 * u * np.abs(x)))
        if r.existing is not None:
            ex = _dt.as_numpy(r.existing[e]).astype(np.float64)
            if fits(-ex):
                return "the existing gradient is missing (overwritten instead of added into)"
            if fits(ex):
                return "the existing gradient is added twice"
        x = _dt.as_numpy(r.tokens).astype(np.float64)
        dy = _dt.as_numpy(r.cotangent).astype(np.float64).reshape(-1, r.n) * r.weights64().reshape(-1)[:, None]

        def block(rows: np.ndarray, cot: np.ndarray) -> np.ndarray:
            out = cot.T @ rows  # [N, K]
            return out if enk else out.T

        for f in flat:
            name = f"slot {int(f) % r.top_k} of token {int(f) // r.top_k}"
            c = block(x[[int(f) // r.top_k]], dy[[int(f)]])
            if fits(-c):
                return f"{name} is missing from the sum"
            if fits(c):
                return f"{name} is added twice"
        return _swapped_rows(a, g, e, fits, x, dy, block)


def _swapped_rows(a: np.ndarray, g: RoutedGradients, e: int, fits: Any, x: np.ndarray, dy: np.ndarray,
                  block: Any) -> str:
    """Slots of expert ``e`` that read the wrong rows: first the orders a gather confuses (the cotangent rows taken
    in expert order, ``dY[i]`` for the expert-ordered row ``i``; the token rows at the flat slot index or the
    expert-ordered position), then, for few slots, each operand solved for by least squares from the kernel's
    block and each solved row matched to a row of its operand; a guess is taken only where it explains the whole
    block."""
    r = g.routing
    flat = g.slots_of_expert(e)
    if not len(flat) or not np.isfinite(a).all():
        return ""
    pos = int(g.sizes[:e].sum()) + np.arange(len(flat))  # the expert-ordered rows of its slots
    own_x, own_dy = x[flat // r.top_k], dy[flat]
    ex = 0.0 if r.existing is None else _dt.as_numpy(r.existing[e]).astype(np.float64)
    want = g.experts_exact[e] - ex
    named = [("the cotangent rows read in expert order (row i of the expert-ordered rows took dY's row i, not "
              "its slot's)", own_x, dy[pos]),
             ("the token rows read at the flat slot index (token * top_k + slot) instead of the token", x[flat]
              if flat.max() < len(x) else None, own_dy),
             ("the token rows read at the expert-ordered position instead of the token", x[pos]
              if pos.max() < len(x) else None, own_dy)]
    for words, rows, cot in named:
        if rows is not None and fits(block(rows, cot) - want):
            return words
    total = (a - ex) if r.expert_layout == "enk" else (a - ex).T  # [N, K]
    guesses = []
    if len(flat) <= r.n:  # the token rows: total = own_dy^T X'
        guesses.append(("token", np.linalg.lstsq(own_dy.T, total, rcond=None)[0], x, own_x,
                        lambda rows: block(rows, own_dy)))
    if len(flat) <= r.k:  # the cotangent rows: total = G'^T own_x
        guesses.append(("cotangent", np.linalg.lstsq(own_x.T, total.T, rcond=None)[0], dy, own_dy,
                        lambda rows: block(own_x, rows)))
    for what, solved, candidates, own, rebuild in guesses:
        picks, moved = [], []
        for i, row in enumerate(solved):
            with np.errstate(invalid="ignore"):
                near = np.abs(candidates - row).max(axis=1)
            c = int(np.argmin(np.where(np.isnan(near), np.inf, near)))
            picks.append(c)
            if not np.array_equal(candidates[c], own[i]):
                moved.append((int(flat[i]), c))
        if moved and fits(rebuild(candidates[picks]) - want):
            return "; ".join(_moved(r, what, f, c) for f, c in moved[:4]) + (" ..." if len(moved) > 4 else "")
    return ""


def _moved(r: Any, what: str, f: int, c: int) -> str:
    name = f"slot {f % r.top_k} of token {f // r.top_k}"
    if what == "token":
        return f"{name} read token {c}'s row instead of token {f // r.top_k}'s"
    return f"{name} took the cotangent of slot {c % r.top_k} of token {c // r.top_k} (flat row {c}) instead of its own"
