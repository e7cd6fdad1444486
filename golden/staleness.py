"""Stale goldens: goldens made from another version of their case, and the commands that remake every one.

A case's goldens sit side by side (the reference's and each kernel version's),
each recording the spec and the inputs' hash it was made from. When a case
changes, regenerating its reference does not (cannot) rerun the kernels, so
their goldens are left describing the old case. Nothing is marked: a golden
whose spec or inputs differ from the case *as it is now* (the corpus' spec when
a corpus is given, else the reference golden's spec and inputs) is stale, and
``check``, ``verify`` and ``regenerate`` all derive it the same way, so a stale
golden can never pass, be reported ok or be called up to date.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable
from typing import Any

from golden.store import PROG, REFERENCE

__all__ = ["by_convention", "case_now", "contents", "fix_command", "fix_commands", "regenerate_command", "spec_diff",
           "stale_keys"]


def case_now(goldens: dict[str, dict[str, Any]], spec: dict[str, Any] | None = None,
             inputs: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(spec, inputs sha256) of a case as it is now: ``spec`` / ``inputs`` when given (the corpus'), else
    the reference golden's; the inputs are the reference golden's only when it was made from that spec."""
    ref = goldens.get(REFERENCE)
    if spec is None:
        spec = ref["spec"] if ref else None
    if inputs is None and ref is not None and ref.get("spec") == spec:
        inputs = ref.get("inputs_sha256")
    return spec, inputs


def stale_keys(goldens: dict[str, dict[str, Any]], spec: dict[str, Any] | None = None,
               inputs: str | None = None) -> list[str]:
    """The producer keys of a case's goldens made from another version of the case (reference first)."""
    want_spec, want_inputs = case_now(goldens, spec, inputs)
    if want_spec is None:  # kernel goldens only and no corpus: nothing to hold them to
        return []
    stale = [key for key, e in goldens.items()
             if e.get("spec") != want_spec or (want_inputs is not None and e.get("inputs_sha256") != want_inputs)]
    return sorted(stale, key=lambda k: (k != REFERENCE, k))


def spec_diff(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    """What changed between two specs of a case, e.g. ``seed 1 -> 7`` (or ``inputs`` when only they did)."""
    if not old or not new:
        return "spec missing"
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if not keys:
        return "same spec, other inputs (the generator or gmm_ref's front-end changed)"
    text = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys[:4])
    return text + (f", ... ({len(keys)} fields)" if len(keys) > 4 else "")


def regenerate_command(case: str, entry: dict[str, Any], *, command: str = PROG, where: str = "") -> str:
    """The command that remakes one golden of ``case`` (a manifest entry) from the case as it is now."""
    producer = entry.get("producer") or {}
    if producer.get("name") == REFERENCE:
        return f"{command} regenerate --cases {case} --update{where}"
    kernel = str(producer.get("name"))
    conv = f" --convention {entry['spec']['convention']}" if ":" in kernel and entry.get("spec") else ""
    return (f"{command} regenerate --kernel {shlex.quote(kernel)}{conv} --kernel-version "
            f"{shlex.quote(str(producer.get('version')))} --cases {case} --update{where}")


def fix_command(case: str, key: str, entry: dict[str, Any], *, command: str = PROG, where: str = "") -> str:
    """What remakes one stale golden of ``case``: ``run: ...`` (a kernel's: on its platform, or drop it)."""
    run = regenerate_command(case, entry, command=command, where=where)
    if key == REFERENCE:
        return f"run: {run}"
    platform = (entry.get("producer") or {}).get("platform", "?")
    return f"run on {platform}: {run}; or drop it: {command} regenerate --cases {case} --drop-stale{where}"


def fix_commands(case: str, goldens: dict[str, dict[str, Any]], keys: list[str], *, command: str = PROG,
                 where: str = "") -> list[str]:
    """``key: what remakes it`` per stale golden (``keys``, the reference's first): together they fix every
    golden of the case."""
    return [f"{key}: {fix_command(case, key, goldens[key], command=command, where=where)}" for key in keys]


def by_convention(conventions: Iterable[str]) -> str:
    """``3 case(s): 2 ragged_dot, 1 megablox.gmm`` (one convention per case), or ``no case``."""
    count = Counter(conventions)
    if not count:
        return "no case"
    return f"{sum(count.values())} case(s): " + ", ".join(f"{n} {c}" for c, n in sorted(count.items()))


def contents(cases: dict[str, dict[str, dict[str, Any]]]) -> str:
    """What a manifest's cases hold, by convention (:func:`by_convention`)."""
    return by_convention(next(iter(g.values()), {}).get("spec", {}).get("convention", "?") for g in cases.values())
