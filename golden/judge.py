"""Judge kernels against stored goldens: bit for bit against their own, else within the gmm_ref bound.

:func:`check_goldens` runs one kernel on every golden case of its convention
and returns one ``gmm_kernels.Result`` per case (the result model the property
checks use too); :func:`drift` and :func:`describe_bad` say how far two outputs
are apart and where.
"""

from __future__ import annotations

import os
import shlex
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import FunctionAdapter, KernelAdapter, Result, Status, resolve_kernel
from gmm_kernels.repro import locate
from gmm_ref import dtypes as _dt
from gmm_ref.compare import group_span, groups_of
from golden import routed
from golden.case import Case, GoldenError, build_problem, select
from golden.producers import kernel_producer
from golden.staleness import case_now, fix_commands, spec_diff, stale_keys
from golden.store import (
    PROG,
    REFERENCE,
    VIEW_AS,
    Golden,
    GoldenStore,
    canonical_output,
    default_directory,
    producer_key,
)

__all__ = ["bits", "check_goldens", "describe_bad", "drift", "out_of_scope", "reasons_text", "scope_reasons"]


def _ordered(a: np.ndarray) -> np.ndarray:
    """Floats as integers in value order (adjacent floats differ by 1): ulp distances."""
    if _dt.is_integer(a.dtype):
        return a.astype(np.int64)
    w = a.dtype.itemsize * 8
    if w == 64:
        b = a.view(np.int64)
        return np.where(b < 0, -(b & np.int64(0x7FFFFFFFFFFFFFFF)), b)
    b = a.view(VIEW_AS[a.dtype.itemsize]).astype(np.int64)
    mag = b & np.int64((1 << (w - 1)) - 1)
    return np.where(b >> np.int64(w - 1), -mag, mag)


def bits(a: np.ndarray) -> np.ndarray:
    """The array's raw bits (unsigned integers of its width)."""
    return a.view(VIEW_AS[a.dtype.itemsize])


def drift(old: np.ndarray, new: np.ndarray, mask: np.ndarray) -> tuple[float, float, int]:
    """(max |new - old|, max ulps apart, elements that differ bitwise) over ``mask``."""
    if old.shape != new.shape or old.dtype != new.dtype:
        return float("nan"), float("nan"), -1
    o, n = old[mask], new[mask]
    differ = bits(o) != bits(n)
    if not np.any(differ):
        return 0.0, 0.0, 0
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.abs(n.astype(np.float64) - o.astype(np.float64))
        ulps = np.abs(_ordered(n) - _ordered(o)).astype(np.float64)
    max_delta = float(np.nanmax(delta)) if np.isfinite(delta).any() else float("nan")
    return max_delta, float(np.max(ulps)), int(np.sum(differ))


def _fmt(x: Any) -> str:
    return repr(int(x)) if np.issubdtype(np.asarray(x).dtype, np.integer) else repr(float(x))


def describe_bad(p: gmm_ref.Problem, bad: np.ndarray, mask: np.ndarray, actual: np.ndarray,
                 desired: np.ndarray, output: str | None = None) -> str:
    """One line: how many defined elements are wrong, in which groups, and the first one (a routing's: in which
    slots, and the first one's token, slot and expert; ``output``, what its convention returns,
    ``golden.routed.output_of``)."""
    if isinstance(p, gmm_ref.Routing):
        return routed.describe_bad(p, bad, mask, actual, desired, output or "slots")
    idx = np.argwhere(bad)
    groups = groups_of(p, idx)
    found, first = np.unique(groups, return_index=True)
    spans = [group_span(p, int(g), tuple(int(v) for v in idx[i])) for g, i in zip(found[:6], first[:6], strict=True)]
    text = ", ".join(spans)
    if len(found) > 6:
        text += f", ... ({len(found)} groups)"
    at = tuple(int(v) for v in idx[0])
    return (f"{len(idx)} / {int(mask.sum())} defined elements wrong in {text}; "
            f"first at {list(at)}: {_fmt(actual[at])} vs {_fmt(desired[at])}")


def scope_reasons(results: Sequence[Result]) -> list[tuple[str, int]]:
    """Each reason a result was out of the kernel's scope (unsupported) with its count, most frequent first."""
    return Counter(r.detail or "unsupported" for r in results if r.status is Status.UNSUPPORTED).most_common()


def reasons_text(reasons: Sequence[tuple[str, int]]) -> str:
    """``4 x REASON; 3 x REASON``."""
    return "; ".join(f"{n} x {why}" for why, n in reasons)


def out_of_scope(results: Sequence[Result]) -> str:
    """Which results were out of the kernel's scope (unsupported), each reason with its count, most frequent
    first: ``7 out of scope: 4 x REASON; 3 x REASON`` (empty when none was)."""
    reasons = scope_reasons(results)
    if not reasons:
        return ""
    return f"{sum(n for _, n in reasons)} out of scope: " + reasons_text(reasons)


def _failed(kernel: str, case: str, detail: str, criterion: str, message: str = "") -> Result:
    error = gmm_ref.Mismatch(message or detail, kind="shape" if criterion == "shape" else "values")
    return Result(kernel, case, Status.FAILED, detail=detail, error=error, criterion=criterion)


def compare_output(kernel: KernelAdapter, golden: Golden, problem: gmm_ref.Problem, actual: Any) -> Result:
    """Judge one kernel output against a golden: bit for bit when the golden is the kernel's own
    (same name, version and platform), else within the gmm_ref bound of its declared numerics
    around the reference, whose stored golden must still be the reference's value bit for bit."""
    name, case = str(kernel.name), golden.case.name
    try:
        act = gmm_ref.as_numpy(actual)
    except Exception as exc:  # noqa: BLE001
        return _failed(name, case, f"case {case}: output not convertible: {exc}", "shape")
    if act.shape != golden.out.shape or act.dtype != golden.out.dtype:
        return _failed(name, case, f"case {case}: shape/dtype {act.shape} {act.dtype}, expected "
                                   f"{golden.out.shape} {golden.out.dtype}", "shape")
    producer = golden.entry.get("producer", {})
    if producer == kernel_producer(kernel):
        got = canonical_output(act, golden.mask)
        _, ulps, n = drift(golden.out, got, golden.mask)
        if n == 0:
            return Result(name, case, Status.PASSED, examples=1, criterion="bit-for-bit")
        bad = golden.mask & (bits(got) != bits(golden.out))
        line = describe_bad(problem, bad, golden.mask, act, golden.out, routed.output_of(golden.case))
        return _failed(name, case, f"case {case}: not bit-for-bit equal to its own golden ({producer['version']}, "
                                   f"{producer['platform']}), max {ulps:g} ulps: {line}", "bit-for-bit")
    ref = routed.reference_of(problem, golden.case)
    if drift(golden.out, canonical_output(ref.values, ref.mask), ref.mask)[2] or not np.array_equal(
            golden.mask, ref.mask):
        return _failed(name, case, f"case {case}: the stored reference golden no longer equals the reference: "
                                   "run python -m golden verify", "bound")
    act = canonical_output(act, ref.mask)  # undefined elements may hold any bits (uninitialised memory)
    if kernel.declared_quantizes is not None:  # a kernel that quantizes: the golden inputs quantized
        ref = kernel.reference_for(problem)
    outcome = routed.check_of(act, ref, numerics=kernel.numerics_for(problem), kernel=name)
    if outcome.ok:
        return Result(name, case, Status.PASSED, examples=1, criterion="bound")
    if outcome.bad is None:
        return _failed(name, case, f"case {case}: {outcome.message.splitlines()[-1]}", "bound", outcome.message)
    line = describe_bad(problem, outcome.bad, ref.mask, act, ref.values, routed.output_of(golden.case))
    crit = outcome.message.splitlines()[1] if len(outcome.message.splitlines()) > 1 else ""
    return _failed(name, case, f"case {case}: {line}; {crit}", "bound", outcome.message)


def _regenerate_command(k: KernelAdapter, store: GoldenStore) -> str:
    """The command that stores ``k``'s own goldens in ``store`` (its manifest is the corpus)."""
    spec = locate(k) or "pkg.module:your_kernel"
    parts = [PROG, "regenerate"]
    if store.dir.resolve() != default_directory().resolve():
        parts += ["--dir", shlex.quote(str(store.dir))]
    parts += ["--kernel", shlex.quote(spec)]
    if isinstance(k, FunctionAdapter) and getattr(k.fn, "__gmm_convention__", None) is None:
        parts += ["--convention", k.convention]
    parts += ["--kernel-version", shlex.quote(kernel_producer(k)["version"])]
    return " ".join(parts)


def _where(store: GoldenStore) -> str:
    """The ``--dir`` a suggested command needs (none for this project's own goldens)."""
    return "" if store.dir.resolve() == default_directory().resolve() else f" --dir {shlex.quote(str(store.dir))}"


def _stale(k: KernelAdapter, name: str, key: str, goldens: dict[str, dict[str, Any]], spec: dict[str, Any] | None,
           where: str) -> Result | None:
    """A failure when the golden ``key`` that would judge ``k`` was made from another version of the case."""
    stale = stale_keys(goldens, spec)
    if key not in stale:
        return None
    now, _ = case_now(goldens, spec)
    basis = "the corpus" if spec is not None else "the reference golden"
    fixes = "; ".join(fix_commands(name, goldens, stale, where=where))
    return Result(k.name, name, Status.FAILED, criterion="stale",
                  detail=f"case {name}: the golden of {key} is stale: made from another version of the case "
                         f"({spec_diff(goldens[key].get('spec'), now)}, against {basis}); to fix every golden of "
                         f"case {name}: {fixes}")


def _check_case(k: KernelAdapter, store: GoldenStore, name: str, goldens: dict[str, dict[str, Any]],
                require_own: bool, spec: dict[str, Any] | None = None, where: str = "") -> Result:
    own_key = producer_key(kernel_producer(k))
    own = goldens.get(own_key)
    if own is None and require_own:
        return Result(k.name, name, Status.FAILED, criterion="bit-for-bit",
                      detail=f"case {name}: no golden of {own_key} (missing; to make "
                             f"them run: {_regenerate_command(k, store)})")
    entry = own or goldens.get(REFERENCE)
    if entry is None:
        return Result(k.name, name, Status.FAILED, detail=f"case {name}: no reference golden (missing)")
    stale = _stale(k, name, own_key if own else REFERENCE, goldens, spec, where)
    if stale is not None:
        return stale
    try:
        golden = store.load(name, entry)
        problem = build_problem(golden.case)
    except (GoldenError, ValueError, TypeError) as exc:
        return _failed(k.name, name, f"case {name}: golden unusable: {exc}", "")
    why = k.supports(problem)
    if why:
        return Result(k.name, name, Status.UNSUPPORTED, detail=why)
    try:
        out = k.run(problem)
    except Exception as exc:  # noqa: BLE001 - a kernel crash is a failure of this case
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return Result(k.name, name, Status.FAILED, detail=f"case {name}: raised {type(exc).__name__}: {first}",
                      error=exc)
    return compare_output(k, golden, problem, out)


def check_goldens(kernel: Any, directory: str | os.PathLike[str], *, cases: str | Sequence[str] | None = None,
                  convention: str | None = None, require_own: bool = False, corpus: Sequence[Case] | None = None,
                  where: str | None = None) -> list[Result]:
    """One kernel (an adapter, a built-in name, ``pkg.mod:fn`` or a function with ``convention``)
    against every golden case of its convention in ``directory``: one result per case.

    Its own golden (same name, version, platform) is matched bit for bit; without
    one, the reference's within the bound. ``require_own``: a missing own golden
    is a failure (the kernel's version was given explicitly). A golden made from
    another version of its case than the reference golden's (or ``corpus``'s,
    when given) is a failure naming the commands that remake every golden of the
    case (``where``: what they need after the command, default ``--dir``)."""
    k = resolve_kernel(kernel, convention=convention)
    store = GoldenStore(directory)
    man = store.manifest()
    names = select(sorted(man["cases"]), cases)
    mine = [n for n in names if any(e["spec"]["convention"] == k.convention for e in man["cases"][n].values())]
    reason = k.available()
    if reason:
        return [Result(k.name, n, Status.UNSUPPORTED, detail=f"kernel unavailable: {reason}") for n in mine]
    specs = {c.name: c.to_json() for c in corpus or ()}
    where = _where(store) if where is None else where
    return [_check_case(k, store, n, man["cases"][n], require_own, specs.get(n), where) for n in mine]
