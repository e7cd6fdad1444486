"""Compare a kernel's output with the reference and say exactly where it is wrong.

Checks run in numpy.testing's order: shape and dtype (exactly), then NaN/Inf
positions, then values against the per-element bound (docs/numerics.md); only
elements the problem defines are compared. A failure names the wrong groups,
draws a group x tile map, and carries a reproducer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.exact import Reference, reference
from gmm_ref.families import ALIGNED, COUNTS
from gmm_ref.numerics import Numerics
from gmm_ref.problem import Problem
from gmm_ref.repro import fenced, reproducer

__all__ = ["REPRODUCE", "Comparison", "Mismatch", "assert_deterministic", "assert_matches_reference", "check",
           "group_of", "group_span", "groups_of", "scale_blocks_of"]

DEFAULT_TILE = (128, 128, 128)
MAX_LISTED = 8
BOUND_CRITERION = "|actual - exact| <= bound (docs/numerics.md)"


@dataclass(frozen=True)
class Comparison:
    """What :func:`check` found. ``ok``; on failure ``kind`` ("shape", "nonfinite" or
    "values"), the report ``message``, the wrong ``groups`` (-1: the tail) with
    ``group_counts``, ``mismatched`` of ``defined`` elements, the ``first`` wrong
    indices, the largest absolute error and error over bound among them, and
    ``bad``, the mask of wrong elements."""

    ok: bool
    kind: str = ""
    message: str = ""
    groups: tuple[int, ...] = ()
    group_counts: dict[int, int] = field(default_factory=dict)
    mismatched: int = 0
    defined: int = 0
    first: tuple[tuple[int, ...], ...] = ()
    max_abs_error: float | None = None
    max_error_over_bound: float | None = None
    bad: np.ndarray | None = field(default=None, repr=False, compare=False)


class Mismatch(AssertionError):
    """A kernel output disagrees with the reference; ``comparison`` says where. ``output`` is the kernel's output
    where the check that raised it keeps it for the report (the forward check, for the guard regions' blame)."""

    def __init__(self, message: str, *, comparison: Comparison | None = None, kind: str | None = None,
                 output: Any = None):
        super().__init__(message)
        self.comparison = comparison or Comparison(False, kind or "values", message)
        self.output = output

    @property
    def groups(self) -> tuple[int, ...]:
        return self.comparison.groups

    @property
    def kind(self) -> str:
        return self.comparison.kind


#: the first line of the note that carries a reproducer
REPRODUCE = "Reproduce with:\n"


# ------------------------------------------------------------------------ groups
def groups_of(p: Problem, idx: np.ndarray) -> np.ndarray:
    """The group of each output index (rows of ``idx``); -1 for the tail past every group."""
    nb = len(p.batch_shape)
    facts = p.family_facts
    if facts.groups == COUNTS:  # group g's matrix; -1 past its valid rows
        g = idx[:, 0].astype(np.int64)
        return np.where(idx[:, 1] < p.group_sizes[g], g, -1)
    if facts.groups == ALIGNED:  # the group whose rows hold it; -1 for padding rows
        starts, ends = p.spans_at(())
        row = idx[:, 0]
        g = np.searchsorted(starts, row, side="right") - 1
        inside = (g >= 0) & (row < ends[np.maximum(g, 0)])
        # empty groups share their start with the next group: the last group starting there holds the row
        return np.where(inside, g, -1)
    if facts.is_grouped("out"):
        return p.group_offset + idx[:, 0].astype(np.int64)
    pos = idx[:, nb + facts.ragged_dim("out")]
    out = np.empty(len(idx), np.int64)
    batch = [tuple(r) for r in idx[:, :nb]] if p.group_sizes.ndim > 1 else None
    for bi in ({()} if batch is None else set(batch)):
        sel = slice(None) if batch is None else np.array([b == bi for b in batch], bool)
        off = p.offsets_at(bi)
        g = np.searchsorted(off, pos[sel], side="right") - 1
        out[sel] = np.where(pos[sel] >= off[-1], -1, g)
    return out


def group_of(p: Problem, index: tuple[int, ...]) -> int:
    """The group an output element belongs to (-1: tail, past every group)."""
    return int(groups_of(p, np.asarray([index], np.int64))[0])


def group_span(p: Problem, g: int, index: tuple[int, ...]) -> str:
    """``group g (rows [a, b), size s)``: the group of output ``index`` and its ragged range."""
    facts = p.family_facts
    if g < 0:
        return facts.outside
    if p.group_sizes is None or not facts.takes_sizes:
        return f"group {g}"
    if facts.serving:
        starts, ends = p.spans_at(())
        where = " of its own matrix" if facts.groups == COUNTS else ""
        return f"group {g} (rows [{starts[g]}, {ends[g]}){where}, size {ends[g] - starts[g]})"
    nb = len(p.batch_shape)
    lead = 1 if facts.is_grouped("out") else 0
    bi = tuple(index[lead:lead + nb]) if p.group_sizes.ndim > 1 else ()
    off = p.offsets_at(bi)
    axis = facts.axis_word
    where = f" at batch index {list(bi)}" if bi else ""
    return f"group {g} ({axis} [{off[g]}, {off[g + 1]}){where}, size {off[g + 1] - off[g]})"


def _group_summary(p: Problem, idx: np.ndarray) -> tuple[str, dict[int, int]]:
    groups = groups_of(p, idx)
    found, first, counts = np.unique(groups, return_index=True, return_counts=True)
    by_group = {int(g): int(c) for g, c in zip(found, counts, strict=True)}
    lines = [f"  {group_span(p, int(g), tuple(int(v) for v in idx[i]))}: {int(c)} wrong"
             for g, i, c in list(zip(found, first, counts, strict=True))[:MAX_LISTED]]
    if len(found) > MAX_LISTED:
        lines.append(f"  ... and {len(found) - MAX_LISTED} more groups")
    # masked: name the groups whose rows past the count are wrong
    if p.family_facts.groups == COUNTS and found.size and found[0] == -1:
        past = idx[groups < 0, 0]
        owners, n_past = np.unique(past, return_counts=True)
        lines[0] = "  rows past a group's valid count (masked):"
        lines[1:1] = [f"    group {int(g)} (valid rows [0, {int(p.group_sizes[g])}) of {p.m}): {int(c)} wrong past them"
                      for g, c in list(zip(owners, n_past, strict=True))[:MAX_LISTED]]
    return "\n".join(lines), by_group


def scale_blocks_of(p: Problem, idx: np.ndarray) -> np.ndarray:
    """For output indices of a scaled problem (rows of ``idx``): ``(group, lhs block row, rhs block row)``, the
    blocks of the group's scales (``Problem.scales_of``) whose row of lhs scales and row of rhs scales the element
    multiplies (every K block of them); group -1 for elements of no group."""
    groups = groups_of(p, idx)
    out = np.full((len(idx), 3), -1, np.int64)
    out[:, 0] = groups
    dim = p.family_facts.ragged_dim("out")  # masked: its groups start at row 0 of their own matrices
    starts = None if dim is None else p.spans_at(())[0]
    for i, (g, ix) in enumerate(zip(groups.tolist(), idx.tolist(), strict=True)):
        if g < 0:
            continue
        rc = [ix[-2], ix[-1]]
        if dim is not None:
            rc[dim] -= int(starts[g])
        row, col = rc
        for j, (quant, at) in enumerate(((p.lhs_quant, row), (p.rhs_quant, col)), 1):
            if quant is not None:
                out[i, j] = 0 if quant.block[0] is None else at // quant.block[0]
    return out


def ranges(values: list[int], most: int = 6) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (the first ``most`` runs)."""
    runs: list[list[int]] = []
    for v in sorted(set(values)):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:most])
    return text + (", ..." if len(runs) > most else "")


def _scale_block_summary(p: Problem, idx: np.ndarray) -> list[str]:
    """Per wrong group, which block rows of its lhs and rhs scales the wrong elements multiply, of how many: a
    misapplied scale shows as one block row wrong, a whole group's wrong scales as every one of them."""
    blocks = scale_blocks_of(p, idx)
    blocks = blocks[blocks[:, 0] >= 0]
    if not len(blocks):
        return []
    lines = [f"Wrong scale blocks (lhs {p.lhs_quant.describe() if p.lhs_quant else 'unscaled'}, rhs "
             f"{p.rhs_quant.describe() if p.rhs_quant else 'unscaled'}; the block rows of each group's scales that "
             "wrong elements multiply):"]
    groups = sorted(set(blocks[:, 0].tolist()))
    for g in groups[:MAX_LISTED]:
        mine = blocks[blocks[:, 0] == g]
        parts = []
        for j, name in ((1, "lhs"), (2, "rhs")):
            quant = getattr(p, f"{name}_quant")
            if quant is None:
                continue
            total = p.scales_of(name, g - p.group_offset).shape[0]
            rows = mine[:, j].tolist()
            parts.append(f"{name} block rows {ranges(rows)} ({len(set(rows))} of {total})")
        lines.append(f"  group {g}: {'; '.join(parts)}")
    if len(groups) > MAX_LISTED:
        lines.append(f"  ... and {len(groups) - MAX_LISTED} more groups")
    return lines


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


def _fmt_val(x: Any) -> str:
    kind = np.asarray(x).dtype
    if np.issubdtype(kind, np.integer):
        return str(int(x))
    return repr(float(x)) if np.issubdtype(kind, np.floating) or isinstance(x, float) else repr(x)


# --------------------------------------------------------------------- criteria
def _integer_errors(act: np.ndarray, ref: Reference) -> tuple[np.ndarray, np.ndarray, str, str]:
    p = ref.problem
    a64 = act.astype(np.int64)
    bad = ref.mask & (a64 != ref.exact.astype(p.out_dtype).astype(np.int64))
    return bad, np.zeros(ref.exact.shape), "values", "exact equality (integer output)"


def _float_errors(act: np.ndarray, ref: Reference, numerics: Numerics | None
                  ) -> tuple[np.ndarray, np.ndarray, str, str]:
    """(wrong elements, bound, kind, criterion): NaN/Inf positions first, then values."""
    p, mask, exact = ref.problem, ref.mask, ref.exact
    bound = ref.bound(numerics)
    with np.errstate(invalid="ignore", over="ignore"):  # signalling NaNs in undefined elements are fine
        a64 = act.astype(np.float64)
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
        if bad_special.any():
            return bad_special, bound, "nonfinite", "NaN/Inf at the same positions as the reference"
        err = np.abs(a64 - exact)
        bad_value = mask & ~expected_special & ~a_nan & ~a_inf & ~(err <= bound)
    exact_mode = not bound[mask].any()
    return bad_value, bound, "values", ("bit-for-bit equality (exact mode)" if exact_mode else BOUND_CRITERION)


def _error_stats(act: np.ndarray, exact: np.ndarray, bound: np.ndarray, bad: np.ndarray
                 ) -> tuple[list[str], float, float | None]:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        errs = np.abs(act.astype(np.float64) - exact)[bad]
        ratio = errs / np.where(bound[bad] > 0, bound[bad], np.nan)
    max_err = float(np.nanmax(errs))
    lines = [f"Max absolute difference among violations: {max_err:.6g}"]
    if np.isfinite(ratio).any():
        max_ratio = float(np.nanmax(ratio))
        lines.append(f"Max |error| / bound: {max_ratio:.6g}")
        return lines, max_err, max_ratio
    lines.append("Bound is 0 here: the exact result is representable, so it must match bit for bit")
    return lines, max_err, None


# ----------------------------------------------------------------------- public
def _as_reference(problem_or_expected: Problem | Reference) -> Reference:
    if isinstance(problem_or_expected, Reference):
        return problem_or_expected
    if isinstance(problem_or_expected, Problem):
        return reference(problem_or_expected)
    raise TypeError(
        "problem_or_expected: expected a gmm_ref.Problem or gmm_ref.Reference, "
        f"got {type(problem_or_expected).__name__}"
    )


def check(actual: Any, problem_or_expected: Problem | Reference, *, numerics: Numerics | None = None,
          kernel: str | None = None) -> Comparison:
    """Compare without raising; see :func:`assert_matches_reference`."""
    ref = _as_reference(problem_or_expected)
    p = ref.problem
    act = _dt.as_numpy(actual)
    head = f"{'kernel ' + kernel if kernel else 'kernel'} vs gmm_ref on {p.describe()}"
    want_shape = ref.exact.shape  # p.out_shape, or more when a convention appends unwritten slots
    if act.shape != want_shape or act.dtype != p.out_dtype:
        msg = f"{head}\nshape/dtype mismatch: ACTUAL {act.shape} {act.dtype}, DESIRED {want_shape} {p.out_dtype}"
        return Comparison(False, "shape", msg)
    if _dt.is_integer(p.out_dtype):
        bad, bound, kind, criterion = _integer_errors(act, ref)
    else:
        bad, bound, kind, criterion = _float_errors(act, ref, numerics)
    n_bad = int(bad.sum())
    if n_bad == 0:
        return Comparison(True)
    return _failure(act, ref, bad, bound, kind, [head, f"Not equal under {criterion}"])


def _failure(act: np.ndarray, ref: Reference, bad: np.ndarray, bound: np.ndarray, kind: str,
             lines: list[str]) -> Comparison:
    p, exact = ref.problem, ref.exact
    n_bad, n_def = int(bad.sum()), int(ref.mask.sum())
    idx = np.argwhere(bad)
    lines += [f"Mismatched elements: {n_bad} / {n_def} defined ({100.0 * n_bad / max(n_def, 1):.3g}%)",
              "First mismatches (index: ACTUAL vs DESIRED [exact], bound, group):"]
    first = tuple(tuple(int(v) for v in ix) for ix in idx[:MAX_LISTED])
    desired = ref.values
    for t in first:
        lines.append(f"  {list(t)}: {_fmt_val(act[t])} vs {_fmt_val(desired[t])} [{_fmt_val(exact[t])}], "
                     f"bound {bound[t]:.3g}, group {group_of(p, t)}")
    max_err = max_ratio = None
    if kind == "values" and not _dt.is_integer(p.out_dtype):
        stats, max_err, max_ratio = _error_stats(act, exact, bound, bad)
        lines += stats
    summary, counts = _group_summary(p, idx)
    lines += ["Wrong groups:", summary]
    if p.scaled:
        lines += _scale_block_summary(p, idx)
    tiles = _tile_map(p, bad, ref.mask)
    if tiles:
        lines.append(tiles)
    return Comparison(False, kind, "\n".join(lines), tuple(sorted(counts)), counts, n_bad, n_def, first,
                      max_err, max_ratio, bad)


def assert_matches_reference(actual: Any, problem_or_expected: Problem | Reference, *,
                             numerics: Numerics | None = None, kernel: str | None = None) -> None:
    """Raise :class:`Mismatch` unless ``actual`` agrees with the reference.

    ``numerics`` is what the kernel declares (default: exact products and an
    accumulator as wide as float32 or the widest dtype involved).
    """
    __tracebackhide__ = True
    ref = _as_reference(problem_or_expected)
    out = check(actual, ref, numerics=numerics, kernel=kernel)
    if not out.ok:
        exc = Mismatch(out.message, comparison=out)
        exc.add_note(REPRODUCE + fenced(reproducer(ref.problem, numerics=numerics)))
        raise exc


def assert_deterministic(first: Any, second: Any, problem_or_expected: Problem | Reference, *,
                         kernel: str | None = None) -> None:
    """Raise :class:`Mismatch` (kind ``"determinism"``) unless two outputs of the same problem agree bit for
    bit wherever the output is defined."""
    __tracebackhide__ = True
    ref = _as_reference(problem_or_expected)
    a, b = _dt.as_numpy(first), _dt.as_numpy(second)
    if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(
            a[ref.mask].view(np.uint8), b[ref.mask].view(np.uint8)):
        raise Mismatch(f"kernel {kernel or '?'} is declared deterministic but two runs of "
                       f"{ref.problem.describe()} differ bit-wise", kind="determinism")
