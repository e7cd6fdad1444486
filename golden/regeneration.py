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
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter, resolve_kernel
from golden.case import Case, GoldenError, build_problem, inputs_of, select, split_patterns
from golden.judge import describe_bad, drift
from golden.lock import locked
from golden.producers import kernel_producer, numerics_json, reference_producer
from golden.store import (
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
    within_bound: bool | None = None
    note: str = ""


def drift_table(changes: Sequence[Change]) -> str:
    rows = [("case", "change", "elements", "max |delta|", "max ulps", "within bound")]
    for c in changes:
        wb = "-" if c.within_bound is None else ("yes" if c.within_bound else "NO")
        fresh = c.status in ("new", "stale")
        rows.append((c.case, c.status + (f" ({c.note})" if c.note else ""),
                     "-" if fresh else str(c.n_diff), "-" if fresh else f"{c.max_delta:.4g}",
                     "-" if fresh else f"{c.max_ulps:g}", wb))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _produce(case: Case, kernel: KernelAdapter | None
             ) -> tuple[gmm_ref.Problem, np.ndarray, np.ndarray, dict, Any, str]:
    """(problem, canonical output, mask, producer, numerics, failure) for one case."""
    p = build_problem(case)
    ref = gmm_ref.reference(p)
    if kernel is None:
        return p, canonical_output(ref.values, ref.mask), ref.mask, reference_producer(), None, ""
    out = canonical_output(kernel.run(p), ref.mask)
    numerics = kernel.numerics_for(p)
    outcome = gmm_ref.check(out, ref, numerics=numerics, kernel=kernel.name)
    fail = ""
    if not outcome.ok:
        fail = "output outside the gmm_ref bound: " + (
            describe_bad(p, outcome.bad, ref.mask, out, ref.values) if outcome.bad is not None
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
        "dtypes": {"lhs": str(p.lhs.dtype), "rhs": str(p.rhs.dtype), "out": str(out.dtype)},
        "producer": producer,
        "numerics": numerics_json(numerics),
        "inputs_stored": bool(store_inputs),
    }, data


def _changed(store: GoldenStore, name: str, prev: dict, entry: dict, out: np.ndarray, mask: np.ndarray) -> Change:
    """How a new golden differs from the stored one."""
    note = ""
    try:
        old_golden = store.load(name, prev)
        common = mask & old_golden.mask if old_golden.mask.shape == mask.shape else mask
        dmax, ulps, ndiff = drift(old_golden.out, out, common)
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
    return Change(name, "changed", dmax, ulps, ndiff, True, note or ", ".join(what))


@dataclass
class _Plan:
    """What a regeneration would do."""

    changes: list[Change] = field(default_factory=list)
    pending: dict[tuple[str, str], tuple[dict[str, Any], bytes]] = field(default_factory=dict)
    refresh: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


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
    plan.changes.append(_changed(store, n, prev, entry, out, mask))
    plan.pending[n, key] = (entry, data)


def _write(store: GoldenStore, old: dict, plan: _Plan, stale: list[str]) -> None:
    """Golden files first, the manifest last (atomically), then files no golden names any more."""
    cases = {n: dict(goldens) for n, goldens in old.items() if n not in stale}
    for (n, key), entry in plan.refresh.items():
        cases.setdefault(n, {})[key] = entry
    for (n, key), (entry, data) in plan.pending.items():
        path = store.dir / entry["file"]
        if not (path.exists() and file_sha256(path) == entry["file_sha256"]):
            atomic_write(path, data)
        cases.setdefault(n, {})[key] = entry
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


def regenerate(corpus: Sequence[Case] | None, directory: str | os.PathLike[str], *,
               kernel: Any = None, convention: str | None = None, cases: str | Sequence[str] | None = None,
               update: bool = False, store_inputs: bool = False, command: str = "python -m golden",
               where: str = "", stream: Any = None, wait: float = 600.0) -> tuple[int, str]:
    """Recompute goldens; write them atomically. Returns (exit status, report text).

    Adds goldens for new cases; refuses (status 1, naming the command to run)
    to change an existing golden unless ``update``. With ``kernel`` only the
    cases of its convention are produced, by that kernel, and stored beside the
    reference's (and other kernels') goldens of each case. ``corpus=None``
    regenerates the cases the directory's manifest already holds. ``where``
    (e.g. ``" --dir PATH"``) is appended to the commands the report suggests.
    The run holds the directory's lock (waiting up to ``wait`` seconds for
    another holder) and first removes what killed runs left behind.
    """
    store = GoldenStore(directory)
    k = None
    if kernel is not None:
        k = resolve_kernel(kernel, convention=convention)
        reason = k.available()
        if reason:
            return 1, f"kernel {k.name} is unavailable: {reason}"
    with locked(store.dir, wait=wait, stream=stream):
        store.clean_temporaries()
        upgrade = store.manifest_path.exists() and json.loads(store.manifest_path.read_text()).get("format") == 1
        old = store.manifest()["cases"]
        by_name = _corpus_by_name(corpus, old)
        patterns = split_patterns(cases)
        names = select(sorted(by_name), patterns)
        if k is not None:
            names = [n for n in names if by_name[n].convention == k.convention]
        if patterns and not names:
            conv = f" of convention {k.convention}" if k else ""
            return 1, f"--cases {','.join(patterns)}: matches no case{conv}"
        plan = _plan(store, old, by_name, names, k, update, store_inputs, stream)
        stale = [] if patterns or k is not None else sorted(set(old) - set(by_name))
        plan.changes += [Change(n, "stale", note="not in the corpus") for n in stale]
        rc, report = _report(plan, stale, update, _hint(plan, stale, patterns, kernel, k, convention, command, where))
        if rc is not None:
            return rc, "\n".join(report)
        if not plan.pending and not plan.refresh and not stale and not upgrade:
            report.append(f"{len(names)} golden(s) up to date in {store.dir}")
            return 0, "\n".join(report)
        _write(store, old, plan, stale)
    report.append(f"wrote {len(plan.pending)} golden(s)" + (f", refreshed {len(plan.refresh)}" if plan.refresh else "")
                  + (f", removed {len(stale)} stale" if stale else "")
                  + (" (manifest rewritten in format 2)" if upgrade else "") + f" in {store.dir}")
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
    """The command that applies a refused change."""
    changed = [c.case for c in plan.changes if c.status != "new"]
    named = len(changed) <= 8 and not stale and not patterns
    sel = (" --cases " + ",".join(changed) if named else f" --cases {','.join(patterns)}" if patterns else "")
    kern = f" --kernel {kernel if isinstance(kernel, str) else k.name}" if k is not None else ""
    conv = f" --convention {convention}" if convention and k is not None else ""
    return f"{command} regenerate{kern}{conv}{sel} --update{where}"
