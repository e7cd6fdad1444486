"""The main job: check every kernel available here against the reference and the goldens.

``gmm-harness check`` (or ``python -m property_tests.main check``) prints a
kernel x mode table, one row per (kernel, family): ``pass``, ``FAIL: cause``
or ``n/a: reason``, plus a goldens column, and exits 1 if anything fails.
With ``-v`` every failure's full report follows the table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _one_line(text: str, width: int = 110) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    # the most telling line of a Mismatch report: the first 'group' line, else the criterion
    pick = next((ln for ln in lines if ln.startswith(("group ", "tail "))), None)
    if pick is None:
        pick = next((ln for ln in lines if ln.startswith(("Not equal", "shape/dtype", "kernel "))), lines[0] if lines else "")
    return pick if len(pick) <= width else pick[: width - 3] + "..."


def run_checks(kernels: list[Any], *, max_examples: int, goldens: bool) -> tuple[list[dict[str, Any]], list[str]]:
    from hypothesis import settings

    import gmm_ref
    from property_tests.checking import FAMILIES_BY_CONVENTION, MODES, Unsupported, check_mode
    from property_tests.plugin import register_profiles

    register_profiles()
    settings.load_profile("ci")
    rows: list[dict[str, Any]] = []
    details: list[str] = []
    for k in kernels:
        why = k.available()
        families = FAMILIES_BY_CONVENTION.get(k.convention, ("?",))
        for fam in families:
            row: dict[str, Any] = {"kernel": k.name, "family": fam}
            for m in MODES:
                if why:
                    row[m] = f"n/a: {why}"
                    continue
                t0 = time.perf_counter()
                try:
                    n = check_mode(k, m, family=fam, max_examples=max_examples)
                    row[m] = f"pass ({n})"
                except Unsupported as exc:
                    row[m] = f"n/a: {exc}"
                except gmm_ref.Mismatch as exc:
                    known = (getattr(k, "known_issues", None) or {}).get(m)
                    if known:  # still caught, shown, but not this run's failure
                        row[m] = f"known bug: {known} (caught: {_one_line(str(exc))})"
                        continue
                    row[m] = "FAIL: " + _one_line(str(exc))
                    details.append(f"== {k.name} / {fam} / {m}\n{exc}\n" + "\n".join(getattr(exc, "__notes__", [])))
                except Exception as exc:  # a kernel crashing is a failure too
                    row[m] = f"FAIL: {type(exc).__name__}: {_one_line(str(exc))}"
                    details.append(f"== {k.name} / {fam} / {m}\n{type(exc).__name__}: {exc}")
                print(f"  {k.name:<34} {fam:<9} {m:<17} {row[m][:70]}  [{time.perf_counter() - t0:.1f}s]",
                      file=sys.stderr, flush=True)
            rows.append(row)
        if goldens:
            status = _golden_status(k, why)
            for r in rows:
                if r["kernel"] == k.name:
                    r["goldens"] = status
            if status.startswith("FAIL"):
                details.append(f"== {k.name} / goldens\n{status}")
    return rows, details


def _golden_status(kernel: Any, why: str | None) -> str:
    if why:
        return f"n/a: {why}"
    from property_tests import goldens

    results = goldens.check_kernels([kernel])
    if not results:
        return "n/a: no golden case in this convention"
    fails = [r for r in results if r.status == "fail"]
    passes = [r for r in results if r.status == "pass"]
    if fails:
        return f"FAIL: {len(fails)}/{len(results)} cases; {_one_line(fails[0].detail)}"
    if not passes:
        return f"n/a: every golden case unsupported ({results[0].detail})"
    return f"pass ({len(passes)}/{len(results)})"


def render(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """The table; a FAIL or n/a cell shows a footnote number, the footnotes follow."""
    notes: dict[str, int] = {}

    def cell(v: Any) -> str:
        v = str(v)
        for prefix in ("FAIL", "n/a", "known bug"):
            if v.startswith(prefix):
                n = notes.setdefault(v, len(notes) + 1)
                return f"{prefix} [{n}]"
        return v

    table = [["kernel", "family", *columns]]
    table += [[r["kernel"], r["family"], *[cell(r.get(c, "")) for c in columns]] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    out = [" | ".join(v.ljust(w) for v, w in zip(line, widths)) for line in table]
    out.insert(1, "-+-".join("-" * w for w in widths))
    out.append("")
    out += [f"[{n}] {text}" for text, n in notes.items()]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gmm-harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="check kernels against the reference and the goldens")
    c.add_argument("--kernel", action="append", default=[], help="built-in adapter name or pkg.module:fn (repeatable)")
    c.add_argument("--convention", default=None, help="convention of the pkg.module:fn kernels")
    c.add_argument("--tiling", default=None, help="TM,TK,TN")
    c.add_argument("--max-examples", type=int, default=8, help="examples per (kernel, family, mode)")
    c.add_argument("--no-goldens", action="store_true", help="skip the goldens column")
    c.add_argument("-v", "--verbose", action="store_true", help="print every failure's full report")
    args = parser.parse_args(argv)

    from property_tests.checking import MODES
    from property_tests.selection import resolve_kernels

    tiling = tuple(int(v) for v in args.tiling.split(",")) if args.tiling else None
    kernels = resolve_kernels(args.kernel, convention=args.convention, tiling=tiling)
    t0 = time.perf_counter()
    rows, details = run_checks(kernels, max_examples=args.max_examples, goldens=not args.no_goldens)
    columns = list(MODES) + ([] if args.no_goldens else ["goldens"])
    print(render(rows, columns))
    n_fail = sum(str(v).startswith("FAIL") for r in rows for v in r.values())
    n_pass = sum(str(v).startswith("pass") for r in rows for v in r.values())
    print(f"\n{n_pass} passed, {n_fail} failed  ({time.perf_counter() - t0:.0f} s; 'n/a' cells give their reason)")
    if details and args.verbose:
        print("\n" + "\n\n".join(details))
    elif details:
        print("run with -v for the full mismatch reports and reproducers")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
