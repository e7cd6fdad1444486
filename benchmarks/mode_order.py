"""The order a run checks a kernel's modes in (``property_tests.checks.engine.RUN_ORDER``), measured on the project's
broken-kernel corpus (a script, not a test; about 45 minutes on 2 cores).

    python benchmarks/mode_order.py [--conventions ragged_dot,torch.grouped_mm,...] [--jsonl FILE]

Each broken kernel of ``tests/corpus/broken_kernels.py`` (``BROKEN`` and ``BROKEN_GRADIENTS``) runs in
every mode under the ``gmm-ci`` profile, every mode to the end (``raise_on_failure=False``); a kernel whose
convention cannot run here (its framework missing, no GPU) is left out and named. Printed: how many kernels
each mode caught, and the order: first the mode that catches the most, then, while some caught kernel escapes
every mode chosen so far, the mode that catches most of those, then the rest by how many they caught (ties in
table order). ``--jsonl`` appends each kernel's modes as it finishes, so a long run can be read as it goes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def order(caught: dict[str, set[str]], modes: list[str]) -> list[str]:
    """The run order: greedy cover of the caught kernels, then by catches, ties in ``modes``' order."""
    chosen: list[str] = []
    left = set().union(*caught.values()) if caught else set()
    while left:
        best = max(modes, key=lambda m: (len(caught.get(m, set()) & left), -modes.index(m)))
        if not caught.get(best, set()) & left:
            break
        chosen.append(best)
        left -= caught[best]
    rest = sorted((m for m in modes if m not in chosen), key=lambda m: (-len(caught.get(m, ())), modes.index(m)))
    return chosen + rest


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--conventions", default=None, help="only these conventions (comma-separated)")
    parser.add_argument("--jsonl", default=None, help="append each kernel's modes to this file")
    args = parser.parse_args()
    import gmm_ref
    from gmm_kernels import Status
    from property_tests.checks.check import check_kernel
    from property_tests.checks.modes import MODES
    from tests.corpus.broken_kernels import BROKEN, BROKEN_GRADIENTS

    wanted = None if args.conventions is None else set(args.conventions.split(","))
    corpus = [(c, fn) for group in (BROKEN, BROKEN_GRADIENTS) for c, fns in group.items() for fn in fns
              if wanted is None or c in wanted]
    caught: dict[str, set[str]] = {}
    for convention, fn in corpus:
        t0 = time.perf_counter()
        framework = gmm_ref.conventions.get(convention).framework
        try:
            __import__(framework)
            report = check_kernel(fn, convention=convention, profile="gmm-ci", raise_on_failure=False)
        except (ImportError, ValueError) as exc:
            print(f"left out {fn.__name__} ({convention}): {exc}", file=sys.stderr)
            continue
        failed = [r.check for r in report if r.status is Status.FAILED]
        for mode in failed:
            caught.setdefault(mode, set()).add(f"{convention}:{fn.__name__}")
        line = {"convention": convention, "kernel": fn.__name__, "failed": failed,
                "seconds": round(time.perf_counter() - t0, 1)}
        print(json.dumps(line), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as out:
                out.write(json.dumps(line) + "\n")
    modes = list(MODES)
    print("caught per mode: " + ", ".join(f"{m} {len(caught.get(m, ()))}" for m in modes))
    print("order: " + ", ".join(order(caught, modes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
