"""The distinct causes of a kernel's failures in one run, and the declaration that would scope each out.

A *cause* is what a shrunk failure stands for: a kernel's own exception by its type and first line (digits
masked, as ``failures.signature``), or a wrong output by its kind (wrong values, a NaN where none belongs, a write
out of bounds...). Every check counts the *traits* of the problems it ran (a zero extent, an operand passed as a
view or not aligned to 16 bytes, the layout, the dtypes, the family, rows past the last group) under what each
example did: passed, or the cause it showed (:class:`Evidence`). Across the run's checks (:func:`summarize`), a
trait that every example of a cause had, and that some example which did not show it lacked, is the problem
property the cause goes with. Where the kernel *raised* there, it may simply not take such problems: the report
prints the declaration that scopes the property out, for the command line, the plugin and
``gmm_kernels.declare``. A wrong output is never offered one (a kernel that does not take a problem should refuse
it, not answer wrongly); its traits are still named.
"""

from __future__ import annotations

import math
import os
import re
import traceback
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter
from gmm_ref.compare import REPRODUCE
from gmm_ref.conventions.base import has_tail
from gmm_ref.layouts import layout_name, misalignment, stored_geometry
from property_tests.checks import failures
from property_tests.checks.picture import NOTE as PICTURE

__all__ = ["MAX_CAUSES", "STOPS", "TOTAL", "Evidence", "cause_of", "declarations", "goes_on", "key_of", "summarize",
           "summary_lines", "traits"]

#: the most causes one check reports: after the kernel's own exception it goes on looking for another, this many
#: times at most
MAX_CAUSES = 4
#: the fewest examples of a cause from which the traits they share are named
MIN_EVIDENCE = 8
#: the least share of the examples having a trait that must show a raised cause for it to be offered a declaration
REFUSAL_SHARE = 0.8
#: the count of examples under each key of :class:`Evidence`
TOTAL = "#"
#: the bytes an operand's offset and strides are judged aligned to (torch._grouped_mm's rule)
ALIGNMENT = 16
_PASSED = ""

#: the traits, most telling first: (prefix, what it says of a problem)
_TRAITS: tuple[tuple[str, str], ...] = (
    ("zero:", "{V} = 0"),
    ("transposed_view:", "{v} passed as a transposed view (a last stride other than 1)"),
    ("view:", "{v} passed as a view (not contiguous)"),
    ("unaligned:", "{v} not aligned to 16 bytes (its offset or a stride)"),
    ("layout:", "the {v} layout"),
    ("tail", "rows past the last group"),
    ("dtype:", "dtypes {v}"),
    ("family:", "the {v} family"),
)


def traits(problem: Any) -> frozenset[str]:
    """The declarable properties of a grouped ``problem`` (none of anything else: a routing's are not yet)."""
    if not isinstance(problem, gmm_ref.Problem):
        return frozenset()
    out = {f"family:{problem.family}", f"dtype:{problem.lhs.dtype}->{np.dtype(problem.out_dtype)}"}
    out.update(f"zero:{axis}" for axis in "mkn" if getattr(problem, axis) == 0)
    for operand, kind, x in zip(("lhs", "rhs"), problem.storage, (problem.lhs, problem.rhs), strict=True):
        if kind != "contiguous":
            out.add(f"view:{operand}")
        if kind == "transposed":
            out.add(f"transposed_view:{operand}")
        if misalignment(x.shape, *stored_geometry(x.shape, x.dtype.itemsize, kind), x.dtype.itemsize, ALIGNMENT):
            out.add(f"unaligned:{operand}")
    out.update(f"layout:{name}" for name, on in (("lhsT", problem.lhs_transposed), ("rhsT", problem.rhs_transposed))
               if on)
    if has_tail(problem):
        out.add("tail")
    return frozenset(out)


def key_of(exc: BaseException) -> str:
    """The cause ``exc`` stands for: ``wrong:KIND`` for a wrong output, ``raised:SIGNATURE`` for the kernel's own
    exception (an exception raised again keeps the key of the one reported)."""
    if isinstance(exc, gmm_ref.Mismatch):
        return f"wrong:{exc.kind}"
    return f"raised:{failures.signature(exc)}"


class Evidence:
    """The traits of the problems one check ran, counted under what each example did (``""``: passed; else the
    cause's key), with :data:`TOTAL` the examples under each."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter[str]] = {}

    def add(self, problem: Any, exc: BaseException | None = None) -> None:
        key = _PASSED if exc is None else key_of(exc)
        counts = self.counts.setdefault(key, Counter())
        counts[TOTAL] += 1
        counts.update(traits(problem))

    def to_json(self) -> dict[str, dict[str, int]]:
        return {key: dict(counts) for key, counts in self.counts.items()}


#: the failures after which a check stops: a kernel that writes where it must not (past a buffer, into an input)
#: may, on the next example, write where no guard region catches it; one that tampered is not called again
STOPS = ("wrote_out_of_bounds", "modified_input", "donated_input", "tampered")


def goes_on(exc: BaseException) -> bool:
    """Whether a check that shrank ``exc`` goes on looking for another cause: after the kernel's own exception (no
    longer a failure once reported, ``failures.CheckRun``) or a wrong output (of its kind, no longer one in this
    check), not after a repeat or a failure of :data:`STOPS`."""
    return not isinstance(exc, failures.Repeated) and getattr(exc, "kind", None) not in STOPS


def _frame(exc: BaseException) -> str:
    """Where the kernel's code raised ``exc``: ``file:line in function`` of the last frame outside the harness,
    Hypothesis and the standard library (from a hosted kernel's traceback note where it ran apart), else ""."""
    found = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    for note in getattr(exc, "__notes__", ()):
        if "Traceback (the kernel's frames" in note:
            found += [(f, int(n), fn) for f, n, fn in re.findall(r'File "([^"]+)", line (\d+), in (\S+)', note)]
    own = [f for f in found if not _library(f[0])]
    own = [f for f in own if not _core(f[0])] or own  # a kernel of torch or jax itself: where it raised in them
    if not own:
        return ""
    path, line, name = own[-1]
    try:
        shown = os.path.relpath(path)
    except ValueError:
        shown = path
    shown = shown if not shown.startswith("..") else os.path.join(*path.split(os.sep)[-2:])
    return f"{shown}:{line} in {name}"


_OURS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), p) + os.sep
              for p in ("gmm_kernels", "gmm_ref", "property_tests", "golden"))


def _library(path: str) -> bool:
    parts = path.split(os.sep)
    return (path.startswith(_OURS) or "hypothesis" in parts or "_pytest" in parts or "pluggy" in parts
            or (os.sep + "lib" + os.sep + "python" in path and "site-packages" not in parts) or path.startswith("<"))


def _core(path: str) -> bool:
    """A frame of the array libraries a kernel calls (where a kernel's own error is not raised)."""
    return any(p in path.split(os.sep) for p in ("torch", "jax", "jaxlib", "numpy", "triton", "ml_dtypes"))


#: a wrong output's kind, in words
_KINDS = {"values": "wrong values", "nonfinite": "NaN or Inf where the reference has none (or the reverse)",
          "shape": "wrong shape or dtype"}


def cause_of(exc: BaseException, where: str) -> dict[str, str]:
    """The record of the cause a check shrank to ``exc`` (after ``failures.finish``): its key, its line, the check
    ``where`` it was shrunk, the smallest problem, the kernel's raising frame and the reproducer."""
    problem = failures.recipe_problem(exc, None)
    script = next((n[len(REPRODUCE):] for n in getattr(exc, "__notes__", ()) if n.startswith(REPRODUCE)), "")
    if isinstance(exc, gmm_ref.Mismatch):
        words, line = _KINDS.get(exc.kind, exc.kind.replace("_", " ")), failures.one_line(exc)
        line = line if words in line else f"{words}: {line}"
    else:
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
        line = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    shown = next((n.rsplit(": ", 1)[-1] for n in getattr(exc, "__notes__", ()) if n.startswith(PICTURE)), "")
    return {"key": key_of(exc), "line": line, "where": where, "problem": "" if problem is None else problem.describe(),
            "frame": _frame(exc), "reproducer": script.strip(), "picture": shown}


# --------------------------------------------------------------- the run's causes
def _merged(records: Iterable[tuple[str, Sequence[Mapping[str, str]], Mapping[str, Mapping[str, int]]]]
            ) -> tuple[dict[str, dict[str, Any]], dict[str, Counter[str]]]:
    """Each cause's smallest shrunk record with the checks it showed in (shrunk or in their evidence, whichever
    came first), and the evidence's counts summed by key."""
    causes: dict[str, dict[str, Any]] = {}
    counts: dict[str, Counter[str]] = {}
    seen: dict[str, set[str]] = {}
    for where, shrunk, evidence in records:
        for c in shrunk:
            best = causes.get(c["key"])
            if best is None or _size(c) < _size(best):
                causes[c["key"]] = dict(c)
            seen.setdefault(c["key"], set()).add(where)
        for key, n in evidence.items():
            counts.setdefault(key, Counter()).update(n)
            seen.setdefault(key, set()).add(where)
    for key, cause in causes.items():
        cause["checks"] = sorted(seen[key])
    return causes, counts


def _size(cause: Mapping[str, Any]) -> tuple[bool, int, str, str]:
    """The smaller cause record of two: one with a problem recorded (a drawn one), then the shorter problem (then
    the first in order: the same whatever order the checks ran in)."""
    return not cause["problem"], len(cause["problem"]), cause["problem"], cause["where"]


def _words(trait: str) -> str:
    for prefix, text in _TRAITS:
        if trait.startswith(prefix):
            value = trait[len(prefix):]
            return text.format(v=value, V=value.upper())
    return trait


def _rank(trait: str) -> int:
    return next(i for i, (prefix, _) in enumerate(_TRAITS) if trait.startswith(prefix))


def _common(key: str, counts: Mapping[str, Counter[str]]) -> list[tuple[str, float]]:
    """The traits every example of ``key`` had and some example that did not show it lacked, most telling first,
    each with the share of the examples having it that showed the cause."""
    mine = counts.get(key, Counter())
    others: Counter[str] = Counter()
    for k, n in counts.items():
        if k != key:
            others.update(n)
    if mine[TOTAL] < MIN_EVIDENCE:  # a few examples share traits by chance
        return []
    shared = {t for t, n in mine.items() if t != TOTAL and n == mine[TOTAL] and others[TOTAL] > others[t]}
    shared -= {f"view:{t.partition(':')[2]}" for t in shared if t.startswith("transposed_view:")}  # implied
    # of two traits alike (N = 0 and K = 0 where shrinking took both to 0), first the one whose examples showed the
    # cause most often: a K = 0 that passed with N > 0 is not what the kernel refuses
    # the share leaves out the examples another refusal stopped first: they could not show this one
    shown = Counter(mine)
    for k, n in counts.items():
        if k != key and not k.startswith("raised:"):
            shown.update(n)
    share = {t: mine[t] / max(shown[t], 1) for t in shared}
    # a dtype or a family every example of a cause had, that most of its examples passed in, says little
    share = {t: s for t, s in share.items() if s >= REFUSAL_SHARE or not t.startswith(("dtype:", "family:"))}
    return sorted(share.items(), key=lambda ts: (_rank(ts[0]), -ts[1], ts[0]))


def _declaration(trait: str, adapter: KernelAdapter) -> tuple[str, str] | None:
    """(the option's value form, the ``declare`` keyword) that scopes ``trait`` out of ``adapter``'s checks, or None
    where no declaration does."""
    kind, _, value = trait.partition(":")
    scope, limits = adapter.scope, adapter.limits()
    if kind == "zero":
        allowed = limits.zero_extents if limits.zero_extents is not None else ("m", "k", "n")
        rest = tuple(a for a in allowed if a != value)
        return f"zero-extents {','.join(rest) or 'none'}", f"zero_extents={rest!r}"
    if kind in ("transposed_view", "view"):
        field = "unit_stride" if kind == "transposed_view" else "contiguous"
        have = tuple(getattr(scope, field, None) or ()) if scope is not None else ()
        ops = tuple(o for o in ("lhs", "rhs") if o in have or o == value)
        return f"{field.replace('_', '-')} {','.join(ops)}", f"{field}={ops!r}"
    if kind == "unaligned":
        need = {**limits.alignment, value: math.lcm(limits.alignment.get(value, 1), ALIGNMENT)}
        need = {o: need[o] for o in ("lhs", "rhs") if o in need}
        return f"alignment {','.join(f'{o}={n}' for o, n in need.items())}", f"alignment={need!r}"
    if kind == "layout":
        names = limits.layouts or tuple(dict.fromkeys(layout_name(x) for f in adapter.families
                                                      for x in adapter.convention_facts.layouts_of(f)))
        rest = tuple(n for n in names if value not in n.split("+"))
        return (f"layouts {','.join(rest)}", f"layouts={rest!r}") if rest else None
    if kind == "tail":
        return "no-tail", "tail=False"
    if kind == "dtype":
        pairs = [f"{np.dtype(i)}->{np.dtype(o)}" for i, o in (limits.dtypes or adapter.convention_facts.dtype_pairs)
                 if not isinstance(i, str)]
        rest = tuple(p for p in pairs if p != value)
        return (f"dtypes {','.join(rest)}", f"dtypes={rest!r}") if rest else None
    if kind == "family":
        fams = limits.families or adapter.convention_facts.families
        rest = tuple(f for f in fams if f != value)
        return (f"families {','.join(rest)}", f"families={rest!r}") if rest else None
    return None


def declarations(adapter: KernelAdapter, evidence: Mapping[str, Mapping[str, int]]) -> dict[str, list[str]]:
    """trait -> [the option's value form, the ``declare`` keyword] that scopes it out of ``adapter``'s checks, for
    every trait in ``evidence`` that a declaration scopes out (computed where the kernel is, read where the causes are
    summed: the pytest plugin's controller)."""
    seen = {t for counts in evidence.values() for t in counts if t != TOTAL}
    return {t: list(d) for t in sorted(seen) if (d := _declaration(t, adapter)) is not None}


def summarize(adapter: KernelAdapter | None,
              records: Iterable[tuple[str, Sequence[Mapping[str, str]], Mapping[str, Mapping[str, int]]]],
              declared: Mapping[str, Sequence[str]] | None = None, convention: str = "") -> list[dict[str, Any]]:
    """The distinct causes of a kernel's failures over ``records`` (each check's name, the causes it shrank, its
    :class:`Evidence` as JSON), those in the most checks first: each with the checks it showed in, its examples,
    the smallest problem it was shrunk to, its reproducer, the traits every example of it had, and (for an
    exception) the declaration that scopes the first of them out: ``{"cli": ..., "plugin": ..., "declare":
    ...}``, from ``adapter`` or, without it, from ``declared`` (:func:`declarations`) and ``convention``."""
    records = list(records)
    if adapter is not None:
        declared = {t: d for _, _, ev in records for t, d in declarations(adapter, ev).items()}
        convention = adapter.convention
    declared = declared or {}
    causes, counts = _merged(records)
    out = []
    for key, cause in causes.items():
        shared = _common(key, counts)
        entry = {**cause, "examples": counts.get(key, Counter())[TOTAL], "declaration": None,
                 "traits": [_words(t) + ("" if share == 1 else f" ({share:.0%} of the examples with it showed it)")
                            for t, share in shared]}
        # a refusal goes with a trait most examples having it show (a dtype that fails by chance does not), and
        # never with what the harness itself found (an access out of bounds)
        if key.startswith("raised:") and "OutOfBounds" not in key:
            decl = next((declared[t] for t, share in shared if t in declared and share >= REFUSAL_SHARE), None)
            if decl is not None:
                option, keyword = decl
                entry["declaration"] = {"cli": f"--{option}", "plugin": f"--gmm-{option}",
                                        "declare": f"@gmm_kernels.declare({convention!r}, {keyword})"}
        out.append(entry)
    # the same list whatever order the checks ran in (a run split into shards and merged gives the unsplit one's)
    return sorted(out, key=lambda c: (-len(c["checks"]), c["key"]))


def summary_lines(causes: Sequence[Mapping[str, Any]], kernel: str, report: str = "the -v report of {}") -> list[str]:
    """The text of :func:`summarize`'s causes of ``kernel``, one block each; ``report`` says where the report of a
    check (``{}``), with its reproducer, is."""
    lines = [f"{kernel}: {len(causes)} distinct cause{'s' * (len(causes) != 1)} of failure"]
    for i, c in enumerate(causes, 1):
        at = f" (raised at {c['frame']})" if c["frame"] else ""
        checks = c["checks"]
        shown = ", ".join(checks[:6]) + (f" and {len(checks) - 6} more" if len(checks) > 6 else "")
        lines.append(f"  [{i}] {c['line'][:300]}{at}")
        lines.append(f"      in {len(checks)} check{'s' * (len(checks) != 1)} ({shown}); {c['examples']} examples; "
                     f"smallest problem: {c['problem'][:300] or '(none recorded)'}")
        if c["traits"]:
            lines.append(f"      every example of it had {' and '.join(c['traits'][:3])}, and some example without it "
                         "did not show it")
        decl = c["declaration"]
        if decl is not None:
            lines.append(f"      if the kernel does not take that, declare it: gmm-harness check {decl['cli']}; pytest "
                         f"{decl['plugin']}; {decl['declare']}")
        elif c["key"].startswith("wrong:") and c["traits"]:
            lines.append("      (a kernel that does not take such problems should raise, not return a wrong output)")
        if c.get("picture"):
            lines.append(f"      picture: {c['picture']}")
        lines.append(f"      reproducer: in {report.format(c['where'])}" if c["reproducer"] else
                     f"      no reproducer; its report: {report.format(c['where'])}")
    return lines
