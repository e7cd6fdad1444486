"""Checked examples per second per kernel in the ``gmm-ci`` profile (a script, not a test).

Each available kernel runs its ``normal`` and ``exact`` modes twice: the first
run pays for compiling each shape bucket, the second finds them compiled
(jit caches persist within the process). Prints examples/s for both.

    python benchmarks/bench_kernels.py [--examples 25] [--kernel NAME ...]
"""

from __future__ import annotations

import argparse
import time

from gmm_kernels.runtimes.process import prepare_process

prepare_process()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=25)
    parser.add_argument("--kernel", action="append", default=[])
    args = parser.parse_args()

    from hypothesis import settings

    from gmm_kernels import Status, resolve_kernels
    from property_tests.checks.check import check_mode
    from property_tests.checks.profiles import register_profiles

    register_profiles()
    settings.load_profile("gmm-ci")
    print(f"{'kernel':<34} {'mode':<7} {'cold ex/s':>10} {'warm ex/s':>10} {'examples':>9}")
    for k in resolve_kernels(args.kernel):
        why = k.available()
        if why:
            print(f"{k.name:<34} skipped: {why[:80]}")
            continue
        for mode in ("normal", "exact"):
            rates = []
            n = 0
            for _ in range(2):
                t0 = time.perf_counter()
                result = check_mode(k, mode, max_examples=args.examples)
                if result.status is not Status.PASSED:
                    print(f"{k.name:<34} {mode:<7} {result.cell()[:80]}")
                    break
                n = result.examples
                rates.append(n / (time.perf_counter() - t0))
            if len(rates) == 2:
                print(f"{k.name:<34} {mode:<7} {rates[0]:>10.1f} {rates[1]:>10.1f} {n:>9}", flush=True)


if __name__ == "__main__":
    main()
