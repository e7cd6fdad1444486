"""Reference speed and memory against one dense float64 matmul of the same FLOPs.

ragged M, M=16384, K=N=512, float32 inputs, G in {1, 8, 64, 1024} equal groups.
Prints, per G: best-of-N time of ``reference(problem)`` (exact values + mask),
of that plus ``.values`` (the rounding to float32), the dense float64
``A @ B`` time, their ratios (dense/reference: >= 0.9 wanted at G=64; the
time ratio reference/dense <= 2 wanted at G=1024), and the tracemalloc peak
of ``reference`` + ``.values`` against inputs + output (<= 2 wanted).

``--scale``: the same figures for the cells of the ``scale`` mode (property_tests/checks/scale.py: G = 129 to
1,025 and 65,600 rows in one group, K = N = 24, as the main job builds them for jax.ragged_dot), plus the time
and tracemalloc peak of building each cell's problem (group sizes and the operands, nothing per row).

    python benchmarks/bench_reference.py [--repeat 5] [--groups 1,8,64,1024] [--scale]
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
    ap.add_argument("--scale", action="store_true", help="the scale mode's cells instead")
    args = ap.parse_args()
    if args.scale:
        scale_cells(args.repeat)
        return
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


def _peak(f):
    gc.collect()
    tracemalloc.start()
    out = f()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, peak


def scale_cells(repeat: int) -> None:
    import gmm_kernels
    from property_tests.checks import scale

    adapter = gmm_kernels.get("jax.ragged_dot")
    mib = 2.0**20
    print(f"the scale mode's cells for {adapter.name}; best of {repeat}; dense: float64 [M, K] @ [K, N] of the "
          "same FLOPs")
    print(f"{'cell':<36} {'build s':>8} {'build MiB':>9} {'ref+round s':>11} {'dense s':>8} {'ref/dense':>9} "
          f"{'peak MiB':>8} {'in+out MiB':>10}")
    for cell in scale.cells(adapter):
        p, build_peak = _peak(lambda cell=cell: scale.scale_problem(adapter, cell))
        if isinstance(p, str):
            print(f"{cell.describe():<36} n/a: {p}")
            continue
        build = best(lambda cell=cell: scale.scale_problem(adapter, cell), repeat)
        ref = best(functools.partial(_values, p), repeat)
        _, peak = _peak(functools.partial(_values, p))
        m, k = p.lhs.shape
        n = p.rhs.shape[-1]
        a64, b64 = np.ones((m, k)), np.ones((k, n))
        dense = best(lambda a64=a64, b64=b64: a64 @ b64, repeat)
        io = p.lhs.nbytes + p.rhs.nbytes + m * n * p.out_dtype.itemsize
        print(f"{cell.describe():<36} {build:>8.4f} {build_peak / mib:>9.2f} {ref:>11.4f} {dense:>8.5f} "
              f"{ref / dense:>9.0f} {peak / mib:>8.2f} {io / mib:>10.2f}")


if __name__ == "__main__":
    main()
