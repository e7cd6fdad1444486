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


def _one_line(text: str, width: int = 60) -> str:
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
    try:
        from property_tests import goldens
    except ImportError as exc:
        return f"n/a: goldens tooling missing ({exc})"
    check = getattr(goldens, "check_kernel_against_goldens", None)
    if check is None:
        return "n/a: goldens tooling has no check_kernel_against_goldens"
    results = check(kernel)
    if not results:
        return "n/a: no golden case in this convention"
    fails = [r for r in results if r.get("status") == "fail"]
    passes = [r for r in results if r.get("status") == "pass"]
    if fails:
        return f"FAIL: {len(fails)}/{len(results)} cases, first {fails[0].get('case')}: {_one_line(fails[0].get('cause', ''))}"
    if not passes:
        return "n/a: every golden case unsupported"
    return f"pass ({len(passes)}/{len(results)})"


def render(rows: list[dict[str, Any]], columns: list[str], width: int = 28) -> str:
    head = ["kernel", "family", *columns]
    widths = [max(len(h), *(len(str(r.get(h, ""))[:width]) for r in rows)) if rows else len(h) for h in head]
    widths[0] = max(widths[0], max((len(r["kernel"]) for r in rows), default=6))
    def fmt(vals: list[str]) -> str:
        return " | ".join(str(v)[: max(w, 1)].ljust(w) for v, w in zip(vals, widths))
    out = [fmt(head), "-+-".join("-" * w for w in widths)]
    for r in rows:
        out.append(fmt([r["kernel"], r["family"], *[str(r.get(c, "")) for c in columns]]))
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
