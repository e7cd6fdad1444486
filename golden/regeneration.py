"""Regenerate goldens: recompute them (by the reference or a kernel) and write the changes atomically.

New cases are added freely; an existing golden changes only with ``update``,
after a drift table; a kernel whose output is outside the gmm_ref bound is
never stored. The manifest is written last, so an interrupted run leaves the
previous set intact.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter, resolve_kernel
from gmm_kernels.repro import locate
from golden import routed
from golden.case import Case, GoldenError, build_problem, inputs_of, select, split_patterns
from golden.judge import describe_bad, drift
from golden.lock import locked
from golden.producers import kernel_producer, numerics_json, reference_producer
from golden.staleness import by_convention, fix_command, spec_diff, stale_keys
from golden.store import (
    REFERENCE,
    GoldenStore,
    array_sha256,
    atomic_write,
    canonical_output,
    corpus_of,
    file_sha256,
    inputs_sha256,
    producer_key,
)

__all__ = ["Change", "Progress", "drift_table", "regenerate"]


class Progress:
    """A plain-text progress bar on stderr (a few lines when stderr is not a terminal)."""

    def __init__(self, total: int, label: str, stream: Any = None):
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, what: str) -> None:
        self.done += 1
        width = 24
        fill = width * self.done // max(self.total, 1)
        text = f"{self.label} [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {what}"
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if self.done == self.total else ""))
        elif self.done == self.total or self.done % max(1, self.total // 8) == 0:
            self.stream.write(text + "\n")  # not a terminal: a few lines, not one per step
        self.stream.flush()


@dataclass
class Change:
    """A golden that regeneration would add or change."""

    case: str
    status: str  # "new", "changed", "stale"
    max_delta: float = 0.0
    max_ulps: float = 0.0
    n_diff: int = 0
    #: whether the old golden is within the gmm_ref bound of the case as it is now (None: not comparable)
    within_bound: bool | None = None
    note: str = ""
    #: the worst |old - exact| / bound over the defined elements, and the largest bound (absolute, output units)
    bound_ratio: float | None = None
    bound: float | None = None


#: what the drift table's columns mean (printed under it)
DRIFT_LEGEND = (
    "max |delta|: the largest change of a defined element, in the output's units; max ulps: the same in units in "
    "the last place of the output dtype (a value that changes sign moves ~2e9 float32 ulps).\n"
    "within bound: the old golden judged as an output of the case as it is now: |old - exact| <= bound, element "
    "by element, the gmm_ref bound of the golden's numerics (the reference's: docs/numerics.md's default), an "
    "absolute bound from K, the input, accumulate and output dtypes and sum |a||b| (0 when the exact result is "
    "representable); shown as the worst |old - exact| / bound and the largest bound. '-': the inputs changed, "
    "so the old golden is the output of another problem and no bound applies.")


def _within(c: Change) -> str:
    if c.within_bound is None or c.bound_ratio is None:
        return "-"
    verdict = "yes" if c.within_bound else "NO"
    if c.bound == 0:
        return f"{verdict} (bound 0: bit for bit)"
    ratio = "inf" if c.bound_ratio == float("inf") else f"{c.bound_ratio:.3g}"
    return f"{verdict} ({ratio} x bound, max bound {c.bound:.3g})"


def drift_table(changes: Sequence[Change]) -> str:
    rows = [("case", "change", "elements", "max |delta|", "max ulps", "within bound")]
    for c in changes:
        fresh = c.status in ("new", "stale")
        rows.append((c.case, c.status + (f" ({c.note})" if c.note else ""),
                     "-" if fresh else str(c.n_diff), "-" if fresh else f"{c.max_delta:.4g}",
                     "-" if fresh else f"{c.max_ulps:g}", _within(c)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if any(c.status == "changed" for c in changes):
        lines.append(DRIFT_LEGEND)
    return "\n".join(lines)


def _old_within_bound(case: Case, p: gmm_ref.Problem, old: np.ndarray, numerics: Any) -> tuple[bool, float, float]:
    """(within, worst |old - exact| / bound, largest bound) of an old golden as an output of ``p`` (``case``) now."""
    ref = routed.reference_of(p, case)
    ok = routed.check_of(old, ref, numerics=numerics).ok
    bound = ref.bound(numerics)[ref.mask]  # (zeros for an integer output: exact)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.abs(old.astype(np.float64) - ref.exact.astype(np.float64))[ref.mask]
        ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1), np.where(err > 0, np.inf, 0.0))
    finite = ~np.isnan(ratio)
    worst = float(ratio[finite].max()) if finite.any() else 0.0
    return ok, worst, float(bound.max()) if bound.size else 0.0


def _produce(case: Case, kernel: KernelAdapter | None
             ) -> tuple[gmm_ref.Problem, np.ndarray, np.ndarray, dict, Any, str]:
    """(problem, canonical output, mask, producer, numerics, failure) for one case."""
    p = build_problem(case)
    ref = routed.reference_of(p, case)
    if kernel is None:
        return p, canonical_output(ref.values, ref.mask), ref.mask, reference_producer(), None, ""
    out = canonical_output(kernel.run(p), ref.mask)
    numerics = kernel.numerics_for(p)
    outcome = routed.check_of(out, ref, numerics=numerics, kernel=kernel.name)
    fail = ""
    if not outcome.ok:
        fail = "output outside the gmm_ref bound: " + (
            describe_bad(p, outcome.bad, ref.mask, out, ref.values, routed.output_of(case)) if outcome.bad is not None
            else outcome.message.splitlines()[-1])
    return p, out, ref.mask, kernel_producer(kernel), numerics, fail


def _entry(case: Case, p: gmm_ref.Problem, out: np.ndarray, mask: np.ndarray, producer: dict, numerics: Any,
           store_inputs: bool) -> tuple[dict[str, Any], bytes]:
    """The manifest entry and file bytes of one golden."""
    data = GoldenStore.encode(out, mask, inputs_of(p) if store_inputs else None)
    fsha = hashlib.sha256(data).hexdigest()
    return {
        "spec": case.to_json(),
        "file": f"{case.name}-{fsha[:10]}.npz",
        "file_sha256": fsha,
        "inputs_sha256": inputs_sha256(p),
        "output_sha256": array_sha256(out),
        "mask_sha256": array_sha256(mask),
        "out_shape": list(out.shape),
        "dtypes": {**routed.record_of(p, case)[1], "out": str(out.dtype)},
        "producer": producer,
        "numerics": numerics_json(numerics),
        "inputs_stored": bool(store_inputs),
    }, data


def _changed(store: GoldenStore, case: Case, prev: dict, entry: dict, out: np.ndarray, mask: np.ndarray,
             p: gmm_ref.Problem, numerics: Any) -> Change:
    """How a new golden differs from the stored one, and whether the old one is within the bound of the case now."""
    name, note, within, ratio, bound = case.name, "", None, None, None
    try:
        old_golden = store.load(name, prev)
        common = mask & old_golden.mask if old_golden.mask.shape == mask.shape else mask
        dmax, ulps, ndiff = drift(old_golden.out, out, common)
        same_problem = prev["spec"] == entry["spec"] and prev["inputs_sha256"] == entry["inputs_sha256"]
        if same_problem and old_golden.out.shape == out.shape and old_golden.out.dtype == out.dtype:
            within, ratio, bound = _old_within_bound(case, p, old_golden.out, numerics)
    except GoldenError as exc:
        dmax, ulps, ndiff = float("nan"), float("nan"), -1
        note = f"old file unusable: {exc}"
    what = []
    if prev["spec"] != entry["spec"]:
        what.append("spec")
    if prev["inputs_sha256"] != entry["inputs_sha256"]:
        what.append("inputs")
    if prev["producer"] != entry["producer"]:
        what.append(f"producer {prev['producer']['name']} -> {entry['producer']['name']}")
    return Change(name, "changed", dmax, ulps, ndiff, within, note or ", ".join(what or ["output"]), ratio, bound)


@dataclass
class _Plan:
    """What a regeneration would do."""

    changes: list[Change] = field(default_factory=list)
    pending: dict[tuple[str, str], tuple[dict[str, Any], bytes]] = field(default_factory=dict)
    refresh: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: the inputs' sha256 of each case produced (the case as it is now)
    inputs: dict[str, str] = field(default_factory=dict)


def _plan_case(plan: _Plan, store: GoldenStore, old: dict, case: Case, k: KernelAdapter | None,
               update: bool, store_inputs: bool) -> None:
    n = case.name
    try:
        p, out, mask, producer, numerics, fail = _produce(case, k)
    except Exception as exc:
        if k is None:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        p, fail = None, f"raised {type(exc).__name__}: {first}"
    if fail:
        plan.failures.append(f"{n}: {k.name}: {fail}")
        return
    entry, data = _entry(case, p, out, mask, producer, numerics, store_inputs)
    plan.inputs[n] = entry["inputs_sha256"]
    key = producer_key(producer)
    prev = old.get(n, {}).get(key)
    if prev is None:
        plan.changes.append(Change(n, "new", within_bound=True))
        plan.pending[n, key] = (entry, data)
        return
    if prev == entry:
        return
    same_bits = all(prev[f] == entry[f] for f in ("output_sha256", "mask_sha256", "spec", "inputs_sha256"))
    if same_bits and prev.get("inputs_stored") == entry["inputs_stored"]:
        if update:  # only metadata (numerics, shape records) moved on
            plan.refresh[n, key] = entry
        return
    plan.changes.append(_changed(store, case, prev, entry, out, mask, p, numerics))
    plan.pending[n, key] = (entry, data)


def _write(store: GoldenStore, old: dict, plan: _Plan, stale: list[str], drop: dict[str, list[str]]) -> None:
    """Golden files first, the manifest last (atomically), then files no golden names any more."""
    cases = {n: dict(goldens) for n, goldens in old.items() if n not in stale}
    for (n, key), entry in plan.refresh.items():
        cases.setdefault(n, {})[key] = entry
    for (n, key), (entry, data) in plan.pending.items():
        path = store.dir / entry["file"]
        if not (path.exists() and file_sha256(path) == entry["file_sha256"]):
            atomic_write(path, data)
        cases.setdefault(n, {})[key] = entry
    for n, keys in drop.items():
        for key in keys:
            cases.get(n, {}).pop(key, None)
    store.write_manifest(cases)
    keep = {e["file"] for goldens in cases.values() for e in goldens.values()}
    for path in store.dir.glob("*.npz"):
        if path.name not in keep:
            with contextlib.suppress(OSError):
                path.unlink()


def _corpus_by_name(corpus: Sequence[Case] | None, old: dict) -> dict[str, Case]:
    if corpus is None:  # the cases the manifest holds
        corpus = corpus_of({"cases": old})
    by_name: dict[str, Case] = {}
    for c in corpus:
        if c.name in by_name:
            raise GoldenError(f"corpus: duplicate case name {c.name!r}")
        by_name[c.name] = c
    return by_name


#: per case with stale goldens: (its goldens once this run is applied, the case's spec now, the stale keys)
_Stale = dict[str, tuple[dict[str, dict[str, Any]], dict[str, Any], list[str]]]


def _stale_after(old: dict, plan: _Plan, by_name: dict[str, Case], names: list[str]) -> _Stale:
    """The goldens of ``names`` made from another version of their case, once the plan is applied."""
    out = {}
    for n in names:
        goldens = dict(old.get(n, {}))
        goldens.update({key: e for (m, key), e in plan.refresh.items() if m == n})
        goldens.update({key: e for (m, key), (e, _) in plan.pending.items() if m == n})
        spec = by_name[n].to_json()
        keys = stale_keys(goldens, spec, plan.inputs.get(n))
        if keys:
            out[n] = (goldens, spec, keys)
    return out


def _stale_lines(stale: _Stale, head: str, command: str, where: str) -> str:
    count = sum(len(keys) for _, _, keys in stale.values())
    lines = [f"{head}: {count} golden(s) of {len(stale)} case(s) made from another version of their case (stale) "
             "still need regenerating; together these commands fix every one:"]
    for n, (goldens, spec, keys) in stale.items():
        lines += [f"  {n} [{key}] ({spec_diff(goldens[key].get('spec'), spec)}): "
                  f"{fix_command(n, key, goldens[key], command=command, where=where)}" for key in keys]
    return "\n".join(lines)


def _report(plan: _Plan, stale: list[str], update: bool, hint: str) -> tuple[int | None, list[str]]:
    """(exit status if the run stops here, report lines)."""
    report: list[str] = []
    if plan.skipped:
        report.append("skipped:\n" + "\n".join("  " + s for s in plan.skipped))
    if plan.failures:
        report.append("kernel failures (nothing written):\n" + "\n".join("  " + f for f in plan.failures))
        return 1, report
    changed = [c for c in plan.changes if c.status != "new"]
    added = [c.case for c in plan.changes if c.status == "new"]
    if added:
        report.append(f"new: {len(added)} case(s): " + ", ".join(added[:12]) + (" ..." if len(added) > 12 else ""))
    if changed:
        report.append(drift_table(changed))
    if changed and not update:
        report.append(f"{len(changed)} existing golden(s) would change; nothing was written.\n"
                      f"If the change is intended, run: {hint}")
        return 1, report
    return None, report


def _nothing(by_name: dict[str, Case], names: list[str], patterns: list[str] | None, k: KernelAdapter | None,
             where: str) -> str | None:
    """Why this regeneration would regenerate nothing (a usage error), or None."""
    held = f"the corpus holds {by_convention(c.convention for c in by_name.values())}"
    if not by_name:
        return "the corpus is empty"
    if patterns and not names:
        conv = f" of {k.name}'s convention {k.convention}" if k else ""
        return f"--cases {','.join(patterns)} matches no case{conv} ({held})"
    if k is not None and not names:
        return f"no case of {k.name}'s convention {k.convention} ({held})"
    return None


def regenerate(corpus: Sequence[Case] | None, directory: str | os.PathLike[str], *,
               kernel: Any = None, convention: str | None = None, cases: str | Sequence[str] | None = None,
               update: bool = False, store_inputs: bool = False, command: str = "python -m golden",
               where: str = "", stream: Any = None, wait: float = 600.0, drop_stale: bool = False) -> tuple[int, str]:
    """Recompute goldens; write them atomically. Returns (exit status, report text).

    Adds goldens for new cases; refuses (status 1, naming the command to run)
    to change an existing golden unless ``update``. With ``kernel`` only the
    cases of its convention are produced, by that kernel, and stored beside the
    reference's (and other kernels') goldens of each case. ``corpus=None``
    regenerates the cases the directory's manifest already holds. ``where``
    (e.g. ``" --dir PATH"``) is appended to the commands the report suggests.
    The run holds the directory's lock (waiting up to ``wait`` seconds for
    another holder) and first removes what killed runs left behind.

    Status 2 when it would regenerate nothing (no case selected, every case
    unsupported, the kernel unavailable); status 1 while a golden of a selected
    case is stale (made from another version of the case, as a kernel's golden
    is once its case's reference is regenerated), naming the command that remakes
    each; ``drop_stale`` removes stale kernel goldens instead.
    """
    store = GoldenStore(directory)
    k = None
    if kernel is not None:
        k = resolve_kernel(kernel, convention=convention)
        reason = k.available()
        if reason:
            return 2, f"{command} regenerate: error: nothing regenerated: kernel {k.name} is unavailable: {reason}"
    if corpus is None and not store.manifest_path.exists():
        return 2, (f"{command} regenerate: error: nothing regenerated: no corpus: {store.manifest_path} is missing, "
                   "so there are no cases to take; give --corpus")
    with locked(store.dir, wait=wait, stream=stream):
        store.clean_temporaries()
        upgrade = store.manifest_path.exists() and json.loads(store.manifest_path.read_text()).get("format") == 1
        old = store.manifest()["cases"]
        by_name = _corpus_by_name(corpus, old)
        patterns = split_patterns(cases)
        names = select(sorted(by_name), patterns)
        if k is not None:
            names = [n for n in names if by_name[n].convention == k.convention]
        why = _nothing(by_name, names, patterns, k, where)
        if why:
            return 2, f"{command} regenerate: error: nothing regenerated: {why}"
        plan = _plan(store, old, by_name, names, k, update, store_inputs, stream)
        if k is not None and len(plan.skipped) == len(names):
            return 2, (f"{command} regenerate: error: nothing regenerated: every case of convention "
                       f"{k.convention} is unsupported by {k.name}:\n" + "\n".join("  " + s for s in plan.skipped))
        removed = [] if patterns or k is not None else sorted(set(old) - set(by_name))
        plan.changes += [Change(n, "stale", note="not in the corpus") for n in removed]
        return _apply(store, old, plan, _stale_after(old, plan, by_name, names), removed, upgrade=upgrade,
                      update=update, drop_stale=drop_stale, count=len(names),
                      hint=_hint(plan, removed, patterns, kernel, k, convention, command, where),
                      command=command, where=where)


def _apply(store: GoldenStore, old: dict, plan: _Plan, stale: _Stale, removed: list[str], *, upgrade: bool,
           update: bool, drop_stale: bool, count: int, hint: str, command: str, where: str) -> tuple[int, str]:
    """Report the plan and write it (holding the directory's lock); the exit status and the report."""
    rc, report = _report(plan, removed, update, hint)
    if rc is not None:
        if stale and not plan.failures:
            report.append(_stale_lines(stale, "Once it is applied", command, where))
        return rc, "\n".join(report)
    drop = {n: [key for key in keys if key != REFERENCE] for n, (_, _, keys) in stale.items()} if drop_stale else {}
    drop = {n: keys for n, keys in drop.items() if keys}
    left = {n: (g, spec, [key for key in keys if key not in drop.get(n, ())]) for n, (g, spec, keys) in stale.items()}
    left = {n: v for n, v in left.items() if v[2]}
    if not plan.pending and not plan.refresh and not removed and not upgrade and not drop:
        if left:
            report.append(f"nothing to write in {store.dir}, but not up to date")
            report.append(_stale_lines(left, "Not up to date", command, where))
            return 1, "\n".join(report)
        report.append(f"{count} golden(s) up to date in {store.dir}")
        return 0, "\n".join(report)
    _write(store, old, plan, removed, drop)
    dropped = sum(len(keys) for keys in drop.values())
    report.append(f"wrote {len(plan.pending)} golden(s)" + (f", refreshed {len(plan.refresh)}" if plan.refresh else "")
                  + (f", removed {len(removed)} stale" if removed else "")
                  + (f", dropped {dropped} stale kernel golden(s) ("
                     + ", ".join(f"{n} [{key}]" for n, keys in drop.items() for key in keys) + ")" if drop else "")
                  + (" (manifest rewritten in format 2)" if upgrade else "") + f" in {store.dir}")
    if left:
        report.append(_stale_lines(left, "Not up to date", command, where))
        return 1, "\n".join(report)
    return 0, "\n".join(report)


def _plan(store: GoldenStore, old: dict, by_name: dict[str, Case], names: list[str], k: KernelAdapter | None,
          update: bool, store_inputs: bool, stream: Any) -> _Plan:
    plan = _Plan()
    bar = Progress(len(names), "regenerate", stream)
    for n in names:
        why = k.supports(build_problem(by_name[n])) if k is not None else None
        if why:
            plan.skipped.append(f"{n}: unsupported by {k.name}: {why}")
            bar.step(n + " (unsupported)")
            continue
        _plan_case(plan, store, old, by_name[n], k, update, store_inputs)
        bar.step(n)
    return plan


def _hint(plan: _Plan, stale: list[str], patterns: list[str] | None, kernel: Any, k: KernelAdapter | None,
          convention: str | None, command: str, where: str) -> str:
    """The command that applies a refused change (a kernel's: the same kernel, convention and version)."""
    changed = [c.case for c in plan.changes if c.status != "new"]
    named = len(changed) <= 8 and not stale and not patterns
    sel = (" --cases " + ",".join(changed) if named else f" --cases {','.join(patterns)}" if patterns else "")
    kern = conv = version = ""
    if k is not None:
        kern = f" --kernel {shlex.quote(kernel if isinstance(kernel, str) else locate(k) or str(k.name))}"
        conv = f" --convention {convention}" if convention else ""
        version = f" --kernel-version {shlex.quote(k.version)}" if k.version else ""
    return f"{command} regenerate{kern}{conv}{version}{sel} --update{where}"
