"""Verify a golden directory: file hashes, manifest against the corpus, inputs recomputed from the
specs, and the reference reproducing its own goldens bit for bit (kernel goldens: within the bound)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

import gmm_ref
from golden.case import Case, GoldenError, build_problem, inputs_of, select
from golden.judge import describe_bad, drift
from golden.producers import numerics_from_json
from golden.regeneration import Progress
from golden.store import MANIFEST, GoldenStore, array_sha256, canonical_output, inputs_sha256

__all__ = ["verify"]


def _corpus_errors(entries: dict, names: list[str], corpus: Sequence[Case], cases: Any, hint: str
                   ) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the manifest against the corpus."""
    errors, warnings = [], []
    specs = {c.name: c for c in corpus}
    wanted = select(sorted(specs), cases)
    missing = [n for n in wanted if n not in entries]
    if missing:
        errors.append(f"{len(missing)} case(s) of the corpus have no golden: {', '.join(missing[:8])}; "
                      f"run: {hint.format(sel='', update='')}")
    for n in wanted:
        if n in entries and entries[n]["spec"] != specs[n].to_json():
            errors.append(f"{n}: the corpus spec differs from the manifest's; "
                          f"run: {hint.format(sel=f' --cases {n}', update=' --update')}")
    extra = [n for n in names if n not in specs]
    if extra:
        warnings.append(f"{len(extra)} golden(s) not in the corpus (stale): {', '.join(extra[:8])}")
    return errors, warnings


def _verify_case(store: GoldenStore, n: str, entry: dict, hint: str) -> str | None:
    """The problem with one stored golden, or None."""
    try:
        g = store.load(n, entry)
        if g.case.name != n:
            raise GoldenError(f"manifest entry {n!r} holds the spec of {g.case.name!r}")
        p = build_problem(g.case)
    except (GoldenError, ValueError, TypeError, KeyError) as exc:
        return f"{n}: {exc}"
    if inputs_sha256(p) != entry["inputs_sha256"]:
        return f"{n}: inputs recomputed from the spec differ from the recorded hash (the generator or gmm_ref's " \
               "front-end changed)"
    for key, arr in g.inputs.items():
        want = inputs_of(p).get(key)
        if want is None or array_sha256(arr) != array_sha256(want):
            return f"{n}: stored input {key!r} differs from the one recomputed from the spec"
    if g.out.shape != p.out_shape or str(g.out.dtype) != str(p.out_dtype) or entry["dtypes"]["out"] != str(p.out_dtype):
        return f"{n}: golden output {g.out.shape} {g.out.dtype} but the problem gives {p.out_shape} {p.out_dtype}"
    ref = gmm_ref.reference(p)
    update = hint.format(sel=f" --cases {n}", update=" --update")
    if not np.array_equal(ref.mask, g.mask):
        differ = int((ref.mask != g.mask).sum())
        return f"{n}: the defined-mask differs from gmm_ref's ({differ} elements); run: {update}"
    if entry["producer"]["name"] == "reference":
        dmax, ulps, ndiff = drift(g.out, canonical_output(ref.values, ref.mask), ref.mask)
        if ndiff:
            return (f"{n}: the reference no longer reproduces its golden bit for bit: {ndiff} element(s) differ, "
                    f"max |delta| {dmax:.4g}, max {ulps:g} ulps; if intended, run: {update}")
        return None
    out = gmm_ref.check(g.out, ref, numerics=numerics_from_json(entry.get("numerics")))
    if not out.ok:
        why = (describe_bad(p, out.bad, ref.mask, g.out, ref.values) if out.bad is not None
               else out.message.splitlines()[-1])
        return f"{n}: golden by {entry['producer']['name']} is outside the gmm_ref bound: {why}"
    return None


def verify(directory: str | os.PathLike[str], corpus: Sequence[Case] | None = None, *,
           cases: str | Sequence[str] | None = None, command: str = "python -m golden",
           where: str = "", stream: Any = None) -> tuple[int, str]:
    """Check a golden directory: file hashes, manifest consistency (with ``corpus``
    when given), inputs recomputed from the specs, and the reference reproducing
    its own goldens bit for bit (kernel goldens: within the bound). Returns
    (exit status, report); ``where`` is appended to the commands it suggests."""
    store = GoldenStore(directory)
    hint = f"{command} regenerate{{sel}}{{update}}{where}"
    try:
        man = store.manifest()
    except GoldenError as exc:
        return 1, f"golden verify FAILED\n  {exc}"
    if not store.manifest_path.exists():
        return 1, f"golden verify FAILED\n  {store.manifest_path}: missing; run: {command} regenerate{where}"
    entries = man["cases"]
    names = select(sorted(entries), cases)
    errors, warnings = _corpus_errors(entries, names, corpus, cases, hint) if corpus is not None else ([], [])
    referenced = {e.get("file") for e in entries.values()}
    for path in sorted(store.dir.iterdir()) if store.dir.is_dir() else []:
        if path.name != MANIFEST and path.name not in referenced:
            warnings.append(f"{path.name}: not referenced by the manifest (left over from an interrupted run?)")
    bar = Progress(len(names), "verify", stream or sys.stderr)
    for n in names:
        bar.step(n)
        error = _verify_case(store, n, entries[n], hint)
        if error:
            errors.append(error)
    if errors:
        lines = [f"golden verify FAILED: {len(errors)} problem(s) in {store.dir}", *("  " + e for e in errors)]
    else:
        lines = [f"golden verify ok: {len(names)} case(s) in {store.dir}"]
    lines += ["  warning: " + w for w in warnings]
    return (1 if errors else 0), "\n".join(lines)
