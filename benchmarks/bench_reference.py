"""Reference speed and memory against one dense float64 matmul of the same FLOPs.

ragged M, M=16384, K=N=512, float32 inputs, G in {1, 8, 64, 1024} equal groups.
Prints, per G: best-of-N time of ``reference(problem)`` (exact values + mask),
of that plus ``.values`` (the rounding to float32), the dense float64
``A @ B`` time, their ratios (dense/reference: >= 0.9 wanted at G=64; the
time ratio reference/dense <= 2 wanted at G=1024), and the tracemalloc peak
of ``reference`` + ``.values`` against inputs + output (<= 2 wanted).

    python benchmarks/bench_reference.py [--repeat 5] [--groups 1,8,64,1024]
"""

from __future__ import annotations

import argparse
import functools
import gc
import time
import tracemalloc

import numpy as np

from gmm_ref import Problem, reference

M, K, N = 16384, 512, 512


def _values(p):
    return reference(p).values


def best(f, repeat):
    ts = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--groups", default="1,8,64,1024")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    lhs = rng.standard_normal((M, K), dtype=np.float32)
    a64, b64 = lhs.astype(np.float64), rng.standard_normal((K, N))
    print(f"ragged_m M={M} K={K} N={N} float32 in/out; best of {args.repeat}")
    print(f"{'G':>5} {'dense s':>8} {'ref s':>8} {'ref+round s':>11} {'dense/ref':>9} "
          f"{'ref/dense':>9} {'peak MiB':>8} {'in+out MiB':>10} {'peak ratio':>10}")
    for g in (int(x) for x in args.groups.split(",")):
        rhs = rng.standard_normal((g, K, N), dtype=np.float32)
        p = Problem("ragged_m", lhs, rhs, np.full(g, M // g))
        dense = best(lambda: a64 @ b64, args.repeat)
        ref = best(functools.partial(reference, p), args.repeat)
        ref_r = best(functools.partial(_values, p), args.repeat)
        gc.collect()
        tracemalloc.start()
        r = reference(p)
        _ = r.values
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del r, _
        io = lhs.nbytes + rhs.nbytes + M * N * 4
        mib = 2.0**20
        print(f"{g:>5} {dense:>8.4f} {ref:>8.4f} {ref_r:>11.4f} {dense / ref:>9.2f} {ref / dense:>9.2f} "
              f"{peak / mib:>8.1f} {io / mib:>10.1f} {peak / io:>10.2f}")
        del rhs, p


if __name__ == "__main__":
    main()
