"""Compare a kernel's output with the reference and say exactly where it is wrong.

Checks run in numpy.testing's order: shape and dtype (exactly), then NaN/Inf
positions, then values against the per-element bound; only elements the
problem defines are compared. A failure names the wrong groups, draws a
group x tile map, and carries a reproducer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.numerics import Numerics
from gmm_ref.problem import Problem
from gmm_ref.reference import Reference

__all__ = ["Mismatch", "assert_matches_reference", "check"]

DEFAULT_TILE = (128, 128, 128)
MAX_LISTED = 8


class Mismatch(AssertionError):
    """A kernel output disagrees with the reference; ``groups`` lists the wrong groups."""

    def __init__(self, message: str, *, groups: tuple[int, ...] = (), kind: str = "values"):
        super().__init__(message)
        self.groups = groups
        self.kind = kind


@dataclass
class Outcome:
    """The result of :func:`check`: ``ok``, and on failure the message and wrong groups."""

    ok: bool
    message: str = ""
    groups: tuple[int, ...] = ()
    kind: str = ""
    bad: np.ndarray | None = field(default=None, repr=False)


def as_numpy(actual: Any) -> np.ndarray:
    """A kernel's output (NumPy, jax array, torch tensor on any device) as NumPy, bfloat16 bit-exact."""
    if isinstance(actual, np.ndarray):
        return actual
    if type(actual).__module__.startswith("torch"):
        import ml_dtypes
        import torch

        t = actual.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    try:
        return np.asarray(actual)
    except Exception as exc:  # pragma: no cover - defensive
        raise TypeError(f"actual: cannot convert {type(actual).__name__} to a NumPy array") from exc


def group_of(p: Problem, index: tuple[int, ...]) -> int:
    """The group an output element belongs to (-1: tail, past every group)."""
    nb = len(p.batch_shape)
    if p.family in ("ragged_k", "batch"):
        return p.group_offset + int(index[0])
    bi = tuple(index[:nb])
    pos = index[nb] if p.family == "ragged_m" else index[nb + 1]
    off = p.offsets_at(bi)
    if pos >= off[-1]:
        return -1
    return int(np.searchsorted(off, pos, side="right") - 1)


def _tile_map(p: Problem, bad: np.ndarray, mask: np.ndarray) -> str:
    """Rows: output row tiles; columns: output column tiles. X wrong, . right, ' ' undefined."""
    tm, _, tn = p.tiling or DEFAULT_TILE
    mats = bad.reshape(-1, *bad.shape[-2:])
    defined = mask.reshape(-1, *mask.shape[-2:])
    lines = []
    for i in np.unique(np.nonzero(mats)[0])[:4]:
        b, d = mats[i], defined[i]
        rows, cols = -(-b.shape[0] // tm), -(-b.shape[1] // tn)
        if rows * cols == 0:
            continue
        lead = np.unravel_index(i, bad.shape[:-2]) if bad.ndim > 2 else ()
        lines.append(f"  tile map of out[{', '.join(map(str, lead)) + ', ' if lead else ''}:, :] "
                     f"({tm}x{tn} tiles; X wrong, . right, blank undefined):")
        for r in range(min(rows, 24)):
            cells = []
            for c in range(min(cols, 48)):
                tb = b[r * tm:(r + 1) * tm, c * tn:(c + 1) * tn]
                td = d[r * tm:(r + 1) * tm, c * tn:(c + 1) * tn]
                cells.append("X" if tb.any() else ("." if td.any() else " "))
            lines.append(f"    {r * tm:>6} |{''.join(cells)}|")
    return "\n".join(lines)


def _batch_index(p: Problem, index: tuple[int, ...]) -> tuple[int, ...]:
    nb = len(p.batch_shape)
    lead = 1 if p.family in ("ragged_k", "batch") else 0
    return tuple(index[lead:lead + nb])


def _group_summary(p: Problem, bad_idx: np.ndarray, n_bad_total: int) -> tuple[str, tuple[int, ...]]:
    counts: dict[int, int] = {}
    first: dict[int, tuple[int, ...]] = {}
    for idx in bad_idx:
        t = tuple(int(v) for v in idx)
        g = group_of(p, t)
        counts[g] = counts.get(g, 0) + 1
        first.setdefault(g, t)
    groups = tuple(sorted(counts))
    lines = []
    for g in groups[:MAX_LISTED]:
        name = "tail (past sum(group_sizes))" if g < 0 else f"group {g}"
        extra = ""
        if g >= 0 and p.group_sizes is not None and p.family != "batch":
            bi = _batch_index(p, first[g])
            off = p.offsets_at(bi)
            axis = {"ragged_m": "rows", "ragged_n": "columns", "ragged_k": "K range"}[p.family]
            where = f" at batch index {list(bi)}" if p.group_sizes.ndim > 1 else ""
            extra = f" ({axis} [{off[g]}, {off[g + 1]}){where}, size {off[g + 1] - off[g]})"
        lines.append(f"  {name}{extra}: {counts[g]} wrong")
    if len(groups) > MAX_LISTED:
        lines.append(f"  ... and {len(groups) - MAX_LISTED} more groups")
    if len(bad_idx) < n_bad_total:
        lines.append(f"  (groups counted over the first {len(bad_idx)} of {n_bad_total} wrong elements)")
    return "\n".join(lines), groups


def _fmt_val(x: Any) -> str:
    kind = np.asarray(x).dtype
    if np.issubdtype(kind, np.integer):
        return str(int(x))
    return repr(float(x)) if np.issubdtype(kind, np.floating) or isinstance(x, float) else repr(x)


def check(
    actual: Any,
    problem_or_expected: Problem | Reference,
    *,
    numerics: Numerics | None = None,
    kernel: str | None = None,
) -> Outcome:
    """Compare without raising; see :func:`assert_matches_reference`."""
    if isinstance(problem_or_expected, Reference):
        ref = problem_or_expected
    elif isinstance(problem_or_expected, Problem):
        ref = problem_or_expected.reference()
    else:
        raise TypeError(
            "problem_or_expected: expected a gmm_ref.Problem or gmm_ref.Reference, "
            f"got {type(problem_or_expected).__name__}"
        )
    p = ref.problem
    act = as_numpy(actual)
    who = f"kernel {kernel}" if kernel else "kernel"
    head = f"{who} vs gmm_ref on {p.describe()}"
    want_shape = ref.exact.shape  # p.out_shape, or more when a convention appends unwritten slots
    if act.shape != want_shape or act.dtype != p.out_dtype:
        msg = (f"{head}\nshape/dtype mismatch: ACTUAL {act.shape} {act.dtype}, "
               f"DESIRED {want_shape} {p.out_dtype}")
        return Outcome(False, msg, (), "shape")
    mask = ref.mask
    exact = ref.exact
    is_int = _dt.is_integer(p.out_dtype)
    with np.errstate(invalid="ignore"):  # signalling NaNs in undefined elements are fine
        a64 = act.astype(np.int64 if is_int else np.float64)
    if is_int:
        bound = np.zeros(want_shape)
        bad = mask & (a64 != exact.astype(p.out_dtype).astype(np.int64))
        criterion = "exact equality (integer output)"
        kind = "values"
    else:
        bound = ref.bound(numerics)
        with np.errstate(invalid="ignore", over="ignore"):
            e_nan, a_nan = np.isnan(exact), np.isnan(a64)
            e_inf, a_inf = np.isinf(exact), np.isinf(a64)
            expected_special = e_nan | e_inf
            # a finite exact value may round past the output's overflow threshold: to an
            # infinity of its sign, or to NaN in formats without infinities (float8_e4m3fn)
            fmt = _dt.float_format(p.out_dtype)
            may_overflow = ~expected_special & (np.abs(exact) + bound >= fmt.overflow_threshold)
            if fmt.has_inf:
                overflow_ok = may_overflow & a_inf & (np.sign(a64) == np.sign(exact))
            else:
                overflow_ok = may_overflow & a_nan
            bad_special = mask & ~overflow_ok & (
                (e_nan != a_nan) | (e_inf & (~a_inf | (np.sign(a64) != np.sign(exact))))
                | (~expected_special & a_inf)
            )
            err = np.abs(a64 - exact)
            bad_value = mask & ~expected_special & ~a_nan & ~a_inf & ~(err <= bound)
        if bad_special.any():
            bad, kind = bad_special, "nonfinite"
            criterion = "NaN/Inf at the same positions as the reference"
        else:
            bad, kind = bad_value, "values"
            criterion = ("bit-for-bit equality (exact mode)" if not bound[mask].any()
                         else "|actual - exact| <= bound (DESIGN.md section 2)")
    n_bad = int(bad.sum())
    if n_bad == 0:
        return Outcome(True)
    n_def = int(mask.sum())
    idx = np.argwhere(bad)
    lines = [
        head,
        f"Not equal under {criterion}",
        f"Mismatched elements: {n_bad} / {n_def} defined ({100.0 * n_bad / max(n_def, 1):.3g}%)",
    ]
    lines.append("First mismatches (index: ACTUAL vs DESIRED [exact], bound, group):")
    desired = ref.values
    for ix in idx[:MAX_LISTED]:
        t = tuple(int(v) for v in ix)
        lines.append(
            f"  {list(t)}: {_fmt_val(act[t])} vs {_fmt_val(desired[t])} [{_fmt_val(exact[t])}], "
            f"bound {bound[t]:.3g}, group {group_of(p, t)}"
        )
    if kind == "values" and not is_int:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            errs = np.abs(a64 - exact)[bad]
            ratio = errs / np.where(bound[bad] > 0, bound[bad], np.nan)
        lines.append(f"Max absolute difference among violations: {np.nanmax(errs):.6g}")
        if np.isfinite(ratio).any():
            lines.append(f"Max |error| / bound: {np.nanmax(ratio):.6g}")
        else:
            lines.append("Bound is 0 here: the exact result is representable, so it must match bit for bit")
    summary, groups = _group_summary(p, idx[:10000], n_bad)
    lines.append("Wrong groups:")
    lines.append(summary)
    tm = _tile_map(p, bad, mask)
    if tm:
        lines.append(tm)
    return Outcome(False, "\n".join(lines), groups, kind, bad)


def assert_matches_reference(
    actual: Any,
    problem_or_expected: Problem | Reference,
    *,
    numerics: Numerics | None = None,
    kernel: str | None = None,
) -> None:
    """Raise :class:`Mismatch` unless ``actual`` agrees with the reference.

    ``numerics`` is what the kernel declares (default: exact products and an
    accumulator as wide as float32 or the widest dtype involved).
    """
    __tracebackhide__ = True
    out = check(actual, problem_or_expected, numerics=numerics, kernel=kernel)
    if not out.ok:
        p = (problem_or_expected.problem if isinstance(problem_or_expected, Reference)
             else problem_or_expected)
        exc = Mismatch(out.message, groups=out.groups, kind=out.kind)
        from gmm_ref.repro import reproducer

        exc.add_note("Reproduce with:\n" + reproducer(p))
        raise exc
