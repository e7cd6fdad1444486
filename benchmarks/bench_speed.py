"""Wall-clock figures of the main job, the test suite and checked examples per second, cold and warm
(a script, not a test; figures from one run are comparable with each other, not across machines).

    python benchmarks/bench_speed.py main      # gmm-harness check: cold cache --jobs 1, cold, warm
    python benchmarks/bench_speed.py suite     # pytest -n N: cold cache, warm cache
    python benchmarks/bench_speed.py examples  # examples/s per kernel: no cache, cold cache, disk-warm, in memory
    python benchmarks/bench_speed.py shards    # the main job in one run against N shards (--shards), each cold
    ... --baseline REV                         # the same figures for a git revision, in a worktree, beside

"cold" starts from an empty compilation cache (a fresh clone or CI machine);
"warm" runs again with the cache the cold run left. Each figure is a fresh
process. A baseline revision that predates the persistent cache ignores it:
its cold and warm figures are both uncached.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# in a fresh process: the examples/s of one kernel and mode, first in a cold process, then again in it
EXAMPLES = '''
import os, sys, time
try:
    from gmm_kernels.runtimes.process import prepare_process
    prepare_process(cache=True, cache_dir=sys.argv[4])
except ImportError:  # a revision measured for comparison that has no prepare_process
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        from property_tests import compile_cache
        compile_cache.enable(sys.argv[4])
    except ImportError:
        pass
from hypothesis import settings
from gmm_kernels import Status, resolve_kernel
from property_tests.checks.check import check_mode
from property_tests.checks.profiles import register_profiles
register_profiles()
settings.load_profile("gmm-ci")
kernel, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rates = []
for _ in range(2):
    t0 = time.perf_counter()
    result = check_mode(resolve_kernel(kernel), mode, max_examples=n)
    assert result.status is Status.PASSED, result.cell()
    rates.append(result.examples / (time.perf_counter() - t0))
print("RATES", *rates)
'''


def _env(tree: Path, cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT"))}
    return {**env, "PYTHONPATH": str(tree), "GMM_HARNESS_COMPILE_CACHE": cache, "XDG_CACHE_HOME": cache + "-xdg"}


def _timed(cmd: list[str], tree: Path, cache: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=_env(tree, cache), capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return seconds, proc.stdout


def _trees(baseline: str | None) -> list[tuple[str, Path]]:
    trees = [("this tree", ROOT)]
    if baseline:
        where = Path(tempfile.mkdtemp(prefix="gmm-baseline-")) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), baseline], check=True,
                       capture_output=True)
        trees.insert(0, (f"baseline {baseline}", where))
    return trees


def bench_main(trees: list[tuple[str, Path]], args: argparse.Namespace) -> None:
    print(f"{'tree':<24} {'run':<26} {'seconds':>8}  result")
    for label, tree in trees:
        for jobs in ([["--jobs", "1"], []] if label == "this tree" else [[]]):
            cache = tempfile.mkdtemp(prefix="gmm-cache-")
            for run in ("cold", "warm"):
                seconds, out = _timed([sys.executable, "-m", "property_tests.cli.main", "check", *jobs], tree, cache)
                summary = next((ln for ln in out.splitlines() if " passed, " in ln), "?")
                print(f"{label:<24} {run + ' ' + ' '.join(jobs):<26} {seconds:>8.1f}  {summary.split('(')[0]}",
                      flush=True)


def bench_suite(trees: list[tuple[str, Path]], args: argparse.Namespace) -> None:
    print(f"{'tree':<24} {'run':<26} {'seconds':>8}  result")
    for label, tree in trees:
        for workers in args.workers.split(","):
            cache = tempfile.mkdtemp(prefix="gmm-cache-")
            for run in ("cold", "warm"):
                # the cache comes from GMM_HARNESS_COMPILE_CACHE, so the command is the same for both trees
                seconds, out = _timed([sys.executable, "-m", "pytest", "-q", "-n", workers], tree, cache)
                summary = next((ln for ln in reversed(out.splitlines()) if " passed" in ln), "?")
                print(f"{label:<24} {run + ' -n ' + workers:<26} {seconds:>8.1f}  {summary.strip('= ')}", flush=True)


def bench_examples(trees: list[tuple[str, Path]], args: argparse.Namespace) -> None:
    print(f"{'tree':<24} {'kernel':<24} {'mode':<7} {'cache':<10} {'cold ex/s':>9} {'in-memory':>9}")
    for label, tree in trees:
        for kernel in args.kernel:
            for mode in ("normal", "exact"):
                cache = tempfile.mkdtemp(prefix="gmm-cache-")
                for run in ("off", "cold", "disk-warm"):
                    _, out = _timed([sys.executable, "-c", EXAMPLES, kernel, mode, str(args.examples),
                                     "off" if run == "off" else cache], tree, cache)
                    cold, warm = map(float, re.search(r"RATES (\S+) (\S+)", out).groups())
                    print(f"{label:<24} {kernel:<24} {mode:<7} {run:<10} {cold:>9.1f} {warm:>9.1f}", flush=True)


def bench_shards(trees: list[tuple[str, Path]], args: argparse.Namespace) -> None:
    """One main-job run against ``--shards`` shards, each with a cold cache of its own (as separate CI machines
    have), run one after the other; the merge must print the unsharded table."""
    n = args.shards
    kernels = [a for k in (args.kernel_filter or []) for a in ("--kernel", k)]
    out_dir = Path(tempfile.mkdtemp(prefix="gmm-shards-"))
    print(f"{'run':<26} {'seconds':>8}  result")
    one, one_out = _timed([sys.executable, "-m", "property_tests.cli.main", "check", *kernels], ROOT,
                          tempfile.mkdtemp(prefix="gmm-cache-"))
    print(f"{'one run (cold)':<26} {one:>8.1f}  {_summary(one_out)}", flush=True)
    times = []
    for i in range(1, n + 1):
        t, out = _timed([sys.executable, "-m", "property_tests.cli.main", "check", *kernels, "--shard", f"{i}/{n}",
                         "--json", str(out_dir / f"shard{i}.json")], ROOT, tempfile.mkdtemp(prefix="gmm-cache-"))
        times.append(t)
        print(f"{f'shard {i}/{n} (cold)':<26} {t:>8.1f}  {_summary(out)}", flush=True)
    _, merged = _timed([sys.executable, "-m", "property_tests.cli.main", "merge",
                        *[str(out_dir / f"shard{i}.json") for i in range(1, n + 1)]], ROOT, tempfile.mkdtemp())
    print(f"{'merged':<26} {'':>8}  {_summary(merged)}; the unsharded table: "
          f"{'same' if _table_of(merged) == _table_of(one_out) else 'DIFFERENT'}")
    print(f"{'shards summed':<26} {sum(times):>8.1f}  {sum(times) / one:.2f}x one run")
    print(f"{'slowest shard (wall)':<26} {max(times):>8.1f}  {max(times) / one:.2f}x one run")


def _summary(stdout: str) -> str:
    return next((ln for ln in stdout.splitlines() if " passed, " in ln), "?").split("(")[0].strip()


def _table_of(stdout: str) -> str:
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("kernel "))
    return "\n".join(lines[start:next(i for i, ln in enumerate(lines) if " passed, " in ln)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["main", "suite", "examples", "shards"])
    parser.add_argument("--baseline", default=None, metavar="REV", help="also measure this git revision")
    parser.add_argument("--workers", default="0,2", help="suite: xdist worker counts (comma-separated)")
    parser.add_argument("--kernel", action="append", default=None, help="examples: kernels (repeatable)")
    parser.add_argument("--examples", type=int, default=25, help="examples: max examples per run")
    parser.add_argument("--shards", type=int, default=2, help="shards: how many")
    parser.add_argument("--kernel-filter", action="append", default=None, metavar="K",
                        help="shards: check only these kernels (default: every kernel here)")
    args = parser.parse_args()
    args.kernel = args.kernel or ["jax.ragged_dot", "megablox.gmm"]
    trees = _trees(args.baseline)
    try:
        {"main": bench_main, "suite": bench_suite, "examples": bench_examples,
         "shards": bench_shards}[args.what](trees, args)
    finally:
        for _, tree in trees:
            if tree != ROOT:  # the baseline's worktree
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


if __name__ == "__main__":
    main()
