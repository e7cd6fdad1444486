"""Verify a golden directory: file hashes, manifest against the corpus, inputs recomputed from the
specs, and the reference reproducing its own goldens bit for bit (kernel goldens: within the bound)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from golden import routed
from golden.case import Case, GoldenError, build_problem, inputs_of, select, split_patterns
from golden.judge import describe_bad, drift
from golden.lock import LOCK_NAME
from golden.producers import numerics_from_json
from golden.regeneration import Progress
from golden.staleness import case_now, contents, fix_command, spec_diff, stale_keys
from golden.store import (
    MANIFEST,
    REFERENCE,
    GoldenStore,
    array_sha256,
    canonical_output,
    inputs_sha256,
    producer_key,
)

__all__ = ["verify"]


def _corpus_errors(cases_map: dict, names: list[str], corpus: Sequence[Case], cases: Any, hint: str
                   ) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the manifest against the corpus (its specs: :func:`_stale_errors`)."""
    errors, warnings = [], []
    specs = {c.name: c for c in corpus}
    wanted = select(sorted(specs), cases)
    missing = [n for n in wanted if REFERENCE not in cases_map.get(n, {})]
    if missing:
        errors.append(f"{len(missing)} case(s) of the corpus have no reference golden: {', '.join(missing[:8])}; "
                      f"run: {hint.format(sel='', update='')}")
    extra = [n for n in names if n not in specs]
    if extra:
        warnings.append(f"{len(extra)} golden(s) not in the corpus (stale): {', '.join(extra[:8])}")
    return errors, warnings


def _stale_errors(cases_map: dict, names: list[str], corpus: Sequence[Case] | None, command: str, where: str
                  ) -> list[str]:
    """One error per golden made from another version of its case than the corpus' (or, without a corpus, the
    reference golden's), each with the command that remakes it: together, every golden of the case."""
    specs = {c.name: c.to_json() for c in corpus or ()}
    errors = []
    for n in names:
        goldens = cases_map.get(n, {})
        stale = stale_keys(goldens, specs.get(n))
        now, _ = case_now(goldens, specs.get(n))
        basis = "the corpus" if n in specs else "the reference golden"
        kernels = len(stale) - (REFERENCE in stale)
        for key in stale:
            fix = fix_command(n, key, goldens[key], command=command, where=where)
            who = "" if key == REFERENCE else f" [golden by {key}]"
            then = f", then the command of each of its {kernels} stale kernel golden(s) below" \
                if key == REFERENCE and kernels else ""
            errors.append(f"{n}{who}: made from another version of the case than {basis} "
                          f"({spec_diff(goldens[key].get('spec'), now)}); {fix}{then}")
    return errors


_FIELDS = {"spec", "file", "file_sha256", "inputs_sha256", "output_sha256", "mask_sha256", "out_shape", "dtypes",
           "producer", "numerics", "inputs_stored"}


def _record_errors(n: str, key: str, entry: dict, g: Any, p: Any) -> str | None:
    """What in a manifest entry disagrees with its file, its key or the recomputed problem."""
    if set(entry) != _FIELDS:
        return f"manifest fields {sorted(set(entry) ^ _FIELDS)} are unexpected or missing"
    producer = entry["producer"]
    if not isinstance(producer, dict) or set(producer) != {"name", "version", "platform"} \
            or not all(isinstance(v, str) and v for v in producer.values()):
        return f"producer {producer!r} is not a name, version and platform"
    if producer_key(producer) != key:
        return f"producer {producer!r} is stored under the key {key!r}"
    if key == REFERENCE and (producer["platform"] != "any" or not producer["version"].startswith("gmm-harness ")):
        return f"producer {producer!r}: the reference's golden is made by 'gmm-harness <version>' on 'any' platform"
    if (key == REFERENCE) != (entry["numerics"] is None):
        return "numerics: the reference's golden records none, a kernel's its declared numerics"
    try:
        numerics_from_json(entry["numerics"])
    except (KeyError, TypeError, ValueError) as exc:
        return f"numerics {entry['numerics']!r} cannot be read: {exc}"
    if entry["file"] != f"{n}-{entry['file_sha256'][:10]}.npz":
        return f"file name {entry['file']!r} is not the case name and its hash"
    shape, want = routed.record_of(p, g.case)
    if entry["out_shape"] != list(g.out.shape) or list(shape) != entry["out_shape"]:
        return f"out_shape {entry['out_shape']} but the file holds {list(g.out.shape)}, the problem {list(shape)}"
    if entry["dtypes"] != want or str(g.out.dtype) != want["out"]:
        return f"dtypes {entry['dtypes']} but the problem gives {want} (file: {g.out.dtype})"
    if bool(g.inputs) != entry["inputs_stored"]:
        return f"inputs_stored is {entry['inputs_stored']} but the file holds {sorted(g.inputs) or 'no inputs'}"
    return None


def _verify_golden(store: GoldenStore, n: str, key: str, entry: dict, command: str, where: str) -> str | None:
    """The problem with one stored golden, or None."""
    who = "" if key == REFERENCE else f" [golden by {key}]"
    try:
        g = store.load(n, entry)
        if g.case.name != n:
            raise GoldenError(f"manifest entry {n!r} holds the spec of {g.case.name!r}")
        p = build_problem(g.case)
    except (GoldenError, ValueError, TypeError, KeyError) as exc:
        return f"{n}{who}: {exc}"
    if inputs_sha256(p) != entry["inputs_sha256"]:
        return f"{n}{who}: inputs recomputed from the spec differ from the recorded hash (the generator or " \
               "gmm_ref's front-end changed)"
    for name, arr in g.inputs.items():
        want = inputs_of(p).get(name)
        if want is None or array_sha256(arr) != array_sha256(want):
            return f"{n}{who}: stored input {name!r} differs from the one recomputed from the spec"
    record = _record_errors(n, key, entry, g, p)
    if record:
        return f"{n}{who}: {record}"
    return _verify_values(n, who, entry, g, p, fix_command(n, key, entry, command=command, where=where))


def _verify_values(n: str, who: str, entry: dict, g: Any, p: Any, fix: str) -> str | None:
    ref = routed.reference_of(p, g.case)
    if not np.array_equal(ref.mask, g.mask):
        differ = int((ref.mask != g.mask).sum())
        return f"{n}{who}: the defined-mask differs from gmm_ref's ({differ} elements); {fix}"
    if entry["producer"]["name"] == REFERENCE:
        dmax, ulps, ndiff = drift(g.out, canonical_output(ref.values, ref.mask), ref.mask)
        if ndiff:
            return (f"{n}: the reference no longer reproduces its golden bit for bit: {ndiff} element(s) differ, "
                    f"max |delta| {dmax:.4g}, max {ulps:g} ulps; if intended, {fix}")
        return None
    out = routed.check_of(g.out, ref, numerics=numerics_from_json(entry.get("numerics")))
    if not out.ok:
        why = (describe_bad(p, out.bad, ref.mask, g.out, ref.values, routed.output_of(g.case)) if out.bad is not None
               else out.message.splitlines()[-1])
        return f"{n}{who}: the golden is outside the gmm_ref bound: {why}"
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
        return 2, (f"{command} verify: error: nothing verified: {store.manifest_path} is missing (no golden "
                   f"there); to make goldens run: {command} regenerate{where}")
    cases_map = man["cases"]
    names = select(sorted(cases_map), cases)
    errors, warnings = _corpus_errors(cases_map, names, corpus, cases, hint) if corpus is not None else ([], [])
    errors += _stale_errors(cases_map, names, corpus, command, where)
    if not names and not errors:
        why = (f"--cases {','.join(split_patterns(cases) or [])} matches no case in {store.dir} (it holds "
               f"{contents(cases_map)})" if cases_map else f"{store.manifest_path} holds no case")
        return 2, f"{command} verify: error: nothing verified: {why}"
    referenced = {e.get("file") for _, _, e in store.goldens(man)}
    for path in sorted(store.dir.iterdir()) if store.dir.is_dir() else []:
        if path.name not in (MANIFEST, LOCK_NAME) and path.name not in referenced:
            warnings.append(f"{path.name}: not referenced by the manifest (left over from an interrupted run?)")
    chosen = [(n, key, e) for n, key, e in store.goldens(man) if n in set(names)]
    bar = Progress(len(chosen), "verify", stream or sys.stderr)
    for n, key, entry in chosen:
        bar.step(n)
        error = _verify_golden(store, n, key, entry, command, where)
        if error:
            errors.append(error)
    if errors:
        lines = [f"golden verify FAILED: {len(errors)} problem(s) in {store.dir}", *("  " + e for e in errors)]
    else:
        kernels = len(chosen) - sum(key == REFERENCE for _, key, _ in chosen)
        extra = f" (and {kernels} kernel golden(s))" if kernels else ""
        lines = [f"golden verify ok: {len(names)} case(s){extra} in {store.dir}"]
    lines += ["  warning: " + w for w in warnings]
    return (1 if errors else 0), "\n".join(lines)
