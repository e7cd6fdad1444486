"""The main job: check every kernel available here against the reference and the goldens.

``gmm-harness check`` (or ``python -m property_tests.main check``) prints a
kernel x mode table, one row per (kernel, family): ``pass (n examples)``,
``FAIL [note]``, ``n/a [note]`` or ``known bug [note]``, the notes below the
table, plus a goldens column; it exits 1 if anything fails. With ``-v`` every
failure's full report and reproducer follows the table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from gmm_kernels import KernelAdapter, Result, Status, resolve_kernels
from golden import check_goldens
from golden.cli import default_directory
from property_tests.checking import check_mode
from property_tests.modes import MODES
from property_tests.profiles import register_profiles

__all__ = ["main", "render", "run_checks"]

_WIDTH = 110


def _short(text: str) -> str:
    return text if len(text) <= _WIDTH else text[: _WIDTH - 3] + "..."


def _golden_cell(kernel: KernelAdapter, why: str | None) -> tuple[str, list[Result]]:
    if why:
        return f"n/a: {why}", []
    results = check_goldens(kernel, default_directory())
    if not results:
        return "n/a: no golden case in this convention", []
    fails = [r for r in results if r.status is Status.FAILED]
    passes = [r for r in results if r.status is Status.PASSED]
    if fails:
        return f"FAIL: {len(fails)}/{len(results)} cases; {_short(fails[0].detail)}", fails
    if not passes:
        return f"n/a: every golden case unsupported ({results[0].detail})", []
    return f"pass ({len(passes)}/{len(results)})", []


def _cell(result: Result) -> str:
    if result.status is Status.FAILED:
        return f"FAIL: {_short(result.detail)}"
    return result.cell()


def _kernel_rows(k: KernelAdapter, max_examples: int, details: list[str]) -> list[dict[str, Any]]:
    why = k.available()
    rows = []
    for fam in k.spec.families:
        row: dict[str, Any] = {"kernel": k.name, "family": fam}
        for m in MODES:
            if why:
                row[m] = f"n/a: {why}"
                continue
            result = check_mode(k, m, family=fam, max_examples=max_examples)
            row[m] = _cell(result)
            if result.status is Status.FAILED:
                details.append(f"== {k.name} / {fam} / {m}\n{result.full_report()}")
            print(f"  {k.name:<34} {fam:<9} {m:<17} {row[m][:70]}  [{result.seconds:.1f}s]",
                  file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def run_checks(kernels: list[KernelAdapter], *, max_examples: int, goldens: bool
               ) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per (kernel, family) with a cell per mode (and goldens); the full failure reports."""
    from hypothesis import settings

    register_profiles()
    settings.load_profile("ci")
    rows: list[dict[str, Any]] = []
    details: list[str] = []
    for k in kernels:
        mine = _kernel_rows(k, max_examples, details)
        if goldens:
            status, fails = _golden_cell(k, k.available())
            for r in mine:
                r["goldens"] = status
            details += [f"== {k.name} / goldens / {r.check}\n{r.full_report()}" for r in fails]
        rows += mine
    return rows, details


def render(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """The table; a FAIL, n/a or known-bug cell shows a footnote number, the footnotes follow."""
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
    out = [" | ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in table]
    out.insert(1, "-+-".join("-" * w for w in widths))
    out.append("")
    out += [f"[{n}] {text}" for text, n in notes.items()]
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gmm-harness", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="check kernels against the reference and the goldens")
    c.add_argument("--kernel", action="append", default=[], help="built-in adapter name or pkg.module:fn (repeatable)")
    c.add_argument("--convention", default=None, help="convention of the pkg.module:fn kernels")
    c.add_argument("--tiling", default=None, help="TM,TK,TN")
    c.add_argument("--max-examples", type=int, default=8, help="examples per (kernel, family, mode)")
    c.add_argument("--no-goldens", action="store_true", help="skip the goldens column")
    c.add_argument("-v", "--verbose", action="store_true", help="print every failure's full report")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # 8 virtual CPU devices for sharded kernels, set before anything imports jax (nothing above does)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        kernels = resolve_kernels(args.kernel, convention=args.convention, tiling=args.tiling)
    except (ValueError, TypeError, ImportError) as exc:
        parser.error(str(exc))
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
